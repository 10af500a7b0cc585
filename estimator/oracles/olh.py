"""Server side of Optimal Local Hashing (OLH).

Sufficient statistic: the support count of every domain item,
``C_x = #{i : reduce_range(xxh32_u32(x, seed_i), g) == y_i}``, computed when a
batch arrives (:func:`estimator.kernels.olh.olh_support_counts`, n·d hash
evaluations). The state is d int64 sums, so partitions merge exactly. The
unbiased count is ``(C_x - n/g) / (p - 1/g)`` with p = e^ε / (e^ε + g - 1)
(Wang et al., USENIX Security 2017, Sec. 4.4).
"""

from __future__ import annotations

import numpy as np

from estimator.kernels.support import olh_support_counts
from estimator.oracles.base import Accumulator
from estimator.oracles.grr import unbias_pure
from estimator.result import Estimate, estimate_from_counts
from ldp_core.mechanisms.olh import OLHSpec

__all__ = ["OLHAccumulator"]


class OLHAccumulator(Accumulator):
    """Support counts of OLH reports (see the module docstring)."""

    spec_type = OLHSpec
    spec: OLHSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        return {"support": np.zeros(self.spec.domain_size, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        self.spec.check_records(records)  # y < g, which the kernel's interval test needs
        olh_support_counts(
            records["seed"], records["y"], self.spec.hash_range, self.spec.domain_size, out=self.sums["support"]
        )

    def estimate(self, confidence: float = 0.95) -> Estimate:
        p, q = self.spec.support_probabilities()
        return estimate_from_counts(self.spec, unbias_pure(self.sums["support"], self.n, p, q), self.n, confidence)
