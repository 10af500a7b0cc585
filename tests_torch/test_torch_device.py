"""DP-SGD on devices with PyTorch modules (client_sdk.fl.torch_device, task option ``local_dp_sgd``).

Run with ``scripts/test-torch``. A torch device must release what a numpy device releases: the
same mechanism on the same task vector, so with the same generators the same update to float32
rounding (the clipped sums come from torch's ghost clipping or ``torch.func`` per-sample
gradients instead of numpy's closed forms; measured differences are a few 1e-8); its noise must
have the variance the spec charges for; one round must pass an empirical privacy audit at the
replace-one ε; and over the real collector and job, torch devices must end where the in-process
numpy run ends, with the same sample-level ledger."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from client_sdk.fl.device import FLDevice, SampleBudgetExceeded
from client_sdk.fl.device_store import FLDeviceStore
from client_sdk.fl.torch_adapter import TorchModel
from client_sdk.fl.torch_device import TorchDeviceModel, train_torch_dpsgd_task, train_torch_local_dpsgd
from estimator.fl.task import FLTaskSpec
from ldp_core.fl.dpsgd import DPSGDConfig, train_dpsgd
from ldp_core.fl.errors import FLError, ModelError
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec, SampleLevelAccountant, train_local_dpsgd
from ldp_core.fl.protocol import encode_vector, model_from_dict
from ldp_core.fl.training import LocalTraining, RoundConfig
from tests.support.fl_pipeline_support import (
    device_rng,
    devices_for,
    drive,
    enroll,
    final_params,
    reference_run,
    running_task,
    task_spec,
)

torch.set_num_threads(1)

DELTA = 1e-5
MODELS = {
    "logistic": {"kind": "logistic", "n_features": 5, "l2": 0.01},
    "softmax": {"kind": "softmax", "n_features": 5, "n_classes": 3, "l2": 0.01},
    "mlp": {"kind": "mlp", "n_features": 5, "hidden": 4, "n_classes": 3, "activation": "tanh", "l2": 0.01},
}


def _data(kind: str, n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    return X, rng.integers(0, 2 if kind == "logistic" else 3, n)


def _start(kind: str, seed: int) -> np.ndarray:
    m = model_from_dict(MODELS[kind])
    rng = np.random.default_rng(seed)
    return (m.init_params(rng) + rng.normal(scale=0.3, size=m.num_params)).astype(np.float32)


# -- the layout ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_module_is_the_task_model_in_the_tasks_layout(kind: str) -> None:
    """Loss and gradient at the same task vector equal the numpy model's (float32: rtol 1e-5, a few ulps of
    sums over 60 rows), and the permutation round-trips."""
    tdm = TorchDeviceModel.for_task_model(MODELS[kind])
    ref = model_from_dict(MODELS[kind])
    X, y = _data(kind, 60, 5, 1)
    p = _start(kind, 2)
    assert np.array_equal(tdm.to_task(tdm.to_torch(p)), p)
    l_ref, g_ref = ref.loss_and_grad(p, X, y)
    loss, g = tdm.loss_and_grad(p, X, y)
    assert loss == pytest.approx(l_ref, rel=1e-5)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(tdm.predict(p, X), ref.predict(p, X))


def test_softmax_weights_are_transposed_into_the_linear_layer() -> None:
    tdm = TorchDeviceModel.for_task_model(MODELS["softmax"])
    p = np.arange(18, dtype=np.float32)
    tdm.torch_model.load_into(tdm.to_torch(p))
    lin = tdm.torch_model.module
    np.testing.assert_array_equal(lin.weight.detach().numpy(), p[:15].reshape(5, 3).T)
    np.testing.assert_array_equal(lin.bias.detach().numpy(), p[15:])


def test_a_module_of_ones_own_in_the_tasks_order_trains_like_the_named_model() -> None:
    """``TorchDeviceModel(TorchModel(module), task_model)`` with no permutation: a ``Sequential`` holding one
    ``nn.Linear(d, 1)`` is the logistic model's layout (w, then b); its DP-SGD steps equal numpy's."""
    module = torch.nn.Sequential(torch.nn.Linear(5, 1))
    tdm = TorchDeviceModel(TorchModel(module, "binary", l2=0.01), MODELS["logistic"])
    X, y = _data("logistic", 40, 5, 13)
    p0 = _start("logistic", 14)
    cfg = DPSGDConfig(1.0, 0.5, 0.3, 0.2)
    ref = model_from_dict(MODELS["logistic"])
    a = train_dpsgd(ref, p0, X, y, cfg, 8, np.random.default_rng(1), np.random.default_rng(2))
    b = train_torch_dpsgd_task(tdm, p0, X, y, cfg, 8, np.random.default_rng(1), np.random.default_rng(2))
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)


def test_bad_modules_and_models_are_refused() -> None:
    with pytest.raises(ModelError, match="parameters"):
        TorchDeviceModel(TorchModel(torch.nn.Linear(4, 1), "binary"), MODELS["logistic"])  # 5 + 1 needed
    with pytest.raises(ModelError, match="l2"):
        TorchDeviceModel(TorchModel(torch.nn.Linear(5, 1), "binary", l2=0.5), MODELS["logistic"])
    frozen = torch.nn.Linear(5, 1)
    frozen.bias.requires_grad_(False)
    with pytest.raises(ModelError, match="frozen"):
        TorchDeviceModel(TorchModel(frozen, "binary", l2=0.01), MODELS["logistic"])
    with pytest.raises(ModelError, match="permutation"):
        TorchDeviceModel(TorchModel(torch.nn.Linear(5, 1), "binary", l2=0.01), MODELS["logistic"], np.zeros(6))
    with pytest.raises(FLError, match="not the one"):
        TorchDeviceModel.for_task_model(MODELS["logistic"]).for_view({**MODELS["logistic"], "l2": 0.0})


# -- (1) the same release as the numpy device ---------------------------------------------------------------
@pytest.mark.parametrize("method", ["ghost", "vmap"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_dpsgd_steps_equal_the_numpy_path_with_the_same_generators(kind: str, method: str) -> None:
    """Noise off (σ = 0: clipping and Poisson batches only) and noise on: 12 steps from the same task vector
    with the same sample and noise generators end within 1e-5 of numpy's train_dpsgd (float32 rounding; an
    unclipped, wrongly scaled or mis-permuted step is off by > 1e-2)."""
    ref = model_from_dict(MODELS[kind])
    tdm = TorchDeviceModel.for_task_model(MODELS[kind], method=method)  # type: ignore[arg-type]
    X, y = _data(kind, 40, 5, 3)
    p0 = _start(kind, 4)
    for sigma in (0.0, 1.5):
        cfg = DPSGDConfig(sigma, 0.5, 0.3, 0.2)
        a = train_dpsgd(ref, p0, X, y, cfg, 12, np.random.default_rng(5), np.random.default_rng(6))
        b = train_torch_dpsgd_task(tdm, p0, X, y, cfg, 12, np.random.default_rng(5), np.random.default_rng(6))
        assert float(np.max(np.abs(a - p0))) > 0.05  # it trained
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)


def test_a_device_round_equals_the_numpy_devices_round() -> None:
    spec = LocalDPSGDSpec(noise_multiplier=2.0, clip=0.8, sample_rate=0.25, steps=6)
    cfg = RoundConfig(3, _start("softmax", 7), "fedavg", LocalTraining(learning_rate=0.4))
    X, y = _data("softmax", 48, 5, 8)
    tdm = TorchDeviceModel.for_task_model(MODELS["softmax"])
    ref = model_from_dict(MODELS["softmax"])
    a = train_local_dpsgd(ref, cfg, X, y, spec, np.random.default_rng(1), np.random.default_rng(2), "c")
    b = train_torch_local_dpsgd(tdm, cfg, X, y, spec, np.random.default_rng(1), np.random.default_rng(2), "c")
    assert (b.client_id, b.round, b.num_examples) == ("c", 3, 48)
    np.testing.assert_allclose(b.delta, a.delta, atol=1e-6, rtol=0)
    # FedProx: the same pull μ·(θ − θ₀) on both paths (it moves the update: μ·η·T is not small here)
    px = RoundConfig(3, cfg.params, "fedprox", LocalTraining(learning_rate=0.4), prox_mu=0.5)
    a = train_local_dpsgd(ref, px, X, y, spec, np.random.default_rng(1), np.random.default_rng(2), "c")
    b = train_torch_local_dpsgd(tdm, px, X, y, spec, np.random.default_rng(1), np.random.default_rng(2), "c")
    np.testing.assert_allclose(b.delta, a.delta, atol=1e-6, rtol=0)
    plain = train_local_dpsgd(ref, cfg, X, y, spec, np.random.default_rng(1), np.random.default_rng(2), "c")
    assert float(np.max(np.abs(a.delta - plain.delta))) > 1e-3
    with pytest.raises(FLError, match="fedavg or fedprox"):
        sc = RoundConfig(3, cfg.params, "scaffold", LocalTraining(learning_rate=0.4), control=np.zeros_like(cfg.params))
        train_torch_local_dpsgd(tdm, sc, X, y, spec, np.random.default_rng(1), np.random.default_rng(2), "c")


def test_the_noise_has_the_charged_variance() -> None:
    """One DP-SGD step per trial through the torch device's round, minus numpy's noiseless step on the same
    Poisson batch (same sample generator, σ = 0): the residual divided by −η is the noise N(0, σ²c²)/(qN) per
    coordinate. Over m = 60 trials × 18 coordinates the sample second moment S² of independent zero-mean
    normals has mS²/v ~ χ²_m, so S²/v − 1 has standard deviation √(2/m) = 0.054; we allow 4 of them (±0.22).
    A missing c (c² = 0.49), a divisor N instead of qN (×1/4) or a missing η fail by more than twice that."""
    sigma, c, q, lr, n = 1.5, 0.7, 0.5, 0.3, 40
    spec = LocalDPSGDSpec(noise_multiplier=sigma, clip=c, sample_rate=q, steps=1)
    tdm = TorchDeviceModel.for_task_model(MODELS["softmax"])
    ref = model_from_dict(MODELS["softmax"])
    X, y = _data("softmax", n, 5, 9)
    p0 = _start("softmax", 10)
    cfg = RoundConfig(0, p0, "fedavg", LocalTraining(learning_rate=lr))
    quiet = DPSGDConfig(0.0, c, q, lr)
    res = []
    for s in range(60):
        up = train_torch_local_dpsgd(
            tdm, cfg, X, y, spec, np.random.default_rng([s, 0]), np.random.default_rng([s, 1]), "c"
        )
        w0 = train_dpsgd(ref, p0, X, y, quiet, 1, np.random.default_rng([s, 0]), np.random.default_rng(0))
        res.append((p0 + up.delta.astype(np.float64) - w0) / -lr)
    e = np.concatenate(res)
    v = (sigma * c / (q * n)) ** 2
    m = e.size
    assert abs(float(np.mean(e**2)) / v - 1.0) < 4 * math.sqrt(2 / m)
    assert abs(float(np.mean(e))) < 4 * math.sqrt(v / m)  # zero mean: the standard error of the mean is √(v/m)


# -- (2) empirical privacy audit ------------------------------------------------------------------------------
def _audit(sigma_run: float, trials: int, seed: int) -> float:
    """:func:`tests.support.audit.device_round_audit` of one torch device round (one step, q = 1, through
    train_torch_local_dpsgd), as the numpy device's audit in tests/fl/test_fl_local_dpsgd.py."""
    from tests.support.audit import device_round_audit

    tdm = TorchDeviceModel.for_task_model({"kind": "logistic", "n_features": 3, "l2": 0.0})

    def train(cfg: Any, X: np.ndarray, y: np.ndarray, spec: Any, srng: Any, nrng: Any) -> np.ndarray:
        return train_torch_local_dpsgd(tdm, cfg, X, y, spec, srng, nrng, "c").delta

    return device_round_audit(train, sigma_run, trials, seed)


