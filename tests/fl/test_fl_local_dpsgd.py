"""DP-SGD on devices inside FL (task option ``local_dp_sgd``): the device's sample-level accountant against
dp_accounting, the noise of the released updates through the real task/collector/device path, refusals."""

from __future__ import annotations

import base64
import dataclasses
import math
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant

from client_sdk.upload.uploader import HttpRequest, urllib_transport
from estimator.fl.job import AggregationJob, JobSettings
from estimator.fl.task import FLTaskSpec
from ldp_core.fl.errors import FLError
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec, SampleLevelAccountant
from ldp_core.fl.protocol import parse_upload
from tests.support.audit import device_round_audit
from tests.support.fl_pipeline_support import (
    AUTHORITY,
    devices_for,
    drive,
    running_task,
    task_spec,
)

DELTA = 1e-5
SPEC = {"noise_multiplier": 3.0, "clip": 1.0, "sample_rate": 0.2, "steps": 5}


def _one_round_pld(sigma: float, q: float, steps: int) -> Any:
    """One round's PLD, one example replaced, built with dp_accounting's PLD library directly (not its
    accountant, not our events)."""
    one = pld_lib.from_gaussian_mechanism(
        sigma,
        sensitivity=1.0,
        sampling_prob=q,
        value_discretization_interval=1e-4,
        use_connect_dots=True,
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
    )
    return one.self_compose(steps)


def _independent(one: Any, k: int, sigma: float, q: float, steps: int) -> tuple[float, float]:
    """dp_accounting's replace-one PLD ε and add/remove RDP ε of k rounds composed one after the other (not as
    the one self-composition of k·steps steps the code under test builds)."""
    total = one
    for _ in range(k - 1):
        total = total.compose(one)
    step = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
    rdp = rdp_privacy_accountant.RdpAccountant()
    for _ in range(k):
        rdp.compose(dp_event.SelfComposedDpEvent(step, steps))
    return float(total.get_epsilon_for_delta(DELTA)), float(rdp.get_epsilon(DELTA))


def test_sample_level_epsilon_is_dp_accountings_composed_figure_and_grows_with_rounds() -> None:
    spec = LocalDPSGDSpec(**SPEC)  # type: ignore[arg-type]
    task = task_spec("ldp-acc", 8, rounds=5, training={"learning_rate": 0.5}, local_dp_sgd=SPEC)
    acc = SampleLevelAccountant(DELTA)
    assert acc.epsilon() == 0.0
    eps: list[float] = []
    one = _one_round_pld(3.0, 0.2, 5)
    for k, r in enumerate((0, 2, 3), start=1):  # the rounds this device happened to join
        acc.record(r, spec)
        acc.record(r, spec)  # a round trains once: a second record does not count
        assert acc.rounds == k
        pld, rdp = _independent(one, k, 3.0, 0.2, 5)
        # PLD of one self-composition vs a list of k compositions: equal up to the discretization (1e-4 per
        # composition) of each; RDP composes exactly (a sum of the curves)
        assert acc.epsilon() == pytest.approx(pld, abs=2e-3)
        assert acc.epsilon_add_remove_rdp() == pytest.approx(rdp, rel=1e-9)
        eps.append(acc.epsilon())
    server = task.sample_level_privacy(
        3, add_remove=False
    )  # the job's figure for a device in 3 rounds is the device's own
    assert server is not None and server["epsilon"] == pytest.approx(eps[-1], rel=1e-9)
    assert eps[0] < eps[1] < eps[2] <= 3 * eps[0]  # composition costs, and no more than basic composition
    assert acc.epsilon_add_remove() < eps[-1]  # replacing an example is the stronger neighbour relation
    worst = task.sample_level_privacy(add_remove=False)
    assert worst is not None and worst["rounds"] == 5 and worst["epsilon"] > eps[-1]
    with pytest.raises(FLError, match="changed between rounds"):
        acc.record(4, dataclasses.replace(spec, noise_multiplier=2.0))


def test_epochs_mean_round_of_one_over_q_steps_each() -> None:
    s = LocalDPSGDSpec(noise_multiplier=1.0, clip=1.0, sample_rate=0.3, epochs=2)
    assert s.steps_per_round == 2 * 3
    assert s.to_dict() == {"noise_multiplier": 1.0, "clip": 1.0, "sample_rate": 0.3, "epochs": 2}


