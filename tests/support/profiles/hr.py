"""Test profile of Hadamard response (Acharya, Sun and Zhang, AISTATS 2019).

Audit event: "y ∈ C_x and y ∉ C_x'". Basic version: rows x+1 and x'+1 of
the Hadamard matrix are orthogonal, so C_x \\ C_x' has K/4 elements:
P[E | x] = p/2 (y is uniform on C_x with probability p) and
P[E | x'] = (1-p)/2 (y is uniform on the complement of C_x' with probability
1-p). The ratio is p/(1-p) = e^ε exactly: the event is tight. Block version:
every output of C_x \\ C_x' has probability e^ε p₀ under x and p₀ under x'
(when x and x' share a block that set has b/4 outputs, else it is all of
C_x), so the ratio is again e^ε exactly.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ldp_core.mechanisms.hr import HRSpec

__all__ = ["specs", "audit_event", "audit_tight", "broken_spec", "LeakyHRSpec"]


def specs() -> list[HRSpec]:
    """Basic: small and large ε, K = 16, 128 and 64 (d = 10, 100, 63: K is the next
    power above d). Blocks: B = 32 blocks of b = 8 (x, x' in one block) and
    B = 16 blocks of b = 2 (one value per block)."""
    return [
        HRSpec(epsilon=0.5, domain_size=10),
        HRSpec(epsilon=2.0, domain_size=100),
        HRSpec(epsilon=4.0, domain_size=63),
        HRSpec(epsilon=4.0, domain_size=100, variant="blocks"),
        HRSpec(epsilon=3.0, domain_size=10, variant="blocks"),
    ]


def audit_event(spec: HRSpec, records: np.ndarray, x: int, x_prime: int) -> np.ndarray:
    """Whether y lies in C_x but not in C_x'."""
    member = spec.support_sets([x, x_prime])
    y = records["y"].astype(np.int64)
    return member[0, y] & ~member[1, y]


def audit_tight(spec: HRSpec) -> bool:
    """P[E|x]/P[E|x'] = p/(1-p) = e^ε exactly."""
    return True


@dataclasses.dataclass(frozen=True)
class LeakyHRSpec(HRSpec):
    """Claims ``epsilon`` but weighs the outputs of C_x by e^{2ε} (the layout stays ε's)."""

    @property
    def response_ratio(self) -> float:
        return math.exp(2.0 * self.epsilon)


def broken_spec(spec: HRSpec) -> HRSpec:
    """HR at 2ε while claiming ε."""
    return LeakyHRSpec(**spec.params())
