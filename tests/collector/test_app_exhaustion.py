"""Thousands of hostile sockets must neither lock honest uploads out nor stay open (``ldp collector`` as a
process, real sockets on 127.0.0.1).

The attack of issue 28: 2,000 sockets opened at once, of three kinds: some send nothing; some send a request
line and then one header byte a second; 1,100 (more than the default ``max_reading`` of 1,024) send their
headers and then one body byte a second. Before the fix the 1,100 partial bodies held every reading place,
so honest uploads were answered 503 for the body timeout (15 s), and the first two kinds were never closed.
Now the honest client's uploads (httpx, the SDKs' wire format) are all 202 with p99 under 100 ms while the
attack runs, the sockets without a complete head are closed by the head deadline, and the trickling bodies
are answered 408 once below the minimum rate.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ldp_core.wire.frames import FRAME_CONTENT_TYPE, encode_frame
from tests.support.collector_support import olh_batch, write_metrics

ROOT = Path(__file__).resolve().parents[2]
FRAME = {"content-type": FRAME_CONTENT_TYPE}
SILENT, HEADS, BODIES = 450, 450, 1100  # 2,000 hostile sockets
HEADER_TIMEOUT = 2.0
BODY_GRACE = 4.0  # the trickling bodies hold (or are evicted from) the reading places through the honest phase


def raise_fd_limit(needed: int) -> None:
    """Soft open-file limit up to the hard one; fails loudly when that is not enough for ``needed``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert soft == resource.RLIM_INFINITY or soft >= needed, (
        f"this test needs {needed} open files, the limit is {soft} (hard {hard}): raise it with ulimit -Hn"
    )


