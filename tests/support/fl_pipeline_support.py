"""Helpers for the tests of federated rounds over the pipeline: a small task, simulated devices,
the in-process reference run, a collector with the FL routes and the job as a subprocess."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from client_sdk.fl.device import FLDevice
from collector.http.app import create_app
from collector.settings import CollectorSettings
from estimator.fl.job import AggregationJob, JobSettings
from estimator.fl.task import FLTaskSpec
from ldp_core.fl.training import ClientUpdate, clip_to_norm
from ldp_core.tokens.enrollment import DeviceIdentity, EnrollmentAuthority
from simulator.rounds import FederatedClient, run_rounds
from tests.support.collector_support import ServerThread, write_metrics

__all__ = [
    "Topics",
    "make_data",
    "task_spec",
    "reference_run",
    "devices_for",
    "collector",
    "drive",
    "JobThread",
    "JobProcess",
    "DEVICE_SEED",
    "final_params",
    "drive_rounds",
    "AUTHORITY",
    "enroll",
]

ROOT = Path(__file__).resolve().parents[2]
DEVICE_SEED = 12345
#: the tests' enrollment authority (a fixed key: tests only); every task names it, every device is enrolled by it
AUTHORITY = EnrollmentAuthority(np.random.default_rng([DEVICE_SEED, 7]).bytes(32))


def enroll(client_id: str) -> DeviceIdentity:
    """A device identity for ``client_id`` from the tests' authority (its key drawn from a fixed generator)."""
    seed = int.from_bytes(client_id.encode()[:16].ljust(16, b"\0"), "little")
    return AUTHORITY.enroll(client_id, random_bytes=np.random.default_rng([DEVICE_SEED, 8, seed]).bytes)


@dataclasses.dataclass(frozen=True)
class Topics:
    """Topic and group names unique to one test (the Kafka broker is shared)."""

    rounds: str
    updates: str
    state: str
    group: str

    @classmethod
    def fresh(cls) -> Topics:
        run = uuid.uuid4().hex[:10]
        return cls(f"ldp.fl.rounds.{run}", f"ldp.fl.updates.{run}", f"ldp.fl.state.{run}", f"ldp-fl-{run}")


