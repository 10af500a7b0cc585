"""Workers started while the broker is down: they wait (no exit, no traceback, a bounded log), report that they
are not ready, become ready when the broker starts, and then process uploads; a broker restart later is
ridden through the same way.

The broker is a private one of this test (own home and ports, jars shared with the project's broker, as in
tests/e2e/test_faults.py), started only after the workers: ``ldp shuffler``, ``ldp sink`` and ``ldp
estimator`` run as subprocesses (tests.support.pipeline_procs) with ``--status-file``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ldp_cli.broker import BrokerConfig, default_home, down, up
from ldp_core.days import utc_day
from ldp_core.metrics import parse_metrics
from simulator.stack import fleet_batches
from tests.support.metrics_docs import dictionary, metric, metrics_doc
from tests.support.pipeline_procs import ROOT, PacedUpload, PipelineProcs, free_port

METRICS = metrics_doc(
    tab=metric("grr", 1.0, dictionary("a", "b", "c", "d")),
)
FRAME = 100
WORKERS = ("shuffler", "sink", "estimator")


@pytest.fixture
def late_broker(tmp_path: Path, kafka_bootstrap: str) -> Iterator[BrokerConfig]:
    """A broker configuration on fresh ports, NOT started (the test starts it); stopped and purged after."""
    shared = BrokerConfig.from_home(default_home())
    home = tmp_path / "kafka"
    home.mkdir()
    cfg = BrokerConfig(home=home, port=free_port(), controller_port=free_port(), heap="384m", lib_dir=shared.libs)
    yield cfg
    down(cfg, grace=10, purge=True)
    shutil.rmtree(home, ignore_errors=True)


def _status(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _check(path: Path) -> int:
    """The exit code of the healthcheck a compose file runs (``python -m pipeline.status FILE``)."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.status", str(path)], cwd=ROOT, capture_output=True, timeout=60
    ).returncode


def _lines(procs: PipelineProcs, name: str) -> list[str]:
    return procs[name].log.read_text(errors="replace").splitlines()


def _wait(cond: Any, timeout: float, what: str, procs: PipelineProcs) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        procs.check_alive()
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s\n" + "\n".join(
            f"--- {n}\n{procs[n].tail(15)}" for n in WORKERS
        )
        time.sleep(0.3)


@pytest.mark.kafka
def test_workers_started_before_the_broker_wait_become_ready_and_process(
    tmp_path: Path, late_broker: BrokerConfig
) -> None:
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(METRICS))
    metrics = parse_metrics(METRICS)
    day = utc_day(time.time())
    fleet = fleet_batches(metrics, ["tab"], 1200, day, np.random.default_rng(61), frame_reports=FRAME)
    first, second = fleet.batches[: len(fleet.batches) // 2], fleet.batches[len(fleet.batches) // 2 :]
    procs = PipelineProcs(tmp_path, f"kafka://{late_broker.bootstrap}", metrics_path, min_batch=FRAME)
    status = {n: tmp_path / f"{n}.status.json" for n in WORKERS}
    for n in WORKERS:
        procs[n].argv += ["--status-file", str(status[n])]
    try:
        for n in WORKERS:
            procs[n].launch()
        # -- the broker is down: every worker waits, says it is not ready, and logs a bounded number of lines
        _wait(lambda: all(_status(status[n]).get("state") == "waiting" for n in WORKERS), 60, "not waiting", procs)
        early = {n: len(_lines(procs, n)) for n in WORKERS}
        time.sleep(20.0)  # several retries at the backoff's cap (15 s) and below
        procs.check_alive()
        for n in WORKERS:
            st = _status(status[n])
            assert st["state"] == "waiting" and st["ready"] is False, (n, st)
            assert "cannot reach Kafka" in st["detail"], st  # the reason, for the operator
            assert _check(status[n]) == 1, f"the healthcheck passes for {n} while the broker is down"
            lines = _lines(procs, n)
            assert len(lines) == early[n], f"{n} kept logging while waiting:\n" + "\n".join(lines[early[n] :])
            assert len(lines) <= 12, f"{n} logged {len(lines)} lines while waiting:\n" + "\n".join(lines)
            # one line for the worker's state (ldp.status) and at most one for the broker's (the transport's
            # BrokerStateLog, in place of kafka-python's burst)
            assert sum("ldp.status" in line and "unreachable" in line for line in lines) == 1, "\n".join(lines)
            assert sum("pipeline.transport.kafka" in line and "unreachable" in line for line in lines) <= 1, "\n".join(
                lines
            )
            assert not [line for line in lines if " kafka." in line], "\n".join(lines)
        assert httpx.get(procs.estimator_url + "/readyz", timeout=10).status_code == 503
        assert httpx.get(procs.estimator_url + "/healthz", timeout=10).status_code == 200  # alive, not ready

        # -- the broker starts: each becomes ready, the pipeline processes uploads
        up(late_broker, timeout=120)
        _wait(lambda: all(_status(status[n]).get("ready") for n in WORKERS), 90, "not all ready", procs)
        assert all(_check(status[n]) == 0 for n in WORKERS)
        assert httpx.get(procs.estimator_url + "/readyz", timeout=10).status_code == 200
        for n in WORKERS:
            assert sum("connected to" in line for line in _lines(procs, n)) == 1, procs[n].tail()
        procs["collector"].start()
        PacedUpload(procs.collector_url, first, interval=0.02).start().join()
        expected = {"tab": sum(len(b) for b in first)}
        procs.wait_counted(expected, timeout=120)
        _wait(
            lambda: _status(status["shuffler"])["counters"]["totals"]["input_reports"] == expected["tab"],
            60,
            "the shuffler's totals did not reach the uploads",
            procs,
        )

        # -- a broker restart while they run: they ride through it and process the rest
        down(late_broker, grace=30)
        time.sleep(3.0)
        up(late_broker, timeout=120)
        PacedUpload(procs.collector_url, second, interval=0.02).start().join(timeout=180)
        expected = {"tab": sum(len(b) for b in fleet.batches)}
        procs.wait_counted(expected, timeout=180)
        _wait(lambda: all(_status(status[n]).get("ready") for n in WORKERS), 90, "not ready after the restart", procs)
        for n in WORKERS:
            lines = _lines(procs, n)
            assert not any("Traceback" in line for line in lines), f"{n}:\n" + "\n".join(lines)
            assert len(lines) <= 30, f"{n} logged {len(lines)} lines:\n" + "\n".join(lines)
        procs.check_alive()
    finally:
        procs.stop()