class _Recorder:
    """The device's HTTP transport (urllib) that keeps every update vector it uploads."""

    def __init__(self, payload_size: int) -> None:
        self.vectors: list[np.ndarray] = []
        self.size = payload_size

    def __call__(self, req: HttpRequest) -> Any:
        if req.method == "POST" and req.url.endswith("/uploads") and req.body is not None:
            u = parse_upload(req.body, payload_size=self.size)
            if u.kind == "update":
                self.vectors.append(np.asarray(u.payload["vector"], np.float64))
        return urllib_transport(req)


def _zero_feature_data(n_clients: int, n: int, d: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """All-zero features: every example's gradient w.r.t. the weights is 0, so what moves the weights of an
    upload is the DP-SGD noise alone (the bias still learns the labels)."""
    rng = np.random.default_rng(11)
    return [(np.zeros((n, d), np.float32), rng.integers(0, 2, n)) for _ in range(n_clients)]


@pytest.mark.parametrize("prox_mu", [None, 0.5])
def test_devices_add_dp_sgd_noise_of_the_signed_variance_to_released_updates(
    tmp_path: Path, prox_mu: float | None
) -> None:
    d, n, lr = 100, 40, 0.5
    sigma, c, q, steps = 3.0, 2.0, 0.25, 3
    algo: dict[str, Any] = {} if prox_mu is None else {"algorithm": "fedprox", "prox_mu": prox_mu}
    spec = task_spec(
        "ldp-noise" if prox_mu is None else "ldp-noise-prox",
        6,
        **algo,
        rounds=3,
        model={"kind": "logistic", "n_features": d, "l2": 0.0},
        training={"learning_rate": lr},
        clip_norm=1e3,  # client-level DP on, with a bound far above the update's norm (no clipping here)
        noise_multiplier=0.8,
        local_dp_sgd={"noise_multiplier": sigma, "clip": c, "sample_rate": q, "steps": steps},
    )
    data = _zero_feature_data(6, n, d)
    rec = _Recorder(d + 1)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (_, srv, jt):
        devices = devices_for(srv.url, spec, data)
        for i, dev in enumerate(devices):
            dev.transport = rec
            dev.dpsgd_noise_rng_for_round = lambda r, i=i: np.random.default_rng([77, r, i])
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None and status["rounds"] == 3
    assert len(rec.vectors) == 3 * 4  # 4 of 6 devices per round
    w = np.concatenate([v[:d] for v in rec.vectors])
    # each weight coordinate: Σ_t −η·N(0, σ²c²)/(qN) over T steps, so Var = T·η²·σ²·c²/(qN)². With FedProx's
    # μ each step is w − θ₀ ← (1 − ημ)(w − θ₀) − η·noise (the weights' data gradient is 0), so the T noises
    # are damped by (1 − ημ)^k, k = 0 … T − 1: Var = η²σ²c²/(qN)²·Σ_k (1 − ημ)^(2k), 0.63 × the FedAvg figure
    damp = 1.0 - lr * (prox_mu or 0.0)
    var = sum(damp ** (2 * k) for k in range(steps)) * lr**2 * sigma**2 * c**2 / (q * n) ** 2
    m = w.size  # 1200 independent zero-mean normals
    s2 = float(np.mean(w**2))
    # the sample second moment has standard error var·√(2/m) (χ²_m/m): 4 of them is ±16 %, where a missing c
    # (×1/4), a missing η or dividing by N instead of qN (×1/16) are far outside
    assert abs(s2 - var) < 4 * var * math.sqrt(2 / m)
    assert abs(float(np.mean(w))) < 4 * math.sqrt(var / m)
    # the device's own ledger: the rounds it was selected in, and the task's figure for that many rounds
    figures: dict[int, float] = {}
    for dev in devices:
        joined = dev.uploads
        rep = dev.sample_level_privacy()
        if joined == 0:
            assert rep is None
            continue
        assert rep is not None and rep["rounds"] == joined
        if joined not in figures:
            fig = spec.sample_level_privacy(joined, add_remove=False)
            assert fig is not None
            figures[joined] = fig["epsilon"]
        assert rep["epsilon"] == pytest.approx(figures[joined], rel=1e-9)
    assert sum(dev.uploads for dev in devices) == 12
    # the job states the worst case (a device in every round) beside the client-level ε
    sl = status["sample_level"]
    assert sl["rounds"] == 3 and sl["task_rounds"] == 3 and sl["epsilon"] == sl["epsilon_task"]
    if 3 in figures:
        assert sl["epsilon"] == pytest.approx(figures[3], rel=1e-9)
    assert sl["epsilon_per_round"] < sl["epsilon"] and status["epsilon"] is not None


def test_without_the_option_the_weights_do_not_move(tmp_path: Path) -> None:
    """The control: the same zero-feature task with plain local SGD uploads exactly zero weight deltas."""
    d = 20
    spec = task_spec(
        "ldp-plain",
        6,
        rounds=1,
        model={"kind": "logistic", "n_features": d, "l2": 0.0},
        clip_norm=1e3,
        noise_multiplier=0.8,
    )
    rec = _Recorder(d + 1)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (_, srv, jt):
        devices = devices_for(srv.url, spec, _zero_feature_data(6, 40, d))
        for dev in devices:
            dev.transport = rec
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None and status["sample_level"] is None
    assert len(rec.vectors) == 4
    assert all(np.all(v[:d] == 0.0) and v[d] != 0.0 for v in rec.vectors)
    assert all(dev.sample_level_privacy() is None for dev in devices)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"algorithm": "scaffold"}, "runs with algorithm fedavg or fedprox"),
        ({"personalization": {"kind": "ditto", "lam": 0.1}}, "cannot run with personalization"),
        ({"training": {"epochs": 2, "learning_rate": 0.1}}, "takes only learning_rate"),
        ({"local_dp_sgd": {**SPEC, "noise_multiplier": 0}}, "no sample-level DP"),
        ({"local_dp_sgd": {**SPEC, "epochs": 1}}, "exactly one of steps"),
        ({"local_dp_sgd": {k: v for k, v in SPEC.items() if k != "steps"}}, "exactly one of steps"),
        ({"local_dp_sgd": {"noise_multiplier": 1.0, "clip": 1.0, "steps": 3}}, "sample_rate missing"),
        ({"local_dp_sgd": {**SPEC, "sample_rate": 1.5}}, r"sample_rate must be a number in \(0, 1\]"),
        ({"local_dp_sgd": {**SPEC, "clip": -1}}, "clip must be a finite number > 0"),
        ({"local_dp_sgd": {**SPEC, "steps": 0}}, "steps must be an integer >= 1"),
        ({"local_dp_sgd": {**SPEC, "batch_size": 8}}, r"no options \['batch_size'\]"),
        ({"local_dp_sgd": [1, 2]}, "must be an object"),
    ],
)
def test_task_refuses_incompatible_local_dp_sgd(kw: dict[str, Any], match: str) -> None:
    base: dict[str, Any] = {"training": {"learning_rate": 0.1}, "local_dp_sgd": SPEC}
    base.update(kw)
    if "algorithm" in kw:
        base["prox_mu"] = 0.1
    with pytest.raises(FLError, match=match):
        task_spec("ldp-bad", 8, **base)


