"""Heavy-hitter metrics on the device: ``record(metric, "word")`` through the ledger, the outbox and the real
collector (a subprocess); values that do not fit are truncated or counted, never raised (docs/HEAVY_HITTERS.md)."""

from __future__ import annotations

import numpy as np
import pytest

from client_sdk.client import TelemetryClient
from client_sdk.config import ClientConfig
from client_sdk.policy import LocalPolicy
from ldp_core.mechanisms.heavy_hitters import PEMSpec, unpad
from ldp_core.metrics import MetricsFileError, parse_metrics
from ldp_core.wire.frames import decode_frame
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)


def words(mechanism: dict[str, object], overflow: str = "truncate", length: int = 8) -> dict[str, object]:
    return {
        "kind": "heavy_hitters",
        "description": "d",
        "owner": "o@example.org",
        "expires": "2099-12-31",
        "mechanism": mechanism,
        "domain": {"kind": "string", "length": length, "overflow": overflow},
        "max_reports_per_day": 50,
    }


DOC = {
    "format": "ldp-metrics/1",
    "metrics": {
        "search": words({"mechanism": "pem", "epsilon": 0.05, "start_bits": 12, "step_bits": 4}),
        "strict": words({"mechanism": "pem", "epsilon": 0.05}, overflow="refuse"),
        "emoji": words({"mechanism": "sfp", "epsilon": 0.05, "num_hashes": 4, "width": 64}),
    },
}
POLICY = LocalPolicy(per_metric_daily=3.0, total_daily=8.0)


def test_strings_are_recorded_truncated_or_refused_and_uploaded(tmp_path, collector_factory) -> None:  # noqa: F811
    col = collector_factory(metrics=DOC)
    c = TelemetryClient(
        tmp_path / "sdk", col.url, POLICY, DOC, config=ClientConfig(mode="simulation", simulation_seed=3)
    )
    try:
        for v in ("weather", "café", "naïve naïve"):  # the last is 13 bytes: truncated to 8 at a boundary
            c.record("search", v)
        for bad in ("", "a\x00b", 12, None, b"\xff", ["x"]):
            c.record("search", bad)  # never raises: counted
        c.record("strict", "much too long")  # refused by the metric's overflow
        c.record("strict", "ok")
        for v in ("🙂🙂", "abcd"):
            c.record("emoji", v)
        assert c.flush(20)
        assert c.stats()["recorded"] == 3 + 1 + 2
        assert c.errors()["bad_value"] == 6 + 1
        metrics = parse_metrics(DOC)
        got: dict[str, list[np.ndarray]] = {}
        for frame in col.frames():
            for name in metrics:
                try:
                    batch = decode_frame(frame, metrics[name].wire_spec)
                except Exception:  # noqa: BLE001 - another metric's frame
                    continue
                metrics[name].spec.check_records(batch.records)
                got.setdefault(name, []).append(batch.records)
        assert {k: sum(len(r) for r in v) for k, v in got.items()} == {"search": 3, "strict": 1, "emoji": 2}
        levels = np.concatenate(got["search"])["level"]
        assert len(set(levels.tolist())) == 1, "a device reports every value at its one level"
        assert c.privacy_spent().metrics["search"].spent == pytest.approx(3 * 0.05)
    finally:
        c.close()


def test_a_device_keeps_its_level_across_restarts(tmp_path, collector_factory) -> None:  # noqa: F811
    spec = parse_metrics(DOC)["search"].spec
    assert isinstance(spec, PEMSpec)
    col = collector_factory(metrics=DOC)
    levels = []
    for _ in range(2):
        c = TelemetryClient(
            tmp_path / "sdk", col.url, POLICY, DOC, config=ClientConfig(mode="simulation", simulation_seed=5)
        )
        try:
            c.record("search", "hello")
            assert c.flush(20)
        finally:
            c.close()
    for frame in col.frames():
        levels.extend(decode_frame(frame, spec).records["level"].tolist())
    assert len(levels) == 2 and levels[0] == levels[1]


def test_string_metric_definitions_are_checked() -> None:
    ok = parse_metrics(DOC)
    assert ok["search"].kind == "heavy_hitters" and ok["search"].spec.length == 8  # type: ignore[attr-defined]
    assert parse_metrics(ok.to_dict())["search"].spec.spec_id == ok["search"].spec.spec_id  # round trip, same id
    assert unpad(ok["search"].domain.index_of("naïve naïve")) == "naïve n"  # type: ignore[arg-type]
    cases = [
        (words({"mechanism": "olh", "epsilon": 1.0}), "needs a heavy-hitter mechanism"),
        (words({"mechanism": "pem", "epsilon": 1.0, "length": 6}), "differ from the domain"),
        (words({"mechanism": "pem", "epsilon": 1.0}, length=0), "'length' must be"),
        (words({"mechanism": "pem", "epsilon": 1.0}, overflow="wrap"), "'overflow' must be"),
        ({**words({"mechanism": "pem", "epsilon": 1.0}), "domain": {"kind": "hashed", "size": 8}}, "'string' domain"),
        ({**words({"mechanism": "pem", "epsilon": 1.0}), "kind": "mean"}, "estimates a heavy_hitters"),
    ]
    for definition, message in cases:
        with pytest.raises(MetricsFileError, match=message):
            parse_metrics({**DOC, "metrics": {"m": definition}})
