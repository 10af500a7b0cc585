"""Test profile of Hadamard response (Acharya, Sun and Zhang, AISTATS 2019).

Audit event: "y ∈ C_x and y ∉ C_x'". Rows x+1 and x'+1 of the Hadamard
matrix are orthogonal, so C_x \\ C_x' has K/4 elements: P[E | x] = p/2
(y is uniform on C_x with probability p) and P[E | x'] = (1-p)/2 (y is
uniform on the complement of C_x' with probability 1-p). The ratio is
p/(1-p) = e^ε exactly: the event is tight.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from client_sdk.hadamard import hadamard_bit
from client_sdk.mechanisms.hr import HRSpec

__all__ = ["specs", "audit_event", "audit_tight", "broken_spec", "LeakyHRSpec"]


def specs() -> list[HRSpec]:
    """Small and large ε; K = 16, 128 and 64 (d = 10, 100, 63: K is the next power above d)."""
    return [
        HRSpec(epsilon=0.5, domain_size=10),
        HRSpec(epsilon=2.0, domain_size=100),
        HRSpec(epsilon=4.0, domain_size=63),
    ]


def audit_event(spec: HRSpec, records: np.ndarray, x: int, x_prime: int) -> np.ndarray:
    """Whether y lies in C_x but not in C_x'."""
    y = records["y"]
    return (hadamard_bit(x + 1, y) == 0) & (hadamard_bit(x_prime + 1, y) == 1)


def audit_tight(spec: HRSpec) -> bool:
    """P[E|x]/P[E|x'] = p/(1-p) = e^ε exactly."""
    return True


@dataclasses.dataclass(frozen=True)
class LeakyHRSpec(HRSpec):
    """Claims ``epsilon`` but lands in C_x with probability e^{2ε}/(1+e^{2ε})."""

    @property
    def p(self) -> float:
        e = math.exp(2.0 * self.epsilon)
        return e / (1.0 + e)


def broken_spec(spec: HRSpec) -> HRSpec:
    """HR at 2ε while claiming ε."""
    return LeakyHRSpec(epsilon=spec.epsilon, domain_size=spec.domain_size)
