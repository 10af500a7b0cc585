r"""Server side of Hadamard response (Acharya, Sun and Zhang, AISTATS 2019).

Sufficient statistic: the histogram N[y] of the reported y ∈ [K]. For every
x at once, one fast Walsh–Hadamard transform gives
F[r] = Σ_y H[r, y] N[y] = #{i: y_i ∈ C_{r-1}} - #{i: y_i ∉ C_{r-1}} = 2 T - n,
so T_x = (n + F[x+1]) / 2 and the unbiased count of the pure protocol with
p* = e^ε/(1+e^ε), q* = 1/2 (Wang et al. 2017, Sec. 3) is

    n̂_x = (T_x - n/2) / (p* - 1/2) = F[x+1] / (2p* - 1).

O(n) to aggregate, O(K log K) to estimate the whole domain.
"""

from __future__ import annotations

import numpy as np

from client_sdk.mechanisms.hr import HRSpec
from estimator.estimate import Estimate, estimate_from_counts
from estimator.kernels.counting import histogram
from estimator.kernels.hadamard import fwht
from estimator.oracles.base import Accumulator

__all__ = ["HRAccumulator"]


class HRAccumulator(Accumulator):
    """Histogram of Hadamard-response outputs."""

    spec_type = HRSpec
    spec: HRSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        return {"hist": np.zeros(self.spec.output_size, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        histogram(records["y"], self.sums["hist"])

    def support_counts(self) -> np.ndarray:
        """T_x = #{i: y_i ∈ C_x} for every x of the domain (int64, exact)."""
        f = fwht(self.sums["hist"])
        return (self.n + f[1 : self.spec.domain_size + 1]) // 2

    def estimate(self, confidence: float = 0.95) -> Estimate:
        p = self.spec.p
        counts = (self.support_counts() - self.n / 2.0) / (p - 0.5)
        return estimate_from_counts(self.spec, counts, self.n, confidence)
