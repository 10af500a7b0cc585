"""Seeded populations: who holds which true value."""

from __future__ import annotations

import re

import numpy as np

__all__ = ["Distribution", "parse_distribution"]


class Distribution:
    """A distribution over domain indices ``0 .. d-1`` (``zipf:S`` or ``uniform``)."""

    def __init__(self, kind: str, domain: int, exponent: float = 1.1) -> None:
        if domain < 2:
            raise ValueError(f"domain must be at least 2, got {domain}")
        self.kind, self.domain, self.exponent = kind, domain, exponent
        if kind == "uniform":
            self.probs = np.full(domain, 1.0 / domain)
        elif kind == "zipf":
            w = 1.0 / np.arange(1, domain + 1, dtype=np.float64) ** exponent
            self.probs = w / w.sum()
        else:
            raise ValueError(f"unknown distribution {kind!r}")
        self._cdf = np.cumsum(self.probs)
        self._cdf[-1] = 1.0

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` independent draws (int64 indices)."""
        return np.searchsorted(self._cdf, rng.random(n), side="right").astype(np.int64)

    def __str__(self) -> str:
        return "uniform" if self.kind == "uniform" else f"zipf:{self.exponent:g}"


def parse_distribution(text: str, domain: int) -> Distribution:
    """``"uniform"`` or ``"zipf:S"`` (S > 0)."""
    if text == "uniform":
        return Distribution("uniform", domain)
    m = re.fullmatch(r"zipf:([0-9]*\.?[0-9]+)", text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"distribution must be 'uniform' or 'zipf:S' with S > 0, got {text!r}")
    return Distribution("zipf", domain, float(m.group(1)))
