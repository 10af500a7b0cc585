"""Optimal Local Hashing (OLH).

Wang, Blocki, Li and Jha, "Locally Differentially Private Protocols for
Frequency Estimation", USENIX Security 2017, Sec. 4.4. Each user draws a
fresh hash function H_s : [d] -> [0, g) (here: a fresh 32-bit seed s for
XXH32, mapped to ``[0, g)`` by multiply-shift, :func:`ldp_core.hashing.hash_to_range`),
and reports ``(s, y)`` where y is k-ary randomized response over ``[0, g)``
applied to ``H_s(x)``:

    P[y = H_s(x)] = p = e^ε / (e^ε + g - 1),
    P[y = z]      = 1 / (e^ε + g - 1)   for each z ≠ H_s(x).

The seed does not depend on x, and y is g-ary randomized response of H_s(x),
so the report is ε-LDP for every g. A report *supports* an item v when
``H_s(v) = y``: for the holder's own item that happens with probability
p* = p, for any other item with probability q* = 1/g (the hash of another
item is uniform and independent of y). Minimizing the resulting variance over
g gives g = e^ε + 1 (Sec. 4.4); the default here is ``round(e^ε) + 1``,
capped at :data:`MAX_G`.

The unbiased count is ``(C_v - n/g) / (p - 1/g)`` and its variance is
:func:`~ldp_core.mechanisms.base.pure_protocol_variance` with p* = p and
q* = 1/g. On exactness: for a fixed item, s ↦ XXH32(v, s) is a bijection of
the 32-bit words (every step of XXH32 on one 4-byte lane is invertible), so
a holder's support probability is exactly p. For other items q* = 1/g holds
exactly for an ideal (uniform, pairwise independent) hash; multiply-shift
from 32 bits gives buckets of ⌊2^32/g⌋ or ⌈2^32/g⌉ seeds, which moves the
support probability of a non-holder from 1/g by at most g/2^64 (a
second-order effect of the bucket-size deviations), a relative error of at
most g²/2^64 ≤ 2^-16 for g ≤ :data:`MAX_G`.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ldp_core.hashing import hash_bytes, hash_to_range
from ldp_core.mechanisms.base import MechanismSpec, pure_protocol_variance
from ldp_core.mechanisms.grr import grr_index_dtype

__all__ = ["OLHSpec", "MAX_G", "ENCODE_CHUNK", "default_g"]

#: Largest hash range accepted: at 2**24 every multiply-shift bucket holds
#: 256 or 257 of the 2**32 hash values, so q* = 1/g stays exact to 2**-16
#: (module docstring). The default reaches it only above ε = ln 2**24 ≈ 16.6.
MAX_G = 2**24

#: Reports encoded per vectorized step of :meth:`OLHSpec.encode`.
ENCODE_CHUNK = 1 << 14


def default_g(epsilon: float) -> int:
    """``round(e^ε) + 1`` (Wang et al. 2017, Sec. 4.4: g = e^ε + 1), capped at :data:`MAX_G`."""
    if epsilon >= math.log(MAX_G):
        return MAX_G
    return min(MAX_G, int(round(math.exp(epsilon))) + 1)


@dataclasses.dataclass(frozen=True)
class OLHSpec(MechanismSpec):
    """Optimal local hashing over ``domain_size`` items with hash range ``g``.

    ``g`` defaults to :func:`default_g` (ε); given or defaulted, the stored
    value is the same, so both give one ``spec_id``.
    """

    g: int | None = None
    name: ClassVar[str] = "olh"

    def _validate(self) -> None:
        if self.g is None:
            object.__setattr__(self, "g", default_g(self.epsilon))
        else:
            object.__setattr__(self, "g", self._require_int("olh", "g", self.g, 2, MAX_G))

    @property
    def hash_range(self) -> int:
        """``g`` as a plain ``int`` (never None after validation)."""
        return int(self.g)  # type: ignore[arg-type]

    @cached_property
    def p(self) -> float:
        """P[y = H_s(x)] = e^ε / (e^ε + g - 1)."""
        return self.exp_epsilon / (self.exp_epsilon + self.hash_range - 1)

    @property
    def q(self) -> float:
        """P[y = z] for each z ≠ H_s(x): 1 / (e^ε + g - 1)."""
        return 1.0 / (self.exp_epsilon + self.hash_range - 1)

    @property
    def q_star(self) -> float:
        """Probability that a report supports an item its user does not hold: 1/g."""
        return 1.0 / self.hash_range

    def support_probabilities(self) -> tuple[float, float]:
        """(p*, q*) = (e^ε / (e^ε + g - 1), 1/g)."""
        return self.p, self.q_star

    @cached_property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("seed", "<u4"), ("y", grr_index_dtype(self.hash_range))])

    def record_bounds(self) -> dict[str, int]:
        return {"y": self.hash_range}

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """Vectorized: one fresh 32-bit seed per report, then g-ary RR of the hash.

        Works in chunks of :data:`ENCODE_CHUNK` reports so that the numpy
        temporaries stay in cache and are reused instead of freshly mapped."""
        v = self.check_values(values)
        n = v.size
        out = np.empty(n, dtype=self.record_dtype)
        g = self.hash_range
        p = self.p
        for start in range(0, n, ENCODE_CHUNK):
            stop = min(n, start + ENCODE_CHUNK)
            m = stop - start
            seeds = rng.integers(0, 2**32, size=m, dtype=np.uint32)
            hv = hash_to_range(v[start:stop].astype(np.uint32), seeds, g)
            keep = rng.random(m) < p
            other = rng.integers(0, g - 1, size=m, dtype=np.uint32)
            other += other >= hv  # uniform over the g-1 values different from hv
            out["seed"][start:stop] = seeds
            out["y"][start:stop] = np.where(keep, hv, other)
        return out

    def encode_one(self, value: int, rng: np.random.Generator) -> np.ndarray:
        """Scalar path for the SDK (same distribution as :meth:`encode`)."""
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < self.domain_size:
            v = int(value)
        else:
            v = int(self.check_values([value])[0])
        g = self.hash_range
        seed = int(rng.integers(0, 2**32, dtype=np.uint32))
        hv = (hash_bytes(v.to_bytes(4, "little"), seed) * g) >> 32  # reduce_range on Python ints
        if rng.random() < self.p:
            y = hv
        else:
            y = int(rng.integers(0, g - 1))
            y += y >= hv
        return np.array([(seed, y)], dtype=self.record_dtype)

    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        """``[n_v p(1-p) + (n - n_v) q*(1-q*)] / (p - q*)^2`` with q* = 1/g
        (Wang et al. 2017, Sec. 3 and 4.4)."""
        return pure_protocol_variance(true_counts, self.p, self.q_star)