def test_audit_of_a_torch_devices_round_stays_within_the_replace_one_epsilon() -> None:
    from estimator.accounting.accountant import account

    claimed = account(LocalDPSGDSpec(2.0, 1.0, 1.0, steps=1).event(1), DELTA, "replace").epsilon_pld
    assert claimed is not None
    lower = _audit(2.0, trials=4000, seed=31)
    assert lower <= claimed
    assert lower > 0.5  # the attack is real (μ = 2c/σc = 1: 2,000 test draws a world cannot show much more)
    # power: a module adding σ/4 of the charged noise is caught
    assert _audit(0.5, trials=2000, seed=32) > claimed


# -- the device: the same spend step, the same ledger ------------------------------------------------------------
D, K = 4, 3
DEV_SPEC = {"noise_multiplier": 2.0, "clip": 1.0, "sample_rate": 0.25, "steps": 4}
SOFTMAX = {"kind": "softmax", "n_features": D, "n_classes": K, "l2": 0.0}


def _softmax_data(n_clients: int, n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=1.5, size=(K, D))
    out = []
    for _ in range(n_clients):
        y = rng.integers(0, K, n)
        out.append(((centers[y] + rng.normal(size=(n, D))).astype(np.float32), y))
    return out


def _view(spec: FLTaskSpec, params: np.ndarray, r: int = 0) -> dict[str, Any]:
    assert spec.task_signature is not None
    return {
        "round": r,
        "num_params": params.size,
        "params": encode_vector(params),
        "algorithm": "fedavg",
        "training": {"epochs": 1, "batch_size": 32, "learning_rate": 0.3, "max_steps": None},
        "prox_mu": 0.0,
        "model": dict(spec.model),
        "clip_norm": spec.device_clip_norm,
        "task_config": {"config": spec.signed_config(), "signature": spec.task_signature},
    }


