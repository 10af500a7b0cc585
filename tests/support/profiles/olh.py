"""Test profile of Optimal Local Hashing (OLH).

Audit event, for inputs x and x': E = {H_s(x) = y and H_s(x') ≠ y}, with
H_s(v) = reduce_range(xxh32_u32(v, s), g) and (s, y) the report. Condition on
the seed s (drawn independently of the input). If H_s(x) = H_s(x'), E is
impossible under either input. Otherwise y is g-ary randomized response of
the input's hash, so

    P[E | x, s]  = P[y = H_s(x) | x]  = p          = e^ε / (e^ε + g - 1),
    P[E | x', s] = P[y = H_s(x) | x'] = (1-p)/(g-1) = 1 / (e^ε + g - 1),

and averaging over s, P[E | x] / P[E | x'] = e^ε exactly, whatever the hash
function: the event is tight. The simpler event {H_s(x) = y} is weaker:
P[· | x'] = 1/g, a ratio of p·g < e^ε.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ldp_core.hashing import hash_to_range
from ldp_core.mechanisms.olh import OLHSpec

__all__ = ["specs", "audit_event", "audit_tight", "broken_spec", "LeakyOLHSpec"]


def specs() -> list[OLHSpec]:
    """ε from 0.5 (g = 3) to 4 (g = 56); domains from 8 to 256."""
    return [
        OLHSpec(epsilon=0.5, domain_size=16),
        OLHSpec(epsilon=1.0, domain_size=256),
        OLHSpec(epsilon=2.0, domain_size=64),
        OLHSpec(epsilon=4.0, domain_size=8),
    ]


def audit_event(spec: OLHSpec, records: np.ndarray, x: int, x_prime: int) -> np.ndarray:
    """Whether each report supports ``x`` and not ``x_prime``."""
    seeds = records["seed"]
    y = records["y"].astype(np.uint32)
    g = spec.hash_range
    return (hash_to_range(x, seeds, g) == y) & (hash_to_range(x_prime, seeds, g) != y)


def audit_tight(spec: OLHSpec) -> bool:
    """P[E | x] / P[E | x'] = p (g-1) / (1-p) = e^ε exactly (module docstring)."""
    return True


@dataclasses.dataclass(frozen=True)
class LeakyOLHSpec(OLHSpec):
    """Claims ``epsilon`` (and keeps its g) but keeps the hashed value with the
    probability of OLH at 2ε, so its true ratio is e^{2ε}."""

    @property
    def p(self) -> float:
        e = math.exp(2.0 * self.epsilon)
        return e / (e + self.hash_range - 1)


def broken_spec(spec: OLHSpec) -> OLHSpec:
    """OLH randomizing at 2ε while claiming ε."""
    return LeakyOLHSpec(epsilon=spec.epsilon, domain_size=spec.domain_size, g=spec.g)
