"""Fixtures of the dashboard's browser tests: a live estimator fed by a real pipeline run, and Chromium.

The pipeline is :class:`simulator.stack.LocalPipeline` (HTTP collector, shuffler, streaming estimator with
its API and the dashboard, Parquet sink) on the embedded log; seeded simulated devices upload wire-format
frames over HTTP on three days, so the page has a time series to draw. The browser is the system's Chromium
(Debian's ``chromium``, installed by ``scripts/install-browser``) driven by Playwright: a missing browser or
a missing ``playwright`` package fails the tests, it never skips them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldp_core.days import utc_day
from ldp_core.metrics import load_metrics
from simulator.stack import LocalPipeline, fleet_batches, upload

#: the browser (scripts/install-browser installs Debian's at /usr/bin/chromium; LDP_CHROMIUM points elsewhere)
CHROMIUM = os.environ.get("LDP_CHROMIUM", "/usr/bin/chromium")
RANGE = {"kind": "range", "low": 0, "high": 120, "out_of_range": "clamp"}
METRICS = {
    "format": "ldp-metrics/1",
    "metrics": {
        "settings_tab": {
            "description": "Which settings tab a user opened.",
            "owner": "o@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "grr", "epsilon": 1.0},
            "domain": {
                "kind": "dictionary",
                "values": ["general", "privacy", "notifications", "appearance", "accounts", "about"],
                "other": True,
            },
            "max_reports_per_day": 2,
        },
        "emoji_used": {
            "description": "Which emoji a user sent (hashed into 64 buckets).",
            "owner": "o@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "olh", "epsilon": 1.0},
            "domain": {"kind": "hashed", "size": 64, "seed": 0},
            "max_reports_per_day": 1,
        },
        "search_word": {
            "kind": "heavy_hitters",
            "description": "A word typed into search, discovered (PEM over strings of up to 4 bytes).",
            "owner": "o@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "pem", "epsilon": 4.0, "start_bits": 8, "step_bits": 8},
            "domain": {"kind": "string", "length": 4, "overflow": "truncate"},
            "max_reports_per_day": 1,
        },
        "minutes": {
            "kind": "mean",
            "description": "Minutes in the app per session.",
            "owner": "o@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "auto", "epsilon": 2.0},
            "domain": RANGE,
            "max_reports_per_day": 1,
        },
        "minutes_dist": {
            "kind": "distribution",
            "description": "Minutes in the app per session, distribution.",
            "owner": "o@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "sw", "epsilon": 2.0, "bins": 16},
            "domain": RANGE,
            "max_reports_per_day": 1,
        },
    },
}
DEVICES = (3000, 4000, 5000)  # per day, oldest first: the days differ, so the series is not flat by accident
FRAME = 500  # reports per frame = the shuffler's crowd threshold: every frame is released


@dataclass
class FedPipeline:
    url: str
    days: list[int]
    metrics: list[str]
    reports: dict[str, int]
    dataset: Path  # the Parquet sink's folder, holding every report uploaded


@contextlib.contextmanager
def feed_pipeline(work: Path, transport_url: str | None = None) -> Iterator[FedPipeline]:
    """A pipeline on ``transport_url`` (default: the embedded log) that seeded devices fed on three days."""
    path = work / "metrics.json"
    path.write_text(json.dumps(METRICS))
    metrics = load_metrics(path)
    names = list(metrics)
    today = utc_day(time.time())
    days = [today - 2, today - 1, today]
    rng = np.random.default_rng(20261202)
    with LocalPipeline(work, path, transport_url=transport_url, min_batch=FRAME) as pipe:
        sent = 0
        for day, devices in zip(days, DEVICES):
            fleet = fleet_batches(metrics, names, devices, day, rng, frame_reports=FRAME)
            upload(pipe.collector_url, fleet.batches, clients=2)
            sent += sum(len(b) for b in fleet.batches)
        _, held = pipe.wait_settled(sent, timeout=120)
        assert held == 0, f"{held} reports stayed in the shuffler"
        pipe.wait_sink(sent, timeout=120)
        pipe.check()
        yield FedPipeline(pipe.estimator_url, days, names, pipe.counted(), pipe.dataset)
        pipe.check()


@pytest.fixture(scope="module")
def fed_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FedPipeline]:
    with feed_pipeline(tmp_path_factory.mktemp("dashboard")) as fp:
        yield fp


def _launch_error() -> str:
    return (
        f"the dashboard tests need Chromium at {CHROMIUM} and the `playwright` package (the `browser` extra): "
        "run scripts/install-browser (Debian/Ubuntu as root: apt-get install -y chromium; elsewhere it says "
        "what to do, and LDP_CHROMIUM can point at another Chrome or Chromium; docs/DASHBOARD.md)"
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(_launch_error())
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.fail(f"{_launch_error()}: {exc}")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, accept_downloads=True)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        yield pg
    finally:
        context.close()
    assert not errors, f"the page logged errors: {errors}"
