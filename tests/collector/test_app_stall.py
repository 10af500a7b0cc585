"""A few sockets must not stall the collector (a real uvicorn server on 127.0.0.1, real sockets).

The attacks: sockets that send headers and part of a body and then hold the connection (before the fix
each held one of the ``max_in_flight`` slots for ever, so ``max_in_flight`` of them answered 503 to
everyone), and connections that send large invalid JSON bodies (before the fix their rows were decoded
on the event loop, so every other upload waited behind them). An honest device's uploads must still be
answered 202, p99 over 100 sequential uploads within 250 ms, or within 3x the same client's p99 before the
attack plus 50 ms on a loaded machine: a bound on stalling (the stalls it catches took seconds, or 503s), not
a speed figure (speed is ``benchmarks/bench_ingest.py``'s).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from collector.http.app import create_app
from collector.settings import CollectorSettings
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, encode_frame
from tests.support.collector_support import TODAY, MemoryTransport, ServerThread, olh_batch, write_metrics

FRAME = {"content-type": FRAME_CONTENT_TYPE}


@pytest.fixture
def metrics(tmp_path: Path) -> MetricSet:
    return write_metrics(tmp_path / "metrics.json")


def settings(tmp_path: Path, **kw: object) -> CollectorSettings:
    # min_body_rate=0: these tests are about the whole-body deadline and the places as such (the rate and the
    # eviction of slow readers: test_app_exhaustion.py)
    base: dict[str, object] = dict(
        metrics_path=str(tmp_path / "metrics.json"), dedup_path=":memory:", raw_partitions=2, min_body_rate=0.0
    )
    base.update(kw)
    return CollectorSettings(**base)  # type: ignore[arg-type]


def invalid_json_body(metrics: MetricSet, size: int = 384 << 10) -> bytes:
    """A JSON form of about ``size`` bytes whose last record is invalid: every row before it is decoded."""
    spec = metrics["emoji_used"].spec
    n = size // 14
    rows: list[list[object]] = [[1_000_000 + i, i % 4] for i in range(n)]
    rows[-1] = [1, "not a number"]
    obj = {
        "version": 1,
        "metric": "emoji_used",
        "spec_id": spec.spec_id,
        "day": TODAY,
        "batch_id": "ab" * 16,
        "records": rows,
    }
    return json.dumps(obj, separators=(",", ":")).encode()


def read_response(sock: socket.socket) -> tuple[int, dict[bytes, bytes], bytes]:
    """One HTTP/1.1 response from ``sock``: status, headers (lower-case names), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data[:200]!r}")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines[1:])}
    length = int(headers.get(b"content-length", b"0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:length]


def request(ctype: str, body: bytes, declared: int | None = None) -> bytes:
    return (
        f"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body) if declared is None else declared}\r\n\r\n"
    ).encode() + body


@contextlib.contextmanager
def partial_bodies(port: int, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections that each send headers and 100 bytes of a 10,000-byte body, then wait."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(request(FRAME_CONTENT_TYPE, b"\x00" * 100, declared=10_000))
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def gauge(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no gauge {name}")


def wait_for(cond: object, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_partial_bodies_and_invalid_json_do_not_stall_honest_uploads(tmp_path: Path, metrics: MetricSet) -> None:
    """300 sockets hold partial bodies (more than the default ``max_in_flight`` of 256) and 2 connections keep
    sending 384 KiB of invalid JSON. Before the fix, the honest client got 503 (every slot held by an idle
    socket) and, without the idle sockets, waited behind the JSON decoding (seconds). Now every honest upload
    is 202 and the p99 of 100 stays within the bound of the module docstring."""
    transport = MemoryTransport()
    cfg = settings(tmp_path)
    assert cfg.max_in_flight < 300
    attack = invalid_json_body(metrics)
    stop = threading.Event()
    attack_answers: list[int] = []

    def attacker(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            while not stop.is_set():
                s.sendall(request("application/json", attack))
                status, _, _ = read_response(s)
                attack_answers.append(status)

    with ServerThread(create_app(cfg, transport=transport)) as srv:
        quiet = honest_latencies(srv.url, metrics, 50, first=1000)  # the machine's own noise, before the attack
        with partial_bodies(srv.port, 300):
            wait_for(lambda: gauge(srv.url, "ldp_collector_uploads_reading") == 300)
            threads = [threading.Thread(target=attacker, args=(srv.port,), daemon=True) for _ in range(2)]
            for t in threads:
                t.start()
            try:
                wait_for(lambda: len(attack_answers) >= 4)  # the attack is in full swing
                answered_before = len(attack_answers)
                latencies: list[float] = []
                codes: list[int] = []
                with httpx.Client(timeout=30) as client:
                    for i in range(100):  # over about 2 s, as a device's uploads would be spread
                        body = encode_frame(olh_batch(metrics, 20, first_seed=20 * i))
                        t0 = time.perf_counter()
                        r = client.post(srv.url + "/v1/reports", content=body, headers=FRAME)
                        latencies.append(time.perf_counter() - t0)
                        codes.append(r.status_code)
                        time.sleep(0.02)
                answered_during = len(attack_answers) - answered_before
            finally:
                stop.set()
                for t in threads:
                    t.join(60)
            reading = gauge(srv.url, "ldp_collector_uploads_reading")
    assert codes == [202] * 100, sorted(set(codes))
    p99 = float(np.percentile(np.array(latencies), 99))
    quiet_p99 = float(np.percentile(np.array(quiet), 99))
    # the stall this test catches took seconds (or 503s); the same client's p99 before the attack shows the
    # machine's own noise (one CI run at load 12: 23 ms quiet, 133 ms under attack, all 202)
    assert p99 < max(0.250, 3 * quiet_p99 + 0.050), (
        f"honest upload p99 {p99 * 1000:.1f} ms (median {np.median(latencies) * 1000:.1f} ms;"
        f" before the attack p99 {quiet_p99 * 1000:.1f} ms)"
    )
    assert answered_during >= 5 and set(attack_answers) == {400}  # the JSON was decoded (and refused) all along
    assert reading == 300  # the idle sockets were still holding their partial bodies
    assert len(transport.records) == 150


def honest_latencies(url: str, metrics: MetricSet, count: int, first: int = 0) -> list[float]:
    """``count`` honest uploads by one client, a little apart, each 202; their latencies."""
    out = []
    with httpx.Client(timeout=30) as client:
        for i in range(count):
            body = encode_frame(olh_batch(metrics, 20, first_seed=20 * (first + i)))
            t0 = time.perf_counter()
            r = client.post(url + "/v1/reports", content=body, headers=FRAME)
            out.append(time.perf_counter() - t0)
            assert r.status_code == 202
            time.sleep(0.02)
    return out


def test_a_body_that_does_not_arrive_in_time_is_408_and_the_connection_closed(
    tmp_path: Path, metrics: MetricSet
) -> None:
    """A socket that stops sending its body is answered 408 ``body_timeout`` after ``body_timeout`` seconds,
    with ``Connection: close``, and the server closes it; before the fix it was held open for ever."""
    transport = MemoryTransport()
    with ServerThread(create_app(settings(tmp_path, body_timeout=0.5), transport=transport)) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            t0 = time.monotonic()
            s.sendall(request(FRAME_CONTENT_TYPE, b"\x00" * 100, declared=10_000))
            status, headers, body = read_response(s)
            elapsed = time.monotonic() - t0
            assert status == 408 and headers[b"connection"] == b"close"
            assert json.loads(body)["error"] == "body_timeout"
            assert 0.4 < elapsed < 5
            assert s.recv(100) == b""  # closed by the server
        assert gauge(srv.url, "ldp_collector_uploads_reading") == 0
        r = httpx.post(srv.url + "/v1/reports", content=encode_frame(olh_batch(metrics, 5)), headers=FRAME)
        assert r.status_code == 202
        text = httpx.get(srv.url + "/metrics").text
    assert 'ldp_collector_batches_total{outcome="rejected",reason="body_timeout"} 1' in text


def test_too_many_bodies_being_read_is_503_and_closes(tmp_path: Path, metrics: MetricSet) -> None:
    """Past ``max_reading`` bodies being read, a new upload is 503 with ``Retry-After`` and ``Connection:
    close`` at once (its body is not read); once the readers are gone, uploads are taken again."""
    transport = MemoryTransport()
    with ServerThread(create_app(settings(tmp_path, max_reading=3, retry_after=4), transport=transport)) as srv:
        with partial_bodies(srv.port, 3):
            wait_for(lambda: gauge(srv.url, "ldp_collector_uploads_reading") == 3)
            r = httpx.post(srv.url + "/v1/reports", content=encode_frame(olh_batch(metrics, 5)), headers=FRAME)
            assert r.status_code == 503 and r.headers["retry-after"] == "4"
            assert r.headers["connection"] == "close" and r.json()["error"] == "overloaded"
        wait_for(lambda: gauge(srv.url, "ldp_collector_uploads_reading") == 0)
        r = httpx.post(srv.url + "/v1/reports", content=encode_frame(olh_batch(metrics, 5)), headers=FRAME)
        assert r.status_code == 202
    assert len(transport.records) == 1


def test_large_json_is_decoded_off_the_loop_and_published_like_a_frame(tmp_path: Path, metrics: MetricSet) -> None:
    """A JSON form above ``offload_json_bytes`` (decoded on a decode thread) and one below it (on the loop)
    are both published as the same frames a binary upload gives; an invalid large one is a 400."""
    from ldp_core.wire.frames import encode_json

    transport = MemoryTransport()
    cfg = settings(tmp_path, offload_json_bytes=4096)
    small, large = olh_batch(metrics, 5), olh_batch(metrics, 3000, first_seed=100)
    assert len(encode_json(small)) < 4096 < len(encode_json(large))
    with ServerThread(create_app(cfg, transport=transport)) as srv:
        for b in (small, large):
            r = httpx.post(
                srv.url + "/v1/reports", content=encode_json(b).encode(), headers={"content-type": "application/json"}
            )
            assert r.status_code == 202 and r.json()["reports"] == len(b), r.text
        r = httpx.post(
            srv.url + "/v1/reports",
            content=invalid_json_body(metrics, 20_000),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400 and r.json()["error"] == "malformed"
    assert [v for _, _, v in transport.records] == [encode_frame(small), encode_frame(large)]


def test_a_dead_decode_process_is_503_once_and_replaced(tmp_path: Path, metrics: MetricSet) -> None:
    """The decode process killed (say by the OOM killer): the upload it was needed for is 503 with
    ``Retry-After``, not a 500 or a hang, and the next large JSON upload gets a fresh process."""
    import os
    import signal

    from ldp_core.wire.frames import encode_json

    transport = MemoryTransport()
    app = create_app(settings(tmp_path, offload_json_bytes=1024), transport=transport)
    batches = [olh_batch(metrics, 500, first_seed=1000 * i) for i in range(3)]
    with ServerThread(app) as srv:

        def post(b: object) -> httpx.Response:
            return httpx.post(
                srv.url + "/v1/reports",
                content=encode_json(b).encode(),  # type: ignore[arg-type]
                headers={"content-type": "application/json"},
                timeout=60,
            )

        assert post(batches[0]).status_code == 202
        pool = app.state.runtime["json_decoder"]
        for pid in list(pool._processes):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: bool(pool._broken))  # the pool has seen its process die
        r = post(batches[1])
        assert r.status_code == 503 and r.json()["error"] == "internal" and r.headers["retry-after"], r.text
        r = post(batches[1])  # the device's retry
        assert r.status_code == 202, r.text
        assert post(batches[2]).status_code == 202
    assert len(transport.records) == 3