def make_data(
    n_clients: int, n_features: int = 4, per_client: int = 24, seed: int = 7
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Linearly separable-ish binary data, each client's features shifted differently."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=n_features)
    out = []
    for i in range(n_clients):
        X = (rng.normal(size=(per_client, n_features)) + 0.3 * i / n_clients).astype(np.float32)
        y = (X @ w + 0.2 * rng.normal(size=per_client) > 0).astype(np.int64)
        out.append((X, y))
    return out


def task_spec(name: str, n_clients: int, **kw: Any) -> FLTaskSpec:
    base: dict[str, Any] = dict(
        task=name,
        model={"kind": "logistic", "n_features": 4, "l2": 0.0},
        clients=[f"dev-{i}" for i in range(n_clients)],
        rounds=3,
        sampling={"kind": "fixed", "count": 4},
        training={"epochs": 1, "batch_size": 8, "learning_rate": 0.5},
        clip_norm=0.5,
        noise_multiplier=0.8,
        delta=1e-5,
        seed=2024,
        round_timeout=60.0,
        phase_timeout=30.0,
    )
    base.update(kw)
    base.setdefault("enrollment_key", base64.b64encode(AUTHORITY.public_key).decode())
    spec = FLTaskSpec(**base)
    if "task_signature" in kw:
        return spec
    sig = base64.b64encode(AUTHORITY.sign_document(spec.signed_config())).decode()
    return dataclasses.replace(spec, task_signature=sig)


def device_rng(index: int, r: int) -> np.random.Generator:
    return np.random.default_rng([DEVICE_SEED, r, index])


def reference_run(
    spec: FLTaskSpec, data: Sequence[tuple[np.ndarray, np.ndarray]], tamper: Any = None, aggregator: Any = None
) -> tuple[np.ndarray, list[Any]]:
    """The same task with :func:`run_rounds` in one process: the job's seed for sampling and noise, each
    device's own generator for training, and the device's float32 clipping (to ``spec.device_clip_norm``)
    applied to the uploads; then ``tamper(round, updates)`` if given (what malicious devices send).
    ``aggregator`` (default: ``spec.build_aggregator``) lets a test keep the stack to inspect it."""
    index = {c: i for i, c in enumerate(spec.clients)}
    clients = [FederatedClient(c, X, y) for c, (X, y) in zip(spec.clients, data)]
    acc = spec.build_accountant()
    clip = spec.device_clip_norm

    def device_clip(r: int, ups: list[ClientUpdate]) -> list[ClientUpdate]:
        if clip is not None:
            ups = [
                ClientUpdate(
                    u.client_id, u.round, np.asarray(clip_to_norm(u.delta, clip)[0], np.float32), u.num_examples
                )
                for u in ups
            ]
        return ups if tamper is None else tamper(r, ups)

    agg = aggregator if aggregator is not None else spec.build_aggregator(acc)
    return run_rounds(
        spec.build_model(),
        spec.build_strategy(),
        agg,
        clients,
        spec.build_sampling(),
        spec.rounds,
        np.random.default_rng(spec.seed),
        tamper=device_clip,
        client_rng=lambda r, c: device_rng(index[c], r),
    )


def in_process_clients(
    spec: FLTaskSpec, data: Sequence[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, list[FederatedClient]]:
    """``spec`` run with :func:`run_rounds` (no device clipping, no tampering) and the clients it trained, whose
    ``state`` holds what devices that never restart keep (Ditto's personal model, MOON's previous one)."""
    index = {c: i for i, c in enumerate(spec.clients)}
    clients = [FederatedClient(c, X, y) for c, (X, y) in zip(spec.clients, data, strict=True)]
    params, _ = run_rounds(
        spec.build_model(),
        spec.build_strategy(),
        spec.build_aggregator(None),
        clients,
        spec.build_sampling(),
        spec.rounds,
        np.random.default_rng(spec.seed),
        client_rng=lambda r, c: device_rng(index[c], r),
    )
    return params, clients


class ScalingDevice(FLDevice):
    """A malicious enrolled device: it uploads ``scale`` × its honest (float32) update."""

    scale = np.float32(1.0)

    def _train(self, view: Any) -> tuple[np.ndarray, int, np.random.Generator]:
        delta, n, rng = super()._train(view)
        return (self.scale * delta).astype(np.float32), n, rng


def scaled_updates(scale: float, attackers: Sequence[str]) -> Callable[[int, list[ClientUpdate]], list[ClientUpdate]]:
    """:func:`reference_run`'s ``tamper`` for :class:`ScalingDevice` attackers: their updates times ``scale``
    (new ClientUpdates, so the upload ids match the changed content, as ValidatingAggregator checks)."""
    factor = np.float32(scale)

    def tamper(r: int, ups: list[ClientUpdate]) -> list[ClientUpdate]:
        return [
            ClientUpdate(u.client_id, u.round, (factor * u.delta).astype(np.float32), u.num_examples)
            if u.client_id in attackers
            else u
            for u in ups
        ]

    return tamper


def devices_for(
    url: str,
    spec: FLTaskSpec,
    data: Sequence[tuple[np.ndarray, np.ndarray]],
    drop_at: dict[str, str] | None = None,
    scale: dict[str, float] | None = None,
) -> list[FLDevice]:
    """One enrolled device per client of ``spec``; those in ``drop_at`` drop out from that phase, those in
    ``scale`` are :class:`ScalingDevice` attackers uploading that multiple of their update."""
    drop_at, scale = drop_at or {}, scale or {}

    def make(c: str) -> type[FLDevice]:
        if c not in scale:
            return FLDevice
        return type("ScalingDevice", (ScalingDevice,), {"scale": np.float32(scale[c])})

    return [
        make(c)(
            url,
            spec.task,
            c,
            X,
            y,
            rng_for_round=lambda r, i=i: device_rng(i, r),
            random_bytes=np.random.default_rng([DEVICE_SEED, 99, i]).bytes,
            timeout=15.0,
            backoff=0.05,
            drop_at=drop_at.get(c),
            identity=enroll(c),
        )
        for i, (c, (X, y)) in enumerate(zip(spec.clients, data))
    ]


@contextlib.contextmanager
def collector(tmp: Path, transport_url: str, topics: Topics) -> Iterator[ServerThread]:
    """A real collector (uvicorn in a thread) with the FL routes on ``transport_url``."""
    metrics = tmp / "metrics.json"
    write_metrics(metrics)
    settings = CollectorSettings(
        metrics_path=str(metrics),
        transport_url=transport_url,
        dedup_path=str(tmp / f"ids-{uuid.uuid4().hex[:6]}.sqlite3"),
        fl_enabled=True,
        fl_rounds_topic=topics.rounds,
        fl_updates_topic=topics.updates,
        raw_topic=f"ldp.reports.raw.{topics.group}",
    )
    with ServerThread(create_app(settings)) as srv:
        yield srv


def drive(devices: Sequence[FLDevice], done: Any, timeout: float = 60.0, pause: float = 0.02) -> None:
    """Step every device in turn until ``done()`` or ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not done():
        if time.monotonic() > end:
            raise AssertionError(f"the task did not finish within {timeout:g} s")
        for d in devices:
            d.step()
        time.sleep(pause)


def served_status(url: str, task: str, pred: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
    """The collector's ``/status`` view of ``task`` once ``pred`` holds for it.

    The collector learns round states by consuming the rounds topic, so its
    view trails the job's own by up to one poll: wait for it, do not sample it.
    """
    end = time.monotonic() + timeout
    served: dict[str, Any] = {}
    while time.monotonic() < end:
        served = httpx.get(f"{url}/v1/fl/tasks/{task}/status", timeout=10).json()
        if pred(served):
            return served
        time.sleep(0.05)
    raise AssertionError(f"the collector's status never satisfied the test: {served}")


class JobThread:
    """The aggregation job in a thread of the test process."""

    def __init__(self, transport: Any, spec: FLTaskSpec, topics: Topics, **kw: Any) -> None:
        self.job = AggregationJob(
            transport,
            spec,
            JobSettings(
                group=topics.group,
                rounds_topic=topics.rounds,
                updates_topic=topics.updates,
                state_topic=topics.state,
                session_timeout=kw.pop("session_timeout", 6.0),
                **kw,
            ),
        )
        self.topics = topics
        self.stop = threading.Event()
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.result = self.job.run(self.stop)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.job.close()

    def __enter__(self) -> JobThread:
        self.job.open()
        self.thread.start()
        return self

    def finished(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.result is not None

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


@contextlib.contextmanager
def running_task(tmp: Path, spec: FLTaskSpec, **job: Any) -> Iterator[tuple[Any, ServerThread, JobThread]]:
    """``spec`` live: an embedded transport in ``tmp``, a collector with the FL routes and the aggregation job
    in a thread, on topics of this test only (``jt.topics``); ``job`` goes to :class:`JobThread`."""
    from pipeline.transport import open_transport

    topics = Topics.fresh()
    url = f"sqlite:///{tmp}/transport.sqlite3"
    with open_transport(url) as tr, collector(tmp, url, topics) as srv, JobThread(tr, spec, topics, **job) as jt:
        yield tr, srv, jt


def run_with_restart(
    tmp: Path,
    spec: FLTaskSpec,
    data: Any,
    on_restore: Callable[[JobThread, dict[str, Any]], None],
    stop_after: int = 2,
) -> dict[str, Any]:
    """Run ``spec`` over the pipeline with the job stopped once round ``stop_after`` opened and started
    again; ``on_restore(jt, status)`` checks the restarted job before it goes on (the restore point is the
    newest committed checkpoint: round ``stop_after``'s, or a neighbour's when the stop raced a phase
    commit, so ``1 <= status["round"] < spec.rounds`` is checked here). The final status."""
    from pipeline.transport import open_transport

    topics = Topics.fresh()
    url = f"sqlite:///{tmp}/transport.sqlite3"
    with open_transport(url) as tr, collector(tmp, url, topics) as srv:
        devices = devices_for(srv.url, spec, data)
        with JobThread(tr, spec, topics, checkpoint_interval=0.2) as jt:
            drive(devices, lambda: jt.job.status()["round"] >= stop_after, timeout=60)
        with JobThread(tr, spec, topics, checkpoint_interval=0.2) as jt:
            restored = jt.job.status()
            assert jt.job.restores == 1 and 1 <= restored["round"] < spec.rounds
            on_restore(jt, restored)
            drive(devices, jt.finished, timeout=60)
            status = jt.result
    assert status is not None
    return status


class JobProcess:
    """``ldp fl job`` as a subprocess (for SIGKILL), its status in a file."""

    def __init__(
        self,
        tmp: Path,
        transport_url: str,
        spec: FLTaskSpec,
        topics: Topics,
        checkpoint_interval: float = 0.2,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.task_file = tmp / "task.json"
        self.task_file.write_text(json.dumps(spec.to_dict()))
        self.status_file = tmp / "job-status.json"
        self.log = tmp / "job.log"
        self.argv = [
            sys.executable,
            "-m",
            "ldp_cli.main",
            "fl",
            "job",
            "--task",
            str(self.task_file),
            "--transport",
            transport_url,
            "--group",
            topics.group,
            "--rounds-topic",
            topics.rounds,
            "--updates-topic",
            topics.updates,
            "--state-topic",
            topics.state,
            "--status-file",
            str(self.status_file),
            "--checkpoint-interval",
            str(checkpoint_interval),
            "--session-timeout",
            "4",
            *extra_args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start(self, timeout: float = 90.0) -> None:
        with open(self.log, "ab") as f:
            start = f.tell()
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1")
            )
        end = time.monotonic() + timeout
        while b"ldp fl job: running" not in self.log.read_bytes()[start:]:
            if self.proc.poll() is not None:
                raise AssertionError(f"the job exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > end:
                raise AssertionError(f"the job did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return None

    def wait_status(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> dict[str, Any]:
        """Poll the status file until ``pred`` holds for it; fail after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            st = self.status()
            if st is not None and pred(st):
                return st
            time.sleep(0.02)
        raise AssertionError(f"the job's status never satisfied the test: {self.status()}")

    def kill9(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, "the job is not running"
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(30) == -signal.SIGKILL
        self.kills += 1

    def finished(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def wait(self, timeout: float = 60.0) -> dict[str, Any]:
        assert self.proc is not None
        rc = self.proc.wait(timeout)
        assert rc == 0, f"the job exited with {rc}:\n{self.log.read_text()[-3000:]}"
        status = self.status()
        assert status is not None
        return status

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def final_params(status: dict[str, Any]) -> np.ndarray:
    """The model in a job status (base64 of little-endian float32)."""
    return np.frombuffer(base64.b64decode(status["params"]), "<f4").astype(np.float32)


def drive_rounds(
    job: JobProcess,
    devices: Sequence[FLDevice],
    rounds: int,
    before: Callable[[int, int], None] | None = None,
    after: Callable[[int, int], None] | None = None,
) -> None:
    """Play ``rounds`` plain rounds against a job process step by step: wait for round r, let each sampled
    device upload in turn, calling ``before(r, i)`` / ``after(r, i)`` around the i-th upload (where tests
    kill and restart the job)."""
    for r in range(rounds):
        job.wait_status(lambda st, r=r: st["round"] == r)
        views: dict[str, Any] = {}
        while not views or any(v is None or v["round"] != r for v in views.values()):
            views = {d.client_id: d.fetch() for d in devices}
        chosen = [d for d in devices if views[d.client_id]["selected"]]
        for i, d in enumerate(chosen):
            if before is not None:
                before(r, i)
            assert d.step() == "update"
            if after is not None:
                after(r, i)
