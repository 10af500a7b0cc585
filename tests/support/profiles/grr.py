"""Test profile of k-ary randomized response (GRR).

Audit event: "the report equals x". P[E | x] = p and P[E | x'] = q, so the
ratio is exactly p / q = e^ε (Wang et al. 2017, Sec. 4.1): the event is tight.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ldp_core.mechanisms.grr import GRRSpec

__all__ = ["specs", "audit_event", "audit_tight", "broken_spec", "LeakyGRRSpec"]


def specs() -> list[GRRSpec]:
    """Small and large ε, small and large domains."""
    return [
        GRRSpec(epsilon=0.5, domain_size=64),
        GRRSpec(epsilon=1.0, domain_size=4),
        GRRSpec(epsilon=3.0, domain_size=32),
        GRRSpec(epsilon=4.0, domain_size=8),
    ]


def audit_event(spec: GRRSpec, records: np.ndarray, x: int, x_prime: int) -> np.ndarray:
    """Whether each report equals ``x``."""
    return records["value"] == x


def audit_tight(spec: GRRSpec) -> bool:
    """P[report = x | x] / P[report = x | x'] = p / q = e^ε exactly."""
    return True


@dataclasses.dataclass(frozen=True)
class LeakyGRRSpec(GRRSpec):
    """Claims ``epsilon`` but keeps the true value with the probability of GRR at 2ε."""

    @property
    def p(self) -> float:
        e = math.exp(2.0 * self.epsilon)
        return e / (e + self.domain_size - 1)

    @property
    def q(self) -> float:
        return 1.0 / (math.exp(2.0 * self.epsilon) + self.domain_size - 1)


def broken_spec(spec: GRRSpec) -> GRRSpec:
    """GRR randomizing at 2ε while claiming ε (its true ratio is e^{2ε})."""
    return LeakyGRRSpec(epsilon=spec.epsilon, domain_size=spec.domain_size)
