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
rate q: :meth:`DPSGDConfig.event` is the privacy event of T steps, which the
server's accountants (:mod:`estimator.accounting.accountant`) turn into
(ε, δ). That ε protects one *example* (add/remove neighbours); on a device
inside federated learning it protects one of the device's examples, not the
device (client-level DP is the job's: docs/DPSGD.md).

Randomness is two explicit generators: ``sample_rng`` draws the batches and
``noise_rng`` the noise, so that a run without noise (σ = 0) follows the
same batches as one with noise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from ldp_core.fl.errors import ModelError
from ldp_core.fl.models import Model
from ldp_core.fl.per_example import clipped_grad_sum, penalty_grad
from ldp_core.privacy_events import GaussianEvent, PoissonSampledEvent, PrivacyEvent, SelfComposedEvent

__all__ = ["DPSGDConfig", "poisson_sample", "privatize_sum", "dpsgd_gradient", "dpsgd_step", "train_dpsgd"]


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
        """The privacy event of ``steps`` steps, per example under add/remove; None
        without noise (σ = 0: no privacy)."""
        if self.noise_multiplier == 0:
            return None
        step: PrivacyEvent = GaussianEvent(float(self.noise_multiplier))
        if self.sample_rate < 1.0:
            step = PoissonSampledEvent(float(self.sample_rate), step)
        return SelfComposedEvent(step, int(steps))


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


def privatize_sum(
    clipped_sum: np.ndarray,
    clip_norm: float,
    noise_multiplier: float,
    expected_batch: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """(Σ clipped + N(0, σ²C²·I)) / (qN): the noisy mean gradient. Each coordinate's
    noise has variance σ²C²/(qN)²."""
    s = np.asarray(clipped_sum, dtype=np.float64)
    noise = rng.normal(0.0, noise_multiplier * clip_norm, size=s.shape)
    return (s + noise) / expected_batch


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
    n = len(X)
    denom = batch_divisor(n, config.sample_rate, expected_batch)
    idx = poisson_sample(n, config.sample_rate, sample_rng)
    if idx.size:
        total, _ = clipped_grad_sum(model, params, X[idx], y[idx], float(config.clip_norm))
    else:
        total = np.zeros(model.num_params)
    g = privatize_sum(total, config.clip_norm, config.noise_multiplier, denom, noise_rng)
    return g + penalty_grad(model, np.asarray(params, dtype=np.float64)), int(idx.size)


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
    g, _ = dpsgd_gradient(model, params, X, y, config, sample_rng, noise_rng)
    return descend(params, g, config.learning_rate, prox_mu, anchor)


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
    """``steps`` DP-SGD steps from ``params``; ``on_step(t, θ)`` after each (t from 1). With ``prox_mu`` > 0
    each step also pulls toward ``params`` (FedProx's μ/2·‖θ − θ₀‖², see :func:`dpsgd_step`)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ModelError(f"steps must be an integer >= 0, got {steps!r}")
    w = np.asarray(params, dtype=np.float32).copy()
    anchor = w.copy()
    for t in range(1, steps + 1):
        w = dpsgd_step(model, w, X, y, config, sample_rng, noise_rng, prox_mu, anchor)
        if on_step is not None:
            on_step(t, w)
    return w
