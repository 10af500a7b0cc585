"""Client sampling per round, and the privacy event each scheme implies.

* :class:`PoissonSampling`: every client takes part independently with
  probability q. The round is a Poisson-subsampled Gaussian mechanism,
  accounted tightly by the PLD accountant under add/remove-one-client
  neighbours (the accounting module's ``PoissonSampledEvent``).
* :class:`FixedCountSampling`: exactly m of the N clients, uniformly without
  replacement. ``dp_accounting`` accounts this only by RDP and only under
  replace-one-client neighbours (Wang, Balle, Kasiviswanathan, "Subsampled
  Rényi differential privacy and analytical moments accountant", AISTATS
  2019); the figure it gives is a valid but looser bound. Treating a fixed
  count as Poisson with q = m/N is common and *not* valid, so it is not done.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, TypeVar

import numpy as np

from ldp_core.fl.errors import FLError

__all__ = ["Sampling", "PoissonSampling", "FixedCountSampling"]

T = TypeVar("T")


class Sampling(Protocol):
    """A per-round client sampling scheme."""

    def sample(self, clients: Sequence[T], rng: np.random.Generator) -> list[T]: ...

    def expected_clients(self, population: int) -> float: ...


@dataclasses.dataclass(frozen=True)
class PoissonSampling:
    """Each client independently with probability ``rate``."""

    rate: float

    def __post_init__(self) -> None:
        if not 0.0 < float(self.rate) <= 1.0:
            raise FLError(f"Poisson sampling rate must be in (0, 1], got {self.rate!r}")

    def sample(self, clients: Sequence[T], rng: np.random.Generator) -> list[T]:
        keep = rng.random(len(clients)) < self.rate
        return [c for c, k in zip(clients, keep) if k]

    def expected_clients(self, population: int) -> float:
        return self.rate * population


@dataclasses.dataclass(frozen=True)
class FixedCountSampling:
    """Exactly ``count`` clients per round, uniformly without replacement."""

    count: int

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise FLError(f"FixedCountSampling.count must be a positive integer, got {self.count!r}")

    def sample(self, clients: Sequence[T], rng: np.random.Generator) -> list[T]:
        if self.count > len(clients):
            raise FLError(f"cannot sample {self.count} of {len(clients)} clients; lower count")
        idx = np.sort(rng.choice(len(clients), size=self.count, replace=False))
        return [clients[i] for i in idx]

    def expected_clients(self, population: int) -> float:
        return float(self.count)
