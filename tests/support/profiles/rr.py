"""Test profile of binary randomized response (Warner 1965).

Audit event: "the reported bit equals x". P[E | x] = p = e^ε / (1 + e^ε) and
P[E | x'] = 1 - p, so the ratio is exactly e^ε: the event is tight.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ldp_core.mechanisms.rr import BinaryRRSpec

__all__ = ["specs", "audit_event", "audit_tight", "broken_spec", "LeakyRRSpec"]


def specs() -> list[BinaryRRSpec]:
    return [BinaryRRSpec(epsilon=0.5), BinaryRRSpec(epsilon=2.0), BinaryRRSpec(epsilon=4.0)]


def audit_event(spec: BinaryRRSpec, records: np.ndarray, x: int, x_prime: int) -> np.ndarray:
    """Whether each reported bit equals ``x``."""
    return records["bit"] == x


def audit_tight(spec: BinaryRRSpec) -> bool:
    """P[bit = x | x] / P[bit = x | x'] = p / (1 - p) = e^ε exactly."""
    return True


@dataclasses.dataclass(frozen=True)
class LeakyRRSpec(BinaryRRSpec):
    """Claims ``epsilon`` but keeps the bit with the probability of RR at 2ε."""

    @property
    def p(self) -> float:
        e = math.exp(2.0 * self.epsilon)
        return e / (1.0 + e)

    @property
    def q(self) -> float:
        return 1.0 / (1.0 + math.exp(2.0 * self.epsilon))


def broken_spec(spec: BinaryRRSpec) -> BinaryRRSpec:
    """RR randomizing at 2ε while claiming ε (its true ratio is e^{2ε})."""
    return LeakyRRSpec(epsilon=spec.epsilon)
