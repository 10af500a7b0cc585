"""Crash safety: the app is killed with SIGKILL while recording and while uploading, then
restarted on the same storage directory; every report whose budget was spent reaches the
real collector (``ldp collector`` on 127.0.0.1, embedded transport) exactly once: each value
is in ``ldp.reports.raw`` once, and no batch id was published twice.

The app (:mod:`tests.support.sdk_crash_app`) records 0, 1, 2, ... with reports that reveal the
value (GRR, ε = 30), so the collector's records can be checked one by one. Spends and
reports commit together and in order, so after any number of crashes the ledger's report
count L says exactly which values were persisted: 0..L-1. The collector (the fixture in
``tests/support/sdk_collector.py``) must end up with each of them once, and nothing else.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from client_sdk.store import DB_FILENAME
from ldp_core.metrics import parse_metrics
from ldp_core.wire.frames import decode_frame
from tests.support.sdk_collector import ROOT, collector_factory, receiver_factory  # noqa: F401  (fixtures)
from tests.support.sdk_crash_app import metrics_doc

COUNT = 2000


def start_app(directory: pathlib.Path, url: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.sdk_crash_app",
            "--dir",
            str(directory),
            "--url",
            url,
            "--count",
            str(COUNT),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def read_start(proc: subprocess.Popen) -> int:
    line = proc.stdout.readline() if proc.stdout else ""
    assert line.startswith("START "), (line, proc.stderr.read() if proc.stderr else "")
    return int(line.split()[1])


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    for s in (proc.stdout, proc.stderr):
        if s:
            s.close()


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    line = [x for x in out.splitlines() if x.startswith("FLUSHED ")][-1]
    return json.loads(line[len("FLUSHED ") :])


def ledger_reports(directory: pathlib.Path) -> int:
    """Reports of ``seq`` on record in the ledger, read without taking the write lock."""
    path = directory / DB_FILENAME
    if not path.exists():
        return 0
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        row = conn.execute("SELECT COALESCE(SUM(reports), 0) FROM ledger WHERE metric = 'seq'").fetchone()
    except sqlite3.OperationalError:  # the app has not created its tables yet
        return 0
    finally:
        conn.close()
    return int(row[0])


def received_values(collector) -> list[int]:
    spec = parse_metrics(metrics_doc(COUNT))["seq"].spec
    values: list[int] = []
    for frame in collector.frames():
        values += decode_frame(frame, spec).records["value"].tolist()
    return values


def wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_kill_during_record_then_restart_uploads_each_report_once(tmp_path, collector_factory) -> None:  # noqa: F811
    col = collector_factory(metrics=metrics_doc(COUNT))
    app_dir = tmp_path / "app"
    seen_starts = []
    for pause in (0.05, 0.3, 0.15):
        proc = start_app(app_dir, col.url, "--slow")
        seen_starts.append(read_start(proc))
        wait_until(lambda: ledger_reports(app_dir) > seen_starts[-1])  # this run has persisted something
        time.sleep(pause)  # recording (slowly), persisting and uploading are all under way
        kill(proc)
    final = start_app(app_dir, col.url)
    seen_starts.append(read_start(final))
    result = finish(final)
    assert result["ok"] and result["pending"] == 0
    assert result["errors"]["outbox_dropped"] == 0 and result["errors"]["upload_rejected_reports"] == 0

    # the kills landed mid-recording: each run began where the persisted prefix ended
    assert seen_starts[0] == 0 and seen_starts[-1] < COUNT, seen_starts
    assert seen_starts == sorted(seen_starts) and len(set(seen_starts)) == 4  # each run got further
    assert ledger_reports(app_dir) == COUNT
    values = received_values(col)
    assert len(values) == COUNT and sorted(values) == list(range(COUNT))  # each exactly once
    stats = col.stats()
    # a kill can land while a batch's body is on the wire: the collector refuses the cut body
    # (client_disconnected) and the next run sends the batch again; no other refusal
    assert stats["invalid"] == stats["disconnected"] and stats["published"] == stats["stored"] == stats["accepted"]


def test_kill_during_upload_then_restart_resends_the_same_batch(tmp_path, receiver_factory) -> None:  # noqa: F811
    """On the TEST RECEIVER (``--delay-after-store``: it stores each batch durably, then waits before
    answering); the real collector's variant is the next test. A kill in that window leaves a batch
    the collector has but the app does not know was delivered."""
    col = receiver_factory(delay_after_store=0.4)
    app_dir = tmp_path / "app"
    proc = start_app(app_dir, col.url, "--batch-size", "500")
    assert read_start(proc) == 0
    wait_until(lambda: col.stats()["accepted"] >= 1)
    kill(proc)
    persisted = ledger_reports(app_dir)
    assert persisted > 0
    accepted_before = col.stats()["accepted"]

    final = start_app(app_dir, col.url, "--batch-size", "500")
    assert read_start(final) == persisted
    result = finish(final)
    assert result["ok"] and result["pending"] == 0
    stats = col.stats()
    assert stats["duplicates"] >= 1  # the interrupted batch was sent again under its id ...
    assert stats["accepted"] == len(col.frames()) >= accepted_before  # ... and stored once
    values = received_values(col)
    assert len(values) == COUNT and sorted(values) == list(range(COUNT))


class HoldingProxy:
    """Forwards uploads to the collector and holds the collector's first answer until released:
    the collector has published the batch, the app has not heard so."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.held = threading.Event()
        self.release = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "idempotency-key")}
                req = urllib.request.Request(proxy.target + self.path, data=body, headers=headers, method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        status, answer = resp.status, resp.read()
                except urllib.error.HTTPError as exc:
                    status, answer = exc.code, exc.read()
                if status == 202 and not proxy.held.is_set():
                    proxy.held.set()
                    proxy.release.wait(60)
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_kill_during_upload_on_the_real_collector_then_restart_uploads_each_report_once(
    tmp_path, collector_factory
) -> None:  # noqa: F811
    """The real collector published a batch and answered 202; the app is killed (SIGKILL) before
    the answer reaches it (a proxy holds it). After a restart the app sends that batch again
    under the same id: the collector answers it as a duplicate and publishes it no second time."""
    col = collector_factory(metrics=metrics_doc(COUNT))
    proxy = HoldingProxy(col.url)
    app_dir = tmp_path / "app"
    try:
        proc = start_app(app_dir, proxy.url, "--batch-size", "500")
        assert read_start(proc) == 0
        assert proxy.held.wait(60)
        kill(proc)
    finally:
        proxy.close()
    persisted = ledger_reports(app_dir)
    before = col.stats()
    assert persisted > 0 and before["accepted"] == before["stored"] == 1 and before["duplicates"] == 0

    final = start_app(app_dir, col.url, "--batch-size", "500")
    assert read_start(final) == persisted
    result = finish(final)
    assert result["ok"] and result["pending"] == 0
    stats = col.stats()
    assert stats["duplicates"] == 1  # the interrupted batch was sent again under its id ...
    assert stats["published"] == stats["stored"] == stats["accepted"] == len(col.frames())  # ... and published once
    assert stats["invalid"] == 0
    values = received_values(col)
    assert len(values) == COUNT and sorted(values) == list(range(COUNT))
