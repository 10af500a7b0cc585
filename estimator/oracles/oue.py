"""Server side of optimized unary encoding (OUE).

Sufficient statistic: how many reports set each of the d bits, counted from
the packed bytes by :func:`estimator.kernels.sketch.cms_add` (carry-save
counters bit-sliced over 64-bit words; one group), or for a small batch by
numpy's ``unpackbits``. OUE is a pure protocol with
p* = 1/2 and q* = 1/(e^ε + 1), so the unbiased count of v is
``(C_v - n q*) / (p* - q*)`` (Wang et al., USENIX Security 2017, Sec. 3).
"""

from __future__ import annotations

import numpy as np

from estimator.oracles.base import Accumulator
from estimator.oracles.grr import unbias_pure
from estimator.result import Estimate, estimate_from_counts
from ldp_core.mechanisms.oue import OUESpec

__all__ = ["OUEAccumulator", "SMALL_BITS"]

#: Batches of at most this many report bits (n x d) are counted with numpy's ``unpackbits``; larger
#: ones with the numba kernel, imported on first use so that a small job does not pay numba's start-up.
SMALL_BITS = 1 << 22


class OUEAccumulator(Accumulator):
    """Per-bit counts of OUE reports."""

    spec_type = OUESpec
    spec: OUESpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        return {"ones": np.zeros(self.spec.domain_size, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        bits = records["bits"]
        if bits.shape[0] * self.spec.domain_size <= SMALL_BITS:
            ones = np.unpackbits(bits, axis=1, count=self.spec.domain_size, bitorder="little")
            self.sums["ones"] += ones.sum(axis=0, dtype=np.int64)
            return
        from estimator.kernels.sketch import cms_add

        rows = np.zeros(bits.shape[0], dtype=np.uint8)
        cms_add(rows, bits, self.sums["ones"].reshape(1, -1), np.zeros(1, dtype=np.int64))

    def estimate(self, confidence: float = 0.95) -> Estimate:
        p, q = self.spec.support_probabilities()
        return estimate_from_counts(self.spec, unbias_pure(self.sums["ones"], self.n, p, q), self.n, confidence)
