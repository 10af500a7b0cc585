"""A web app on its own origin uploads to the collector at another origin, in headless Chromium.

``sdk-web/test/browser/cors.ts`` serves a page at ``http://127.0.0.1:20192`` (or 20195; a node HTTP server) that uses the built bundle to read the metrics from and upload to the real collector at
``http://127.0.0.1:<its port>``. With ``--allow-origin http://127.0.0.1:20192`` the browser lets it and
the collector holds the reports; without it the browser withholds the requests (``TypeError: Failed to
fetch``) and the reports stay on the device, unsent. Debian's chromium is required (a failure, not a skip).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ldp_core.metrics import parse_metrics
from ldp_core.wire.frames import decode_frame
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)
from tests.web.node_support import run_tsx
from tests.web.test_web_browser import CHROMIUM, METRICS

PAGE_ORIGIN = "http://127.0.0.1:20192"
OTHER_PAGE_ORIGIN = "http://127.0.0.1:20195"  # the second test's page: the two may run at once


def run_page(collector_url: str, page_origin: str = PAGE_ORIGIN) -> Any:
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is required (apt-get install -y chromium)"
    return run_tsx("test/browser/cors.ts", page_origin, collector_url, CHROMIUM, json.dumps(METRICS), timeout=300)


def test_a_page_on_an_allowed_origin_uploads_cross_origin(collector_factory: Callable[..., Any]) -> None:  # noqa: F811
    collector = collector_factory(metrics=METRICS, allow_origin=PAGE_ORIGIN)
    out = run_page(collector.url)
    assert out["origin"] == PAGE_ORIGIN and out["origin"] != collector.url  # really cross-origin
    assert out["metricsError"] is None and out["fetchErrors"] == [] and out["consoleErrors"] == [], out
    assert out["flushed"] is True and out["pending"] == 0, out
    assert out["stats"]["uploaded_reports"] == 4 == out["stats"]["recorded"], out
    specs = {m.spec.spec_id: m.spec for m in parse_metrics(METRICS).values()}
    counted = sum(len(decode_frame(f, specs)) for f in collector.frames())
    assert counted == 4
    assert collector.stats()["accepted"] >= 1


def test_the_same_page_fails_against_a_collector_without_the_flag(collector_factory: Callable[..., Any]) -> None:  # noqa: F811
    collector = collector_factory(metrics=METRICS)
    out = run_page(collector.url, OTHER_PAGE_ORIGIN)
    assert out["metricsError"] is not None and "Failed to fetch" in out["metricsError"], out
    assert out["fetchErrors"] and all("Failed to fetch" in e for e in out["fetchErrors"]), out
    # and it is the CORS check that refused it (the console says why; the page itself is told nothing)
    assert any("blocked by CORS policy" in e and "Access-Control-Allow-Origin" in e for e in out["consoleErrors"]), out
    assert out["flushed"] is False and out["pending"] == 4, out  # kept on the device, not lost
    assert out["stats"]["uploaded_reports"] == 0 and out["errors"]["upload_failures"] >= 1
    assert collector.frames() == []