def _device(
    spec: FLTaskSpec, X: np.ndarray, y: np.ndarray, torch_dev: bool, noise_seed: int | None, **kw: Any
) -> FLDevice:
    return FLDevice(
        "http://127.0.0.1:9",
        spec.task,
        "dev-0",
        X,
        y,
        identity=enroll("dev-0"),
        rng_for_round=lambda r: np.random.default_rng([1, r]),
        dpsgd_noise_rng_for_round=None if noise_seed is None else (lambda r: np.random.default_rng([noise_seed, r])),
        torch_model=TorchDeviceModel.for_task_model(spec.model) if torch_dev else None,
        **kw,
    )


def test_a_torch_device_spends_and_releases_like_a_numpy_device(tmp_path: Path) -> None:
    spec = task_spec("tdev", 4, model=SOFTMAX, training={"learning_rate": 0.3}, local_dp_sgd=DEV_SPEC)
    ((X, y),) = _softmax_data(1, 40, 3)
    p = np.random.default_rng(4).normal(scale=0.2, size=(D + 1) * K).astype(np.float32)
    numpy_dev = _device(spec, X, y, False, 9)
    torch_dev = _device(spec, X, y, True, 9, storage_dir=tmp_path / "store")
    a, n_a, _ = numpy_dev._train(_view(spec, p))
    b, n_b, _ = torch_dev._train(_view(spec, p))
    assert n_a == n_b == 40
    assert float(np.max(np.abs(a))) > 1e-3
    np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    # the same ledger: one round, the same replace-one ε (dp_accounting's PLD on the same event)
    assert numpy_dev.sample_accountant is not None and torch_dev.sample_accountant is not None
    assert torch_dev.sample_accountant.rounds == numpy_dev.sample_accountant.rounds == 1
    eps = torch_dev.sample_accountant.epsilon()
    assert eps == numpy_dev.sample_accountant.epsilon() > 0
    fig = spec.sample_level_privacy(1, add_remove=False)
    assert fig is not None and eps == pytest.approx(fig["epsilon"], rel=1e-9)
    # spend before send: the row is on disk, and a restarted torch device does not train the round again
    torch_dev.close()
    stored = FLDeviceStore(tmp_path / "store").ledger(spec.task)
    assert stored is not None and stored.recorded_rounds == {0}
    again = _device(spec, X, y, True, 9, storage_dir=tmp_path / "store")
    with pytest.raises(FLError, match="already"):
        again._train(_view(spec, p))
    again.close()


