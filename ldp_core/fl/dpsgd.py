"""DP-SGD: per-example clipping and Gaussian noise on Poisson-sampled batches.

Abadi et al., "Deep learning with differential privacy" (CCS 2016), Alg. 1,
with Poisson sampling as its accountant assumes. Each step

1. samples a batch B: every one of the N training examples independently
   with probability q (:func:`poisson_sample`);
2. clips each example's gradient to norm C and sums them (ghost clipping,
   :func:`ldp_core.fl.per_example.clipped_grad_sum`);
3. adds Gaussian noise N(0, σ²C²·I) with σ the noise multiplier and divides
   by the *expected* batch size qN, not by |B|: |B| depends on whether an
   example was sampled, dividing by it would leak (:func:`privatize_sum`);
4. adds the L2 penalty's gradient (it depends on no example) and moves
   θ ← θ − η·g.

Adding or removing one example moves the clipped sum by at most C, so each
step is the Gaussian mechanism with noise multiplier σ, Poisson-subsampled at
rate q: :meth:`DPSGDConfig.event` is the privacy event of T steps, whose
(ε, δ) :mod:`ldp_core.fl.dpsgd_accounting` computes (the server's accountants,
:mod:`estimator.accounting.accountant`, give the same figures). That ε protects one *example* (add/remove neighbours); on a device
inside federated learning it protects one of the device's examples, not the
device (client-level DP is the job's: docs/DPSGD.md).

Randomness is two explicit generators: ``sample_rng`` draws the batches and
``noise_rng`` the noise, so that a run without noise (σ = 0) follows the
same batches as one with noise. Each step draws its batch (N uniforms from
``sample_rng``) and then the whole noise vector (one ``normal`` call of the
trainable parameters' size from ``noise_rng``), in that order.

The loop is written once, :func:`dpsgd_loop` (one step: :func:`dpsgd_step_on`),
over a small backend (:class:`DPSGDBackend`): the clipped sum of per-example
gradients, the noised mean in the backend's arithmetic, and the step.
:class:`FlatBackend` runs it on a flat float32 parameter vector for anything
with per-example gradients (:class:`PerExampleGradients`: the numpy models'
:class:`~ldp_core.fl.per_example.NumpyGradients`, the torch device model
:class:`client_sdk.fl.torch_device.TorchDeviceModel`);
:class:`client_sdk.fl.torch_dpsgd.TorchModuleBackend` runs it in place on a
PyTorch module's trainable parameters. The central job (``ldp dpsgd``), the
devices' ``local_dp_sgd`` rounds (:mod:`ldp_core.fl.local_dpsgd`) and the
torch paths all step through it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ldp_core.fl.errors import ModelError
from ldp_core.fl.models import Model
from ldp_core.fl.per_example import NumpyGradients
from ldp_core.privacy_events import PrivacyEvent, sampled_gaussian_event

__all__ = [
    "DPSGDConfig",
    "PerExampleGradients",
    "DPSGDBackend",
    "FlatBackend",
    "poisson_sample",
    "batch_divisor",
    "privatize_sum",
    "descend",
    "dpsgd_step_on",
    "dpsgd_loop",
    "train_flat_dpsgd",
    "dpsgd_gradient",
    "dpsgd_step",
    "train_dpsgd",
]


def _finite(name: str, v: object, low: float, strict: bool) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or (v <= low if strict else v < low):  # type: ignore[operator]
        raise ModelError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {v!r}")


@dataclasses.dataclass(frozen=True)
class DPSGDConfig:
    """σ (``noise_multiplier``, 0 = clipped SGD without privacy), C (``clip_norm``),
    q (``sample_rate``, in (0, 1]) and η (``learning_rate``)."""

    noise_multiplier: float
    clip_norm: float
    sample_rate: float
    learning_rate: float = 0.1

    def __post_init__(self) -> None:
        _finite("noise_multiplier", self.noise_multiplier, 0.0, strict=False)
        _finite("clip_norm", self.clip_norm, 0.0, strict=True)
        _finite("learning_rate", self.learning_rate, 0.0, strict=True)
        q = self.sample_rate
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < q <= 1.0:
            raise ModelError(f"sample_rate must be in (0, 1], got {q!r}")

    def steps_per_epoch(self) -> int:
        """round(1/q) steps make one expected pass over the data (at least 1)."""
        return max(1, round(1.0 / self.sample_rate))

    def event(self, steps: int) -> PrivacyEvent | None:
        """The privacy event of ``steps`` steps, per example under add/remove
        (:func:`~ldp_core.privacy_events.sampled_gaussian_event`; its ε:
        :mod:`ldp_core.fl.dpsgd_accounting`); None without noise (σ = 0: no privacy)."""
        if self.noise_multiplier == 0:
            return None
        return sampled_gaussian_event(float(self.noise_multiplier), float(self.sample_rate), int(steps))


def poisson_sample(n: int, sample_rate: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of the examples kept when each of ``n`` is kept independently with
    probability ``sample_rate``."""
    return np.flatnonzero(rng.random(n) < sample_rate)


