"""The SDK seals a sealed metric's records at upload (on the uploader thread), to the current analyzer key;
plain metrics' frames are unchanged; a rotated key served by the collector is used from the next batch if
the app's bundled file names it (a key it does not name is refused: tests/sdk/test_sealed_attacks.py)."""

from __future__ import annotations

import copy
import pathlib
import time
from typing import Any

import numpy as np

from client_sdk import ClientConfig, TelemetryClient
from client_sdk.policy import LocalPolicy
from ldp_core.metrics import FORMAT
from ldp_core.wire.frames import decode_frame, read_header
from ldp_core.wire.sealing import KeyRing, new_key_file, open_batch
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)

POLICY = LocalPolicy(per_metric_daily=30.0, total_daily=60.0)
COLORS = {"kind": "dictionary", "values": ["red", "green", "blue"], "other": True}


def _doc(public: dict[str, str], *more: dict[str, str]) -> dict[str, Any]:
    common = {"description": "d", "owner": "o@example.org", "expires": "2099-12-31", "max_reports_per_day": 20}
    return {
        "format": FORMAT,
        "analyzer_keys": [public, *more],
        "metrics": {
            "color": {**common, "mechanism": {"mechanism": "grr", "epsilon": 1.0}, "domain": COLORS, "sealed": True},
            "plain": {**common, "mechanism": {"mechanism": "grr", "epsilon": 1.0}, "domain": COLORS},
        },
    }


def _opened(frames: list[bytes], specs: dict[str, Any], ring: KeyRing) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for f in frames:
        b = decode_frame(f, specs[read_header(f).metric])
        if b.sealed:
            res = open_batch(b, ring)
            assert res.failed == 0
            b = res.batch
        out.setdefault(b.metric, []).extend(int(v) for v in b.records["value"])
    return out


def test_the_client_seals_a_sealed_metric_and_the_collector_takes_it(
    tmp_path: pathlib.Path, collector_factory: Any
) -> None:
    _, key = new_key_file(tmp_path / "keys")
    doc = _doc(key.public.to_dict())
    col = collector_factory(metrics=doc)
    c = TelemetryClient(tmp_path / "sdk", col.url, POLICY, doc, config=ClientConfig(batch_size=5, batch_max_age=0.0))
    try:
        for _ in range(10):
            c.record("color", "red")
            c.record("plain", "blue")
        assert c.flush(30)
        assert c.stats()["uploaded_reports"] == 20
    finally:
        c.close()
    frames = col.frames()
    headers = [read_header(f) for f in frames]
    assert {h.metric: h.sealed for h in headers} == {"color": True, "plain": False}
    color_spec = c.metrics["color"].spec
    assert all(h.record_size == color_spec.record_size + 52 for h in headers if h.metric == "color")
    got = _opened(frames, {n: c.metrics[n].spec for n in ("color", "plain")}, KeyRing.load(tmp_path / "keys"))
    assert len(got["color"]) == len(got["plain"]) == 10
    assert all(0 <= v < color_spec.domain_size for v in got["color"])


def test_a_rotated_key_from_the_collector_is_used_for_the_next_batches(
    tmp_path: pathlib.Path, collector_factory: Any
) -> None:
    _, old = new_key_file(tmp_path / "keys")
    _, new = new_key_file(tmp_path / "keys")
    # the app ships the next key ahead (listed after the current one): a served key must be one it names
    bundled = _doc(old.public.to_dict(), new.public.to_dict())
    served = copy.deepcopy(_doc(new.public.to_dict(), old.public.to_dict()))  # the new key first, the old retired
    col = collector_factory(metrics=served)
    c = TelemetryClient(
        tmp_path / "sdk",
        col.url,
        POLICY,
        bundled,
        config=ClientConfig(batch_size=4, batch_max_age=0.0, fetch_metrics=True),
    )
    try:
        deadline = time.monotonic() + 20
        while c._sealing.get("color") != new.public and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c._sealing.get("color") == new.public
        for _ in range(8):
            c.record("color", "green")
        assert c.flush(30)
    finally:
        c.close()
    frames = [f for f in col.frames() if read_header(f).metric == "color"]
    assert frames
    spec = c.metrics["color"].spec
    kids = {
        bytes(r[:4]).hex()
        for f in frames
        for r in np.asarray(decode_frame(f, spec).records).view(np.uint8).reshape(-1, spec.record_size + 52)
    }
    assert kids == {new.key_id}
    ring = KeyRing.load(tmp_path / "keys")
    assert len(_opened(frames, {"color": spec}, ring)["color"]) == 8
    assert len(_opened(frames, {"color": spec}, KeyRing([ring[new.key_id]]))["color"]) == 8
