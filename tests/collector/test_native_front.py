"""The native upload front (``ldp_front``, native/front) over real sockets, against a real Python upstream.

The front is built and installed by scripts/bootstrap (scripts/build-front); without it this module fails
at import (never skips). Each test starts a front on a 127.0.0.1 port-0 socket; a thread plays the Python
consumer (``take`` + ``answer``) and a ``http.server`` on another thread plays the collector's app.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

try:
    import ldp_front
except ImportError as exc:  # pragma: no cover - CI builds it through scripts/bootstrap
    raise ImportError("ldp_front is not installed: run scripts/bootstrap (or scripts/build-front)") from exc

FRAME = "application/vnd.ldp.frame"
MAX_BODY = 4096


class Upstream(BaseHTTPRequestHandler):
    """Records each request as it arrived (chunked bodies decoded) and answers 418 with an echo."""

    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]]

    def _handle(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append(  # type: ignore[attr-defined]
            {
                "method": self.command,
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }
        )
        out = json.dumps({"upstream": True, "length": len(body)}).encode()
        self.send_response(418)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Upstream", "yes")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = _handle

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def upstream() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


class Consumer:
    """The Python side: takes batches and answers them with `answer` (default: 202 echoing the upload)."""

    def __init__(self, front: Any, answer: Callable[[tuple], tuple] | None = None) -> None:
        self.front = front
        self.taken: list[tuple] = []
        self.answer = answer or (
            lambda u: (202, json.dumps({"got": len(u[1])}).encode(), [(b"x-ticket", b"%d" % u[0])])
        )
        self.running = True
        self.paused = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.running:
            if self.paused.is_set():
                time.sleep(0.01)
                continue
            batch = self.front.take(64, 0.05)
            self.taken.extend(batch)
            # answered in reverse: the front must still send each connection's answers in request order
            self.front.answer_many([(u[0], *self.answer(u)) for u in reversed(batch)])

    def stop(self) -> None:
        self.running = False
        self.thread.join()


@pytest.fixture()
def start() -> Iterator[Callable[..., tuple[Any, int]]]:
    made: list[tuple[Any, socket.socket]] = []

    def _start(upstream_addr: str | None, **kw: Any) -> tuple[Any, int]:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        opts = {"max_body_bytes": MAX_BODY, "body_timeout": 5.0, "header_timeout": 5.0, "max_connections": 100}
        opts |= {"max_queued": 100, "retry_after": 7, "threads": 1} | kw
        front = ldp_front.Front(sock.fileno(), upstream_addr, upload_path="/v1/reports", content_types=[FRAME], **opts)
        made.append((front, sock))
        return front, sock.getsockname()[1]

    yield _start
    for front, sock in made:
        front.close(0.5)
        sock.close()


def addr(server: ThreadingHTTPServer) -> str:
    return f"127.0.0.1:{server.server_address[1]}"


def read_response(rfile: Any) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response off a buffered socket file (Content-Length bodies only)."""
    status_line = rfile.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers: dict[str, str] = {}
    while (line := rfile.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, rfile.read(int(headers.get("content-length", 0)))


def upload_bytes(body: bytes, **headers: str) -> bytes:
    head = (
        f"POST /v1/reports?x=1 HTTP/1.1\r\nHost: front.test\r\nContent-Type: {FRAME}\r\nContent-Length: {len(body)}\r\n"
    )
    head += "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"\r\n" + body


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_upload_reaches_python_intact_and_gets_its_answer(start, upstream) -> None:
    front, port = start(addr(upstream))
    consumer = Consumer(
        front,
        lambda u: (
            201,
            b'{"ok":1}',
            [(b"x-ticket", b"%d" % u[0]), (b"access-control-allow-origin", b"https://a.test")],
        ),
    )
    body = os.urandom(3000)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {
        "Content-Type": f"{FRAME}; v=1",
        "Idempotency-Key": "k-1",
        "Authorization": "Bearer t",
        "Origin": "https://a.test",
    }
    conn.request("POST", "/v1/reports", body=body, headers=headers)
    resp = conn.getresponse()
    assert (resp.status, resp.read()) == (201, b'{"ok":1}')
    assert resp.getheader("content-type") == "application/json"
    assert resp.getheader("access-control-allow-origin") == "https://a.test"
    consumer.stop()
    [(ticket, got, ctype, key, auth, origin, checked)] = consumer.taken
    assert (got, ctype, key, auth, origin) == (body, f"{FRAME}; v=1", "k-1", "Bearer t", "https://a.test")
    assert checked is None  # not a frame (the pre-check: tests/collector/test_front_precheck.py)
    assert resp.getheader("x-ticket") == str(ticket)
    assert upstream.seen == [] and front.stats()["uploads_taken"] == 1


def test_python_can_close_the_connection_and_the_limit_is_inclusive(start, upstream) -> None:
    front, port = start(addr(upstream))
    consumer = Consumer(front, lambda u: (202, b"{}", [(b"connection", b"close")]))
    sock = connect(port)
    sock.sendall(upload_bytes(b"L" * MAX_BODY))  # exactly max_body_bytes: still the fast path
    status, headers, _ = read_response(sock.makefile("rb"))
    assert (status, headers["connection"]) == (202, "close") and closed_within(sock, 2)
    consumer.stop()
    assert [len(u[1]) for u in consumer.taken] == [MAX_BODY] and upstream.seen == []
    assert front.take(10, 0.05) == []  # nothing waiting: [] once the timeout passes


def test_keep_alive_serves_many_requests_on_one_connection(start, upstream) -> None:
    front, port = start(addr(upstream))
    consumer = Consumer(front)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for i in range(40):
        conn.request("POST", "/v1/reports", body=b"x" * i, headers={"Content-Type": FRAME})
        resp = conn.getresponse()
        assert (resp.status, json.loads(resp.read())) == (202, {"got": i})
    conn.request("GET", "/v1/health")
    assert conn.getresponse().status == 418
    consumer.stop()
    assert front.stats()["accepted"] == 1 and len(consumer.taken) == 40


def test_pipelined_requests_are_answered_in_order(start, upstream) -> None:
    front, port = start(addr(upstream))
    consumer = Consumer(front)
    consumer.paused.set()  # let all of them queue, then answer the batch in reverse
    sock = connect(port)
    sizes = [5, 17, 0, 300, 9]
    sock.sendall(b"".join(upload_bytes(b"y" * n) for n in sizes))
    time.sleep(0.3)
    consumer.paused.clear()
    rfile = sock.makefile("rb")
    answers = [read_response(rfile) for _ in sizes]
    assert [(s, json.loads(b)) for s, _, b in answers] == [(202, {"got": n}) for n in sizes]
    consumer.stop()


def test_everything_else_is_proxied_byte_exact(start, upstream) -> None:
    front, port = start(addr(upstream))
    consumer = Consumer(front)
    big = os.urandom(MAX_BODY + 1)
    chunked_body = os.urandom(700)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    cases = [
        ("GET", "/v1/health?deep=1", None, {}),
        ("POST", "/v1/other", b"abc", {"Content-Type": FRAME}),
        ("POST", "/v1/reports", b'{"a": 1}', {"Content-Type": "application/json"}),
        ("POST", "/v1/reports", big, {"Content-Type": FRAME}),
        ("PUT", "/v1/reports", b"zz", {"Content-Type": FRAME}),
    ]
    for method, path, body, headers in cases:
        conn.request(method, path, body=body, headers=headers | {"X-Custom": "v 1"})
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("x-upstream"), json.loads(resp.read())) == (
            418,
            "yes",
            {"upstream": True, "length": len(body or b"")},
        )
    # chunked, with a hop-by-hop header named by Connection: the body arrives whole, the header does not
    conn.putrequest("POST", "/v1/reports", skip_host=True)
    for name, value in [("Host", "front.test:1"), ("Content-Type", FRAME), ("Transfer-Encoding", "chunked")]:
        conn.putheader(name, value)
    conn.putheader("Connection", "keep-alive, X-Hop")
    conn.putheader("X-Hop", "drop me")
    conn.endheaders()
    for part in (chunked_body[:300], chunked_body[300:]):
        conn.send(b"%x\r\n%s\r\n" % (len(part), part))
    conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    assert (resp.status, json.loads(resp.read())["length"]) == (418, len(chunked_body))
    consumer.stop()
    seen = upstream.seen
    assert [(s["method"], s["path"], s["body"]) for s in seen] == [(m, p, b or b"") for m, p, b, _ in cases] + [
        ("POST", "/v1/reports", chunked_body)
    ]
    assert all(s["headers"]["x-custom"] == "v 1" for s in seen[:-1])
    assert seen[0]["headers"]["host"] == f"127.0.0.1:{port}" and seen[-1]["headers"]["host"] == "front.test:1"
    assert "x-hop" not in seen[-1]["headers"] and "connection" not in seen[-1]["headers"]
    assert consumer.taken == [] and front.stats()["proxied"] == len(cases) + 1


