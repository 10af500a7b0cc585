r"""Server side of Count Mean Sketch and Hadamard Count Mean Sketch.

Apple's Differential Privacy Team, "Learning with Privacy at Scale" (2017),
algorithms A_server-CMS and A_server-HCMS. Both build a k×m sketch matrix
M whose expectation, given the hash functions, is the non-private count
sketch ``E M[j, a] = #{i: h_j(x_i) = a}``, and estimate every item d of the
domain by the debiased count mean

    f̂(d) = m/(m-1) · ( (1/k) Σ_j M[j, h_j(d)] - n/m ).

Averaged over a random hash family, a user with x ≠ d lands on h_j(d) with
probability 1/m, so E[(1/k) Σ_j M[j, h_j(d)]] = n_d + (n - n_d)/m and f̂(d)
is unbiased (the derivation, with the variance, is in the docstrings of
``CMSSpec.count_variance`` and ``HCMSSpec.count_variance``). For a *fixed* hash
family the estimate is biased by the collisions of that family; the
variances in ``ldp_core.mechanisms.cms`` include that term averaged
over families.

**CMS.** A report (j, ṽ) adds k(c_ε/2 · ṽ + 1/2) to row j (c_ε =
(e^{ε/2}+1)/(e^{ε/2}-1)). The accumulator keeps integer sufficient
statistics instead: ``ones[j, a]`` (reports of row j whose bit a is +1) and
``rows[j]`` (reports of row j), from which
M[j, a] = k(c_ε(ones[j, a] - rows[j]/2) + rows[j]/2).

**HCMS.** A report (j, l, b) adds k c_ε (-1)^b to M_H[j, l] (c_ε =
(e^ε+1)/(e^ε-1)); the accumulator keeps ``signed[j, l] = Σ (-1)^b`` and the
estimate transforms each row back with the Hadamard matrix,
M = k c_ε · signed · H_m (a fast Walsh–Hadamard transform per row).
"""

from __future__ import annotations

import functools

import numpy as np

from estimator.kernels.hadamard import fwht
from estimator.kernels.sketch import cms_add, hcms_add
from estimator.oracles.base import Accumulator
from estimator.result import Estimate, estimate_from_counts
from ldp_core.mechanisms.cms import CMSSpec, HCMSSpec

__all__ = ["CMSAccumulator", "HCMSAccumulator", "count_mean"]

_ITEM_CHUNK = 1 << 14


#: Cache the flattened hash positions of a spec when they take at most this many entries.
_CACHE_ENTRIES = 1 << 24


@functools.lru_cache(maxsize=8)
def _flat_positions(spec: CMSSpec | HCMSSpec) -> np.ndarray:
    """``j * m + h_j(d)`` for every row j and item d: a ``(k, d)`` index into the flattened
    sketch. Depends only on the spec, so it is computed once per spec and process."""
    pos = spec.hash_positions(np.arange(spec.domain_size)).astype(np.intp)
    pos += (np.arange(spec.num_hashes, dtype=np.intp) * spec.width)[:, None]
    pos.setflags(write=False)
    return pos


def count_mean(sketch: np.ndarray, spec: CMSSpec | HCMSSpec, n: int) -> np.ndarray:
    """f̂(d) = m/(m-1)((1/k) Σ_j M[j, h_j(d)] - n/m) for every item d of the domain."""
    k, m = sketch.shape
    d = spec.domain_size
    if k * d <= _CACHE_ENTRIES:
        means = np.take(np.ascontiguousarray(sketch).ravel(), _flat_positions(spec)).sum(axis=0) / k
        return m / (m - 1.0) * (means - n / m)
    means = np.empty(d, dtype=np.float64)
    for start in range(0, d, _ITEM_CHUNK):
        stop = min(d, start + _ITEM_CHUNK)
        pos = spec.hash_positions(np.arange(start, stop))
        means[start:stop] = np.take_along_axis(sketch, pos.astype(np.intp), axis=1).sum(axis=0) / k
    return m / (m - 1.0) * (means - n / m)


class CMSAccumulator(Accumulator):
    """Sums of CMS reports: per-row bit counts and per-row report counts."""

    spec_type = CMSSpec
    spec: CMSSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        k, m = self.spec.num_hashes, self.spec.width
        return {"ones": np.zeros((k, m), dtype=np.int64), "rows": np.zeros(k, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        cms_add(records["row"], records["bits"], self.sums["ones"], self.sums["rows"])

    def sketch_matrix(self) -> np.ndarray:
        """The paper's M: M[j, a] = k(c_ε(ones[j, a] - rows[j]/2) + rows[j]/2)."""
        k, c = self.spec.num_hashes, self.spec.c_eps
        half_rows = self.sums["rows"][:, None] / 2.0
        return k * (c * (self.sums["ones"] - half_rows) + half_rows)

    def estimate(self, confidence: float = 0.95) -> Estimate:
        counts = count_mean(self.sketch_matrix(), self.spec, self.n)
        return estimate_from_counts(self.spec, counts, self.n, confidence)


class HCMSAccumulator(Accumulator):
    """Sums of HCMS reports: ``signed[j, l] = Σ (-1)^bit`` over reports (j, l, bit)."""

    spec_type = HCMSSpec
    spec: HCMSSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        return {"signed": np.zeros((self.spec.num_hashes, self.spec.width), dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        hcms_add(records["row"], records["col"], records["bit"], self.sums["signed"])

    def sketch_matrix(self) -> np.ndarray:
        """The paper's M = k c_ε · signed · H_m (exact integer transform, then scaled)."""
        return self.spec.num_hashes * self.spec.c_eps * fwht(self.sums["signed"]).astype(np.float64)

    def estimate(self, confidence: float = 0.95) -> Estimate:
        counts = count_mean(self.sketch_matrix(), self.spec, self.n)
        return estimate_from_counts(self.spec, counts, self.n, confidence)
