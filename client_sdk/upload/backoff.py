"""Full-jitter exponential backoff, shared by the uploader and the token wallet."""

from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass(frozen=True)
class BackoffPolicy:
    """Full-jitter exponential backoff (see the module docstring)."""

    base: float = 1.0
    max_delay: float = 3600.0

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.max_delay >= self.base):
            raise ValueError(f"backoff needs base > 0 and max_delay >= base, got {self.base}, {self.max_delay}")

    def delay(self, failures: int, rng: random.Random, retry_after: float | None = None) -> float:
        """The wait after ``failures`` consecutive transient failures (>= 1; 0 gives ``U(0, base)``)."""
        if retry_after is not None:
            wait = min(retry_after, self.max_delay)
            return wait * (1.0 + 0.1 * rng.random())
        ceiling = min(self.max_delay, self.base * 2.0 ** min(failures, 62))
        return rng.uniform(0.0, ceiling)
