"""A TEST RECEIVER standing in for the collector in the SDK's tests (not the collector).

A small stdlib ``http.server`` on 127.0.0.1 that speaks the SDK's upload
protocol (:mod:`client_sdk.upload.uploader`): ``POST /v1/reports`` with one binary
frame; the frame is checked (header, CRC, spec when a metrics file is given),
stored durably (written, fsynced, renamed to ``<batch id>.frame``) and only
then answered ``202``; a batch id already stored is answered ``202`` and not
stored again. ``GET /v1/metrics`` serves a metrics file. ``GET /stats``
reports counters as JSON.

Run it as a process so tests can kill it, or the app, with SIGKILL::

    python -m tests.support.sdk_test_receiver --dir DIR [--metrics FILE] [--fail-first N]
        [--retry-after S] [--delay-after-store S] [--status CODE]

It prints ``PORT <n>`` on stdout once listening. The SDK tests run against
the real collector (``collector_factory`` in ``tests/support/sdk_collector.py``);
this receiver remains behind ``receiver_factory`` for a behaviour the
collector has no switch for (``--delay-after-store``).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
import threading
import time
import zlib

from ldp_core.errors import FrameError
from ldp_core.metrics import load_metrics
from ldp_core.wire.frames import decode_frame, read_header

__all__ = ["main"]


class _State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.dir = args.dir
        self.metrics_bytes = open(args.metrics, "rb").read() if args.metrics else None
        self.specs = (
            {m.spec.spec_id: m.spec for m in load_metrics(args.metrics, reject_expired=False).values()}
            if args.metrics and args.check_specs
            else None
        )
        self.fail_left = args.fail_first
        self.retry_after = args.retry_after
        self.delay = args.delay_after_store
        self.status = args.status
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "accepted": 0, "duplicates": 0, "invalid": 0, "failed": 0}


def _handler(state: _State) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            if self.path.split("?", 1)[0] == "/v1/metrics" and state.metrics_bytes is not None:
                self._reply(200, state.metrics_bytes, {"Content-Type": "application/json"})
            elif self.path == "/stats":
                with state.lock:
                    body = json.dumps(state.counts).encode()
                self._reply(200, body, {"Content-Type": "application/json"})
            else:
                self._reply(404)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            if self.path != "/v1/reports":
                self._reply(404)
                return
            with state.lock:
                state.counts["requests"] += 1
                if state.fail_left > 0:
                    state.fail_left -= 1
                    state.counts["failed"] += 1
                    fail = True
                else:
                    fail = False
            if fail:
                headers = {"Retry-After": str(state.retry_after)} if state.retry_after is not None else {}
                self._reply(state.status, b"", headers)
                return
            try:
                header = read_header(body)
                crc_ok = zlib.crc32(body[:-4]) == int.from_bytes(body[-4:], "little")
                if not crc_ok:
                    raise FrameError("CRC mismatch")
                if state.specs is not None:
                    decode_frame(body, state.specs)
            except FrameError as exc:
                with state.lock:
                    state.counts["invalid"] += 1
                self._reply(400, str(exc).encode())
                return
            name = header.batch_id.hex()
            final = os.path.join(state.dir, name + ".frame")
            with state.lock:
                duplicate = os.path.exists(final)
                if not duplicate:
                    tmp = final + ".tmp"
                    with open(tmp, "wb") as f:
                        f.write(body)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, final)
                    state.counts["accepted"] += 1
                else:
                    state.counts["duplicates"] += 1
            if state.delay:
                time.sleep(state.delay)
            self._reply(202)

    return Handler


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="where accepted frames are stored")
    ap.add_argument("--metrics", help="metrics file served at GET /v1/metrics")
    ap.add_argument("--check-specs", action="store_true", help="decode frames against the metrics file's specs")
    ap.add_argument("--fail-first", type=int, default=0, help="answer the first N uploads with --status")
    ap.add_argument("--status", type=int, default=503)
    ap.add_argument("--retry-after", type=int, default=None, help="Retry-After seconds on failures")
    ap.add_argument("--delay-after-store", type=float, default=0.0, help="sleep after storing, before answering")
    args = ap.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(_State(args)))
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