def test_a_torch_device_respects_the_cap_and_refuses_another_model() -> None:
    spec = task_spec("tdev-cap", 4, model=SOFTMAX, training={"learning_rate": 0.3}, local_dp_sgd=DEV_SPEC)
    ((X, y),) = _softmax_data(1, 40, 5)
    p = np.zeros((D + 1) * K, np.float32)
    one = SampleLevelAccountant(DELTA).with_round(0, LocalDPSGDSpec(**DEV_SPEC)).epsilon()  # type: ignore[arg-type]
    capped = _device(spec, X, y, True, 9, max_sample_epsilon=0.9 * one)
    before = capped.torch_model.torch_model.current_params()
    with pytest.raises(SampleBudgetExceeded):
        capped._train(_view(spec, p))
    assert capped.sample_accountant is None  # nothing spent
    np.testing.assert_array_equal(capped.torch_model.torch_model.current_params(), before)  # nothing trained
    other = task_spec(
        "tdev-cap", 4, model={**SOFTMAX, "l2": 0.1}, training={"learning_rate": 0.3}, local_dp_sgd=DEV_SPEC
    )
    dev = _device(spec, X, y, True, 9)
    with pytest.raises(FLError, match="not the one"):
        dev._train(_view(other, p))
    assert dev.sample_accountant is None  # refused before the spend step: nothing recorded


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox"])
def test_plain_rounds_train_on_torch_gradients_like_the_numpy_device(algorithm: str) -> None:
    """Without local_dp_sgd a torch device runs train_client's minibatch SGD on the module's gradients: the
    same batches (the same training generator) give the numpy device's update to float32 rounding; MOON
    (which needs the numpy MLP's hidden layer) is refused by name."""
    spec = task_spec("tdev-plain", 4, model=SOFTMAX, training={"epochs": 2, "batch_size": 8, "learning_rate": 0.3})
    ((X, y),) = _softmax_data(1, 40, 11)
    p = np.random.default_rng(12).normal(scale=0.2, size=(D + 1) * K).astype(np.float32)
    view = {
        **_view(spec, p),
        "task_config": None,
        "algorithm": algorithm,
        "prox_mu": 0.1 if algorithm == "fedprox" else 0.0,
    }
    view["training"] = {"epochs": 2, "batch_size": 8, "learning_rate": 0.3, "max_steps": None}
    a, _, _ = _device(spec, X, y, False, 9)._train(view)
    b, _, _ = _device(spec, X, y, True, 9)._train(view)
    assert float(np.max(np.abs(a))) > 1e-2
    np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    moon = {**view, "algorithm": "fedavg", "prox_mu": 0.0, "personalization": {"kind": "moon", "mu": 1.0}}
    with pytest.raises(ModelError, match="MOON"):
        _device(spec, X, y, True, 9)._train(moon)


