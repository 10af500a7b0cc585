"""Server side of optimized unary encoding (OUE).

Sufficient statistic: how many reports set each of the d bits, counted from
the packed bytes by :func:`estimator.kernels.sketch.cms_add` (a byte at a
time, eight 8-bit lanes of a word; one group). OUE is a pure protocol with
p* = 1/2 and q* = 1/(e^ε + 1), so the unbiased count of v is
``(C_v - n q*) / (p* - q*)`` (Wang et al., USENIX Security 2017, Sec. 3).
"""

from __future__ import annotations

import numpy as np

from estimator.kernels.sketch import cms_add
from estimator.oracles.base import Accumulator
from estimator.oracles.grr import unbias_pure
from estimator.result import Estimate, estimate_from_counts
from ldp_core.mechanisms.oue import OUESpec

__all__ = ["OUEAccumulator"]


class OUEAccumulator(Accumulator):
    """Per-bit counts of OUE reports."""

    spec_type = OUESpec
    spec: OUESpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        return {"ones": np.zeros(self.spec.domain_size, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        bits = records["bits"]
        rows = np.zeros(bits.shape[0], dtype=np.uint8)
        cms_add(rows, bits, self.sums["ones"].reshape(1, -1), np.zeros(1, dtype=np.int64))

    def estimate(self, confidence: float = 0.95) -> Estimate:
        p, q = self.spec.support_probabilities()
        return estimate_from_counts(self.spec, unbias_pure(self.sums["ones"], self.n, p, q), self.n, confidence)
