r"""Server side of Hadamard response (Acharya, Sun and Zhang, AISTATS 2019).

Sufficient statistic: the histogram N of the reported outputs, seen as B
blocks of b (the basic version has B = 1 block of K). One fast
Walsh–Hadamard transform per block gives, for every x at once,

    F_x = Σ_{y in block β(x)} H_b[r(x), y] N[β(x), y] = T_x - (N_β(x) - T_x),

where T_x = #{i: y_i ∈ C_x} and N_β the reports in block β. E F_x = g n_x
with g = p - (b/2) p₀ (``HRSpec.gain``; see ``ldp_core.mechanisms.hr``),
so n̂_x = F_x / g is unbiased. In the basic version N_β = n and g = 2p - 1,
so this is the pure-protocol estimator n̂_x = (T_x - n/2)/(p - 1/2) with
p = e^ε/(1+e^ε), q* = 1/2 (Wang et al. 2017, Sec. 3).

O(n) to aggregate, O(K log b) to estimate the whole domain.
"""

from __future__ import annotations

import numpy as np

from estimator.kernels.counting import histogram
from estimator.kernels.hadamard import fwht
from estimator.oracles.base import Accumulator
from estimator.result import Estimate, estimate_from_counts
from ldp_core.mechanisms.hr import HRSpec

__all__ = ["HRAccumulator"]


class HRAccumulator(Accumulator):
    """Histogram of Hadamard-response outputs."""

    spec_type = HRSpec
    spec: HRSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        return {"hist": np.zeros(self.spec.output_size, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        histogram(records["y"], self.sums["hist"])

    def _transform(self) -> tuple[np.ndarray, np.ndarray]:
        """(F_x, N_β(x)) for every x of the domain (int64, exact)."""
        spec = self.spec
        blocks = self.sums["hist"].reshape(spec.num_blocks, spec.block_size)
        f = fwht(blocks)
        block, row = spec.block_and_row(np.arange(spec.domain_size))
        return f[block, row], blocks.sum(axis=1)[block]

    def support_counts(self) -> np.ndarray:
        """T_x = #{i: y_i ∈ C_x} for every x of the domain (int64, exact)."""
        f, n_block = self._transform()
        return (n_block + f) // 2

    def estimate(self, confidence: float = 0.95) -> Estimate:
        f, _ = self._transform()
        return estimate_from_counts(self.spec, f / self.spec.gain, self.n, confidence)
