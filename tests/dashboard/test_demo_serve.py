"""``ldp demo`` prints the dashboard's address, and ``--serve`` keeps the pipeline and the dashboard up until
interrupted: a real subprocess, interrupted with SIGINT (what Ctrl-C sends), must exit cleanly."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ldp_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ["--devices", "2000", "--sdk-devices", "0", "--frame-reports", "500", "--min-batch", "500", "--no-plot"]


def test_demo_prints_the_dashboard_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", *DEMO, "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")])
    text = capsys.readouterr().out
    assert code == 0, text
    urls = re.findall(r"dashboard (http://127\.0\.0\.1:\d+/)", text)
    assert len(urls) == 1, text  # printed when the pipeline starts
    assert f"dashboard: {urls[0]}   (gone with the pipeline; --serve keeps it)" in text
    # without --serve the run ends and takes the dashboard with it
    with pytest.raises(httpx.ConnectError):
        httpx.get(urls[0], timeout=5)


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            q.put(line)
        q.put("")  # end of output

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(q: queue.Queue[str], pattern: str, seen: list[str], timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line == "":
            break
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s; output:\n{''.join(seen)}")


def test_demo_serve_keeps_the_dashboard_until_interrupted(tmp_path: Path, browser: Any) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ldp_cli", "demo", *DEMO, "--serve", "--out", str(tmp_path / "out")]
        + ["--workdir", str(tmp_path / "work")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    try:
        q = _lines(proc)
        url = _wait_for(q, r"serving: dashboard (http://127\.0\.0\.1:\d+)/ ", seen, timeout=300).group(1)
        assert any("every uploaded report counted exactly once: yes" in s for s in seen), "".join(seen)
        time.sleep(1.0)  # the run is over: the pipeline keeps serving
        assert proc.poll() is None, "".join(seen)
        page = httpx.get(url + "/", timeout=30)
        assert page.status_code == 200 and "dashboard/dashboard.js" in page.text
        available = httpx.get(url + "/v1/estimates", timeout=30).json()["estimates"]
        assert {e["n"] for e in available} == {2000}  # every example metric, every device's report
        # the page itself, in the browser, shows the served numbers
        ctx = browser.new_context()
        try:
            pg = ctx.new_page()
            pg.goto(url + "/")
            first = sorted(e["metric"] for e in available)[0]
            pg.wait_for_selector(f'body[data-shown^="{first}/"]:not(.loading)', timeout=60_000)
            assert pg.get_attribute('[data-testid="n"] .v', "data-value") == "2000"
        finally:
            ctx.close()

        proc.send_signal(signal.SIGINT)  # Ctrl-C
        code = proc.wait(timeout=120)
        rest = q.get(timeout=10)
        while rest:
            seen.append(rest)
            rest = q.get(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(seen)
    assert code == 0, text
    assert "stopping the pipeline ...\nstopped.\n" in text and "Traceback" not in text, text
    with pytest.raises(httpx.ConnectError):  # the dashboard went with the pipeline
        httpx.get(url + "/", timeout=5)


def test_serve_and_offline_do_not_mix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--offline", "--serve"]) == 2
    assert "--offline runs no pipeline" in capsys.readouterr().err
