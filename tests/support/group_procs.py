"""The pipeline with several members per stage, as real ``ldp`` processes (issue 31).

:class:`GroupProcs` starts ``collectors`` ``ldp collector`` processes (one shared dedup file, as on one host)
and ``members`` members of each consumer group: ``ldp shuffler``, ``ldp sink`` (one shared dataset folder) and
``ldp estimator`` (each its own state folder, every other member named with ``--peer``, so a read at any
member answers for the whole group). Every member has a stable ``--member`` name (static membership): a
member killed and started again takes its own place. Topic and group names are unique to the run, ports fixed
for the run, so a restarted process takes its predecessor's place. :class:`RoundRobinUpload` spreads uploads
over the collectors as a load balancer would, moving on to the next collector when one does not answer.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from client_sdk.upload.uploader import FRAME_CONTENT_TYPE, parse_retry_after
from ldp_core.wire.frames import encode_frame
from tests.support.pipeline_procs import PacedUpload, Service, free_port

__all__ = ["GroupProcs", "RoundRobinUpload"]


class GroupProcs:
    """Collectors and ``members`` members of the shuffler's, the sink's and the estimator's groups."""

    def __init__(
        self,
        workdir: Path,
        transport_url: str,
        metrics_path: Path,
        *,
        min_batch: int,
        members: int = 2,
        collectors: int = 2,
        partitions: int = 4,
        session_timeout: float = 3.0,
        shuffler_args: Sequence[str] = (),
    ) -> None:
        run = uuid.uuid4().hex[:8]
        self.raw, self.shuffled, self.state = (
            f"ldp.reports.raw.{run}",
            f"ldp.reports.shuffled.{run}",
            f"ldp.shuffler.state.{run}",
        )
        self.dataset = workdir / "dataset"
        self.groups = (f"shuffler-{run}", f"sink-{run}", f"estimator-{run}")
        t, m, st, parts = transport_url, str(metrics_path), str(session_timeout), str(partitions)
        # the sink's and the estimator's members route-check sealed records under the shuffler's keying
        keying = [
            a
            for i, a in enumerate(shuffler_args)
            if a in ("--shuffled-key", "--shuffled-spread")
            or (i and shuffler_args[i - 1] in ("--shuffled-key", "--shuffled-spread"))
        ]
        self.collector_urls = [f"http://127.0.0.1:{free_port()}" for _ in range(collectors)]
        self.estimator_urls = [f"http://127.0.0.1:{free_port()}" for _ in range(members)]
        self.services: dict[str, Service] = {}
        for i, url in enumerate(self.collector_urls):
            argv = ["collector", "--transport", t, "--metrics", m, "--port", url.rsplit(":", 1)[1]]
            argv += ["--raw-topic", self.raw, "--raw-partitions", parts, "--dedup", str(workdir / "dedup.sqlite3")]
            self._add(f"collector-{i}", argv, workdir, "listening on", url)
        for i in range(members):
            argv = ["shuffler", "--transport", t, "--metrics", m, "--min-batch", str(min_batch)]
            argv += ["--raw-topic", self.raw, "--shuffled-topic", self.shuffled, "--state-topic", self.state]
            argv += ["--partitions", parts, "--group", f"shuffler-{run}", "--member", f"shuffler-{i}"]
            argv += ["--checkpoint-interval", "0.3", "--session-timeout", st, "--no-guarantee"]
            argv += ["--key-file", str(workdir / "shuffler.key")]  # one secret for the group's checkpoints
            argv += list(shuffler_args)
            self._add(f"shuffler-{i}", argv, workdir, "ldp shuffler: running")
        for i in range(members):
            argv = ["sink", "--transport", t, "--metrics", m, "--dataset", str(self.dataset)]
            argv += ["--topic", self.shuffled, "--group", f"sink-{run}", "--member", f"sink-{i}"]
            argv += ["--partitions", parts, "--flush-seconds", "0.3", "--session-timeout", st, *keying]
            self._add(f"sink-{i}", argv, workdir, "ldp sink: writing")
        for i, url in enumerate(self.estimator_urls):
            argv = ["estimator", "--transport", t, "--metrics", m, "--state", str(workdir / f"estimator-{i}")]
            argv += ["--port", url.rsplit(":", 1)[1], "--topic", self.shuffled, "--group", f"estimator-{run}"]
            argv += ["--member", f"estimator-{i}", "--partitions", parts, "--checkpoint-seconds", "0.3"]
            argv += ["--session-timeout", st, *keying]
            for peer in self.estimator_urls:
                if peer != url:
                    argv += ["--peer", peer]
            self._add(f"estimator-{i}", argv, workdir, "listening on", url)

    def _add(self, name: str, argv: list[str], workdir: Path, ready: str, url: str | None = None) -> None:
        self.services[name] = Service(name, argv, workdir / f"{name}.log", ready, url)

    def __getitem__(self, name: str) -> Service:
        return self.services[name]

    def start(
        self, names: Sequence[str] | None = None, timeout: float = 120.0, meanwhile: Callable[[], Any] | None = None
    ) -> None:
        """Launch ``names`` (default all) at once, call ``meanwhile`` (while they start), and wait until each is
        ready."""
        chosen = [self.services[n] for n in (names or list(self.services))]
        for s in chosen:
            s.launch()
        try:
            if meanwhile is not None:
                meanwhile()
            for s in chosen:
                s.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def check_alive(self) -> None:
        dead = [n for n, s in self.services.items() if s.starts and not s.alive()]
        if dead:
            raise AssertionError(f"{dead} exited on their own:\n" + "\n".join(self.services[n].tail() for n in dead))

    def group_read(self, path: str, at: int = 0, **params: Any) -> dict[str, Any] | None:
        """``GET path`` at estimator ``at`` (merged over the group by default); ``None`` if it fails."""
        try:
            r = httpx.get(self.estimator_urls[at] + path, params=params, timeout=30)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def counted(self, at: int = 0) -> tuple[dict[str, int], bool]:
        """Reports counted per metric by the whole group, as estimator ``at`` answers, and whether it was partial."""
        body = self.group_read("/v1/estimates", at)
        if body is None:
            return {}, True
        out: dict[str, int] = {}
        for e in body["estimates"]:
            out[e["metric"]] = out.get(e["metric"], 0) + e["n"]
        return out, bool(body.get("partial"))

    def wait_counted(self, expected: dict[str, int], timeout: float, at: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            got, partial = self.counted(at)
            if got == expected and not partial:
                return
            if any(got.get(m, 0) > n for m, n in expected.items()):
                raise AssertionError(f"the estimator group counted more than was uploaded: {got} > {expected}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"after {timeout:g} s the group counted {got} (partial {partial}), expected {expected}\n"
                    + "\n".join(f"--- {n}\n{s.tail(12)}" for n, s in self.services.items())
                )
            self.check_alive()
            time.sleep(0.2)

    def warnings(self, limit: int = 40) -> str:
        """Each service's WARNING, ERROR and start lines over all its runs (the last ``limit`` of each): what a
        failure's message shows of what the services did."""
        out = []
        for name, s in self.services.items():
            try:
                lines = s.log.read_text(errors="replace").splitlines()
            except OSError:
                continue
            kept = [ln[:300] for ln in lines if " WARNING " in ln or " ERROR " in ln or ln.startswith("==== start")]
            out.append(f"--- {name}\n" + "\n".join(kept[-limit:]))
        return "\n".join(out)

    def stop(self) -> None:
        """SIGTERM to every process at once, then wait for each (:meth:`Service.stop`)."""
        for s in self.services.values():
            if s.alive():
                assert s.proc is not None
                s.proc.send_signal(signal.SIGTERM)
        for s in self.services.values():
            s.stop()


class RoundRobinUpload(PacedUpload):
    """:class:`PacedUpload` over several collectors: batch ``i`` goes to collector ``i mod n`` first and, while
    that one does not answer (or answers 5xx), to the next, with the same ``Idempotency-Key``."""

    def __init__(self, urls: Sequence[str], batches: Sequence[Any], interval: float, allowed: int | None = None):
        super().__init__(urls[0], batches, interval, allowed)
        self.urls = list(urls)
        self.moved = 0  # uploads that went to another collector than their first

    def _run(self) -> None:
        try:
            with httpx.Client(timeout=30) as http:
                for i, b in enumerate(self.batches):
                    with self._cond:
                        while i >= self._allowed:
                            self._cond.wait(0.5)
                    self._send(http, i, encode_frame(b), b.batch_id.hex())
                    self.accepted += 1
                    time.sleep(self.interval)
        except BaseException as exc:  # noqa: BLE001 - reported by wait_until()/join()
            self.error = exc

    def _send(self, http: httpx.Client, i: int, body: bytes, key: str) -> None:
        target = i % len(self.urls)
        first = target
        while True:
            url = self.urls[target]
            try:
                r = http.post(
                    url + "/v1/reports",
                    content=body,
                    headers={"Content-Type": FRAME_CONTENT_TYPE, "Idempotency-Key": key},
                )
            except httpx.TransportError:
                r = None
            if r is not None and r.status_code == 202:
                self.moved += target != first
                return
            if r is not None and not (r.status_code in (408, 429) or r.status_code >= 500):
                raise AssertionError(f"the collector {url} rejected a batch: {r.status_code} {r.text}")
            self.retries += 1
            wait = 0.2 if r is None else parse_retry_after(r.headers.get("retry-after"), time.time()) or 0.2
            time.sleep(min(2.0, wait))
            target = (target + 1) % len(self.urls)
