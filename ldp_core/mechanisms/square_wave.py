"""Square Wave (SW): the distribution of a bounded number.

Li, Wang, Lopuhaä-Zwakenberg, Li and Škorić, "Estimating Numerical
Distributions under Local Differential Privacy", SIGMOD 2020
(arXiv:1912.01051), Sec. 4. A value in ``[low, high]`` is mapped to ``v`` in
``[0, 1]``; the report ``ṽ`` lies in ``[−b, 1 + b]`` with density

    p = e^ε / (2b e^ε + 1)   where |ṽ − v| ≤ b,
    q = 1 / (2b e^ε + 1)     elsewhere,

so any two inputs' densities differ by at most ``p/q = e^ε``. The width is
their choice maximizing the mutual information bound,
``b = (ε e^ε − e^ε + 1) / (2 e^ε (e^ε − 1 − ε))``.

**Discretized here, on the device.** The spec has ``bins = B`` input bins of
width ``1/B`` over ``[0, 1]`` (the histogram the server estimates) and
``out_bins`` output bins over ``[−b, 1 + b]`` (default ``⌈(1 + 2b) B⌉``, the
same width). The device first moves ``v`` to the centre ``c_i`` of its input
bin (pre-processing: no privacy cost), draws ``ṽ`` from the square wave
around ``c_i`` and reports only the index of ``ṽ``'s output bin
(post-processing). The server's model is then exact, not an approximation
for values spread inside a bin:

    M[j, i] = P[report j | input bin i] = q·|J_j| + (p − q)·|J_j ∩ [c_i − b, c_i + b]|,

``J_j`` the ``j``-th output bin. The histogram is estimated by EM with
smoothing (:mod:`estimator.oracles.square_wave`).

**Record**: ``bin``, the output bin (``u2``, or ``u4`` above 65,536 bins).
"""

from __future__ import annotations

import dataclasses
import math
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ldp_core.errors import SpecError
from ldp_core.mechanisms.grr import grr_index_dtype
from ldp_core.mechanisms.numeric import NumericSpec

__all__ = ["SquareWaveSpec", "square_wave_b"]

MAX_BINS = 1 << 16


def square_wave_b(epsilon: float) -> float:
    """``b = (ε e^ε − e^ε + 1) / (2 e^ε (e^ε − 1 − ε))`` (Li et al. 2020, Sec. 4.2)."""
    e = math.exp(epsilon)
    if epsilon < 1e-4:  # the formula is 0/0 at ε → 0; its limit is 1/2
        return 0.5
    return (epsilon * e - e + 1.0) / (2.0 * e * (e - 1.0 - epsilon))


@dataclasses.dataclass(frozen=True)
class SquareWaveSpec(NumericSpec):
    """Square Wave over ``[low, high]`` with ``bins`` histogram bins (module docstring)."""

    bins: int = 256
    out_bins: int | None = None

    name: ClassVar[str] = "sw"
    kind: ClassVar[str] = "distribution"

    def _validate(self) -> None:
        object.__setattr__(self, "bins", self._require_int("sw", "bins", self.bins, 2, MAX_BINS))
        if self.out_bins is None:
            object.__setattr__(self, "out_bins", int(math.ceil((1.0 + 2.0 * self.b) * self.bins - 1e-9)))
        object.__setattr__(self, "out_bins", self._require_int("sw", "out_bins", self.out_bins, 2, 4 * MAX_BINS))
        if self.b <= 0:
            raise SpecError(f"sw: epsilon {self.epsilon} gives no square wave width")

    @property
    def b(self) -> float:
        return square_wave_b(self.epsilon)

    @property
    def p(self) -> float:
        return math.exp(self.epsilon) / (2.0 * self.b * math.exp(self.epsilon) + 1.0)

    @property
    def q(self) -> float:
        return 1.0 / (2.0 * self.b * math.exp(self.epsilon) + 1.0)

    @property
    def n_out(self) -> int:
        return int(self.out_bins)  # type: ignore[arg-type]

    @cached_property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("bin", grr_index_dtype(self.n_out))])

    def record_bounds(self) -> dict[str, int]:
        return {"bin": self.n_out}

    def input_bins(self, values: Any) -> np.ndarray:
        """The input bin of each value in ``[low, high]`` (``high`` in the last bin)."""
        t = (self.normalize(values) + 1.0) / 2.0
        return np.minimum((t * self.bins).astype(np.int64), self.bins - 1)

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        i = self.input_bins(np.asarray(values, dtype=np.float64).reshape(-1))
        c = (i + 0.5) / self.bins
        b = self.b
        near = rng.random(i.shape) < 2.0 * b * self.p
        u = rng.random(i.shape)
        inside = c - b + u * 2.0 * b
        # the rest of [−b, 1 + b] has length 1: [−b, c − b) then (c + b, 1 + b]
        outside = np.where(u < c, -b + u, c + b + (u - c))
        v = np.where(near, inside, outside)
        j = np.floor((v + b) / (1.0 + 2.0 * b) * self.n_out).astype(np.int64)
        out = np.empty(i.size, dtype=self.record_dtype)
        out["bin"] = np.clip(j, 0, self.n_out - 1)
        return out

    def encode_one(self, value: Any, rng: np.random.Generator) -> np.ndarray:
        return self.encode(np.asarray([value], dtype=np.float64), rng)

    def transition_matrix(self) -> np.ndarray:
        """``M[j, i] = P[report j | input bin i]`` (module docstring), shape ``(out_bins, bins)``; columns sum
        to 1."""
        b = self.b
        edges = -b + np.arange(self.n_out + 1) * ((1.0 + 2.0 * b) / self.n_out)
        lo, hi = edges[:-1, None], edges[1:, None]
        c = ((np.arange(self.bins) + 0.5) / self.bins)[None, :]
        overlap = np.clip(np.minimum(hi, c + b) - np.maximum(lo, c - b), 0.0, None)
        return self.q * (hi - lo) + (self.p - self.q) * overlap

    def bin_edges(self) -> np.ndarray:
        """The ``bins + 1`` edges of the histogram, in the value's units."""
        return float(self.low) + np.linspace(0.0, 1.0, self.bins + 1) * 2.0 * self.half_width