def test_the_task_model_is_compared_with_its_defaults_filled_in() -> None:
    tdm = TorchDeviceModel.for_task_model({"kind": "logistic", "n_features": 5})
    assert tdm.for_view({"kind": "logistic", "n_features": 5, "l2": 0.0}) is tdm
    with pytest.raises(FLError, match="not the one"):
        tdm.for_view({"kind": "logistic", "n_features": 6, "l2": 0.0})


def test_without_a_fixed_generator_the_noise_comes_from_the_csprng() -> None:
    """The training generator fixed, the DP-SGD noise from the device's default: the OS CSPRNG
    (``secure_generator``), so two runs on the same batches differ in every coordinate, while two runs with
    the same fixed noise generator agree bit for bit."""
    from ldp_core.randomness import UrandomBitGenerator

    spec = task_spec("tdev-rng", 4, model=SOFTMAX, training={"learning_rate": 0.3}, local_dp_sgd=DEV_SPEC)
    ((X, y),) = _softmax_data(1, 40, 6)
    p = np.zeros((D + 1) * K, np.float32)
    dev = _device(spec, X, y, True, None)
    assert isinstance(dev.dpsgd_noise_rng_for_round(0).bit_generator, UrandomBitGenerator)
    a, _, _ = dev._train(_view(spec, p))
    b, _, _ = _device(spec, X, y, True, None)._train(_view(spec, p))
    c, _, _ = _device(spec, X, y, True, 4)._train(_view(spec, p))
    d, _, _ = _device(spec, X, y, True, 4)._train(_view(spec, p))
    assert np.array_equal(c, d)
    assert float(np.min(np.abs(a - b))) > 0


