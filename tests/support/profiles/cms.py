"""Test profile of the private Count Mean Sketch (Apple DP Team 2017, A_client-CMS).

Audit event: with r the reported row, "h_r(x) ≠ h_r(x'), the bit at h_r(x) is
+1 and the bit at h_r(x') is -1". Every coordinate is flipped independently
with probability q = 1/(1+e^{ε/2}), so given a row without collision
P[E | x] = (1-q)² and P[E | x'] = q²; rows with a collision never count.
Both probabilities carry the same factor P[no collision in the chosen row],
so the ratio is ((1-q)/q)² = e^ε exactly: the event is tight.

Unbiasedness holds over a random hash family, so each statistical trial uses
a fresh ``hash_seed``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ldp_core.mechanisms.cms import CMSSpec

__all__ = ["specs", "audit_event", "audit_tight", "broken_spec", "fresh_trial_spec", "LeakyCMSSpec", "coordinate_bits"]


def specs() -> list[CMSSpec]:
    """Small and large ε and domains; one width that is not a multiple of 8 (padding bits)."""
    return [
        CMSSpec(epsilon=0.5, domain_size=16, num_hashes=8, width=32, hash_seed=11),
        CMSSpec(epsilon=2.0, domain_size=100, num_hashes=16, width=60, hash_seed=12),
        CMSSpec(epsilon=4.0, domain_size=40, num_hashes=4, width=128, hash_seed=13),
    ]


def coordinate_bits(records: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """Bit ``coords[i]`` of report i's sketch row (1 means +1)."""
    rows = np.arange(records.size)
    byte = records["bits"][rows, coords // 8]
    return (byte >> (coords % 8).astype(np.uint8)) & 1


def audit_event(spec: CMSSpec, records: np.ndarray, x: int, x_prime: int) -> np.ndarray:
    """Whether, in the reported row, x's coordinate is +1 and x''s is -1 (and they differ)."""
    pos = spec.hash_positions([x, x_prime]).astype(np.int64)
    row = records["row"].astype(np.int64)
    hx, hy = pos[row, 0], pos[row, 1]
    return (hx != hy) & (coordinate_bits(records, hx) == 1) & (coordinate_bits(records, hy) == 0)


def audit_tight(spec: CMSSpec) -> bool:
    """P[E|x]/P[E|x'] = ((1-q)/q)² = e^ε exactly (see the module docstring)."""
    return True


@dataclasses.dataclass(frozen=True)
class LeakyCMSSpec(CMSSpec):
    """Claims ``epsilon`` but flips each coordinate with 1/(1+e^ε) (the rate of a
    2ε sketch): the audit event's ratio is e^{2ε}."""

    @property
    def flip_probability(self) -> float:
        return 1.0 / (1.0 + math.exp(self.epsilon))


def broken_spec(spec: CMSSpec) -> CMSSpec:
    """CMS flipping at the rate of 2ε while claiming ε."""
    return LeakyCMSSpec(**spec.params())


def fresh_trial_spec(spec: CMSSpec, trial: int) -> CMSSpec:
    """The spec with a trial-specific hash family."""
    return dataclasses.replace(spec, hash_seed=(spec.hash_seed * 1_000_003 + 7_919 * (trial + 1)) % 2**32)