def test_upstream_down_is_a_502_and_no_upstream_a_404(start) -> None:
    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{spare.getsockname()[1]}"
    spare.close()  # nothing listens there now
    for upstream_addr, status, reason in [(dead, 502, "upstream_unavailable"), (None, 404, "not_found")]:
        front, port = start(upstream_addr)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/v1/health")
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("content-type")) == (status, "application/json")
        assert json.loads(resp.read())["error"] == reason
    assert front.stats()["proxy_errors"] == 0


def test_an_app_that_does_not_answer_gets_the_client_a_504_in_time(start) -> None:
    """A hung app (its event loop blocked) accepts the proxied request and never answers: the client gets 504
    ``upstream_timeout`` after ``upstream_timeout`` s, not a connection held for ever, and the front serves the
    next request. (Before, the proxy waited without a bound: this client's read timed out.)"""
    hung = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog) and never reads or answers
    try:
        front, port = start(f"127.0.0.1:{hung.getsockname()[1]}", upstream_timeout=0.5)
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            t0 = time.monotonic()
            conn.request("GET", "/v1/health")
            resp = conn.getresponse()
            waited = time.monotonic() - t0
            assert (resp.status, resp.getheader("content-type")) == (504, "application/json")
            assert json.loads(resp.read())["error"] == "upstream_timeout"
            assert 0.4 < waited < 5.0, waited
            conn.close()
        assert front.stats()["proxy_timeouts"] == 2
        assert front.stats()["proxy_errors"] == 0
    finally:
        hung.close()