# -- (3) end to end: torch devices over the real collector and job -----------------------------------------------
def test_torch_devices_over_the_collector_and_job_end_where_the_numpy_run_ends(tmp_path: Path) -> None:
    """3 rounds of a softmax task with local_dp_sgd and DP-FedAvg, 5 enrolled torch devices (3 a round). Each
    device draws its batches and its DP-SGD noise from one generator per round, as the in-process run does,
    so the job's final model equals :func:`reference_run`'s with numpy clients to float32 rounding; each
    device's ledger holds the rounds it uploaded in, at the task's figure for that many rounds."""
    spec = task_spec(
        "tdev-e2e",
        5,
        model=SOFTMAX,
        rounds=3,
        sampling={"kind": "fixed", "count": 3},
        training={"learning_rate": 0.3},
        local_dp_sgd=DEV_SPEC,
    )
    data = _softmax_data(5, 30, 7)
    ref, _ = reference_run(spec, data)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (_, srv, jt):
        devices = devices_for(srv.url, spec, data)
        for i, dev in enumerate(devices):
            cache: dict[int, np.random.Generator] = {}

            def shared(r: int, i: int = i, cache: dict[int, np.random.Generator] = cache) -> np.random.Generator:
                return cache.setdefault(r, device_rng(i, r))

            dev.rng_for_round = shared
            dev.dpsgd_noise_rng_for_round = shared
            dev.torch_model = TorchDeviceModel.for_task_model(spec.model)
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None and status["rounds"] == 3
    got = final_params(status)
    assert float(np.max(np.abs(ref))) > 0.05  # the model moved
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    assert sum(d.uploads for d in devices) == 9
    for dev in devices:
        rep = dev.sample_level_privacy()
        if dev.uploads == 0:
            assert rep is None
            continue
        assert rep is not None and rep["rounds"] == dev.uploads
        fig = spec.sample_level_privacy(dev.uploads, add_remove=False)
        assert fig is not None and rep["epsilon"] == pytest.approx(fig["epsilon"], rel=1e-9)
    assert status["sample_level"]["rounds"] == 3


def test_torch_devices_under_secagg_train_every_survivor_once(tmp_path: Path) -> None:
    """SecAgg trains in its masked phase, through the same dispatch: every torch device that took part holds
    exactly one round in its ledger, and the job completes the round."""
    spec = task_spec(
        "tdev-secagg",
        5,
        model=SOFTMAX,
        rounds=1,
        training={"learning_rate": 0.3},
        secagg=True,
        local_dp_sgd=DEV_SPEC,
    )
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (_, srv, jt):
        devices = devices_for(srv.url, spec, _softmax_data(5, 30, 13))
        for dev in devices:
            dev.torch_model = TorchDeviceModel.for_task_model(spec.model)
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None and status["history"] and "failed" not in status["history"][-1]
    trained = [d for d in devices if d.sample_accountant is not None]
    assert len(trained) == 4 and all(d.sample_accountant.rounds == 1 for d in trained)  # type: ignore[union-attr]
    # nothing refused or failed (a 404 before the job published the task is the only error allowed)
    assert all(k.startswith("fetch_") for d in devices for k in d.errors), [dict(d.errors) for d in devices]
    assert status["sample_level"]["rounds"] == 1
