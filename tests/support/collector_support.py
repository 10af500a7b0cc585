"""Helpers for the collector and shuffler tests: a metrics file, batches, a real uvicorn server in a thread, fake transports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn

from ldp_core.days import utc_day
from ldp_core.metrics import MetricSet, load_metrics
from ldp_core.wire.frames import ReportBatch
from pipeline.transport import Consumer, RecordPosition, TopicError, Transport, TransportError

__all__ = [
    "TODAY",
    "write_metrics",
    "olh_batch",
    "ServerThread",
    "MemoryTransport",
    "FailingTransport",
    "BlockingTransport",
    "start_collector_command",
]

ROOT = Path(__file__).resolve().parents[2]

TODAY = utc_day(time.time())


def start_collector_command(
    tmp_path: Path, *flags: str, dedup: str = "ids.sqlite3", env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str, str]:
    """``ldp collector`` as a subprocess on a free port, on the embedded log ``tmp_path/log.sqlite3``, with the
    metrics file ``tmp_path/metrics.json``, the batch-id store ``tmp_path/dedup`` and ``flags``: the process, its
    URL and its operational-metrics URL (both read from the lines it prints once it listens)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ldp_cli.main",
            "collector",
            "--transport",
            f"sqlite:///{tmp_path}/log.sqlite3",
            "--metrics",
            str(tmp_path / "metrics.json"),
            "--dedup",
            str(tmp_path / dedup),
            "--port",
            "0",
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        cwd=tmp_path,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.stderr else "")
    mline = proc.stdout.readline()
    assert "operational metrics on http://" in mline, mline
    return proc, line.split("listening on ")[1].split()[0], mline.split(" on ")[1].strip()


def write_metrics(path: Path, *, expired_on: str = "2020-01-01", emoji_reports_per_day: int = 1) -> MetricSet:
    """A metrics file with an OLH metric (``emoji_reports_per_day`` reports a device a day), a GRR metric and
    one that expired on ``expired_on``."""
    doc = {
        "format": "ldp-metrics/1",
        "metrics": {
            "emoji_used": {
                "description": "emoji",
                "owner": "a@example.org",
                "expires": "2099-12-31",
                "mechanism": {"mechanism": "olh", "epsilon": 1.0},
                "domain": {"kind": "hashed", "size": 1024, "seed": 0},
                "max_reports_per_day": emoji_reports_per_day,
            },
            "settings_tab": {
                "description": "tab",
                "owner": "b@example.org",
                "expires": "2099-12-31",
                "mechanism": {"mechanism": "grr", "epsilon": 2.0},
                "domain": {"kind": "dictionary", "values": ["a", "b", "c", "d"]},
                "max_reports_per_day": 1,
            },
            "old_metric": {
                "description": "gone",
                "owner": "c@example.org",
                "expires": expired_on,
                "mechanism": {"mechanism": "rr", "epsilon": 0.5},
                "domain": {"kind": "dictionary", "values": ["off", "on"]},
                "max_reports_per_day": 1,
            },
        },
    }
    path.write_text(json.dumps(doc))
    return load_metrics(path, reject_expired=False)


def olh_batch(
    metrics: MetricSet,
    n: int,
    *,
    first_seed: int = 0,
    day: int = TODAY,
    metric: str = "emoji_used",
    batch_id: bytes | None = None,
) -> ReportBatch:
    """A batch of ``n`` reports whose OLH seeds ``first_seed .. first_seed+n-1`` identify each report."""
    spec = metrics[metric].spec
    rec = np.zeros(n, dtype=spec.record_dtype)
    rec["seed"] = np.arange(first_seed, first_seed + n, dtype=np.uint32)
    rec["y"] = np.arange(n) % 4
    kw = {} if batch_id is None else {"batch_id": batch_id}
    return ReportBatch(metric, spec, day, rec, **kw)


class ServerThread:
    """A real uvicorn server for ``app`` on 127.0.0.1 (a free port), in a thread; a context manager."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, access_log=False, log_level="warning", lifespan="on", log_config=None)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        end = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > end or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


class MemoryTransport(Transport):
    """Publishing only, in memory: records ``(topic, key, value)`` in order (for fuzzing the app quickly)."""

    def __init__(self) -> None:
        self.url = "memory://"
        self.topics: dict[str, int] = {}
        self.records: list[tuple[str, bytes | None, bytes]] = []
        self.lock = threading.Lock()

    def create_topic(
        self, name: str, partitions: int = 1, *, retention: float | None = None, segment: float | None = None
    ) -> None:
        self.topics.setdefault(name, partitions)

    def partitions(self, topic: str) -> int:
        if topic not in self.topics:
            raise TopicError(f"no topic {topic}")
        return self.topics[topic]

    def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> list[RecordPosition]:
        items = list(items)
        with self.lock:
            start = len(self.records)
            self.records.extend((topic, k, bytes(v)) for k, v in items)
        return [RecordPosition(topic, 0, start + i) for i in range(len(items))]

    def consume(
        self,
        topics: str | Sequence[str],
        group: str,
        *,
        member: str | None = None,
        session_timeout: float = 10.0,
        static: bool = False,
    ) -> Consumer:
        raise NotImplementedError("MemoryTransport only publishes")

    def close(self) -> None:
        pass


class FailingTransport(Transport):
    """Wraps a transport; while ``failing`` is set, publishing (and, with ``unreachable``, every call) raises."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.url = "failing+" + inner.url
        self.failing = threading.Event()
        self.unreachable = threading.Event()

    def _check(self) -> None:
        if self.unreachable.is_set():
            raise TransportError("broker unreachable (test)")

    def create_topic(
        self, name: str, partitions: int = 1, *, retention: float | None = None, segment: float | None = None
    ) -> None:
        self._check()
        self.inner.create_topic(name, partitions, retention=retention)

    def partitions(self, topic: str) -> int:
        self._check()
        return self.inner.partitions(topic)

    def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> list[RecordPosition]:
        self._check()
        if self.failing.is_set():
            raise TransportError("the broker did not acknowledge (test)")
        return self.inner.publish_many(topic, items)

    def consume(
        self,
        topics: str | Sequence[str],
        group: str,
        *,
        member: str | None = None,
        session_timeout: float = 10.0,
        static: bool = False,
    ) -> Consumer:
        return self.inner.consume(topics, group, member=member, session_timeout=session_timeout, static=static)

    def close(self) -> None:
        self.inner.close()


class BlockingTransport(FailingTransport):
    """Publishing waits until ``release`` is set; ``entered`` is set when a publish started."""

    def __init__(self, inner: Transport) -> None:
        super().__init__(inner)
        self.release = threading.Event()
        self.entered = threading.Event()

    def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> list[RecordPosition]:
        items = list(items)
        self.entered.set()
        if not self.release.wait(60):
            raise TransportError("test never released the publish")
        return super().publish_many(topic, items)