def batch_divisor(n: int, sample_rate: float, expected_batch: float | None) -> float:
    """The divisor of a DP-SGD step's noised sum: ``expected_batch``, or qN with the dataset size N
    taken as public; refuses an empty dataset and a divisor that is not > 0."""
    if n == 0:
        raise ModelError("DP-SGD needs at least one training example")
    denom = sample_rate * n if expected_batch is None else float(expected_batch)
    if not denom > 0:
        raise ModelError(f"expected_batch must be > 0, got {expected_batch!r}")
    return denom


def _noised_mean(clipped_sum: np.ndarray, noise: np.ndarray, expected_batch: float) -> np.ndarray:
    return (np.asarray(clipped_sum, dtype=np.float64) + noise) / expected_batch


def privatize_sum(
    clipped_sum: np.ndarray,
    clip_norm: float,
    noise_multiplier: float,
    expected_batch: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """(Σ clipped + N(0, σ²C²·I)) / (qN): the noisy mean gradient. Each coordinate's
    noise has variance σ²C²/(qN)²."""
    noise = rng.normal(0.0, noise_multiplier * clip_norm, size=np.shape(clipped_sum))
    return _noised_mean(clipped_sum, noise, expected_batch)


def descend(
    params: np.ndarray, g: np.ndarray, learning_rate: float, prox_mu: float = 0.0, anchor: np.ndarray | None = None
) -> np.ndarray:
    """θ − η·(g + μ·(θ − anchor)), float32: a step on the privatized gradient g, with FedProx's proximal pull
    when ``prox_mu`` > 0 (``anchor`` the round's global parameters). The pull depends on θ and the public
    anchor only, never on the examples: adding it to the noised gradient is post-processing, so the step's
    privacy is g's."""
    if prox_mu:
        if anchor is None:
            raise ModelError("a proximal term needs the anchor (the round's global parameters)")
        g = g + float(prox_mu) * (np.asarray(params, dtype=np.float64) - np.asarray(anchor, dtype=np.float64))
    w = np.asarray(params, dtype=np.float32)
    return (w - np.float32(learning_rate) * np.asarray(g).astype(np.float32)).astype(np.float32)


class PerExampleGradients(Protocol):
    """A model's per-example side of DP-SGD on flat parameter vectors: the clipped sum
    Σ_i min(1, C/‖∇ℓ_i‖)·∇ℓ_i with the per-example norms, and the gradient of the model's L2 penalty
    (it depends on no example). The numpy models have :class:`~ldp_core.fl.per_example.NumpyGradients`;
    :class:`client_sdk.fl.torch_device.TorchDeviceModel` computes them with PyTorch."""

    @property
    def num_params(self) -> int: ...

    def clipped_grad_sum(
        self, params: np.ndarray, X: np.ndarray, y: np.ndarray, clip_norm: float
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def penalty_grad(self, params: np.ndarray) -> np.ndarray: ...


class DPSGDBackend(Protocol):
    """What :func:`dpsgd_loop` needs of a model. ``params`` is whatever the backend steps (a flat vector, or
    nothing for a module updated in place); a sum and a gradient are the backend's own arrays.

    * ``noise_size``: how many coordinates are noised (the trainable parameters);
    * ``clipped_sum(params, X, y, C)``: Σ_i min(1, C/‖∇ℓ_i‖)·∇ℓ_i over the batch (X, y);
    * ``zero_sum(params)``: the sum of an empty batch;
    * ``noised_mean(total, noise, qN)``: (total + noise)/qN, ``noise`` the flat float64 draw;
    * ``step(params, g, η)``: the parameters after θ ← θ − η·(g + the penalty's gradient [+ a proximal pull])."""

    @property
    def noise_size(self) -> int: ...

    def clipped_sum(self, params: Any, X: np.ndarray, y: np.ndarray, clip_norm: float) -> Any: ...

    def zero_sum(self, params: Any) -> Any: ...

    def noised_mean(self, total: Any, noise: np.ndarray, expected_batch: float) -> Any: ...

    def step(self, params: Any, g: Any, learning_rate: float) -> Any: ...


class FlatBackend:
    """DP-SGD on a flat parameter vector through ``grads`` (float64 noised mean, float32 parameters), with
    FedProx's pull μ·(θ − ``anchor``) when ``prox_mu`` > 0 (:func:`descend`)."""

    def __init__(self, grads: PerExampleGradients, prox_mu: float = 0.0, anchor: np.ndarray | None = None) -> None:
        self.grads = grads
        self.prox_mu = prox_mu
        self.anchor = anchor

    @property
    def noise_size(self) -> int:
        return self.grads.num_params

    def clipped_sum(self, params: np.ndarray, X: np.ndarray, y: np.ndarray, clip_norm: float) -> np.ndarray:
        return self.grads.clipped_grad_sum(params, X, y, clip_norm)[0]

    def zero_sum(self, params: np.ndarray) -> np.ndarray:
        return np.zeros(self.grads.num_params)

    def noised_mean(self, total: np.ndarray, noise: np.ndarray, expected_batch: float) -> np.ndarray:
        return _noised_mean(total, noise, expected_batch)

    def gradient(self, params: np.ndarray, g: np.ndarray) -> np.ndarray:
        """g plus the L2 penalty's gradient at ``params`` (float64)."""
        return g + self.grads.penalty_grad(np.asarray(params, dtype=np.float64))

    def step(self, params: np.ndarray, g: np.ndarray, learning_rate: float) -> np.ndarray:
        return descend(params, self.gradient(params, g), learning_rate, self.prox_mu, self.anchor)


def _noised_gradient(
    backend: DPSGDBackend,
    params: Any,
    X: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    expected_batch: float,
) -> tuple[Any, int]:
    """Steps 1 to 3 of the module docstring: the noised mean of a Poisson batch's clipped gradients (without
    the penalty) and the batch's size."""
    Xa, ya = np.asarray(X), np.asarray(y)
    idx = poisson_sample(len(Xa), config.sample_rate, sample_rng)
    if idx.size:
        total = backend.clipped_sum(params, Xa[idx], ya[idx], float(config.clip_norm))
    else:
        total = backend.zero_sum(params)
    noise = noise_rng.normal(0.0, config.noise_multiplier * config.clip_norm, size=backend.noise_size)
    return backend.noised_mean(total, noise, expected_batch), int(idx.size)


def dpsgd_step_on(
    backend: DPSGDBackend,
    params: Any,
    X: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    expected_batch: float | None = None,
) -> tuple[Any, int]:
    """One DP-SGD step through ``backend`` (steps 1 to 4 of the module docstring): the parameters after it
    and the Poisson batch's size. The divisor is ``expected_batch``, default qN with N = len(X) taken as
    public (:func:`batch_divisor`)."""
    denom = batch_divisor(len(X), config.sample_rate, expected_batch)
    g, size = _noised_gradient(backend, params, X, y, config, sample_rng, noise_rng, denom)
    return backend.step(params, g, config.learning_rate), size


def _check_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ModelError(f"steps must be an integer >= 0, got {steps!r}")


def dpsgd_loop(
    backend: DPSGDBackend,
    params: Any,
    X: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    steps: int,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    on_step: Callable[[int, Any], None] | None = None,
) -> Any:
    """``steps`` DP-SGD steps (:func:`dpsgd_step_on`) from ``params`` through ``backend``; ``on_step(t, θ)``
    after each (t from 1). Returns the last parameters."""
    _check_steps(steps)
    for t in range(1, steps + 1):
        params, _ = dpsgd_step_on(backend, params, X, y, config, sample_rng, noise_rng)
        if on_step is not None:
            on_step(t, params)
    return params


def train_flat_dpsgd(
    grads: PerExampleGradients,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    steps: int,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    on_step: Callable[[int, np.ndarray], None] | None = None,
    prox_mu: float = 0.0,
) -> np.ndarray:
    """``steps`` DP-SGD steps from the flat vector ``params`` (float32) through ``grads``; with ``prox_mu`` > 0
    each step also pulls toward ``params`` (FedProx's μ/2·‖θ − θ₀‖², :func:`descend`)."""
    _check_steps(steps)
    w = np.asarray(params, dtype=np.float32).copy()
    backend = FlatBackend(grads, prox_mu, w.copy())
    out: np.ndarray = dpsgd_loop(backend, w, X, y, config, steps, sample_rng, noise_rng, on_step)
    return out


def dpsgd_gradient(
    model: Model,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    expected_batch: float | None = None,
) -> tuple[np.ndarray, int]:
    """One step's privatized gradient (float64, penalty included) over a Poisson
    batch of (X, y), and the batch's size. The divisor is ``expected_batch``
    (default qN with N = len(X)): it must not depend on the private data beyond
    what is public, so the dataset size N is taken as public, as in Abadi et
    al. and Opacus (a privacy audit passes one fixed value for neighbours)."""
    denom = batch_divisor(len(X), config.sample_rate, expected_batch)
    backend = FlatBackend(NumpyGradients(model))
    g, size = _noised_gradient(backend, params, X, y, config, sample_rng, noise_rng, denom)
    return backend.gradient(params, g), size


def dpsgd_step(
    model: Model,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    prox_mu: float = 0.0,
    anchor: np.ndarray | None = None,
) -> np.ndarray:
    """θ − η·(privatized gradient + μ·(θ − anchor)), float32 (:func:`descend`)."""
    backend = FlatBackend(NumpyGradients(model), prox_mu, anchor)
    w, _ = dpsgd_step_on(backend, params, X, y, config, sample_rng, noise_rng)
    out: np.ndarray = w
    return out


def train_dpsgd(
    model: Model,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    steps: int,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    on_step: Callable[[int, np.ndarray], None] | None = None,
    prox_mu: float = 0.0,
) -> np.ndarray:
    """``steps`` DP-SGD steps of the numpy ``model`` from ``params``; ``on_step(t, θ)`` after each (t from 1).
    With ``prox_mu`` > 0 each step also pulls toward ``params`` (FedProx's μ/2·‖θ − θ₀‖², see :func:`descend`)."""
    return train_flat_dpsgd(NumpyGradients(model), params, X, y, config, steps, sample_rng, noise_rng, on_step, prox_mu)
