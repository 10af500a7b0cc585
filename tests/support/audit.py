"""The threshold attack's ε lower bound that the empirical privacy audits share (Jagielski, Ullman, Oprea,
NeurIPS 2020; Nasr et al., IEEE S&P 2021).

Given a scalar statistic of the mechanism's output in the world without the target (``out``) and with it
(``inn``), the attacker says "target" above a threshold τ. τ is chosen on the first half of each sample
(among quantiles of the first half of ``out``), and on the second half ε ≥ log((1 − δ − FNR_hi)/FPR_hi),
FPR_hi and FNR_hi one-sided 95 % Clopper–Pearson upper bounds: a lower bound on ε at δ that holds with
about 90 % confidence, which a correct mechanism's claimed ε must not fall below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from simulator.scenarios.fl.attacks import clopper_pearson

__all__ = ["threshold_epsilon_lower_bound", "device_round_audit"]


def _bound(tau: float, out: np.ndarray, inn: np.ndarray, delta: float) -> float:
    fpr_hi = clopper_pearson(int(np.sum(out > tau)), len(out), 0.10)[1]  # one-sided 95 %
    fnr_hi = clopper_pearson(int(np.sum(inn <= tau)), len(inn), 0.10)[1]
    num = 1.0 - delta - fnr_hi
    return math.log(num / fpr_hi) if num > 0 else 0.0


def threshold_epsilon_lower_bound(out: np.ndarray, inn: np.ndarray, delta: float = 1e-5, thresholds: int = 60) -> float:
    """The audit's ε lower bound (module docstring) from equally many ``out`` and ``inn`` statistics."""
    out, inn = np.asarray(out, dtype=np.float64), np.asarray(inn, dtype=np.float64)
    half = min(len(out), len(inn)) // 2
    taus = np.quantile(out[:half], np.linspace(0.5, 0.999, thresholds))
    best = max(taus, key=lambda t: _bound(float(t), out[:half], inn[:half], delta))
    return max(0.0, _bound(float(best), out[half:], inn[half:], delta))


def device_round_audit(
    train: Callable[[Any, np.ndarray, np.ndarray, Any, np.random.Generator, np.random.Generator], np.ndarray],
    sigma_run: float,
    trials: int,
    seed: int,
    steps: int = 1,
    prox_mu: float = 0.0,
) -> float:
    """A 95 % lower bound on ε at δ = 1e-5 from telling apart a device's released DP-SGD round (q = 1, clip 1,
    learning rate 1, a 3-feature logistic model from θ₀ = 0) on D = X + x₀ and on D' = X + canary, the canary
    replacing x₀ (N fixed, as the upload reveals it). x₀ = −canary with the same label: their clipped
    gradients are opposite, so the clipped sum moves by the full 2c. The attacker projects the update on that
    direction and thresholds (:func:`threshold_epsilon_lower_bound`). ``train(config, X, y, spec,
    sample_rng, noise_rng)`` is the device's round under test (numpy or torch), returning the update."""
    from ldp_core.fl.local_dpsgd import LocalDPSGDSpec
    from ldp_core.fl.training import LocalTraining, RoundConfig

    rng = np.random.default_rng(seed)
    X, y = rng.normal(scale=0.1, size=(10, 3)).astype(np.float32), rng.integers(0, 2, 10)
    canary = np.array([[30.0, -20.0, 10.0]], np.float32)
    d_x, d_y = np.vstack([X, -canary]), np.concatenate([y, [0]])
    n_x, n_y = np.vstack([X, canary]), np.concatenate([y, [0]])
    spec = LocalDPSGDSpec(noise_multiplier=sigma_run, clip=1.0, sample_rate=1.0, steps=steps)
    algorithm = "fedprox" if prox_mu else "fedavg"
    cfg = RoundConfig(0, np.zeros(4, np.float32), algorithm, LocalTraining(learning_rate=1.0), prox_mu=prox_mu)
    u = np.zeros(4)
    u[:3] = -canary[0] / np.linalg.norm(canary[0])  # the update is −η·(sum + noise)/N: the canary's gradient sign

    def release(data_x: np.ndarray, data_y: np.ndarray, s: int) -> float:
        up = train(cfg, data_x, data_y, spec, np.random.default_rng([seed, s, 0]), np.random.default_rng([seed, s, 1]))
        return float(np.asarray(up, dtype=np.float64) @ u)

    out = np.array([release(d_x, d_y, s) for s in range(trials)])
    inn = np.array([release(n_x, n_y, trials + s) for s in range(trials)])
    return threshold_epsilon_lower_bound(out, inn)