def test_the_job_refuses_an_unsigned_local_dp_sgd_task() -> None:
    spec = task_spec("ldp-unsigned", 8, training={"learning_rate": 0.1}, local_dp_sgd=SPEC, task_signature=None)
    with pytest.raises(FLError, match="needs task_signature"):
        AggregationJob(object(), spec, JobSettings(group="g"))  # type: ignore[arg-type]


def _view_for(spec: FLTaskSpec, signature: str | None) -> dict[str, Any]:
    from ldp_core.fl.protocol import encode_vector

    model = spec.build_model()
    return {
        "round": 0,
        "num_params": model.num_params,
        "params": encode_vector(np.zeros(model.num_params, np.float32)),
        "algorithm": "fedavg",
        "training": {"epochs": 1, "batch_size": 32, "learning_rate": 0.1, "max_steps": None},
        "prox_mu": 0.0,
        "model": dict(spec.model),
        "clip_norm": spec.device_clip_norm,
        "task_config": None if signature is None else {"config": spec.signed_config(), "signature": signature},
    }


def test_a_device_refuses_local_dp_sgd_it_cannot_verify() -> None:
    from ldp_core.tokens.enrollment import EnrollmentAuthority
    from tests.support.fl_pipeline_support import enroll

    spec = task_spec("ldp-dev", 4, training={"learning_rate": 0.1}, local_dp_sgd=SPEC)
    X, y = np.zeros((10, 4), np.float32), np.zeros(10, np.int64)
    from client_sdk.fl.device import FLDevice

    dev = FLDevice("http://127.0.0.1:9", spec.task, "dev-0", X, y, identity=enroll("dev-0"))
    assert spec.task_signature is not None
    dev._train(_view_for(spec, spec.task_signature))  # the authority's signature: trains under DP-SGD
    assert dev.sample_accountant is not None and dev.sample_accountant.rounds == 1
    # a configuration the server weakened (σ lowered) under the old signature
    weak = dataclasses.replace(spec, local_dp_sgd={**SPEC, "noise_multiplier": 0.1})
    with pytest.raises(FLError, match="not signed"):
        dev._train(_view_for(weak, spec.task_signature))
    # signed by another authority
    other = EnrollmentAuthority.generate()
    forged = base64.b64encode(other.sign_document(weak.signed_config())).decode()
    with pytest.raises(FLError, match="not signed"):
        dev._train(_view_for(weak, forged))
    assert dev.sample_accountant.rounds == 1
    # a device that insists on sample-level DP refuses a round without it
    strict = FLDevice(
        "http://127.0.0.1:9", spec.task, "dev-0", X, y, identity=enroll("dev-0"), require_local_dp_sgd=True
    )
    with pytest.raises(FLError, match="requires"):
        strict._train(_view_for(spec, None))
    assert AUTHORITY is not None


