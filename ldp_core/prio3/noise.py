"""Central DP for Prio3, added by the aggregators (docs/PRIO3.md, "Central noise").

Each aggregator adds discrete Laplace noise of scale ``b = Δ / ε`` (Δ: the L1 sensitivity of one
device's report under add/remove, :func:`sensitivity`) to **its own** aggregate share before it
releases it, so the collector only ever holds ``exact + N_leader + N_helper``. Each aggregator adds
the full noise, so the release is ε-DP against the collector (and the analyst) and stays ε-DP
against the collector colluding with either aggregator: the other one's noise alone suffices (the
crate's ``AggregatorWithNoise`` makes the same choice). The price: the collector's error has twice
the variance of one noise draw.

The noise values are the ``prio`` crate's exact discrete Laplace sampler ([CKS20]) over a
TurboSHAKE128 stream whose 32-byte seed comes from the OS CSPRNG (``secrets.token_bytes``) unless a
test passes one; the binding adds them to the aggregate share in the field. Nothing here does
field arithmetic.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from ldp_core.errors import SpecError
from ldp_core.noise import laplace_scale_used
from ldp_core.prio3.vdaf import Prio3, load_binding

__all__ = ["AggregatorNoise", "SeedSource", "sensitivity"]

#: where an aggregator's noise seeds come from: () -> 32 bytes
SeedSource = Callable[[], bytes]


def os_seed() -> bytes:
    return secrets.token_bytes(32)


def sensitivity(config: Prio3) -> int:
    """L1 sensitivity of the aggregate to adding or removing one report of ``config``."""
    if config.type in ("count", "histogram"):
        return 1
    if config.type == "sum":
        return int(config.max_measurement)
    return int(config.max_measurement) * int(config.length)


def output_length(config: Prio3) -> int:
    return int(config.length) if config.type in ("histogram", "sumvec") else 1


@dataclasses.dataclass(frozen=True)
class AggregatorNoise:
    """One aggregator's noise for one metric: discrete Laplace of scale Δ/ε (rounded up to 2^-20) per element."""

    epsilon: float
    sensitivity: int

    def __post_init__(self) -> None:
        e = float(self.epsilon)
        if not (math.isfinite(e) and e > 0):
            raise SpecError(f"central epsilon must be a positive number, got {self.epsilon!r}")
        if self.sensitivity < 1:
            raise SpecError(f"sensitivity must be >= 1, got {self.sensitivity!r}")

    @classmethod
    def for_config(cls, config: Prio3, epsilon: float) -> AggregatorNoise:
        return cls(float(epsilon), sensitivity(config))

    @property
    def scale(self) -> Fraction:
        return laplace_scale_used(self.sensitivity / self.epsilon)

    @property
    def variance(self) -> float:
        """Variance of one draw: 2r / (1 - r)² with r = exp(-1/b)."""
        r = math.exp(-1.0 / float(self.scale))
        return 2.0 * r / (1.0 - r) ** 2

    def draw(self, n: int, seed: bytes) -> list[int]:
        """``n`` noise values from the crate's sampler, TurboSHAKE128 seeded with ``seed`` (32 bytes)."""
        b = self.scale
        return [int(v) for v in load_binding().discrete_laplace(b.numerator, b.denominator, int(n), bytes(seed))]

    def apply(self, config: Prio3, share: bytes, seed: bytes) -> bytes:
        """``share`` with this noise added to each of its elements (in the field, by the crate)."""
        return bytes(config.vdaf().add_to_aggregate_share(share, self.draw(output_length(config), seed)))

    def to_json(self) -> dict[str, Any]:
        return {
            "mechanism": "discrete_laplace",
            "epsilon": self.epsilon,
            "sensitivity": self.sensitivity,
            "neighbours": "add/remove one report",
            "scale": f"{self.scale.numerator}/{self.scale.denominator}",
            "variance": self.variance,
        }
