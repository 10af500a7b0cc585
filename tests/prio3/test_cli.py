"""The command line: ``ldp aggregator`` (--init, two services as processes beside ``ldp collector``,
--collect) and ``ldp demo --prio3 --json`` (exit 0 when every aggregate equals the truth)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from client_sdk.prio3 import Prio3Client
from ldp_core.days import utc_day
from ldp_core.metrics import load_metrics

LDP = [sys.executable, "-m", "ldp_cli.main"]


def _ldp(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LDP, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:  # each by its own pid
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            p.wait(20)


def _start(procs: list[subprocess.Popen[str]], cwd: Path, *args: str) -> dict[str, str]:
    p = subprocess.Popen([*LDP, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(p)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line, p.stderr.read() if p.stderr else ""
    return json.loads(line) if line.startswith("{") else {"line": line}


def test_aggregators_as_processes(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    init = _ldp("aggregator", "--init", "dep", "--json", cwd=tmp_path)
    assert init.returncode == 0, init.stderr
    dep = json.loads(init.stdout)
    (tmp_path / "token").write_text("s3cret-token\n")
    log = f"sqlite:///{tmp_path / 'log.sqlite3'}"
    common = ["--metrics", dep["metrics_path"], "--verify-key", dep["verify_key"], "--token-file", "token"]
    common += ["--min-batch", "2", "--state", "st", "--json"]
    helper = _start(procs, tmp_path, "aggregator", "--role", "helper", "--key", dep["helper_key"], *common)
    leader = _start(
        procs,
        tmp_path,
        "aggregator",
        "--role",
        "leader",
        "--key",
        dep["leader_key"],
        "--helper-url",
        helper["url"],
        "--transport",
        log,
        *common,
    )
    assert (helper["role"], leader["role"]) == ("helper", "leader")
    _start(procs, tmp_path, "collector", "--metrics", dep["metrics_path"], "--transport", log, "--port", "21540")
    metrics = load_metrics(tmp_path / dep["metrics_path"], reject_expired=False)
    for i, v in enumerate((1, 0, 1)):
        dev = Prio3Client(metrics, tmp_path / f"dev{i}", "http://127.0.0.1:21540")
        assert dev.record("prio3.crashed", v) and dev.flush() == "idle"
        dev.close()
    # without the token the services refuse to act
    assert (
        httpx.post(leader["url"] + "/v1/prio3/collect", json={"metric": "prio3.crashed", "day": 0}).status_code == 401
    )
    deadline = time.monotonic() + 60
    while httpx.get(leader["url"] + "/v1/prio3/status").json()["counts"].get("accepted", 0) < 3:
        assert time.monotonic() < deadline, "the leader did not aggregate the reports"
        time.sleep(0.2)
    args = ["--collect", "prio3.crashed", "--metrics", dep["metrics_path"], "--leader-url", leader["url"]]
    out = _ldp("aggregator", *args, "--helper-url", helper["url"], "--token-file", "token", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "metric": "prio3.crashed",
        "day": utc_day(time.time()),
        "reports": 3,
        "value": 2,
        "noise": None,  # these aggregators run without --central-epsilon
    }


def test_demo_prio3_json(tmp_path: Path) -> None:
    args = ("--prio3", "--devices", "40", "--central-epsilon", "1", "--no-plot", "--json", "--out", "o")
    out = _ldp("demo", *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["all_equal"] and len(doc["metrics"]) == 4
    assert all(r["prio3"] == r["truth"] and r["reports"] == 40 for r in doc["metrics"])
    for r in doc["metrics"]:  # the collector's result carries both aggregators' noise
        c = r["central"]
        assert {"epsilon", "sensitivity", "std", "value", "added_by", "std_per_aggregator", "error"} <= set(c)
        assert c["error"] == [v - t for v, t in zip(c["value"], np.atleast_1d(r["truth"]).tolist(), strict=True)]
        assert c["std"] == pytest.approx(2**0.5 * c["std_per_aggregator"])
    assert doc["leader"]["counts"]["replayed"] == doc["replayed_reports"] > 0


def test_aggregator_usage_errors(tmp_path: Path) -> None:
    out = _ldp("aggregator", cwd=tmp_path)
    assert out.returncode == 2 and "--role" in out.stderr
    out = _ldp("aggregator", "--role", "leader", cwd=tmp_path)
    assert out.returncode == 2 and "--metrics" in out.stderr
    out = _ldp("demo", "--central-epsilon", "1", "--devices", "5", cwd=tmp_path)  # a --prio3 option alone
    assert out.returncode == 2 and "go(es) with --prio3" in out.stderr
