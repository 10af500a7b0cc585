"""Server side of RAPPOR.

Sufficient statistics (linear, so accumulators merge exactly): the number of
reports per cohort N_c and, per cohort, how many reports set each bit Y_{c,j},
counted from the packed bytes by :func:`estimator.kernels.sketch.cms_add`
(cohorts as its groups). Decoding is the least squares of
:class:`ldp_core.mechanisms.rappor.RapporDesign` (unbiased, with its exact
variance), built and cached by :mod:`estimator.oracles.rappor_design`; the
interval uses the plug-in variance (the estimate clipped to [0, n] and
rescaled to sum to n, as for every mechanism).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from estimator.kernels.sketch import cms_add
from estimator.oracles.base import Accumulator
from estimator.oracles.rappor_design import rappor_design
from estimator.result import Estimate, estimate_from_counts
from ldp_core.mechanisms.rappor import RapporSpec

__all__ = ["RapporAccumulator"]


class RapporAccumulator(Accumulator):
    """Per-cohort per-bit counts of RAPPOR reports."""

    spec_type = RapporSpec
    spec: RapporSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        s = self.spec
        return {
            "ones": np.zeros((s.num_cohorts, s.num_bits), dtype=np.int64),
            "cohort_counts": np.zeros(s.num_cohorts, dtype=np.int64),
        }

    def _add(self, records: np.ndarray) -> None:
        cms_add(records["cohort"], records["bits"], self.sums["ones"], self.sums["cohort_counts"])

    def estimate(self, confidence: float = 0.95, candidates: Any = None) -> Estimate:
        """Least-squares counts of ``candidates`` (default: every domain value, in order).

        With an explicit candidate list the estimate is unbiased when every user
        holds a candidate (values outside the list bias it, as in the paper)."""
        design = rappor_design(self.spec, candidates)
        counts = design.counts(self.sums["ones"], self.sums["cohort_counts"])
        n = self.n
        if n > 0:
            plug = np.clip(counts, 0.0, float(n))
            total = plug.sum()
            plug = plug * (n / total) if total > 0 else np.full_like(plug, n / plug.size)
            variance = np.maximum(design.variance(plug), 0.0)
        else:
            variance = np.zeros_like(counts)
        return estimate_from_counts(self.spec, counts, n, confidence, variance=variance)
