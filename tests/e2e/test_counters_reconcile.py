"""The books balance from the counters alone, across kill -9 of the collector and of the shuffler mid-load.

``ldp collector`` and ``ldp shuffler --status-file`` run as subprocesses while a paced uploader streams
frames (retrying while the collector is down); each is killed with SIGKILL once while uploads flow, and
started again. Afterwards the collector's accepted reports (its Prometheus ``/metrics`` text, kept in its
batch-id store) equal the shuffler's input reports (its status file's totals, kept in its checkpoints),
and both equal what was uploaded. The shuffler's duplicate reports are the copies the collector published
twice across its crash window (published, then killed before recording the id: the device's retry is
published again and counted once by the collector), so ``accepted == input`` holds exactly and
``accepted == input + duplicates`` holds when no kill landed in that window (docs/ARCHITECTURE.md,
Operations).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ldp_core.days import utc_day
from ldp_core.metrics import parse_metrics
from simulator.stack import fleet_batches
from tests.support.metrics_docs import dictionary, metric, metrics_doc
from tests.support.pipeline_procs import PacedUpload, PipelineProcs

METRICS = metrics_doc(
    tab=metric("grr", 1.0, dictionary("a", "b", "c", "d")),
)
FRAME = 50
ACCEPTED = 'ldp_collector_reports_total{outcome="accepted",reason="ok"}'


def _accepted(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(ACCEPTED + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _totals(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text())["counters"]["totals"])
    except (OSError, ValueError, KeyError):
        return {}


@pytest.fixture
def transport_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "embedded":
        return f"sqlite:///{tmp_path}/log.sqlite3"
    return f"kafka://{request.getfixturevalue('kafka_bootstrap')}"


@pytest.mark.parametrize("transport_url", ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)], indirect=True)
def test_collector_accepted_equals_shuffler_input_across_kill_9(tmp_path: Path, transport_url: str) -> None:
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(METRICS))
    fleet = fleet_batches(
        parse_metrics(METRICS), ["tab"], 3000, utc_day(time.time()), np.random.default_rng(71), frame_reports=FRAME
    )
    uploaded = sum(len(b) for b in fleet.batches)
    procs = PipelineProcs(tmp_path, transport_url, metrics_path, min_batch=1000)  # most stays buffered
    status = tmp_path / "shuffler.status.json"
    procs["shuffler"].argv += ["--status-file", str(status)]
    for name in ("collector", "shuffler"):
        procs[name].start()
    try:
        n = len(fleet.batches)
        stream = PacedUpload(procs.collector_url, fleet.batches, interval=0.02, allowed=n // 3).start()
        stream.wait_until(n // 6)
        procs["collector"].kill9()  # while uploads flow
        procs["collector"].start()
        stream.wait_until(n // 3)
        stream.allow(n // 3)
        stream.wait_until(n // 2)
        procs["shuffler"].kill9()  # with reports buffered in its checkpoints and input not yet committed
        procs["shuffler"].start()
        stream.allow(n)
        stream.join(timeout=180)
        deadline = time.monotonic() + 90
        while _totals(status).get("input_reports", 0) < uploaded:
            assert time.monotonic() < deadline, f"the shuffler's totals stay at {_totals(status)} of {uploaded}"
            procs.check_alive()
            time.sleep(0.5)
        time.sleep(6.0)  # another write of the status file: nothing more comes
        totals, accepted = _totals(status), _accepted(procs.collector_url)
        assert accepted == totals["input_reports"] == uploaded, (accepted, totals, uploaded)
        assert totals["duplicate_reports"] % FRAME == 0  # whole uploads published twice, if any
        print(f"accepted {accepted:.0f}, input {totals['input_reports']}, duplicates {totals['duplicate_reports']}")
        assert procs["collector"].kills == procs["shuffler"].kills == 1
    finally:
        procs.stop()
