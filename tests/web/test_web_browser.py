"""Browser smoke test: the built bundle records and uploads from headless Chromium to the real collector.

``sdk-web/test/browser/smoke.ts`` bundles the SDK with esbuild, starts Debian's ``chromium``
(``/usr/bin/chromium``, through playwright-core) and serves a page that imports the bundle at the
collector's own origin. The page's client reads ``GET /v1/metrics``, records (a sealed metric too,
sealed in the browser with Web Crypto, then opened here) with the browser's
IndexedDB and ``crypto.getRandomValues``, and flushes by ``fetch``; a second client, offline, forms
and stores its batch and then sees ``pagehide``, which sends the batch by ``navigator.sendBeacon``
(or ``fetch`` with ``keepalive``) while the client's own retry sends it again. The collector must
hold every report exactly once, in frames the Python SDK decodes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ldp_core.metrics import parse_metrics
from ldp_core.wire.frames import decode_frame
from ldp_core.wire.sealing import AnalyzerKey, KeyRing, open_batch
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)
from tests.web.node_support import run_tsx

CHROMIUM = os.environ.get("LDP_CHROMIUM", "/usr/bin/chromium")
_BASE = {"description": "browser smoke", "owner": "web@example.org", "expires": "2099-12-31"}
METRICS: dict[str, Any] = {
    "format": "ldp-metrics/1",
    "metrics": {
        "tab": {
            **_BASE,
            "mechanism": {"mechanism": "grr", "epsilon": 1.0},
            "domain": {"kind": "dictionary", "values": ["a", "b", "c", "d", "e"], "other": True},
            "max_reports_per_day": 10,
        },
        "word": {
            **_BASE,
            "mechanism": {"mechanism": "olh", "epsilon": 1.0},
            "domain": {"kind": "hashed", "size": 1024, "seed": 0},
            "max_reports_per_day": 10,
        },
        "emoji": {
            **_BASE,
            "mechanism": {"mechanism": "rappor", "epsilon": 2.0, "num_bits": 16, "num_cohorts": 4},
            "domain": {"kind": "dictionary", "values": [f"e{i}" for i in range(8)]},
            "max_reports_per_day": 1,
        },
        "secret": {
            **_BASE,
            "mechanism": {"mechanism": "grr", "epsilon": 1.0},
            "domain": {"kind": "dictionary", "values": ["x", "y", "z"]},
            "max_reports_per_day": 10,
            "sealed": True,
        },
    },
}
#: the analyzer's key: the page seals "secret" to it in Chromium (Web Crypto, @hpke/core), Python opens it
ANALYZER = AnalyzerKey(os.urandom(32))
METRICS["analyzer_keys"] = [ANALYZER.public.to_dict()]


def test_bundle_records_and_uploads_from_headless_chromium(collector_factory: Callable[..., Any]) -> None:  # noqa: F811
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is required (apt-get install -y chromium)"
    collector = collector_factory(metrics=METRICS)
    out = run_tsx("test/browser/smoke.ts", collector.url, CHROMIUM, timeout=300)
    p1, p2 = out["phase1"], out["phase2"]
    assert p1["flushed"] is True, out
    assert {k: v for k, v in p1["errors"].items() if v} == {}, out
    assert p1["stats"]["recorded"] == 11 == p1["stats"]["uploaded_reports"]
    assert abs(p1["spent"]["spent"] - 12.0) < 1e-9  # 5 + 3 + 2 reports of ε 1, one of ε 2
    assert p2["beacons"], "pagehide must try navigator.sendBeacon"
    assert p2["pending"] == 0 and p2["stats"]["recorded"] == 2, out
    defs = parse_metrics(METRICS)
    specs = {m.spec.spec_id: m.spec for m in defs.values()}
    frames = collector.frames()
    per_metric: dict[str, int] = {}
    opened: list[int] = []
    for f in frames:
        batch = decode_frame(f, specs)
        per_metric[batch.metric] = per_metric.get(batch.metric, 0) + len(batch)
        assert batch.sealed == (batch.metric == "secret")
        if batch.sealed:
            res = open_batch(batch, KeyRing([ANALYZER]))
            assert res.failed == 0
            opened += [int(v) for v in res.batch.records["value"]]
    assert per_metric == {"tab": 7, "word": 3, "emoji": 1, "secret": 2}, "every report exactly once"
    assert len(opened) == 2 and all(0 <= v < 3 for v in opened), "the sealed reports open to GRR records"
    stats = collector.stats()
    assert stats["accepted"] == stats["stored"] == len(frames)
