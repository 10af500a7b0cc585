"""PATE's federated teachers over the real FL pipeline, on one machine: ``ldp pate --federated http``.

One PATE task (:mod:`ldp_core.fl.pate`) run end to end: an embedded transport in a work folder, the collector
with its FL routes under uvicorn on 127.0.0.1 (a free port), the aggregation job with the PATE release
(:class:`estimator.pate.fl_task.PateVoteRelease`) on a thread, and one :class:`client_sdk.fl.device.FLDevice` per
teacher, each holding only its own partition and the public queries, talking to the collector over HTTP. The
job unmasks only the sum of the teachers' votes, answers, accounts and publishes the labels in its history; the
student is then trained on the labelled public inputs.

:func:`run_pate_http` also sums the same teachers' votes in this process (:func:`in_process_labels`: the same
training generators, the same noise generator) and reports whether the two releases are equal.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from client_sdk.fl.device import FLDevice
from estimator.fl.options import FixedSamplingSpec
from estimator.fl.task import FLTaskSpec
from estimator.pate.aggregators import vote_histograms
from estimator.pate.fl_task import PateVoteRelease, in_process_release, pate_noise_rng
from ldp_core.fl.errors import FLError
from ldp_core.fl.pate import PateTaskSpec, noise_share, queries_digest, teacher_predictions
from ldp_core.tokens.enrollment import EnrollmentAuthority

__all__ = ["PateFLRun", "pate_task", "in_process_labels", "run_pate_http", "device_rng", "device_noise_rng"]

_METRICS = {
    "format": "ldp-metrics/1",
    "metrics": {
        "unused": {
            "description": "the collector needs a metrics file; a PATE task uses only its FL routes",
            "owner": "pate@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "grr", "epsilon": 1.0},
            "domain": {"kind": "dictionary", "values": ["a", "b"]},
            "max_reports_per_day": 1,
        }
    },
}


def device_rng(seed: int, index: int, r: int) -> np.random.Generator:
    """Teacher ``index``'s training generator in round ``r`` of a seeded run."""
    return np.random.default_rng([seed, 0x7EAC, index, r])


def device_noise_rng(seed: int, index: int, r: int) -> np.random.Generator:
    """Teacher ``index``'s noise-share generator (``noise: distributed``) in round ``r`` of a seeded run."""
    return np.random.default_rng([seed, 0x7015E, index, r])


def pate_task(
    name: str,
    authority: EnrollmentAuthority,
    queries: np.ndarray,
    teachers: int,
    model: dict[str, Any],
    training: dict[str, Any],
    pate: dict[str, Any],
    seed: int | None,
    delta: float = 1e-5,
    phase_timeout: float = 60.0,
) -> FLTaskSpec:
    """A signed PATE task over ``teachers`` clients (every one sampled) voting on ``queries``."""
    classes = int(model["n_classes"])
    p = {"queries": int(len(queries)), "classes": classes, "queries_sha256": queries_digest(queries), **pate}
    spec = FLTaskSpec(
        task=name,
        model=model,
        clients=tuple(f"teacher-{i:03d}" for i in range(teachers)),
        rounds=1,
        sampling=FixedSamplingSpec(teachers),
        training=training,
        secagg=True,
        seed=seed,
        delta=delta,
        phase_timeout=phase_timeout,
        round_timeout=phase_timeout,
        enrollment_key=base64.b64encode(authority.public_key).decode(),
        pate=p,
    )
    sig = base64.b64encode(authority.sign_document(spec.signed_config())).decode()
    return dataclasses.replace(spec, task_signature=sig)


def in_process_labels(
    spec: FLTaskSpec, parts: Sequence[tuple[np.ndarray, np.ndarray]], queries: np.ndarray, seed: int
) -> dict[str, Any]:
    """The same release computed in one process: each teacher trained with its device's generator, the votes
    summed in the clear (plus the same noise shares for ``noise: distributed``), the job's noise generator."""
    assert spec.pate is not None
    pate = PateTaskSpec.from_dict(spec.pate)
    preds = np.stack(
        [
            teacher_predictions(spec.model, spec.training, X, y, queries, device_rng(seed, i, 0))
            for i, (X, y) in enumerate(parts)
        ]
    )
    hist = vote_histograms(preds, pate.classes)
    n = len(parts)
    if pate.noise == "distributed":
        from ldp_core.noise import discrete_gaussian

        share = noise_share(pate.sigma, n)
        for i in range(n):
            hist = hist + discrete_gaussian(share, hist.size, device_noise_rng(seed, i, 0)).reshape(hist.shape)
    out = in_process_release(pate, hist, n, float(spec.delta), pate_noise_rng(spec.seed, 0), honest=n)
    out["predictions"] = preds
    return out


