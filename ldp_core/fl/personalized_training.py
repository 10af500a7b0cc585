"""Device-side personalization: Ditto, Per-FedAvg and MOON local updates.

All three keep FedAvg's server step (x ← x + η_g Δ̄) and change what a device
does with its data; the spec of each (:mod:`ldp_core.fl.personalization`) is a
frozen value that rides on the :class:`~ldp_core.fl.training.RoundConfig`
(``personalization``) with ``algorithm = "fedavg"``.

* Ditto (Li, Hu, Beirami, Smith, "Ditto: fair and robust federated learning
  through personalization", ICML 2021, Algorithm 1): the device uploads
  FedAvg's update of the global model w and, besides, trains its own model
  v_k on F_k(v) + (λ/2)‖v − w‖², keeping v_k on the device
  (:attr:`ClientState.personal <ldp_core.fl.training.ClientState>`). Each step
  is the proximal-gradient step v ← (v − η g(v) + ηλ w)/(1 + ηλ), which agrees
  with Ditto's v − η(g(v) + λ(v − w)) to first order in ηλ and stays stable for
  every λ: λ = 0 is plain local SGD on v, λ → ∞ pins v to w.
  v_k starts as the global model of the client's first round.
* Per-FedAvg (Fallah, Mokhtari, Ozdaglar, "Personalized federated learning
  with theoretical guarantees: a model-agnostic meta-learning approach",
  NeurIPS 2020, the first-order variant FO of §5): the local step is
  w ← w − β ∇f(w − α ∇f(w; D); D′) on two independent batches D, D′ (the
  MAML gradient with the Hessian term dropped). The global model is an
  initialization: a device personalizes it by a few SGD steps of size α on
  its own data before use (:func:`personalized_params`).
* MOON (Li, He, Song, "Model-contrastive federated learning", CVPR 2021, Eq. 3-4):
  the local loss is cross-entropy plus μ ℓ_con with, per example,
  ℓ_con = −log(e^{a/τ} / (e^{a/τ} + e^{b/τ})) = log(1 + e^{(b − a)/τ}),
  a = cos(z, z_glob), b = cos(z, z_prev): z is the representation (the MLP's
  hidden layer) under the model being trained, z_glob under the round's global
  model, z_prev under this device's previous local model
  (:attr:`ClientState.previous <ldp_core.fl.training.ClientState>`; the global
  model on a first round, where ℓ_con is the constant log 2). The model is the
  global one; MOON personalizes nothing at evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from ldp_core.fl.errors import ModelError
from ldp_core.fl.models import MLP, Model, _work
from ldp_core.fl.personalization import DittoSpec, MoonSpec, PerFedAvgSpec, Personalization
from ldp_core.fl.training import ClientState, ClientUpdate, LocalTraining, RoundConfig, local_sgd

__all__ = [
    "ditto_personal_sgd",
    "first_order_meta_gradient",
    "perfedavg_local",
    "representation",
    "moon_loss_and_grad",
    "moon_local",
    "train_personalized",
    "personalized_params",
]


def _batches(n: int, training: LocalTraining, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """The batches of ``training.epochs`` shuffled passes, drawn lazily as
    :func:`~ldp_core.fl.training.local_sgd` draws them (same generator use)."""
    for _ in range(training.epochs):
        order = rng.permutation(n)
        for s in range(0, n, training.batch_size):
            yield order[s : s + training.batch_size]


def ditto_personal_sgd(
    model: Model,
    personal: np.ndarray,
    global_params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    training: LocalTraining,
    lam: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Ditto's personal-model update: from ``personal``, proximal SGD steps on
    F_k(v) + (λ/2)‖v − w‖², v ← (v − η g(v) + ηλ w)/(1 + ηλ), with the batches and
    step count of :func:`~ldp_core.fl.training.local_sgd`."""
    w = np.asarray(global_params, dtype=np.float32)
    v = np.asarray(personal, dtype=np.float32).copy()
    if len(X) == 0:
        return v
    eta = np.float32(training.learning_rate)
    pull, shrink = np.float32(training.learning_rate * lam), np.float32(1.0 + training.learning_rate * lam)
    steps = 0
    for idx in _batches(len(X), training, rng):
        _, g = model.loss_and_grad(v, X[idx], y[idx])
        v = ((v - eta * g.astype(np.float32, copy=False)) + pull * w) / shrink
        steps += 1
        if training.max_steps is not None and steps >= training.max_steps:
            break
    return v.astype(np.float32, copy=False)