@contextlib.contextmanager
def collector(tmp_path: Path, *flags: str) -> Iterator[tuple[str, str]]:
    """``ldp collector`` with its defaults but a 2 s head deadline and a 4 s body grace (or ``flags``);
    (device URL, metrics URL)."""
    cmd = [sys.executable, "-m", "ldp_cli.main", "collector", "--port", "0", "--metrics", str(tmp_path / "m.json")]
    cmd += ["--transport", f"sqlite:///{tmp_path}/log.sqlite3", "--dedup", str(tmp_path / "ids.sqlite3")]
    cmd += list(flags) or ["--header-timeout", str(HEADER_TIMEOUT), "--body-grace", str(BODY_GRACE)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert "listening on http://127.0.0.1:" in lines[0], (lines, proc.stderr.read() if proc.stderr else "")
        url = lines[0].split("listening on ")[1].split()[0]
        murl = lines[1].split("operational metrics on ")[1].split()[0]
        yield url, murl
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def gauge(murl: str, name: str) -> float:
    for line in httpx.get(murl, timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no gauge {name}")


def open_hostile(
    port: int, opened_at: dict[int, float]
) -> tuple[list[socket.socket], list[socket.socket], list[socket.socket]]:
    def conn() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        opened_at[s.fileno()] = time.monotonic()
        return s

    silent = [conn() for _ in range(SILENT)]
    heads = []
    for _ in range(HEADS):
        s = conn()
        s.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        heads.append(s)
    bodies = []
    for _ in range(BODIES):
        s = conn()
        s.sendall(
            f"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: {FRAME_CONTENT_TYPE}\r\n"
            "Content-Length: 100000\r\n\r\n\x00".encode()
        )
        bodies.append(s)
    return silent, heads, bodies


def trickle(socks: list[socket.socket], stop: threading.Event, until: float) -> None:
    """One byte a second on every socket still open, until ``stop`` or ``until`` (monotonic); spread over the
    second in tenths, as independent clients would be."""
    open_ = list(socks)
    tick = 0
    while not stop.wait(0.1) and time.monotonic() < until and open_:
        for s in open_[tick % 10 :: 10]:
            try:
                s.send(b"a")
            except OSError:  # closed by the server
                open_.remove(s)
        tick += 1


class CloseWatch(threading.Thread):
    """Records when the server closes each of ``socks`` (an answer before the close is read and skipped), for
    at most ``seconds``."""

    def __init__(self, socks: list[socket.socket], seconds: float) -> None:
        super().__init__(daemon=True)
        self.pending = {s.fileno(): s for s in socks}
        self.closed_at: dict[int, float] = {}
        self.until = time.monotonic() + seconds
        self.start()

    def run(self) -> None:
        poller = select.poll()
        for fd in self.pending:
            poller.register(fd, select.POLLIN)
        while len(self.closed_at) < len(self.pending) and time.monotonic() < self.until:
            for fd, _ in poller.poll(200):
                try:
                    data = self.pending[fd].recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self.closed_at[fd] = time.monotonic()
                    poller.unregister(fd)


def honest_uploads(url: str, bodies: list[bytes], pause: float) -> tuple[list[float], list[int]]:
    """Upload ``bodies`` one after the other on one keep-alive connection; (latencies in s, status codes)."""
    latencies: list[float] = []
    codes: list[int] = []
    with httpx.Client(timeout=30) as client:
        for body in bodies:
            t0 = time.perf_counter()
            r = client.post(url + "/v1/reports", content=body, headers=FRAME)
            latencies.append(time.perf_counter() - t0)
            codes.append(r.status_code)
            time.sleep(pause)
    return latencies, codes


def attacker(port: int, out: Any) -> None:
    """The attack, in a process of its own (the measuring client shares no interpreter lock with it): opens the
    2,000 sockets, says ``"open"`` on ``out``, trickles and watches for up to 30 s, then sends its findings:
    seconds each head-less socket and each trickling body stayed open (those the server closed)."""
    opened_at: dict[int, float] = {}
    silent, heads, bodies = open_hostile(port, opened_at)
    out.put("open")
    head_watch = CloseWatch(silent + heads, HEADER_TIMEOUT + 10)
    body_watch = CloseWatch(bodies, BODY_GRACE + 12)
    stop = threading.Event()
    until = time.monotonic() + 30
    tricklers = [threading.Thread(target=trickle, args=(g, stop, until), daemon=True) for g in (heads, bodies)]
    for t in tricklers:
        t.start()
    head_watch.join(HEADER_TIMEOUT + 10)
    body_watch.join(BODY_GRACE + 12)
    stop.set()
    for t in tricklers:
        t.join(5)
    held = [head_watch.closed_at[fd] - opened_at[fd] for fd in head_watch.closed_at]
    body_held = [body_watch.closed_at[fd] - opened_at[fd] for fd in body_watch.closed_at]
    out.put((held, body_held))
    for s in silent + heads + bodies:
        s.close()


def test_two_thousand_hostile_sockets_neither_lock_out_nor_stay_open(tmp_path: Path) -> None:
    raise_fd_limit(SILENT + HEADS + BODIES + 200)  # inherited by the attacker's process
    metrics = write_metrics(tmp_path / "m.json")
    bodies_ = [encode_frame(olh_batch(metrics, 20, first_seed=20 * i)) for i in range(250)]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    with collector(tmp_path) as (url, murl):
        port = int(url.rsplit(":", 1)[1])
        quiet = honest_uploads(url, bodies_[:50], pause=0.005)[0]  # the same client without an attack: for the message
        attack = ctx.Process(target=attacker, args=(port, out), daemon=True)
        attack.start()
        try:
            assert out.get(timeout=30) == "open"
            end = time.monotonic() + 10
            while gauge(murl, "ldp_collector_uploads_reading") < 1000:  # the attack holds the reading places
                assert time.monotonic() < end, "the partial bodies never reached the collector"
                time.sleep(0.05)
            time.sleep(0.3)  # the last of the 2,000 connections are accepted
            latencies, codes = honest_uploads(url, bodies_[50:], pause=0.01)  # about 2 s, inside the bodies' grace
            held_, body_held = out.get(timeout=40)
        finally:
            attack.join(10)
            if attack.is_alive():
                attack.kill()
    p99 = float(np.percentile(np.array(latencies), 99))
    quiet_p99 = float(np.percentile(np.array(quiet), 99))
    figures = f"p99 {p99 * 1e3:.1f} ms, median {np.median(latencies) * 1e3:.1f} ms; before the attack p99 {quiet_p99 * 1e3:.1f} ms"
    print("honest uploads under attack:", figures)
    assert codes == [202] * len(latencies), sorted(set(codes))
    # The guarantee: the attack costs an honest upload no more than the machine's own noise. Unloaded, p99 stays
    # under 100 ms (38-78 ms measured, docs/COLLECTOR.md). On a loaded machine (the other test worker running a
    # CPU-heavy test beside this one) the p99 *before* the attack, measured over fewer uploads than the attack
    # phase's, understates the machine's own spread: 134 ms was seen against a quiet p99 of 44 ms at load 20. So
    # the bound is 250 ms or three times that p99 plus 50 ms: still far below what the old code gave (every upload
    # refused 503, and p99s of seconds), which is what this test catches.
    assert p99 < max(0.250, 3 * quiet_p99 + 0.050), f"honest upload {figures}"
    open_heads = SILENT + HEADS - len(held_)
    assert open_heads == 0, (
        f"{open_heads} head-less sockets still open {HEADER_TIMEOUT + 10:g} s after the attack began"
    )
    held = np.array(held_)
    print(f"head-less sockets closed {held.min():.2f}-{held.max():.2f} s after they opened")
    # not before the deadline (the trickled header bytes do not renew it), and soon after it (0.2 s of the
    # watcher's poll period, the rest for a loaded machine)
    assert HEADER_TIMEOUT - 0.05 < held.min() and held.max() < HEADER_TIMEOUT + 3
    assert len(body_held) == BODIES, f"{BODIES - len(body_held)} trickling bodies still open"
    # by the minimum rate, soon after the grace: long before the 15 s whole-body deadline
    print(f"trickling bodies closed {min(body_held):.2f}-{max(body_held):.2f} s after they opened")
    assert max(body_held) < BODY_GRACE + 4


def test_beyond_max_connections_the_oldest_headless_connection_is_closed(tmp_path: Path) -> None:
    """``--max-connections 16``: 40 silent sockets (no head deadline in sight: 60 s) make room for newcomers
    by closing the oldest silent ones; an honest upload still gets through, and the newest silent sockets
    are the ones left open."""
    metrics = write_metrics(tmp_path / "m.json")
    with collector(tmp_path, "--header-timeout", "60", "--max-connections", "16") as (url, _):
        port = int(url.rsplit(":", 1)[1])
        silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
        order = [s.fileno() for s in silent]  # oldest first
        try:
            watch = CloseWatch(silent, 10)
            r = httpx.post(url + "/v1/reports", content=encode_frame(olh_batch(metrics, 5)), headers=FRAME, timeout=30)
            end = time.monotonic() + 10
            while len(watch.closed_at) < 40 - 15 and time.monotonic() < end:
                time.sleep(0.05)
            closed = set(watch.closed_at)
        finally:
            for s in silent:
                s.close()
    assert r.status_code == 202
    # the honest connection and at most 15 silent ones fit; the closed ones are the oldest
    assert len(closed) >= 40 - 15, len(closed)
    assert closed == set(order[: len(closed)])
