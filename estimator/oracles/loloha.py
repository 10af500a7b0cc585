"""Server side of LOLOHA: OLH's support counts with LOLOHA's support probability.

A report ``(s, y)`` supports item ``x`` when ``reduce_range(xxh32_u32(x, s), g) == y``; the state is the
``d`` int64 support counts (:func:`estimator.kernels.olh.olh_support_counts`), so partitions merge exactly.
The unbiased count is ``(C_x − n/g)/(p* − 1/g)`` with ``p* = p1 p2 + (1 − p1) q2``
(:mod:`ldp_core.mechanisms.loloha`).
"""

from __future__ import annotations

import numpy as np

from estimator.kernels.support import olh_support_counts
from estimator.oracles.base import Accumulator
from estimator.oracles.grr import unbias_pure
from estimator.result import Estimate, estimate_from_counts
from ldp_core.mechanisms.loloha import LolohaSpec

__all__ = ["LolohaAccumulator"]


class LolohaAccumulator(Accumulator):
    """Support counts of LOLOHA reports (module docstring)."""

    spec_type = LolohaSpec
    spec: LolohaSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        return {"support": np.zeros(self.spec.domain_size, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        self.spec.check_records(records)
        olh_support_counts(
            records["seed"], records["y"], self.spec.hash_range, self.spec.domain_size, out=self.sums["support"]
        )

    def estimate(self, confidence: float = 0.95) -> Estimate:
        p, q = self.spec.support_probabilities()
        return estimate_from_counts(self.spec, unbias_pure(self.sums["support"], self.n, p, q), self.n, confidence)