@dataclasses.dataclass
class PateFLRun:
    """What :func:`run_pate_http` returns: the job's published record, the devices' counters, the job's
    final status and (seeded runs) the in-process release."""

    record: dict[str, Any]
    status: dict[str, Any]
    devices: list[dict[str, Any]]
    seconds: float
    collector_url: str
    in_process: dict[str, Any] | None = None
    observed: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _observed_uploads(transport: Any, topic: str, length: int) -> list[dict[str, Any]]:
    """Every masked upload the job's side received (read back from the updates topic by a group of its own):
    what the server sees of each teacher."""
    from ldp_core.fl.protocol import parse_upload

    out = []
    with transport.consume(topic, f"observer-{uuid.uuid4().hex[:8]}") as consumer:
        for rec in consumer.records(idle_timeout=0.5):
            u = parse_upload(rec.value, payload_size=length)
            if u.kind == "masked":
                out.append({"client_id": u.client_id, "vector": np.asarray(u.payload["vector"], np.uint32)})
    return out


def run_pate_http(
    parts: Sequence[tuple[np.ndarray, np.ndarray]],
    queries: np.ndarray,
    model: dict[str, Any],
    training: dict[str, Any],
    pate: dict[str, Any],
    seed: int | None,
    delta: float = 1e-5,
    timeout: float = 300.0,
    workdir: str | Path | None = None,
    drop: Sequence[int] = (),
    phase_timeout: float = 60.0,
) -> PateFLRun:
    """Run the PATE task of ``parts`` (one teacher each) over the collector and the job (module docstring);
    ``drop`` lists teacher indices that go away after sharing their keys (SecAgg recovers without them, once
    the ``masked`` phase's ``phase_timeout`` has passed)."""
    from collector.http.app import create_app
    from collector.settings import CollectorSettings
    from estimator.fl.job import AggregationJob, JobSettings
    from pipeline.transport import open_transport
    from simulator.stack import serve_in_thread

    if len(parts) < 3:
        raise FLError(f"secure aggregation needs at least 3 teachers, got {len(parts)}")
    rnd = np.random.default_rng(seed) if seed is not None else None
    key = rnd.bytes(32) if rnd is not None else None
    authority = EnrollmentAuthority(key) if key is not None else EnrollmentAuthority.generate()
    run = uuid.uuid4().hex[:10]
    spec = pate_task(f"pate-{run}", authority, queries, len(parts), model, training, pate, seed, delta, phase_timeout)
    tmp_ctx = tempfile.TemporaryDirectory(prefix="ldp-pate-") if workdir is None else None
    folder = Path(tmp_ctx.name if tmp_ctx is not None else workdir)  # type: ignore[arg-type]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps(_METRICS))
    url = f"sqlite:///{folder / f'transport-{run}.sqlite3'}"
    rounds_topic, updates_topic, state_topic = (f"ldp.fl.{k}.{run}" for k in ("rounds", "updates", "state"))
    settings = CollectorSettings(
        metrics_path=str(folder / "metrics.json"),
        transport_url=url,
        dedup_path=str(folder / f"ids-{run}.sqlite3"),
        fl_enabled=True,
        fl_rounds_topic=rounds_topic,
        fl_updates_topic=updates_topic,
        raw_topic=f"ldp.reports.raw.{run}",
    )
    start = time.monotonic()
    uvi, collector_url, thread = serve_in_thread(create_app(settings))
    try:
        with open_transport(url) as tr:
            job = AggregationJob(
                tr,
                spec,
                JobSettings(
                    group=f"ldp-fl-{run}",
                    rounds_topic=rounds_topic,
                    updates_topic=updates_topic,
                    state_topic=state_topic,
                    session_timeout=6.0,
                ),
                vote_release=PateVoteRelease(spec),
            )
            job.open()
            stop = threading.Event()
            result: dict[str, Any] = {}

            def work() -> None:
                try:
                    result["status"] = job.run(stop)
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    result["error"] = exc

            th = threading.Thread(target=work, daemon=True, name="pate-job")
            th.start()

            def rngs(i: int) -> dict[str, Any]:
                if seed is None:  # the devices' own OS-CSPRNG generators
                    return {}
                return {
                    "rng_for_round": lambda r: device_rng(seed, i, r),
                    "noise_rng_for_round": lambda r: device_noise_rng(seed, i, r),
                    "random_bytes": np.random.default_rng([seed, 99, i]).bytes,
                }

            devices = [
                FLDevice(
                    collector_url,
                    spec.task,
                    c,
                    X,
                    y,
                    identity=authority.enroll(
                        c, random_bytes=os.urandom if seed is None else np.random.default_rng([seed, 8, i]).bytes
                    ),
                    **rngs(i),
                    pate_queries=queries,
                    drop_at="masked" if i in drop else None,
                    timeout=30.0,
                    backoff=0.05,
                )
                for i, (c, (X, y)) in enumerate(zip(spec.clients, parts))
            ]
            end = time.monotonic() + timeout
            while "status" not in result and "error" not in result:
                if time.monotonic() > end:
                    stop.set()
                    errors = {d.client_id: dict(d.errors) for d in devices if d.errors}
                    raise FLError(
                        f"the PATE task did not finish within {timeout:g} s (the job at round "
                        f"{job.status().get('round')}, phase {job.status().get('phase')}; device errors {errors})"
                    )
                for d in devices:
                    d.step()
                time.sleep(0.02)
            stop.set()
            th.join(30)
            job.close()
            if "error" in result:
                raise result["error"]
            status = result["status"]
            observed = _observed_uploads(tr, updates_topic, spec.payload_size())
    finally:
        uvi.should_exit = True
        thread.join(10)
        if tmp_ctx is not None:
            tmp_ctx.cleanup()
    hist = status.get("history") or []
    rec = next((h for h in hist if "pate" in h), None)
    if rec is None:
        failures = {d.client_id: (dict(d.errors), d.last_error) for d in devices if d.errors}
        raise FLError(f"the PATE round failed: {hist[-1] if hist else status}; device errors: {failures}")
    out = PateFLRun(
        record=rec,
        status=status,
        devices=[{"client_id": d.client_id, "uploads": d.uploads, "errors": dict(d.errors)} for d in devices],
        seconds=time.monotonic() - start,
        collector_url=collector_url,
        observed=observed,
    )
    if seed is not None and not drop:
        out.in_process = in_process_labels(spec, parts, queries, seed)
    return out


