"""The collector the SDK tests upload to, behind one fixture.

``collector_factory(**options)`` starts a collector process on 127.0.0.1 and
returns a handle with ``url``, ``stats()``, ``frames()`` (every accepted
frame, once per batch id) and ``stop()``. :data:`COLLECTOR` is the real
collector (:class:`RealCollectorProcess`: ``ldp collector`` on an embedded
transport, its frames read back from ``ldp.reports.raw``).
``receiver_factory`` starts the stdlib TEST RECEIVER
(:mod:`tests.support.sdk_test_receiver`) instead, for the few tests that need a
behaviour the real collector cannot be made to produce.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from ldp_core.metrics import load_metrics
from ldp_core.wire.frames import decode_frame, read_header
from pipeline.topics import RAW_TOPIC
from pipeline.transport import TopicError
from pipeline.transport.embedded import EmbeddedTransport

__all__ = ["TestReceiverProcess", "RealCollectorProcess", "COLLECTOR", "collector_factory", "receiver_factory"]

ROOT = pathlib.Path(__file__).resolve().parents[2]


class TestReceiverProcess:
    """The test receiver in a subprocess; its accepted frames live in ``directory``."""

    __test__ = False  # not a test class

    def __init__(self, directory: pathlib.Path, **options: Any) -> None:
        self.directory = pathlib.Path(directory)
        args = [sys.executable, "-m", "tests.support.sdk_test_receiver", "--dir", str(self.directory)]
        for key, val in options.items():
            flag = "--" + key.replace("_", "-")
            if val is True:
                args.append(flag)
            elif val is not None and val is not False:
                args += [flag, str(val)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("PORT "):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"test receiver did not start: {line!r} {err}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.url + "/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def frames(self) -> list[bytes]:
        return [p.read_bytes() for p in sorted(self.directory.glob("*.frame"))]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


_BATCHES_LINE = re.compile(r'^ldp_collector_batches_total\{outcome="([^"]*)",reason="([^"]*)"\} (\S+)$')


class RealCollectorProcess:
    """``ldp collector`` in a subprocess on 127.0.0.1 (a free port), with an embedded transport,
    dedup store and metrics file in ``directory``.

    ``metrics`` is the metrics file (a path, or a document written to ``directory/metrics.json``);
    other options are the collector's flags (``max_body_bytes=64`` becomes ``--max-body-bytes 64``).
    :meth:`frames` and the ``published``/``stored`` counts of :meth:`stats` come from what reached
    the transport (``ldp.reports.raw``, read from its beginning with a fresh consumer group); the
    answer counts come from the collector's ``GET /metrics``.
    """

    def __init__(
        self, directory: pathlib.Path, *, metrics: str | os.PathLike[str] | dict[str, Any], **options: Any
    ) -> None:
        self.directory = pathlib.Path(directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        if isinstance(metrics, dict):
            path = self.directory / "metrics.json"
            path.write_text(json.dumps(metrics))
            metrics = path
        self.metrics_path = pathlib.Path(metrics).resolve()
        self._specs = {m.spec.spec_id: m.spec for m in load_metrics(self.metrics_path, reject_expired=False).values()}
        self.transport_path = self.directory / "transport.sqlite3"
        args = [
            sys.executable,
            "-m",
            "ldp_cli.main",
            "collector",
            "--transport",
            f"sqlite:///{self.transport_path}",
            "--metrics",
            str(self.metrics_path),
            "--dedup",
            str(self.directory / "batch-ids.sqlite3"),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ]
        for key, val in options.items():
            if val is True:  # a switch (require_tokens=True becomes --require-tokens)
                args.append("--" + key.replace("_", "-"))
            elif isinstance(val, (list, tuple)):  # a repeatable flag (allow_origin=[a, b])
                for item in val:
                    args += ["--" + key.replace("_", "-"), str(item)]
            else:
                args += ["--" + key.replace("_", "-"), str(val)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for name in list(env):
            if name.startswith("LDP_COLLECTOR_") or name in ("LDP_TRANSPORT", "LDP_METRICS"):
                del env[name]
        self._log = open(self.directory / "collector.log", "w+")
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env, cwd=self.directory
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if not found:
            self.stop()
            raise RuntimeError(f"ldp collector did not start: {line!r} {self._stderr()}")
        self.url = found.group(1)
        self.metrics_url = self.url  # with --public-metrics; else the listener of its own, printed next
        if not options.get("public_metrics"):
            line = self.proc.stdout.readline() if self.proc.stdout else ""
            found = re.search(r"operational metrics on (http://127\.0\.0\.1:\d+)/metrics", line)
            if not found:
                self.stop()
                raise RuntimeError(f"ldp collector printed no metrics listener: {line!r} {self._stderr()}")
            self.metrics_url = found.group(1)
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ldp collector never became ready: {self._stderr()}")
            time.sleep(0.02)

    def _stderr(self) -> str:
        self._log.seek(0)
        return self._log.read()[-4000:]

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _published(self) -> list[bytes]:
        """Every record value in the raw topic, from offset 0 of each partition."""
        transport = EmbeddedTransport(self.transport_path)
        try:
            try:
                consumer = transport.consume(RAW_TOPIC, "sdk-tests-" + uuid.uuid4().hex)
            except TopicError:  # nothing was ever published
                return []
            with consumer:
                values: list[bytes] = []
                while batch := consumer.poll(max_records=10_000, timeout=0.0):
                    values += [r.value for r in batch]
                return values
        finally:
            transport.close()

    def frames(self) -> list[bytes]:
        """The re-encoded frames in the raw topic, one per batch id (sorted by batch id).

        A batch id published twice must carry the same metric, spec, day and records each time."""
        by_id: dict[bytes, bytes] = {}
        for value in self._published():
            batch_id = read_header(value).batch_id
            if batch_id in by_id:
                a, b = decode_frame(by_id[batch_id], self._specs), decode_frame(value, self._specs)
                if (a.metric, a.spec_id, a.day) != (b.metric, b.spec_id, b.day) or not np.array_equal(
                    a.records, b.records
                ):
                    raise AssertionError(f"batch id {batch_id.hex()} reached the transport with different contents")
            else:
                by_id[batch_id] = value
        return [by_id[k] for k in sorted(by_id)]

    def stats(self) -> dict[str, int]:
        """Answers by outcome (``accepted``, ``duplicates``, ``invalid`` = 4xx, ``failed`` = 503 and
        their sum ``requests``) from the collector's counters, and ``disconnected``, the part of ``invalid``
        whose body ended early because the client went away (a killed app); ``published`` records and
        ``stored`` distinct batch ids from the transport."""
        with urllib.request.urlopen(self.metrics_url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        by_outcome: dict[str, int] = {}
        disconnected = 0
        for line in text.splitlines():
            m = _BATCHES_LINE.match(line)
            if m:
                by_outcome[m.group(1)] = by_outcome.get(m.group(1), 0) + int(float(m.group(3)))
                if m.group(1) == "rejected" and m.group(2) == "client_disconnected":
                    disconnected += int(float(m.group(3)))
        values = self._published()
        return {
            "requests": sum(by_outcome.values()),
            "accepted": by_outcome.get("accepted", 0),
            "duplicates": by_outcome.get("duplicate", 0),
            "invalid": by_outcome.get("rejected", 0),
            "disconnected": disconnected,
            "failed": by_outcome.get("unavailable", 0),
            "published": len(values),
            "stored": len({read_header(v).batch_id for v in values}),
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        if not self._log.closed:
            self._log.close()


#: What ``collector_factory`` starts.
COLLECTOR: Callable[..., Any] = RealCollectorProcess


def _factory(tmp_path: pathlib.Path, kind: Callable[..., Any], prefix: str) -> Iterator[Callable[..., Any]]:
    started: list[Any] = []

    def start(**options: Any) -> Any:
        handle = kind(tmp_path / f"{prefix}{len(started)}", **options)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()


@pytest.fixture
def collector_factory(tmp_path: pathlib.Path) -> Iterator[Callable[..., Any]]:
    """Starts :data:`COLLECTOR` (the real collector): ``collector_factory(metrics=..., **flags)``."""
    yield from _factory(tmp_path, COLLECTOR, "collector")


@pytest.fixture
def receiver_factory(tmp_path: pathlib.Path) -> Iterator[Callable[..., Any]]:
    """Starts the TEST RECEIVER (:class:`TestReceiverProcess`), for behaviour the real collector lacks."""
    yield from _factory(tmp_path, TestReceiverProcess, "receiver")
