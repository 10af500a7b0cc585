"""Server side of binary and k-ary randomized response.

Sufficient statistic: the histogram of reported values. The unbiased count
of v is ``(C_v - n q) / (p - q)`` (Wang et al. 2017, Sec. 3)."""

from __future__ import annotations

import numpy as np

from estimator.kernels.counting import histogram
from estimator.oracles.base import Accumulator
from estimator.result import Estimate, estimate_from_counts
from ldp_core.mechanisms.grr import GRRSpec
from ldp_core.mechanisms.rr import BinaryRRSpec

__all__ = ["GRRAccumulator", "BinaryRRAccumulator", "unbias_pure"]


def unbias_pure(support: np.ndarray, n: int, p_star: float, q_star: float) -> np.ndarray:
    """``(C - n q*) / (p* - q*)``: the unbiased counts of a pure protocol."""
    return (support.astype(np.float64) - n * q_star) / (p_star - q_star)


class GRRAccumulator(Accumulator):
    # The histogram accumulator of both k-ary and binary randomized response (BinaryRRAccumulator).
    spec_type: type[GRRSpec] | type[BinaryRRSpec] = GRRSpec
    spec: GRRSpec | BinaryRRSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        return {"hist": np.zeros(self.spec.domain_size, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        histogram(records["value"], self.sums["hist"])

    def estimate(self, confidence: float = 0.95) -> Estimate:
        p, q = self.spec.support_probabilities()
        return estimate_from_counts(self.spec, unbias_pure(self.sums["hist"], self.n, p, q), self.n, confidence)


class BinaryRRAccumulator(GRRAccumulator):
    spec_type = BinaryRRSpec
    spec: BinaryRRSpec

    def _add(self, records: np.ndarray) -> None:
        histogram(records["bit"], self.sums["hist"])
