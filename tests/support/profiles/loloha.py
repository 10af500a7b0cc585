"""Test profile of LOLOHA (memoized local hashing; :mod:`ldp_core.mechanisms.loloha`).

Audit event, as OLH's: E = {H_s(x) = y and H_s(x') ≠ y}. Given the seed, y is one GRR over [g] of the
input's hash with P[y = h] = p* = e^{ε1}/(e^{ε1} + g − 1), so P[E | x] / P[E | x'] = p*(g − 1)/(1 − p*) =
e^{ε1} exactly. The suite audits against ``spec.epsilon`` (ε∞ > ε1), which the ratio must not exceed; it
is not tight for ε∞ (a single report is ε1-LDP: tests/mechanisms/test_repeated.py checks e^{ε1} itself).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ldp_core.hashing import hash_to_range
from ldp_core.mechanisms.loloha import LolohaSpec

__all__ = ["specs", "audit_event", "audit_tight", "broken_spec", "LeakyLolohaSpec"]


def specs() -> list[LolohaSpec]:
    """ε∞ from 1 to 6, g from 2 to the policy-sized optimum; domains from 8 to 128."""
    return [
        LolohaSpec(epsilon=1.0, domain_size=16),
        LolohaSpec(epsilon=2.0, domain_size=128, epsilon_one=1.0),
        LolohaSpec(epsilon=4.0, domain_size=64, epsilon_one=1.5, g=8),
        LolohaSpec(epsilon=6.0, domain_size=8, epsilon_one=4.0),
    ]


def audit_event(spec: LolohaSpec, records: np.ndarray, x: int, x_prime: int) -> np.ndarray:
    seeds = records["seed"]
    y = records["y"].astype(np.uint32)
    g = spec.hash_range
    return (hash_to_range(x, seeds, g) == y) & (hash_to_range(x_prime, seeds, g) != y)


def audit_tight(spec: LolohaSpec) -> bool:
    """The event's ratio is e^{ε1} < e^{ε∞} (module docstring)."""
    return False


@dataclasses.dataclass(frozen=True)
class LeakyLolohaSpec(LolohaSpec):
    """Claims its epsilons but skips both randomizations: every report is the hashed value itself."""

    @property
    def p1(self) -> float:
        return 1.0

    @property
    def p2(self) -> float:
        return 1.0


def broken_spec(spec: LolohaSpec) -> LolohaSpec:
    return LeakyLolohaSpec(epsilon=spec.epsilon, domain_size=spec.domain_size, epsilon_one=spec.epsilon_one, g=spec.g)
