"""FLTrust as a task-file aggregator of the real job (``"aggregator": {"kind": "fltrust", "root_data": ...}``).

* Loading: a relative ``root_data`` is relative to the task file; the root file is checked against the model
  (every malformed file gets an error that names what is wrong); the compositions that cannot work are refused.
* The root update is the task's local training on the root data from the round's model, with a generator of
  the seed and the round only (the same value twice; not the job's own generator).
* A round where every client is distrusted keeps the model.
* Over the pipeline (devices → collector → job), 3 of 10 enrolled devices sign-flip their update (−4×):
  the job's model equals the in-process run with the same attack, bit for bit; the plain mean is pushed
  off while FLTrust stays near the clean run (margins derived from the clean run, see the test).
* A job stopped after round 2 and restarted ends with the same model as the uninterrupted run; so does
  `ldp fl job` SIGKILLed mid-round (the new process recomputes the round's root update); a pinned
  ``sha256`` refuses a root file that changed.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from estimator.fl.aggregators import RoundContext
from estimator.fl.fltrust_root import RootTraining, root_generator
from estimator.fl.robust import FLTrust
from estimator.fl.task import FLTaskSpec
from ldp_cli.main import main
from ldp_core.fl.client_round import train_client
from ldp_core.fl.errors import FLError
from ldp_core.fl.models import accuracy
from ldp_core.fl.training import ClientUpdate
from tests.support.fl_pipeline_support import (
    JobProcess,
    JobThread,
    Topics,
    collector,
    devices_for,
    drive,
    drive_rounds,
    final_params,
    reference_run,
    run_with_restart,
    running_task,
    scaled_updates,
    task_spec,
)
from tests.support.fltrust_setup import ATTACKERS, DATA, N_CLIENTS, PER_CLIENT, ROOT, SCALE, X_TEST, Y_TEST


def _root_file(tmp: Path, name: str = "root.npz", **arrays: Any) -> Path:
    path = tmp / name
    np.savez(path, **(arrays or {"x": ROOT[0], "y": ROOT[1]}))
    return path


def _spec(tmp: Path, name: str = "fltrust", **kw: Any) -> FLTaskSpec:
    base: dict[str, Any] = dict(
        rounds=4,
        clip_norm=None,
        noise_multiplier=0.0,
        sampling={"kind": "fixed", "count": N_CLIENTS},
        aggregator={"kind": "fltrust", "root_data": str(_root_file(tmp))},
    )
    base.update(kw)
    return task_spec(name, N_CLIENTS, **base)


# -- loading and refusals ------------------------------------------------------------------------------
def test_relative_root_data_is_relative_to_the_task_file(tmp_path: Path) -> None:
    sub = tmp_path / "tasks"
    sub.mkdir()
    _root_file(sub, "root.npz")
    d = _spec(tmp_path).to_dict()
    d["aggregator"] = {"kind": "fltrust", "root_data": "root.npz"}
    (sub / "task.json").write_text(json.dumps(d))
    spec = FLTaskSpec.from_file(str(sub / "task.json"))  # the working directory holds no root.npz
    assert spec.aggregator.to_dict() == {"kind": "fltrust", "root_data": str(sub / "root.npz"), "sha256": None}
    assert FLTaskSpec.from_dict(spec.to_dict()) == spec
    agg = spec.build_aggregator(spec.build_accountant())
    assert isinstance(agg.inner, FLTrust)  # type: ignore[attr-defined]
    assert spec.build_accountant() is None and spec.device_clip_norm is None
    with pytest.raises(FLError, match="no such file.*relative to the task file"):
        FLTaskSpec.from_dict(d)  # from_dict: relative to the working directory, where there is none
    # the CLI: sign-task checks the root file next to the task file and writes the path back as it was;
    # the job refuses a task whose root file is malformed with the loader's message, not a traceback
    auth = tmp_path / "authority.key"
    assert main(["fl", "enroll", "--authority", str(auth), "--init-authority"]) == 0
    signed = sub / "signed.json"
    assert (
        main(["fl", "sign-task", "--authority", str(auth), "--task", str(sub / "task.json"), "--out", str(signed)]) == 0
    )
    assert json.loads(signed.read_text())["aggregator"] == {"kind": "fltrust", "root_data": "root.npz", "sha256": None}
    assert FLTaskSpec.from_file(str(signed)).aggregator == spec.aggregator
    np.savez(sub / "root.npz", x=ROOT[0][:, :2], y=ROOT[1])
    url = f"sqlite:///{tmp_path}/transport.sqlite3"
    with pytest.raises(SystemExit, match="ldp fl job: aggregator 'fltrust'.*x has 2 columns, the model takes 4"):
        main(["fl", "job", "--task", str(signed), "--transport", url])
    (sub / "bad.json").write_text("[1, 2]")
    with pytest.raises(FLError, match="must hold one JSON object"):
        FLTaskSpec.from_file(str(sub / "bad.json"))


def _bad_files(tmp: Path) -> list[tuple[Path, str]]:
    x, y = ROOT
    (tmp / "text.npz").write_text("not an archive")
    np.save(tmp / "one.npy", x)
    return [
        (tmp / "missing.npz", "no such file"),
        (tmp / "text.npz", "not a readable .npz"),
        (tmp / "one.npy", "not a .npz archive"),
        (_root_file(tmp, "noy.npz", x=x), r"no array \['y'\]"),
        (_root_file(tmp, "x1d.npz", x=x[:, 0], y=y), "x must be a 2-D float array"),
        (_root_file(tmp, "xint.npz", x=x.astype(np.int64), y=y), "x must be a 2-D float array"),
        (_root_file(tmp, "cols.npz", x=x[:, :3], y=y), "x has 3 columns, the model takes 4"),
        (_root_file(tmp, "empty.npz", x=x[:0], y=y[:0]), "empty"),
        (_root_file(tmp, "nan.npz", x=np.where(np.arange(x.size).reshape(x.shape) == 5, np.nan, x), y=y), "NaN"),
        (_root_file(tmp, "yfloat.npz", x=x, y=y.astype(np.float64)), "y must be a 1-D integer array"),
        (_root_file(tmp, "ylen.npz", x=x, y=y[:-1]), "y has 23 labels for 24 rows"),
        (_root_file(tmp, "ylab.npz", x=x, y=np.where(y == 1, 2, 0)), r"labels must be in \[0, 2\).*\[0, 2\]"),
    ]


def test_root_data_is_checked_against_the_model(tmp_path: Path) -> None:
    for path, message in _bad_files(tmp_path):
        with pytest.raises(FLError, match=message):
            _spec(tmp_path, aggregator={"kind": "fltrust", "root_data": str(path)})
    # a softmax model over 3 classes takes labels 0..2 and refuses 3
    soft = {"kind": "softmax", "n_features": 4, "n_classes": 3}
    ok = _root_file(tmp_path, "three.npz", x=ROOT[0], y=(np.arange(PER_CLIENT) % 3))
    _spec(tmp_path, model=soft, aggregator={"kind": "fltrust", "root_data": str(ok)})
    four = _root_file(tmp_path, "four.npz", x=ROOT[0], y=(np.arange(PER_CLIENT) % 4))
    with pytest.raises(FLError, match=r"labels must be in \[0, 3\)"):
        _spec(tmp_path, model=soft, aggregator={"kind": "fltrust", "root_data": str(four)})


def test_a_pinned_sha256_refuses_a_changed_root_file(tmp_path: Path) -> None:
    import hashlib

    path = _root_file(tmp_path, "pinned.npz")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    spec = _spec(tmp_path, aggregator={"kind": "fltrust", "root_data": str(path), "sha256": digest.upper()})
    spec.build_aggregator(None)
    np.savez(path, x=ROOT[0][::-1], y=ROOT[1][::-1])  # same shapes, other order: the rounds would differ
    with pytest.raises(FLError, match="SHA-256 is [0-9a-f]{64}, the task pins.*changed"):
        spec.build_aggregator(None)  # what a restarted job does first
    with pytest.raises(FLError, match="sha256 must be 64 hex digits"):
        _spec(tmp_path, aggregator={"kind": "fltrust", "root_data": str(path), "sha256": "abc"})


def test_compositions_that_cannot_work_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FLError, match="secure aggregation reveals only their sum"):
        _spec(tmp_path, secagg=True, clip_norm=0.5)
    with pytest.raises(FLError, match="without client-level DP.*2‖g₀‖"):
        _spec(tmp_path, clip_norm=0.5)
    with pytest.raises(FLError, match="without client-level DP"):
        _spec(tmp_path, clip_norm=0.5, noise_multiplier=0.8)
    with pytest.raises(FLError, match="fedavg or fedprox.*control-variate"):
        _spec(tmp_path, algorithm="scaffold")
    mlp = {"kind": "mlp", "n_features": 4, "hidden": 3, "n_classes": 2}
    with pytest.raises(FLError, match="personalization moon"):
        _spec(tmp_path, model=mlp, personalization={"kind": "moon", "mu": 1.0, "tau": 0.5})
    dpsgd = {"noise_multiplier": 1.0, "clip": 1.0, "sample_rate": 0.5, "steps": 2}
    with pytest.raises(FLError, match="local_dp_sgd"):
        _spec(tmp_path, training={"learning_rate": 0.5}, local_dp_sgd=dpsgd)
    with pytest.raises(FLError, match="root_data must be the path"):
        _spec(tmp_path, aggregator={"kind": "fltrust", "root_data": 3})
    with pytest.raises(FLError, match="root_data must be the path.*missing"):
        _spec(tmp_path, aggregator={"kind": "fltrust"})
    # what works: fedprox, ditto, perfedavg, Poisson sampling
    _spec(tmp_path, algorithm="fedprox", prox_mu=0.1)
    _spec(tmp_path, personalization={"kind": "ditto", "lam": 0.5})
    _spec(tmp_path, personalization={"kind": "perfedavg", "inner_learning_rate": 0.05, "eval_steps": 1})
    _spec(tmp_path, sampling={"kind": "poisson", "rate": 0.5})


# -- the root update -----------------------------------------------------------------------------------
def test_root_update_is_the_tasks_local_training_with_a_round_seeded_generator(tmp_path: Path) -> None:
    spec = _spec(tmp_path, algorithm="fedprox", prox_mu=0.1)
    agg = spec.build_aggregator(None)
    root = agg.inner.root  # type: ignore[attr-defined]
    assert isinstance(root, RootTraining)
    params = np.random.default_rng(3).normal(size=5).astype(np.float32)
    job_rng = np.random.default_rng(0)
    ctx = RoundContext(2, 5, job_rng, float(N_CLIENTS), params=params)
    before = job_rng.bit_generator.state
    g0 = root(ctx)
    assert job_rng.bit_generator.state == before  # the job's generator is not drawn from
    cfg = spec.build_strategy().configure(2, params)
    assert cfg.algorithm == "fedprox" and cfg.prox_mu == 0.1
    want = train_client(spec.build_model(), cfg, ROOT[0], ROOT[1], np.random.default_rng([2024, 0x524F4F54, 2]), "r")
    np.testing.assert_array_equal(g0, want.delta.astype(np.float64))
    np.testing.assert_array_equal(root(ctx), g0)  # a restart recomputes the same g₀
    other = root(dataclasses.replace(ctx, round=3))
    assert not np.array_equal(other, g0)  # another round shuffles the root batches differently
    # unseeded (production): the OS CSPRNG, two draws of 62 bits equal with probability 2⁻⁶²
    assert root_generator(None, 0).integers(2**62) != root_generator(None, 0).integers(2**62)
    with pytest.raises(FLError, match="needs the round's global model"):
        root(RoundContext(2, 5, job_rng, float(N_CLIENTS)))


def test_a_round_with_every_client_distrusted_keeps_the_model(tmp_path: Path) -> None:
    spec = _spec(tmp_path, rounds=2)

    def flip_all(r: int, ups: list[ClientUpdate]) -> list[ClientUpdate]:
        return [ClientUpdate(u.client_id, u.round, (-u.delta).astype(np.float32), u.num_examples) for u in ups]

    x, history = reference_run(spec, DATA[:N_CLIENTS], tamper=flip_all)
    assert np.array_equal(x, spec.build_model().init_params(np.random.default_rng(spec.seed)))
    assert all(h.info["trusted_clients"] == 0 for h in history)


# -- over the pipeline ---------------------------------------------------------------------------------
_attack = scaled_updates(SCALE, ATTACKERS)


def test_fltrust_task_over_the_pipeline_resists_30_percent_sign_flippers(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    data = DATA[:N_CLIENTS]
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (tr, srv, jt):
        devices = devices_for(srv.url, spec, data, scale=dict.fromkeys(ATTACKERS, SCALE))
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None
    x_fltrust = final_params(status)
    ref, ref_history = reference_run(spec, data, tamper=_attack)
    assert np.array_equal(x_fltrust, ref)  # the job's root training is the in-process one, bit for bit
    assert status["accepted"] == {"update": 40} and status["rejected"] == {}
    for h, rh in zip(status["history"], ref_history, strict=True):
        scores = h["trust_scores"]  # sorted, without client ids (the sample is not in the history)
        assert scores == sorted(rh.info["trust_scores"].values(), reverse=True)
        assert len(scores) == N_CLIENTS and scores[-len(ATTACKERS) :] == [0.0] * len(ATTACKERS)
        assert h["trusted_clients"] == N_CLIENTS - len(ATTACKERS) and h["root_update_norm"] > 0
        assert not any(c in json.dumps(h) for c in spec.clients)

    fedavg = dataclasses.replace(spec, aggregator={"kind": "fedavg"})  # type: ignore[arg-type]
    x0 = spec.build_model().init_params(np.random.default_rng(spec.seed)).astype(np.float64)
    x_clean, _ = reference_run(fedavg, data)
    x_mean, _ = reference_run(fedavg, data, tamper=_attack)
    model = spec.build_model()
    acc = {k: accuracy(model, v, X_TEST, Y_TEST) for k, v in (("clean", x_clean), ("mean", x_mean), ("ft", ref))}
    dist = {k: float(np.linalg.norm(v.astype(np.float64) - x_clean)) for k, v in (("mean", x_mean), ("ft", ref))}
    travel = float(np.linalg.norm(x_clean - x0))  # how far the clean run moved the model: the scale of "near"
    # the mean moves along −0.5 × the honest mean update ((7 − 3·4)/10): it ends further from the clean model
    # than the clean model is from the start; FLTrust ends within half of the clean run's travel
    assert dist["mean"] > travel and dist["ft"] < 0.5 * travel, (dist, travel)
    # accuracy: 96 test examples; the binomial standard error of the clean accuracy a is √(a(1 − a)/96) ≤ 0.051;
    # FLTrust stays within 2 standard errors of the clean run, the attacked mean falls below the clean one by 3
    se = max(np.sqrt(acc["clean"] * (1 - acc["clean"]) / len(Y_TEST)), 1.0 / len(Y_TEST))
    assert acc["ft"] >= acc["clean"] - 2 * se and acc["mean"] < acc["clean"] - 3 * se, (acc, se)


def test_fltrust_task_restarted_mid_run_ends_with_the_same_model(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "fltrust-restart")
    data = DATA[:N_CLIENTS]
    ref, history = reference_run(spec, data)

    def check(jt: JobThread, restored: dict[str, Any]) -> None:
        done = restored["history"]
        assert [h["trust_scores"] for h in done] == [
            sorted(h.info["trust_scores"].values(), reverse=True) for h in history[: len(done)]
        ]

    status = run_with_restart(tmp_path, spec, data, check)
    assert np.array_equal(final_params(status), ref)
    assert [h["trust_scores"] for h in status["history"]] == [
        sorted(h.info["trust_scores"].values(), reverse=True) for h in history
    ]


def test_sigkill_mid_round_the_restarted_job_recomputes_the_same_root_update(tmp_path: Path) -> None:
    """`ldp fl job` on a task file whose root_data is relative, with the 3 sign flippers: SIGKILLed in round 1
    after a mid-phase checkpoint of 9 of the 10 uploads, restarted; the new process closes the round with
    its own root training. The final model is bit-identical to the in-process run."""
    spec = _spec(tmp_path, "fltrust-kill", rounds=3)
    data = DATA[:N_CLIENTS]
    ref, _ = reference_run(spec, data, tamper=_attack)
    topics = Topics.fresh()
    url = f"sqlite:///{tmp_path}/transport.sqlite3"
    job = JobProcess(tmp_path, url, spec, topics, checkpoint_interval=0.3)
    d = spec.to_dict()
    d["aggregator"]["root_data"] = "root.npz"  # next to the task file, which JobProcess wrote into tmp_path
    job.task_file.write_text(json.dumps(d))

    def before(r: int, i: int) -> None:
        if (r, i) == (1, 9):
            job.wait_status(lambda st: st["round"] == 1 and st["received_this_round"] >= 9)
            time.sleep(0.8)  # past checkpoint_interval: the 9 uploads are in a committed mid-phase checkpoint
            job.kill9()
            job.start()

    with collector(tmp_path, url, topics) as srv:
        devices = devices_for(srv.url, spec, data, scale=dict.fromkeys(ATTACKERS, SCALE))
        job.start()
        try:
            drive_rounds(job, devices, spec.rounds, before=before)
            status = job.wait()
        finally:
            job.stop()
    assert job.kills == 1 and status["restores"] == 1  # the second process restored the mid-round checkpoint
    assert np.array_equal(final_params(status), ref)
    assert status["accepted"] == {"update": 30} and status["rejected"] == {}
    assert all(h["trusted_clients"] == N_CLIENTS - len(ATTACKERS) for h in status["history"])
