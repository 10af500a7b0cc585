"""DP on the cut-layer activations: each example's activation vector is clipped to L2 norm C and
Gaussian noise of standard deviation σ·C is added to it, every time it is sent.

What one release protects: one example's input against whoever sees the activations (the server).
Any two inputs' clipped activations differ by at most 2C, so one release is the Gaussian mechanism
with sensitivity 2C and noise σC, i.e. noise multiplier σ/2 for replacing the example's input by any
other; an example sent once per epoch for E epochs is E such releases,
SelfComposed(Gaussian(σ/2), E), which is exactly one Gaussian of multiplier σ/(2√E): its ε is computed
on the exact Gaussian curve here (stdlib only; the tests check it against the project's DP-SGD
accountant, ``dp_accounting``'s PLD, composing the E releases). This is a local guarantee per example; it
does not cover the labels (the server holds them), nor what reaches the server through the client's
weights, which are trained on all of the client's raw inputs and shape every later example's
activation (docs/SPLIT.md).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ldp_core.errors import ConfigError

__all__ = ["SmashedDP", "gaussian_delta", "gaussian_epsilon"]


@dataclasses.dataclass(frozen=True)
class SmashedDP:
    """Clip each activation vector to ``clip`` (C) and add N(0, (σC)²) noise, σ = ``noise_multiplier``
    (0: clipping only, no privacy)."""

    clip: float
    noise_multiplier: float

    def __post_init__(self) -> None:
        if not (isinstance(self.clip, (int, float)) and math.isfinite(self.clip) and self.clip > 0):
            raise ConfigError(f"the activation clip must be a finite number > 0, got {self.clip!r}")
        nm = self.noise_multiplier
        if not (isinstance(nm, (int, float)) and math.isfinite(nm) and nm >= 0):
            raise ConfigError(f"the noise multiplier must be a finite number >= 0, got {nm!r}")

    def privatize(self, a: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(released activations, per-row clipping scale); the scale is what the client multiplies the
        returned gradient by on the way back (the clipping's Jacobian without its norm term)."""
        norms = np.linalg.norm(a, axis=1)
        scale = np.minimum(1.0, self.clip / np.maximum(norms, 1e-12))
        out = a * scale[:, None]
        if self.noise_multiplier > 0:
            out = out + rng.normal(0.0, self.noise_multiplier * self.clip, size=a.shape)
        return out.astype(np.float32), scale

    def epsilon(self, releases: int, delta: float) -> float | None:
        """ε at ``delta`` of ``releases`` releases of one example's activations (replace-one of its
        input: sensitivity 2C, noise σC, so each release is μ = 2/σ Gaussian DP); None without noise.
        E such releases compose exactly to μ = 2√E/σ (Dong, Roth and Su 2019, Cor. 2), whose ε is the
        exact Gaussian curve (:func:`gaussian_epsilon`); the tests check it against ``dp_accounting``'s
        PLD accountant composing the E releases one by one."""
        if self.noise_multiplier == 0:
            return None
        if releases < 1:
            raise ConfigError(f"releases must be >= 1, got {releases}")
        return gaussian_epsilon(2.0 * math.sqrt(releases) / self.noise_multiplier, delta)


def _log_phi(t: float) -> float:
    """log Φ(t), accurate far into the lower tail."""
    if t > -30.0:
        return math.log(0.5 * math.erfc(-t / math.sqrt(2.0)))
    # Φ(t) ~ φ(t)/|t|·(1 − 1/t² + 3/t⁴): the asymptotic series where erfc underflows
    return -0.5 * t * t - math.log(-t) - 0.5 * math.log(2 * math.pi) + math.log1p(-1 / t**2 + 3 / t**4)


def gaussian_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of μ-Gaussian DP: Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Balle and Wang 2018, Thm. 8)."""
    a = math.exp(_log_phi(-epsilon / mu + mu / 2))
    b = math.exp(epsilon + _log_phi(-epsilon / mu - mu / 2))
    return max(0.0, a - b)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The least ε with δ(ε) <= ``delta`` for μ-Gaussian DP, by bisection (to 1e-9 relative)."""
    if not (mu > 0 and 0 < delta < 1):
        raise ConfigError(f"need mu > 0 and delta in (0, 1), got {mu}, {delta}")
    lo, hi = 0.0, 1.0
    while gaussian_delta(hi, mu) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-9 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gaussian_delta(mid, mu) > delta else (lo, mid)
    return hi
