"""Operational metrics stay off the device-facing port (issue #28).

``/metrics`` tells per-round accepted FL updates (the realized sample size) and upload counts: operator
data. The real ``ldp collector`` runs as a subprocess; a device-side client asks its public port over a
real socket, and the operator asks the separate metrics listener.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ldp_core.metrics import FORMAT

DOC = {
    "format": FORMAT,
    "metrics": {
        "color": {
            "description": "listener test",
            "owner": "tests@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "grr", "epsilon": 1.0},
            "domain": {"kind": "dictionary", "values": ["red", "green"], "other": True},
            "max_reports_per_day": 1,
        }
    },
}


def start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """Start ``ldp collector``; its URLs from the lines it prints (the metrics line follows the listening one)."""
    (tmp_path / "metrics.json").write_text(json.dumps(DOC))
    argv = [sys.executable, "-m", "ldp_cli.main", "collector", "--metrics", str(tmp_path / "metrics.json")]
    argv += ["--transport", f"sqlite:///{tmp_path}/log.sqlite3", "--dedup", str(tmp_path / "ids.sqlite3")]
    argv += ["--port", "0", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_COLLECTOR_")}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    urls: dict[str, str] = {}
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    out = proc.stdout
    threading.Thread(target=lambda: [lines.put(x) for x in out], daemon=True).start()
    want = {"public"} if "--public-metrics" in extra else {"public", "metrics"}
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline and not want <= set(urls):
        try:
            line = lines.get(timeout=max(0.01, min(5.0, deadline - time.monotonic())))
        except queue.Empty:
            if "public" in urls:
                break  # listening, and no metrics line followed within 5 s
            continue
        seen.append(line)
        if m := re.search(r"operational metrics on (http://\S+)/metrics", line):
            urls["metrics"] = m.group(1)
        if m := re.search(r"listening on (http://\S+)", line):
            urls["public"] = m.group(1)
    if "public" not in urls:
        proc.kill()
        pytest.fail(f"the collector did not start: {seen}")
    return proc, urls


def wait_ready(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail("collector not ready")


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[dict[str, str]]:
    proc, urls = start(tmp_path)
    try:
        wait_ready(urls["public"])
        yield urls
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_public_port_does_not_serve_metrics_and_the_metrics_port_does(collector: dict[str, str]) -> None:
    public = collector["public"]
    leaked = httpx.get(public + "/metrics", timeout=10)  # anyone who can reach the device-facing port
    assert leaked.status_code == 404 and "ldp_collector" not in leaked.text
    metrics = collector["metrics"]  # the operator's listener, printed at start-up
    assert public != metrics
    assert httpx.get(public + "/v1/metrics", timeout=10).status_code == 200  # devices still get their document
    resp = httpx.get(metrics + "/metrics", timeout=10)
    assert resp.status_code == 200 and "ldp_collector_request_duration_seconds" in resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    assert httpx.get(metrics + "/v1/metrics", timeout=10).status_code == 404  # and nothing else
    assert httpx.post(metrics + "/metrics", content=b"", timeout=10).status_code == 405
    assert metrics.startswith("http://127.0.0.1:")  # loopback unless told otherwise


def test_public_metrics_only_when_asked(tmp_path: Path) -> None:
    proc, urls = start(tmp_path, "--public-metrics")
    try:
        wait_ready(urls["public"])
        assert "metrics" not in urls  # no second listener (its line would precede readiness)
        resp = httpx.get(urls["public"] + "/metrics", timeout=10)
        assert resp.status_code == 200 and "ldp_collector_request_duration_seconds" in resp.text
    finally:
        proc.terminate()
        proc.wait(30)