# -- empirical privacy audit of the device's release -------------------------------------------------------
def _audit_device(sigma_run: float, trials: int, seed: int, steps: int = 1, prox_mu: float = 0.0) -> float:
    """:func:`device_round_audit` of the numpy device's round (:func:`train_local_dpsgd`)."""
    from ldp_core.fl.local_dpsgd import train_local_dpsgd
    from ldp_core.fl.models import LogisticRegression

    model = LogisticRegression(3, l2=0.0)

    def train(cfg: Any, X: np.ndarray, y: np.ndarray, spec: Any, srng: Any, nrng: Any) -> np.ndarray:
        return train_local_dpsgd(model, cfg, X, y, spec, srng, nrng, "c").delta

    return device_round_audit(train, sigma_run, trials, seed, steps, prox_mu)


def test_audit_of_a_devices_round_stays_within_the_replace_one_epsilon() -> None:
    from estimator.accounting.accountant import account

    claimed = account(LocalDPSGDSpec(2.0, 1.0, 1.0, steps=1).event(1), DELTA, "replace").epsilon_pld
    assert claimed is not None
    lower = _audit_device(2.0, trials=4000, seed=21)
    assert lower <= claimed
    # the attack is real (a Gaussian with μ = 2c/σc = 1 at δ = 1e-5 cannot show much more on 2,000 test draws
    # per world: Clopper-Pearson on a false-positive rate near 1 % caps the bound)
    assert lower > 0.5
    # power: a device adding σ/4 of the noise the accountant charges for is caught
    assert _audit_device(0.5, trials=4000, seed=22) > claimed


def test_audit_of_a_fedprox_round_stays_within_the_same_epsilon() -> None:
    """Two DP-SGD steps with FedProx's pull μ·(θ − θ₀) (nonzero at the second step): the proximal term is a
    function of θ and the public θ₀, so the round's ε is the two Gaussian steps' alone."""
    from estimator.accounting.accountant import account

    claimed = account(LocalDPSGDSpec(2.0, 1.0, 1.0, steps=2).event(1), DELTA, "replace").epsilon_pld
    assert claimed is not None
    lower = _audit_device(2.0, trials=4000, seed=23, steps=2, prox_mu=0.5)
    assert 0.5 < lower <= claimed


def test_local_dp_sgd_under_secagg_trains_every_survivor_once(tmp_path: Path) -> None:
    """The SecAgg path trains in its masked phase: every device that took part holds one round in its ledger."""
    spec = task_spec(
        "ldp-secagg",
        5,
        rounds=1,
        training={"learning_rate": 0.5},
        secagg=True,
        local_dp_sgd={"noise_multiplier": 3.0, "clip": 1.0, "sample_rate": 0.5, "steps": 2},
    )
    from tests.support.fl_pipeline_support import make_data

    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (_, srv, jt):
        devices = devices_for(srv.url, spec, make_data(5))
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None and status["history"] and "failed" not in status["history"][-1]
    trained = [d for d in devices if d.sample_accountant is not None]
    assert len(trained) == 4 and all(d.sample_accountant.rounds == 1 for d in trained)  # type: ignore[union-attr]
    assert status["sample_level"]["rounds"] == 1
