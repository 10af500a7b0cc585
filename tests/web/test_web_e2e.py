"""The TypeScript SDK end to end: TS clients in Node -> the real collector -> shuffler -> estimator.

Devices are TelemetryClients of ``sdk-web`` (each with its own fake-indexeddb database and device
secret) driven by ``sdk-web/test/e2e/drive.ts``; they read ``GET /v1/metrics``, record a known
population, and upload to :class:`simulator.stack.LocalPipeline`'s real HTTP collector. One
frame in five is then uploaded a second time. The test checks that every report is counted exactly
once (the estimator's counts per metric equal what the devices recorded, the resent frames answered
as duplicates) and that each item's estimate lies within 5 standard deviations of its true count,
the deviation from the mechanism's ``count_variance`` (the Python SDK's formula; a pure protocol's
[n_v p*(1-p*) + (n - n_v) q*(1-q*)]/(p* - q*)^2, RAPPOR's least-squares variance): the probability
that one of the 141 items fails by chance is below 1e-4. The shuffler's crowd threshold is 1, so
every group is released: the threshold is tested elsewhere.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ldp_core.days import utc_day
from ldp_core.mechanisms import frequency_spec
from ldp_core.metrics import parse_metrics
from simulator.stack import LocalPipeline
from tests.web.node_support import run_tsx

_BASE = {"description": "web e2e", "owner": "web@example.org", "expires": "2099-12-31"}
WORDS = [f"word{i}" for i in range(40)]
METRICS: dict[str, Any] = {
    "format": "ldp-metrics/1",
    "metrics": {
        "tab": {
            **_BASE,
            "mechanism": {"mechanism": "grr", "epsilon": 2.0},
            "domain": {"kind": "dictionary", "values": ["a", "b", "c", "d", "e", "f"], "other": True},
            "max_reports_per_day": 5,
        },
        "word": {
            **_BASE,
            "mechanism": {"mechanism": "olh", "epsilon": 2.0},
            "domain": {"kind": "hashed", "size": 64, "seed": 3},
            "max_reports_per_day": 5,
        },
        "feature": {
            **_BASE,
            "mechanism": {"mechanism": "oue", "epsilon": 1.0},
            "domain": {"kind": "dictionary", "values": list(range(12))},
            "max_reports_per_day": 5,
        },
        "search": {
            **_BASE,
            "mechanism": {"mechanism": "hcms", "epsilon": 3.0, "num_hashes": 8, "width": 64},
            "domain": {"kind": "hashed", "size": 32, "seed": 0},
            "max_reports_per_day": 5,
        },
        "page": {
            **_BASE,
            "mechanism": {"mechanism": "hr", "epsilon": 2.0},
            "domain": {"kind": "dictionary", "values": [f"p{i}" for i in range(10)]},
            "max_reports_per_day": 5,
        },
        "emoji": {
            **_BASE,
            "mechanism": {"mechanism": "rappor", "epsilon": 4.0, "num_bits": 16, "num_cohorts": 8},
            "domain": {"kind": "dictionary", "values": [f"e{i}" for i in range(16)]},
            "max_reports_per_day": 1,
        },
    },
}
DEVICES = 160
PER_DEVICE = {"tab": 5, "word": 5, "feature": 5, "search": 5, "page": 5, "emoji": 1}


def _population(rng: np.random.Generator) -> list[dict[str, list[Any]]]:
    """Each device's values: Zipf-like choices from each metric's values (fixed seed)."""
    choices: dict[str, list[Any]] = {
        "tab": ["a", "b", "c", "d", "e", "f", "something else"],
        "word": WORDS,
        "feature": list(range(12)),
        "search": WORDS[:25],
        "page": [f"p{i}" for i in range(10)],
        "emoji": [f"e{i}" for i in range(16)],
    }
    devices = []
    for _ in range(DEVICES):
        dev: dict[str, list[Any]] = {}
        for metric, k in PER_DEVICE.items():
            opts = choices[metric]
            w = 1.0 / np.arange(1, len(opts) + 1)
            dev[metric] = [opts[i] for i in rng.choice(len(opts), size=k, p=w / w.sum())]
        devices.append(dev)
    return devices


def test_ts_clients_through_collector_shuffler_and_estimator(tmp_path: Path) -> None:
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(METRICS))
    defs = parse_metrics(METRICS)
    devices = _population(np.random.default_rng(20261202))
    specs = {name: frequency_spec(defs[name].spec) for name in METRICS["metrics"]}
    truth = {name: np.zeros(specs[name].domain_size) for name in METRICS["metrics"]}
    for dev in devices:
        for metric, values in dev.items():
            for v in values:
                index = defs[metric].domain.index_of(v)
                assert isinstance(index, int)
                truth[metric][index] += 1
    expected = {m: int(t.sum()) for m, t in truth.items()}
    day = utc_day(time.time())
    with LocalPipeline(tmp_path / "run", metrics_path, min_batch=1, partitions=1, checkpoint_interval=0.2) as pipe:
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"collectorUrl": pipe.collector_url, "devices": devices, "resendEvery": 5}))
        out = run_tsx("test/e2e/drive.ts", str(plan))
        assert {k: v for k, v in out["errors"].items() if v} == {}, out
        assert out["stats"]["recorded"] == sum(expected.values()) == out["stats"]["uploaded_reports"]
        assert out["leftover"] == 0
        assert out["resent"] >= 100 and set(out["resentStatuses"]) <= {202, 409}, out["resentStatuses"][:20]
        pipe.wait_settled(sum(expected.values()), timeout=120)
        assert pipe.counted() == expected, "every report counted exactly once"
        live = {
            m: httpx.get(f"{pipe.estimator_url}/v1/estimates/{m}", params={"day": day}, timeout=60).json()
            for m in METRICS["metrics"]
        }
    for metric, body in live.items():
        spec = specs[metric]
        assert body["n"] == expected[metric] and body["spec_id"] == spec.spec_id
        counts = np.array(body["counts"])
        sd = np.sqrt(spec.count_variance(truth[metric]))
        z = (counts - truth[metric]) / sd
        assert np.all(np.abs(z) < 5), f"{metric}: z = {np.round(z, 2)}"
