"""Numeric metrics on the device: ``record(metric, 12.5)`` through the ledger, the outbox and the real
collector (a subprocess), and what happens to values that do not fit (docs/NUMERIC.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from client_sdk.client import STAT_TALLIES, TelemetryClient
from client_sdk.config import ClientConfig
from client_sdk.policy import LocalPolicy
from ldp_core.metrics import MetricsFileError, parse_metrics
from ldp_core.wire.frames import decode_frame
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)


def numeric(kind: str, mechanism: dict[str, object], out_of_range: str = "clamp") -> dict[str, object]:
    return {
        "kind": kind,
        "description": "d",
        "owner": "o@example.org",
        "expires": "2099-12-31",
        "mechanism": mechanism,
        "domain": {"kind": "range", "low": 0, "high": 60, "out_of_range": out_of_range},
        "max_reports_per_day": 50,
    }


DOC = {
    "format": "ldp-metrics/1",
    "metrics": {
        "minutes": numeric("mean", {"mechanism": "pm", "epsilon": 0.05}),
        "strict": numeric("mean", {"mechanism": "duchi", "epsilon": 0.05}, out_of_range="refuse"),
        "dist": numeric("distribution", {"mechanism": "sw", "epsilon": 0.05, "bins": 16}),
    },
}
POLICY = LocalPolicy(per_metric_daily=3.0, total_daily=8.0)


def test_numbers_are_recorded_clamped_or_refused_and_uploaded(tmp_path, collector_factory) -> None:  # noqa: F811
    col = collector_factory(metrics=DOC)
    c = TelemetryClient(
        tmp_path / "sdk", col.url, POLICY, DOC, config=ClientConfig(mode="simulation", simulation_seed=3)
    )
    try:
        for v in (0, 12.5, np.float32(59.0), 60):
            c.record("minutes", v)
        c.record("minutes", 75.0)  # above the range: clamped to 60 and recorded
        c.record("minutes", -3)  # below: clamped to 0
        for bad in (math.nan, math.inf, "12", None, True):
            c.record("minutes", bad)  # never raises: counted
        c.record("strict", 61.0)  # refused by the metric's out_of_range
        c.record("strict", 30.0)
        for v in (1.0, 10.0, 55.0):
            c.record("dist", v)
        assert c.flush(20)
        assert c.stats()["recorded"] == 6 + 1 + 3
        assert c.stats()["clamped"] == 2 and "clamped" in STAT_TALLIES
        assert c.errors()["bad_value"] == 5 + 1
        assert c.stats()["uploaded_reports"] == 10
        metrics = parse_metrics(DOC)
        got: dict[str, int] = {}
        for frame in col.frames():
            for name in metrics:
                try:
                    batch = decode_frame(frame, metrics[name].spec)
                except Exception:  # noqa: BLE001 - another metric's frame
                    continue
                got[name] = got.get(name, 0) + len(batch)
                metrics[name].spec.check_records(batch.records)
        assert got == {"minutes": 6, "strict": 1, "dist": 3}
        assert c.privacy_spent().metrics["minutes"].spent == pytest.approx(6 * 0.05)
    finally:
        c.close()


def test_metrics_file_kinds_are_checked() -> None:
    auto = parse_metrics({**DOC, "metrics": {"m": numeric("mean", {"mechanism": "auto", "epsilon": 0.3})}})
    assert auto["m"].spec.name == "duchi" and auto["m"].kind == "mean"  # below ε* ≈ 0.61
    assert auto["m"].spec.low == 0 and auto["m"].spec.high == 60  # the range fills low/high
    assert parse_metrics(auto.to_dict())["m"].spec.spec_id == auto["m"].spec.spec_id  # round trip, same id
    cases = [
        (numeric("mean", {"mechanism": "sw", "epsilon": 1.0}), "estimates a distribution"),
        (numeric("distribution", {"mechanism": "auto", "epsilon": 1.0}), "'auto' picks a mean"),
        (numeric("mean", {"mechanism": "pm", "epsilon": 1.0, "low": 0, "high": 50}), "differs from the domain"),
        ({**numeric("mean", {"mechanism": "grr", "epsilon": 1.0})}, "needs a 'dictionary' or 'hashed' domain"),
        ({**numeric("median", {"mechanism": "pm", "epsilon": 1.0})}, "'kind' must be one of"),
        (
            {**numeric("mean", {"mechanism": "pm", "epsilon": 1.0}), "domain": {"kind": "range", "low": 5, "high": 1}},
            "below high",
        ),
    ]
    for definition, message in cases:
        with pytest.raises(MetricsFileError, match=message):
            parse_metrics({**DOC, "metrics": {"m": definition}})
    freq = {**numeric("mean", {"mechanism": "pm", "epsilon": 1.0}), "domain": {"kind": "dictionary", "values": [1, 2]}}
    with pytest.raises(MetricsFileError, match="needs a 'range' domain"):
        parse_metrics({**DOC, "metrics": {"m": freq}})


def test_a_metric_of_several_attributes_records_sequences(tmp_path, collector_factory) -> None:  # noqa: F811
    """dims = 3 with k = 1 sampled (Wang et al.'s attribute sampling): record() takes 3 numbers, clamps each, and
    refuses a wrong count or a non-number; the reports decode with one sampled attribute each."""
    doc = {
        "format": "ldp-metrics/1",
        "metrics": {"vec": numeric("mean", {"mechanism": "hm", "epsilon": 0.05, "dims": 3, "sample": 1})},
    }
    col = collector_factory(metrics=doc)
    c = TelemetryClient(
        tmp_path / "sdk", col.url, POLICY, doc, config=ClientConfig(mode="simulation", simulation_seed=4)
    )
    try:
        c.record("vec", [1.0, 30.0, 59.0])
        c.record("vec", (0, 61.0, -2))  # two numbers clamped: one report, counted once as clamped
        c.record("vec", np.array([5.0, 6.0, 7.0]))
        for bad in ([1.0, 2.0], 4.0, [1.0, math.nan, 2.0], ["a", 1, 2]):
            c.record("vec", bad)
        assert c.flush(20)
        assert c.stats()["recorded"] == 3 and c.stats()["clamped"] == 1
        assert c.errors()["bad_value"] == 4
        spec = parse_metrics(doc)["vec"].spec
        (frame,) = col.frames()
        batch = decode_frame(frame, spec)
        assert len(batch) == 3 and batch.records["attr"].shape == (3, 1)
        spec.check_records(batch.records)
    finally:
        c.close()
