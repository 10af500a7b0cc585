"""Test profile of the private Hadamard Count Mean Sketch (Apple DP Team 2017, A_client-HCMS).

Audit event: with (r, l, b) the report, "H[h_r(x), l] ≠ H[h_r(x'), l] and the
reported coefficient equals x's, (-1)^b = H[h_r(x), l]". The coefficient is
flipped with probability f = 1/(1+e^ε), so P[E | x] = P[differ](1-f) and
P[E | x'] = P[differ] f, where P[differ] (over the row, the column and the
hash family) is the same for both inputs: the ratio is (1-f)/f = e^ε exactly.

Each statistical trial uses a fresh ``hash_seed`` (unbiased over the family).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ldp_core.hadamard import hadamard_bit
from ldp_core.mechanisms.cms import HCMSSpec

__all__ = ["specs", "audit_event", "audit_tight", "broken_spec", "fresh_trial_spec", "LeakyHCMSSpec"]


def specs() -> list[HCMSSpec]:
    """Small and large ε and domains."""
    return [
        HCMSSpec(epsilon=0.5, domain_size=16, num_hashes=8, width=32, hash_seed=21),
        HCMSSpec(epsilon=2.0, domain_size=100, num_hashes=16, width=64, hash_seed=22),
        HCMSSpec(epsilon=4.0, domain_size=40, num_hashes=4, width=128, hash_seed=23),
    ]


def audit_event(spec: HCMSSpec, records: np.ndarray, x: int, x_prime: int) -> np.ndarray:
    """Whether the reported coefficient is x's where x's and x''s differ."""
    pos = spec.hash_positions([x, x_prime])
    row = records["row"].astype(np.int64)
    col = records["col"]
    bx, by = hadamard_bit(pos[row, 0], col), hadamard_bit(pos[row, 1], col)
    return (bx != by) & (records["bit"] == bx)


def audit_tight(spec: HCMSSpec) -> bool:
    """P[E|x]/P[E|x'] = (1-f)/f = e^ε exactly (see the module docstring)."""
    return True


@dataclasses.dataclass(frozen=True)
class LeakyHCMSSpec(HCMSSpec):
    """Claims ``epsilon`` but flips the coefficient with 1/(1+e^{2ε})."""

    @property
    def flip_probability(self) -> float:
        return 1.0 / (1.0 + math.exp(2.0 * self.epsilon))


def broken_spec(spec: HCMSSpec) -> HCMSSpec:
    """HCMS randomizing at 2ε while claiming ε."""
    return LeakyHCMSSpec(**spec.params())


def fresh_trial_spec(spec: HCMSSpec, trial: int) -> HCMSSpec:
    """The spec with a trial-specific hash family."""
    return dataclasses.replace(spec, hash_seed=(spec.hash_seed * 1_000_003 + 7_919 * (trial + 1)) % 2**32)
