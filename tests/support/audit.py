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

import numpy as np

from simulator.scenarios.attacks import clopper_pearson

__all__ = ["threshold_epsilon_lower_bound"]


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