def first_order_meta_gradient(
    model: Model,
    params: np.ndarray,
    batch: tuple[np.ndarray, np.ndarray],
    meta_batch: tuple[np.ndarray, np.ndarray],
    inner_learning_rate: float,
) -> np.ndarray:
    """Per-FedAvg's FO meta-gradient ∇f(w − α ∇f(w; D); D′) (Fallah et al. 2020, §5)."""
    _, g = model.loss_and_grad(params, *batch)
    adapted = params - inner_learning_rate * g
    return model.loss_and_grad(adapted, *meta_batch)[1]


def perfedavg_local(
    model: Model,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    training: LocalTraining,
    inner_learning_rate: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, int]:
    """Per-FedAvg's local training: each epoch's shuffled batches in pairs (D, D′), one meta step
    w ← w − β ∇f(w − α∇f(w; D); D′) per pair (D′ = D when an epoch has one batch); returns
    the parameters and the number of meta steps."""
    w = np.asarray(params, dtype=np.float32).copy()
    n = len(X)
    if n == 0:
        return w, 0
    beta = np.float32(training.learning_rate)
    b = training.batch_size
    steps = 0
    for _ in range(training.epochs):
        order = rng.permutation(n)
        nb = math.ceil(n / b)
        for t in range(max(1, nb // 2)):
            d1 = order[2 * t * b : (2 * t + 1) * b]
            d2 = order[(2 * t + 1) * b : (2 * t + 2) * b] if nb > 1 else d1
            g = first_order_meta_gradient(model, w, (X[d1], y[d1]), (X[d2], y[d2]), inner_learning_rate)
            w -= beta * g.astype(np.float32, copy=False)
            steps += 1
            if training.max_steps is not None and steps >= training.max_steps:
                return w, steps
    return w, steps


def _need_mlp(model: Model) -> MLP:
    if not isinstance(model, MLP):
        raise ModelError(f"MOON's contrastive term is on an MLP's hidden layer; got {type(model).__name__}")
    return model


def representation(model: MLP, params: np.ndarray, X: np.ndarray) -> np.ndarray:
    """The MLP's hidden-layer activations for the rows of ``X`` (MOON's z)."""
    p, Xw = _work(params, X, model.num_params)
    return model._forward(p, Xw)[1]


def _cos_and_grad(z: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise cos(z, r) and its gradient in z: r/(‖z‖‖r‖) − cos · z/‖z‖²."""
    nz = np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    nr = np.maximum(np.linalg.norm(r, axis=1, keepdims=True), 1e-12)
    cos = np.sum(z * r, axis=1, keepdims=True) / (nz * nr)
    return cos[:, 0], r / (nz * nr) - cos * z / (nz * nz)


def moon_loss_and_grad(
    model: Model,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    z_global: np.ndarray,
    z_previous: np.ndarray,
    mu: float,
    tau: float,
) -> tuple[float, np.ndarray]:
    """MOON's local loss CE + μ · mean log(1 + e^{(b − a)/τ}) and its gradient (module docstring).
    ``z_global`` and ``z_previous`` are the fixed representations of ``X`` under the global
    and the previous local model; the gradient reaches only W1 and b1 through z."""
    mlp = _need_mlp(model)
    loss, g = mlp.loss_and_grad(params, X, y)
    p, Xw = _work(params, X, mlp.num_params)
    pre, hid, _ = mlp._forward(p, Xw)
    n = hid.shape[0]
    if n == 0 or mu == 0:
        return loss, g
    a, da = _cos_and_grad(hid, np.asarray(z_global, hid.dtype))
    b, db = _cos_and_grad(hid, np.asarray(z_previous, hid.dtype))
    u = (b - a) / tau
    con = float(np.mean(np.logaddexp(0.0, u)))
    s = (0.5 * (1.0 + np.tanh(0.5 * u)))[:, None]  # σ(u) = dℓ/du, stable
    gz = (mu / (tau * n)) * s * (db - da)
    gpre = gz * (1.0 - hid * hid) if mlp.activation == "tanh" else gz * (pre > 0)
    gW1, gb1, _, _ = mlp._split(g)
    gW1 += Xw.T @ gpre
    gb1 += gpre.sum(axis=0)
    return loss + mu * con, g


def moon_local(
    model: Model,
    params: np.ndarray,
    previous: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    training: LocalTraining,
    spec: MoonSpec,
    rng: np.random.Generator,
) -> np.ndarray:
    """MOON's local training: minibatch SGD on :func:`moon_loss_and_grad` from the global ``params``."""
    mlp = _need_mlp(model)
    x = np.asarray(params, dtype=np.float32)
    w = x.copy()
    if len(X) == 0:
        return w
    z_glob, z_prev = representation(mlp, x, X), representation(mlp, previous, X)
    eta = np.float32(training.learning_rate)
    steps = 0
    for idx in _batches(len(X), training, rng):
        _, g = moon_loss_and_grad(mlp, w, X[idx], y[idx], z_glob[idx], z_prev[idx], spec.mu, spec.tau)
        w -= eta * g.astype(np.float32, copy=False)
        steps += 1
        if training.max_steps is not None and steps >= training.max_steps:
            break
    return w


def train_personalized(
    model: Model,
    config: RoundConfig,
    X: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator,
    client_id: str,
    state: ClientState | None,
) -> ClientUpdate:
    """The device's round under ``config.personalization``: the upload is Δ = y − x of the
    global model's local training (Ditto: FedAvg's; Per-FedAvg: the meta steps; MOON: the
    contrastive objective); Ditto and MOON also update ``state``."""
    spec = config.personalization
    x = np.asarray(config.params, dtype=np.float32)
    tr = config.training
    if isinstance(spec, DittoSpec):
        if state is None:
            raise ModelError("Ditto needs the device's ClientState (its personal model)")
        w, _ = local_sgd(model, x, X, y, tr, rng)
        start = x if state.personal is None else state.personal
        state.personal = ditto_personal_sgd(model, start, x, X, y, tr, spec.lam, rng)
    elif isinstance(spec, PerFedAvgSpec):
        w, _ = perfedavg_local(model, x, X, y, tr, spec.inner_learning_rate, rng)
    elif isinstance(spec, MoonSpec):
        if state is None:
            raise ModelError("MOON needs the device's ClientState (its previous local model)")
        prev = x if state.previous is None else state.previous
        w = moon_local(model, x, prev, X, y, tr, spec, rng)
        state.previous = w.copy()
    else:
        raise ModelError(f"unknown personalization {spec!r}")
    return ClientUpdate(client_id, config.round, (w - x).astype(np.float32), len(X))


def personalized_params(
    model: Model,
    spec: Personalization | None,
    global_params: np.ndarray,
    state: ClientState | None,
    X: np.ndarray,
    y: np.ndarray,
    training: LocalTraining,
    rng: np.random.Generator,
) -> np.ndarray:
    """The parameters a device uses after training: Ditto's v_k (a device that never took
    part trains one now from the global model, as in its first round), Per-FedAvg's global
    model after ``eval_steps`` SGD steps of size α on (X, y), otherwise the global model."""
    x = np.asarray(global_params, dtype=np.float32)
    if isinstance(spec, DittoSpec):
        if state is not None and state.personal is not None:
            return state.personal
        return ditto_personal_sgd(model, x, x, X, y, training, spec.lam, rng)
    if isinstance(spec, PerFedAvgSpec):
        if spec.eval_steps == 0:
            return x
        tune = LocalTraining(
            epochs=max(1, spec.eval_steps),
            batch_size=training.batch_size,
            learning_rate=spec.inner_learning_rate,
            max_steps=spec.eval_steps,
        )
        return local_sgd(model, x, X, y, tune, rng)[0]
    return x
