"""k-ary (generalized) randomized response, also called direct encoding.

A user with value v reports v with probability p = e^ε / (e^ε + d - 1) and
each other value with probability q = 1 / (e^ε + d - 1) (Kairouz, Oh and
Viswanath 2014; Wang et al. 2017, Sec. 4.1). p/q = e^ε, so it is ε-LDP.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from ldp_core.mechanisms.base import MechanismSpec, pure_protocol_variance

__all__ = ["GRRSpec", "grr_index_dtype"]


def grr_index_dtype(domain_size: int) -> np.dtype:
    """The narrowest little-endian unsigned integer that holds ``domain_size - 1``."""
    if domain_size <= 1 << 8:
        return np.dtype("u1")
    if domain_size <= 1 << 16:
        return np.dtype("<u2")
    return np.dtype("<u4")


@dataclasses.dataclass(frozen=True)
class GRRSpec(MechanismSpec):
    """Generalized randomized response over ``domain_size`` values."""

    name: ClassVar[str] = "grr"

    @property
    def p(self) -> float:
        return self.exp_epsilon / (self.exp_epsilon + self.domain_size - 1)

    @property
    def q(self) -> float:
        return 1.0 / (self.exp_epsilon + self.domain_size - 1)

    def support_probabilities(self) -> tuple[float, float]:
        return self.p, self.q

    @property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("value", grr_index_dtype(self.domain_size))])

    def record_bounds(self) -> dict[str, int]:
        return {"value": self.domain_size}

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        v = self.check_values(values)
        n = v.size
        keep = rng.random(n) < self.p
        other = rng.integers(0, self.domain_size - 1, size=n, dtype=np.int64)
        other += other >= v  # uniform over the d-1 values different from v
        out = np.empty(n, dtype=self.record_dtype)
        out["value"] = np.where(keep, v, other)
        return out

    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        return pure_protocol_variance(true_counts, self.p, self.q)