def pate_http_study(
    seed: int | None,
    teachers: int = 25,
    queries: int = 200,
    pate: dict[str, Any] | None = None,
    delta: float = 1e-5,
    timeout: float = 600.0,
    progress: Any = None,
) -> dict[str, Any]:
    """``ldp pate --federated http``: load_digits split as the study splits it (each sensitive record assigned
    to a teacher by its own draw), ``teachers`` devices over HTTP labelling the first ``queries`` public inputs
    (default GNMax σ = teachers/6, the server's noise), the student trained on the released labels. The JSON
    result says whether the labels equal the same release computed in one process (seeded runs only)."""
    from estimator.pate.experiment import load_digits_split, train_softmax
    from ldp_core.fl.models import SoftmaxRegression, accuracy

    if teachers < 3:
        raise FLError("--federated http needs at least 3 teachers (secure aggregation)")
    rng = np.random.default_rng(seed) if seed is not None else np.random.default_rng()
    data = load_digits_split(rng)
    q = min(int(queries), len(data.x_public))
    owner = rng.integers(0, teachers, size=len(data.x_sensitive))
    parts = [(data.x_sensitive[owner == t], data.y_sensitive[owner == t]) for t in range(teachers)]
    config = pate or {"aggregator": "gnmax", "sigma": max(teachers / 6.0, 1.0)}
    model = {"kind": "softmax", "n_features": int(data.x_public.shape[1]), "n_classes": 10, "l2": 1e-3}
    training = {"epochs": 20, "batch_size": 16, "learning_rate": 0.3}
    if progress is not None:
        progress(f"{teachers} teacher devices over HTTP, {q} public queries, {config}")
    run = run_pate_http(parts, data.x_public[:q], model, training, config, seed, delta, timeout)
    rec = run.record["pate"]
    labels = np.asarray(rec["labels"], np.int64)
    answered = labels >= 0
    student = SoftmaxRegression(data.x_test.shape[1], 10, l2=1e-3)
    w = train_softmax(data.x_public[:q][answered], labels[answered], 10, rng)
    same = None if run.in_process is None else bool(run.in_process["labels"] == rec["labels"])
    return {
        "data": "digits",
        "federated": "http",
        "teachers": teachers,
        "teacher_sizes": [int(len(y)) for _, y in parts],
        "queries": q,
        "aggregator": config,
        "answered": int(answered.sum()),
        "labels": rec["labels"],
        "label_accuracy": float(np.mean(labels[answered] == data.y_public[:q][answered])) if answered.any() else None,
        "student_accuracy": accuracy(student, w, data.x_test, data.y_test),
        "epsilon": rec["epsilon"],
        "epsilon_data_dependent_published": rec.get("epsilon_data_dependent_published"),
        "delta": delta,
        "survivors": run.record["clients"],
        "equal_to_in_process": same,
        "uploads": sum(d["uploads"] for d in run.devices),
        "collector": run.collector_url,
        "protects": rec["protects"],
        "seconds": round(run.seconds, 3),
        "seed_warning": None if seed is None else "seeded: the noise is predictable to anyone who knows the seed",
    }