def test_stalled_body_gets_408_and_the_connection_closes(start, upstream) -> None:
    front, port = start(addr(upstream), body_timeout=0.3)
    sock = connect(port)
    sock.sendall(upload_bytes(b"z" * 100)[:-90])  # the head and 10 bytes of a 100-byte body
    rfile = sock.makefile("rb")
    status, headers, body = read_response(rfile)
    assert (status, headers["connection"], json.loads(body)["error"]) == (408, "close", "body_timeout")
    assert closed_within(sock, 2) and front.stats()["body_timeouts"] == 1


def test_full_queue_gets_503_overloaded(start, upstream) -> None:
    front, port = start(addr(upstream), max_queued=2)
    socks = [connect(port) for _ in range(3)]
    for s in socks[:2]:
        s.sendall(upload_bytes(b"q"))
    deadline = time.monotonic() + 5
    while front.stats()["queued"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    socks[2].sendall(upload_bytes(b"q"))
    status, headers, body = read_response(socks[2].makefile("rb"))
    assert (status, headers["retry-after"], json.loads(body)["error"]) == (503, "7", "overloaded")
    batch = front.take_nowait(10)
    assert len(batch) == 2 and front.take_nowait(10) == []
    assert front.answer_many([(t, 202, b"{}", []) for t, *_ in batch]) == 2
    assert [read_response(s.makefile("rb"))[0] for s in socks[:2]] == [202, 202]
    assert front.stats()["overloaded"] == 1


def test_the_bytes_of_bodies_being_read_are_bounded_as_they_arrive(start, upstream) -> None:
    """The reading budget is counted in bytes as they arrive: two slow bodies that sent 5 bytes each hold 10 of
    a 16-byte budget, so a 7-byte body is refused 503 ``overloaded`` and its connection closed (its unread rest
    must not be parsed as a request), while a 2-byte one still gets in; a finished body gives its bytes back.
    A slow body holds only what it sent, never a whole place."""
    front, port = start(addr(upstream), max_reading_bytes=16)
    slow = [connect(port) for _ in range(2)]
    for s in slow:
        s.sendall(upload_bytes(b"0123456789")[:-5])  # the head and half the body
    time.sleep(0.3)
    third = connect(port)
    third.sendall(upload_bytes(b"abcdefg"))
    status, headers, body = read_response(third.makefile("rb"))
    assert (status, headers["retry-after"], headers["connection"], json.loads(body)["error"]) == (
        503,
        "7",
        "close",
        "overloaded",
    )
    assert closed_within(third, 5)
    small = connect(port)
    small.sendall(upload_bytes(b"ok"))
    deadline = time.monotonic() + 5
    while front.stats()["queued"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    slow[0].sendall(b"56789")  # the first slow body ends: its bytes are free again once it is queued
    while front.stats()["queued"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    fourth = connect(port)
    fourth.sendall(upload_bytes(b"abcdefg"))
    while front.stats()["queued"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    batch = front.take_nowait(10)
    assert sorted(b for _, b, *_ in batch) == [b"0123456789", b"abcdefg", b"ok"]
    assert front.answer_many([(t, 202, b"{}", []) for t, *_ in batch]) == 3
    assert [read_response(x.makefile("rb"))[0] for x in (slow[0], small, fourth)] == [202, 202, 202]
    assert front.stats()["overloaded"] == 1


def test_notify_fd_is_readable_exactly_while_uploads_wait(start, upstream) -> None:
    import select

    front, port = start(addr(upstream))
    fd = front.notify_fd()
    assert select.select([fd], [], [], 0)[0] == []
    sock = connect(port)
    sock.sendall(upload_bytes(b"n"))
    assert select.select([fd], [], [], 5)[0] == [fd]
    [(ticket, *_)] = front.take_nowait(512)
    assert select.select([fd], [], [], 0)[0] == []
    assert front.answer(ticket, 202, b"{}", [])


def test_header_timeout_closes_silent_and_idle_connections(start, upstream) -> None:
    front, port = start(addr(upstream), header_timeout=0.3)
    consumer = Consumer(front)
    silent = connect(port)
    slow = connect(port)
    slow.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
    idle = connect(port)
    idle.sendall(upload_bytes(b"i"))
    assert read_response(idle.makefile("rb"))[0] == 202
    assert all(closed_within(s, 2) for s in (silent, slow, idle))
    consumer.stop()
    assert front.stats()["header_timeouts"] == 3


def test_beyond_max_connections_the_oldest_waiting_one_is_evicted(start, upstream) -> None:
    front, port = start(addr(upstream), max_connections=2)
    busy = connect(port)
    busy.sendall(upload_bytes(b"b"))  # queued, never taken: in the middle of a request
    deadline = time.monotonic() + 5
    while front.stats()["queued"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    waiting = connect(port)
    time.sleep(0.1)
    newest = connect(port)
    assert closed_within(waiting, 2)
    assert not closed_within(busy, 0.2) and not closed_within(newest, 0.2)
    assert front.stats()["evicted"] == 1


def test_answer_to_a_departed_client_is_false(start, upstream) -> None:
    front, port = start(addr(upstream))
    sock = connect(port)
    sock.sendall(upload_bytes(b"gone"))
    [(ticket, *_)] = front.take(10, 5.0)
    sock.close()
    time.sleep(0.3)
    assert front.answer(ticket, 202, b"{}", []) is False
    assert front.answer(ticket + 1000, 202, b"{}", []) is False
    assert front.stats()["client_gone"] == 2


def test_close_answers_untaken_uploads_shutting_down(start, upstream) -> None:
    front, port = start(addr(upstream))
    socks = [connect(port) for _ in range(2)]
    for s in socks:
        s.sendall(upload_bytes(b"late"))
    deadline = time.monotonic() + 5
    while front.stats()["queued"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    front.close(1.0)
    for s in socks:
        status, _, body = read_response(s.makefile("rb"))
        assert (status, json.loads(body)["error"]) == (503, "shutting_down")
    assert front.take_nowait(10) == []


def test_close_lets_taken_uploads_be_answered_within_grace(start, upstream) -> None:
    front, port = start(addr(upstream))
    sock = connect(port)
    sock.sendall(upload_bytes(b"taken"))
    [(ticket, *_)] = front.take(10, 5.0)
    t0 = time.monotonic()
    closing = threading.Thread(target=front.close, args=(10.0,))
    closing.start()
    time.sleep(0.2)  # close() is now waiting for this busy connection
    assert front.answer(ticket, 202, b'{"late":true}', [])
    status, headers, body = read_response(sock.makefile("rb"))
    assert (status, body, headers.get("connection")) == (202, b'{"late":true}', "close")
    closing.join()
    assert time.monotonic() - t0 < 5  # it ended with the last connection, not at the grace's end
