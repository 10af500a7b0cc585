"""Binary randomized response (Warner 1965).

A user with a bit b reports b with probability p = e^ε / (1 + e^ε) and its
complement otherwise; the domain is {0, 1}. Counts are estimated for both
values, exactly as k-ary randomized response with k = 2.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from ldp_core.errors import SpecError
from ldp_core.mechanisms.base import MechanismSpec, pure_protocol_variance

__all__ = ["BinaryRRSpec"]


@dataclasses.dataclass(frozen=True)
class BinaryRRSpec(MechanismSpec):
    """Warner's randomized response on one bit."""

    domain_size: int = 2
    name: ClassVar[str] = "rr"

    def _validate(self) -> None:
        if self.domain_size != 2:
            raise SpecError(f"rr: the domain of binary randomized response is 2, got {self.domain_size}; use grr")

    @property
    def p(self) -> float:
        return self.exp_epsilon / (1.0 + self.exp_epsilon)

    @property
    def q(self) -> float:
        return 1.0 / (1.0 + self.exp_epsilon)

    def support_probabilities(self) -> tuple[float, float]:
        return self.p, self.q

    @property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("bit", "u1")])

    def record_bounds(self) -> dict[str, int]:
        return {"bit": 2}

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        v = self.check_values(values)
        flip = rng.random(v.size) >= self.p
        out = np.empty(v.size, dtype=self.record_dtype)
        out["bit"] = v ^ flip
        return out

    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        return pure_protocol_variance(true_counts, self.p, self.q)
