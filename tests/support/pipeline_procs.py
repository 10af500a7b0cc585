"""The pipeline as real ``ldp`` processes, for tests that kill and restart them.

:class:`PipelineProcs` starts ``ldp collector``, ``ldp shuffler``, ``ldp
estimator`` and ``ldp sink`` as subprocesses on one transport, with topic
and group names unique to the run and fixed ports, so a restarted process
takes its predecessor's place. :class:`PacedUpload` uploads frames in the
background at a steady pace, retrying while the collector is down.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from client_sdk.upload.uploader import FRAME_CONTENT_TYPE, parse_retry_after
from ldp_core.wire.frames import ReportBatch, encode_frame

__all__ = ["free_port", "Service", "PipelineProcs", "PacedUpload"]

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """One ``ldp <command> ...`` subprocess, its output appended to ``log``."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, ready: str, url: str | None = None) -> None:
        self.name, self.argv, self.log, self.ready, self.url = name, list(argv), log, ready, url
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0
        self._log_pos = 0

    def start(self, timeout: float = 90.0) -> None:
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process without waiting for it to say it is ready."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log, "ab") as f:
            f.write(f"\n==== start {self.name} {time.strftime('%H:%M:%S')}\n".encode())
            self._log_pos = f.tell()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ldp_cli.main", *self.argv],
                cwd=ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.starts += 1

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc and self.proc.returncode}:\n{self.tail()}")
            with open(self.log, "rb") as f:
                f.seek(self._log_pos)
                started = self.ready.encode() in f.read()
            if started and self.url is not None:
                try:
                    started = httpx.get(self.url + "/healthz", timeout=2).status_code == 200
                except httpx.HTTPError:
                    started = False
            if started:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start within {timeout:g} s:\n{self.tail()}")
            time.sleep(0.1)

    def kill9(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, f"{self.name} is not running"
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(30) == -signal.SIGKILL
        self.kills += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class PipelineProcs:
    """Collector, shuffler, estimator and sink subprocesses on ``transport_url``."""

    def __init__(
        self,
        workdir: Path,
        transport_url: str,
        metrics_path: Path,
        *,
        min_batch: int,
        partitions: int = 3,
        session_timeout: float = 3.0,
        front: str = "python",
    ) -> None:
        """``front``: what serves the collector's port (``ldp collector --front``)."""
        run = uuid.uuid4().hex[:8]
        self.workdir = workdir
        self.raw, self.shuffled, self.state = (
            f"ldp.reports.raw.{run}",
            f"ldp.reports.shuffled.{run}",
            f"ldp.shuffler.state.{run}",
        )
        self.dataset = workdir / "dataset"
        cport, eport = free_port(), free_port()
        self.collector_url = f"http://127.0.0.1:{cport}"
        self.estimator_url = f"http://127.0.0.1:{eport}"
        t, m, st = transport_url, str(metrics_path), str(session_timeout)
        self.services = {
            "collector": Service(
                "collector",
                [
                    "collector",
                    "--transport",
                    t,
                    "--metrics",
                    m,
                    "--port",
                    str(cport),
                    "--raw-topic",
                    self.raw,
                    "--raw-partitions",
                    str(partitions),
                    "--dedup",
                    str(workdir / "collector-ids.sqlite3"),
                    "--public-metrics",  # the reconciliation tests read the counters at the collector's URL
                    "--front",
                    front,
                ],
                workdir / "collector.log",
                "listening on",
                self.collector_url,
            ),
            "shuffler": Service(
                "shuffler",
                [
                    "shuffler",
                    "--transport",
                    t,
                    "--metrics",
                    m,
                    "--min-batch",
                    str(min_batch),
                    "--raw-topic",
                    self.raw,
                    "--shuffled-topic",
                    self.shuffled,
                    "--state-topic",
                    self.state,
                    "--partitions",
                    str(partitions),
                    "--group",
                    f"shuffler-{run}",
                    "--member",
                    "shuffler-0",
                    "--checkpoint-interval",
                    "0.3",
                    "--session-timeout",
                    st,
                    "--no-guarantee",
                    "--key-file",
                    str(workdir / "shuffler.key"),
                ],
                workdir / "shuffler.log",
                "ldp shuffler: running",
            ),
            "estimator": Service(
                "estimator",
                [
                    "estimator",
                    "--transport",
                    t,
                    "--metrics",
                    m,
                    "--state",
                    str(workdir / "estimator-state"),
                    "--port",
                    str(eport),
                    "--topic",
                    self.shuffled,
                    "--group",
                    f"estimator-{run}",
                    "--partitions",
                    str(partitions),
                    "--checkpoint-seconds",
                    "0.3",
                    "--session-timeout",
                    st,
                ],
                workdir / "estimator.log",
                "listening on",
                self.estimator_url,
            ),
            "sink": Service(
                "sink",
                [
                    "sink",
                    "--transport",
                    t,
                    "--metrics",
                    m,
                    "--dataset",
                    str(self.dataset),
                    "--topic",
                    self.shuffled,
                    "--group",
                    f"sink-{run}",
                    "--member",
                    "sink-0",
                    "--partitions",
                    str(partitions),
                    "--flush-seconds",
                    "0.3",
                    "--session-timeout",
                    st,
                ],
                workdir / "sink.log",
                "ldp sink: writing",
            ),
        }

    def __getitem__(self, name: str) -> Service:
        return self.services[name]

    def start(self) -> None:
        threads = [threading.Thread(target=s.start) for s in self.services.values()]
        errors: list[BaseException] = []

        def run(s: Service) -> None:
            try:
                s.start()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(s,)) for s in self.services.values()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            self.stop()
            raise errors[0]

    def restart(self, name: str) -> None:
        self.services[name].start()

    def check_alive(self) -> None:
        dead = [n for n, s in self.services.items() if s.starts and not s.alive()]
        if dead:
            raise AssertionError(f"{dead} exited on their own:\n" + "\n".join(self.services[n].tail() for n in dead))

    def estimates(self, metric: str, day: int) -> dict[str, Any] | None:
        try:
            r = httpx.get(f"{self.estimator_url}/v1/estimates/{metric}", params={"day": day}, timeout=30)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def counted(self) -> dict[str, int]:
        try:
            r = httpx.get(f"{self.estimator_url}/v1/estimates", timeout=30)
            r.raise_for_status()
        except httpx.HTTPError:
            return {}
        out: dict[str, int] = {}
        for e in r.json()["estimates"]:
            out[e["metric"]] = out.get(e["metric"], 0) + e["n"]
        return out

    def wait_counted(self, expected: dict[str, int], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            got = self.counted()
            if got == expected:
                return
            if any(got.get(m, 0) > n for m, n in expected.items()):
                raise AssertionError(f"the estimator counted more than was uploaded: {got} > {expected}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"after {timeout:g} s the estimator counted {got}, expected {expected}\n"
                    + "\n".join(f"--- {n}\n{s.tail(15)}" for n, s in self.services.items())
                )
            self.check_alive()
            time.sleep(0.2)

    def stop(self) -> None:
        for s in self.services.values():
            s.stop()

    def stats_lines(self) -> list[dict[str, Any]]:
        """The JSON counters each process printed on a clean exit."""
        out = []
        for s in self.services.values():
            for line in s.log.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
        return out


class PacedUpload:
    """Uploads ``batches`` in order from a background thread, one every ``interval`` seconds, retrying until each
    is accepted; it uploads only as many as :meth:`allow` permitted so far (all, by default)."""

    def __init__(self, url: str, batches: Sequence[ReportBatch], interval: float, allowed: int | None = None) -> None:
        self.url, self.batches, self.interval = url, list(batches), interval
        self.accepted = 0
        self.retries = 0
        self.error: BaseException | None = None
        self._allowed = len(self.batches) if allowed is None else allowed
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PacedUpload:
        self._thread.start()
        return self

    @property
    def allowed(self) -> int:
        return self._allowed

    def allow(self, n: int) -> None:
        """Let ``n`` more batches go."""
        with self._cond:
            self._allowed = min(len(self.batches), self._allowed + n)
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=30) as http:
                for i, b in enumerate(self.batches):
                    with self._cond:
                        while i >= self._allowed:
                            self._cond.wait(0.5)
                    body = encode_frame(b)
                    while True:
                        try:
                            r = http.post(
                                "/v1/reports",
                                content=body,
                                headers={"Content-Type": FRAME_CONTENT_TYPE, "Idempotency-Key": b.batch_id.hex()},
                            )
                        except httpx.TransportError:
                            self.retries += 1
                            time.sleep(0.2)
                            continue
                        if r.status_code == 202:
                            break
                        if r.status_code in (408, 429) or r.status_code >= 500:
                            self.retries += 1
                            time.sleep(min(2.0, parse_retry_after(r.headers.get("retry-after"), time.time()) or 0.2))
                            continue
                        raise AssertionError(f"the collector rejected a batch: {r.status_code} {r.text}")
                    self.accepted += 1
                    time.sleep(self.interval)
        except BaseException as exc:  # noqa: BLE001 - reported by wait_until()/join()
            self.error = exc

    def wait_until(self, accepted: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.accepted < accepted:
            if self.error is not None:
                raise self.error
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.accepted} of {accepted} batches were accepted in {timeout:g} s")
            time.sleep(0.02)

    def wait_for(self, fraction: float, timeout: float = 120.0) -> None:
        self.wait_until(int(fraction * len(self.batches)), timeout)

    def join(self, timeout: float = 120.0) -> None:
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        assert self.accepted == len(self.batches), f"{self.accepted} of {len(self.batches)} uploaded"
