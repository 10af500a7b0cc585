"""Test profile of optimized unary encoding (OUE).

Audit event: "bit x is 1 and bit x' is 0". Bits are independent, so
P[E | x] = p (1 - q) and P[E | x'] = q (1 - p) with p = 1/2, and the ratio is
exactly (1 - q)/q = e^ε (Wang et al. 2017, Sec. 4.3): the event is tight.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ldp_core.mechanisms.oue import OUESpec

__all__ = ["specs", "audit_event", "audit_tight", "broken_spec", "LeakyOUESpec", "report_bit"]


def specs() -> list[OUESpec]:
    """Small and large ε; domains from 5 to 100, none a multiple of 8 (padding bits in use)."""
    return [
        OUESpec(epsilon=0.5, domain_size=37),
        OUESpec(epsilon=1.0, domain_size=5),
        OUESpec(epsilon=2.5, domain_size=100),
        OUESpec(epsilon=4.0, domain_size=12),
    ]


def report_bit(records: np.ndarray, index: int) -> np.ndarray:
    """Bit ``index`` of each report (little-endian packing)."""
    return ((records["bits"][:, index >> 3] >> np.uint8(index & 7)) & np.uint8(1)).astype(bool)


def audit_event(spec: OUESpec, records: np.ndarray, x: int, x_prime: int) -> np.ndarray:
    """Whether bit ``x`` is set and bit ``x_prime`` is clear."""
    return report_bit(records, x) & ~report_bit(records, x_prime)


def audit_tight(spec: OUESpec) -> bool:
    """P[E | x] / P[E | x'] = (1 - q)/q = e^ε exactly."""
    return True


@dataclasses.dataclass(frozen=True)
class LeakyOUESpec(OUESpec):
    """Claims ``epsilon`` but sets the other bits with OUE's q at 2ε."""

    @property
    def q(self) -> float:
        return 1.0 / (math.exp(2.0 * self.epsilon) + 1.0)


def broken_spec(spec: OUESpec) -> OUESpec:
    """OUE with q = 1/(e^{2ε} + 1) while claiming ε (its true ratio is e^{2ε})."""
    return LeakyOUESpec(epsilon=spec.epsilon, domain_size=spec.domain_size)
