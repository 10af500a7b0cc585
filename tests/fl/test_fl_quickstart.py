"""The federated quickstart of docs/fl/README.md, run as written: three real processes over HTTP on 127.0.0.1
(the collector, ``ldp fl job``, ``ldp fl device``), on a free port instead of 8080, in a scratch folder that
holds the files the commands name (``metrics/example.json``, ``examples/fl/``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "docs" / "fl" / "README.md"


def quickstart_commands() -> list[str]:
    """The ``ldp …`` lines of the code block after the ``<!-- quickstart`` marker."""
    text = README.read_text()
    block = re.search(r"<!-- quickstart.*?-->\s*```bash\n(.*?)```", text, re.S)
    assert block is not None, "docs/fl/README.md has no quickstart block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip().startswith("ldp ")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _argv(command: str, port: int) -> list[str]:
    words = shlex.split(command.replace("8080", str(port)))
    assert words[0] == "ldp"
    return [sys.executable, "-m", "ldp_cli.main", *words[1:]]


def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    """The three commands, all started at once (the devices and the job wait for what they need, so the test
    does not pay three interpreter start-ups in a row). The job gets ``--progress`` (its per-round lines,
    forced on a pipe); the devices run exactly as written, so their stderr, a pipe, must stay empty. Then
    ``ldp fl device --json`` against the finished task: stdout is one JSON object, progress only on stderr."""
    tmp = tmp_path
    (tmp / "metrics").mkdir()
    shutil.copy(ROOT / "metrics" / "example.json", tmp / "metrics" / "example.json")
    shutil.copytree(ROOT / "examples" / "fl", tmp / "examples" / "fl")
    task = json.loads((tmp / "examples" / "fl" / "task.json").read_text())
    collector_cmd, job_cmd, device_cmd = quickstart_commands()
    port = _free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(tmp / "collector.log", "wb") as clog:
            procs.append(subprocess.Popen(_argv(collector_cmd, port), cwd=tmp, env=env, stdout=clog, stderr=clog))
        with open(tmp / "job.out", "wb") as jout, open(tmp / "job.err", "wb") as jerr:
            job = subprocess.Popen(_argv(job_cmd, port) + ["--progress"], cwd=tmp, env=env, stdout=jout, stderr=jerr)
        procs.append(job)
        devices = subprocess.run(_argv(device_cmd, port), cwd=tmp, env=env, capture_output=True, text=True, timeout=180)
        assert devices.returncode == 0, devices.stdout + devices.stderr + (tmp / "collector.log").read_text()[-2000:]
        assert job.wait(60) == 0, (tmp / "job.err").read_text()
        again = subprocess.run(
            _argv(device_cmd, port) + ["--json", "--progress"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(20)
    job_out, job_err = (tmp / "job.out").read_text(), (tmp / "job.err").read_text()
    assert "ldp fl job: running" in job_out
    status = json.loads(job_out.strip().splitlines()[-1])
    rounds, sampled = task["rounds"], task["sampling"]["count"]
    assert status["done"] is True and status["round"] == rounds, status
    assert status["epsilon"] is not None and status["epsilon"] > 0
    for r in range(1, rounds + 1):  # forced progress: one line per round on stderr
        assert re.search(rf"ldp fl job: round {r}/{rounds}: {sampled} devices accepted, epsilon [0-9.e+-]+ \(", job_err)
    assert "example authority" in job_err  # the public example key is called out
    # every round took the sampled devices' updates
    assert re.search(rf"ldp fl device: task quickstart done: 4 devices, {rounds * sampled} uploads", devices.stdout)
    assert devices.stderr == ""  # a pipe, not a terminal: no progress
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("\n") == 1
    report = json.loads(again.stdout)  # one object: progress went to stderr
    assert report["finished"] is True and report["task"] == "quickstart" and report["rounds"] == rounds
    assert report["uploads"] == 0  # the task was over before these devices came
    assert sorted(d["client_id"] for d in report["devices"]) == ["dev-0", "dev-1", "dev-2", "dev-3"]
    assert 0.0 <= report["train_accuracy"] <= 1.0
    assert "ldp fl device: 4 devices of task quickstart" in again.stderr
