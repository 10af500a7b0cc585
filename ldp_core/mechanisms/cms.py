r"""Count Mean Sketch (CMS) and Hadamard Count Mean Sketch (HCMS), device side.

Both follow Apple's Differential Privacy Team, "Learning with Privacy at
Scale" (2017), algorithms A_client-CMS and A_client-HCMS. A sketch has k
hash functions h_1..h_k into [0, m).

**Hash family.** ``h_j(x) = hash_to_range(x, seed_j, m)`` (XXH32 of x's
4-byte little-endian form, reduced by multiply-shift; see
:mod:`ldp_core.hashing`) with ``seed_j = XXH32(j, seed=hash_seed)``, i.e.
``seed_j = xxh32_u32(j, hash_seed)``. ``hash_seed`` (a u32 parameter of the
spec, default 0) selects the family; devices and the estimator compute the
same k·d positions. Python's ``hash`` is never used.

**CMS.** Pick j uniformly in [k]; let v = -1^m with v[h_j(x)] = +1; flip
each coordinate independently with probability 1/(1 + e^{ε/2}); report
(j, ṽ). Changing x moves the +1 of at most two coordinates, each flip ratio
is e^{ε/2}, so the report is ε-LDP. The record stores ṽ as m bits (bit 1 is
+1), little-endian bit order: coordinate a is bit ``a % 8`` of byte
``a // 8``; padding bits of the last byte are 0.

**HCMS.** Pick j uniformly in [k] and l uniformly in [m] (m a power of two);
w = H_m[h_j(x), l] with H_m the Sylvester Hadamard matrix,
H[a, l] = (-1)^popcount(a & l); flip w with probability 1/(1 + e^ε); report
(j, l, b) where w̃ = (-1)^b. One bit of randomized response: ε-LDP.

The server side (the unbiased estimators and why they are unbiased) is in
``estimator/oracles/cms.py``; :meth:`CMSSpec.count_variance` and
:meth:`HCMSSpec.count_variance` derive the exact variances.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ldp_core.bernoulli import bernoulli_words
from ldp_core.errors import FrameError, SpecError
from ldp_core.hadamard import hadamard_bit
from ldp_core.hashing import hash_to_range, xxh32_u32
from ldp_core.mechanisms.base import MechanismSpec
from ldp_core.mechanisms.grr import grr_index_dtype

__all__ = ["CMSSpec", "HCMSSpec", "sketch_row_seeds", "MAX_SKETCH_CELLS"]

#: k·m above this would make the estimator's sketch (int64) exceed 128 MiB.
MAX_SKETCH_CELLS = 1 << 24
_MAX_HASHES = 1 << 16
_MAX_WIDTH = 1 << 16


def sketch_row_seeds(hash_seed: int, num_hashes: int) -> np.ndarray:
    """``seed_j = xxh32_u32(j, hash_seed)`` for j = 0..k-1 (``uint32``)."""
    return xxh32_u32(np.arange(num_hashes, dtype=np.uint32), np.uint32(hash_seed))


def _other_counts_terms(true_counts: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    c = np.asarray(true_counts, dtype=np.float64)
    n = float(c.sum())
    others = n - c
    others_sq = float(np.dot(c, c)) - c * c  # Σ_{x≠d} n_x²
    return c, n, others, others_sq


@dataclasses.dataclass(frozen=True)
class _SketchSpec(MechanismSpec):
    """Fields and hash family shared by CMS and HCMS."""

    num_hashes: int = 256
    width: int = 1024
    hash_seed: int = 0

    def _validate(self) -> None:
        k = self._require_int(self.name, "num_hashes", self.num_hashes, 1, _MAX_HASHES)
        m = self._require_int(self.name, "width", self.width, 2, _MAX_WIDTH)
        s = self._require_int(self.name, "hash_seed", self.hash_seed, 0, 2**32 - 1)
        if k * m > MAX_SKETCH_CELLS:
            raise SpecError(
                f"{self.name}: num_hashes*width = {k}*{m} = {k * m} exceeds {MAX_SKETCH_CELLS} sketch cells; "
                "lower num_hashes or width"
            )
        object.__setattr__(self, "num_hashes", k)
        object.__setattr__(self, "width", m)
        object.__setattr__(self, "hash_seed", s)

    @cached_property
    def row_seeds(self) -> np.ndarray:
        """The k hash seeds ``seed_j`` (see the module docstring)."""
        seeds = sketch_row_seeds(self.hash_seed, self.num_hashes)
        seeds.setflags(write=False)
        return seeds

    def hash_positions(self, items: Any) -> np.ndarray:
        """``h_j(x)`` for every row j and item x: a ``(k, len(items))`` ``uint32`` array."""
        x = np.asarray(items, dtype=np.int64).astype(np.uint32)
        return hash_to_range(x[None, :], self.row_seeds[:, None], self.width)

    @property
    def _row_dtype(self) -> np.dtype:
        return grr_index_dtype(self.num_hashes)

    @staticmethod
    def _collision_variance(m: int, k: int, others_sq: np.ndarray) -> np.ndarray:
        """Var over the hash family of Σ_{x≠d} n_x R_x, R_x = (1/k)#{j: h_j(x)=h_j(d)} ~ Bin(k, 1/m)/k."""
        return others_sq * (m - 1) / (k * m * m)


@dataclasses.dataclass(frozen=True)
class CMSSpec(_SketchSpec):
    """Private Count Mean Sketch (A_client-CMS): report a row index and m flipped bits."""

    name: ClassVar[str] = "cms"

    @property
    def flip_probability(self) -> float:
        """1 / (1 + e^{ε/2}): each sketch coordinate is flipped with this probability."""
        return 1.0 / (1.0 + math.exp(self.epsilon / 2.0))

    @property
    def c_eps(self) -> float:
        """c_ε = (e^{ε/2} + 1) / (e^{ε/2} - 1), the paper's debiasing constant."""
        e = math.exp(self.epsilon / 2.0)
        return (e + 1.0) / (e - 1.0)

    @property
    def n_bytes(self) -> int:
        return (self.width + 7) // 8

    @property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("row", self._row_dtype), ("bits", "u1", (self.n_bytes,))])

    def record_bounds(self) -> dict[str, int]:
        return {"row": self.num_hashes}

    def check_records(self, records: np.ndarray) -> None:
        super().check_records(records)
        pad = self.width % 8
        if pad and records.size:
            bad = (records["bits"][:, -1] >> np.uint8(pad)) != 0
            if bad.any():
                i = int(np.argmax(bad))
                raise FrameError(f"cms: record {i} sets padding bits above coordinate {self.width - 1}; they must be 0")

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        v = self.check_values(values)
        n, m = v.size, self.width
        rows = rng.integers(0, self.num_hashes, size=n)
        pos = hash_to_range(v.astype(np.uint32), self.row_seeds[rows], m).astype(np.int64)
        words = (m + 63) // 64
        flips = bernoulli_words(self.flip_probability, n * words, rng)
        flat_word = np.arange(n, dtype=np.int64) * words + (pos >> 6)
        flips[flat_word] ^= np.left_shift(np.uint64(1), (pos & 63).astype(np.uint64))
        packed = flips.astype("<u8", copy=False).view(np.uint8).reshape(n, words * 8)[:, : self.n_bytes]
        out = np.empty(n, dtype=self.record_dtype)
        out["row"] = rows
        out["bits"] = packed
        if m % 8:
            out["bits"][:, -1] &= np.uint8((1 << (m % 8)) - 1)
        return out

    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        r"""Exact variance of the CMS estimate of each item, over the device
        randomness *and* a uniformly random hash family (each h_j(x) uniform on
        [m], independent across j and x).

        Write c = c_ε, q = 1/(1+e^{ε/2}), and for report i with row j_i let
        B_i = 1 if the reported bit at h_{j_i}(d) is +1. The estimator is
        f̂(d) = m/(m-1) (A - n/m) with A = Σ_i Y_i, Y_i = (1-c)/2 + c B_i.

        Given the hashes, reports are independent. Let r_i = (1/k)#{j: h_j(x_i)
        = h_j(d)} (r_i = 1 when x_i = d). Then P(B_i = 1 | h) = q + r_i/c, so
        E[Y_i | h] = r_i (using c q = 1/(e^{ε/2}-1) = -(1-c)/2), and
        Var(Y_i | h) = c² p_i(1-p_i) = c² q(1-q) + r_i(1-r_i), where
        c² q(1-q) = e^{ε/2}/(e^{ε/2}-1)².

        Over the hash family, for x ≠ d, k r_x ~ Binomial(k, 1/m): E r = 1/m,
        Var r = (m-1)/(k m²), and r_x, r_y are uncorrelated for x ≠ y (three
        independent uniform positions). Hence E[r(1-r)] = (m-1)(k-1)/(k m²), and
        by the law of total variance

            Var A = n e^{ε/2}/(e^{ε/2}-1)² + (n - n_d)(m-1)(k-1)/(k m²)
                    + Σ_{x≠d} n_x² (m-1)/(k m²),
            Var f̂(d) = (m/(m-1))² Var A.

        The first term is the paper's (c_ε² - 1)/4 · n noise term; the others
        are hash collisions, averaged over the family.
        """
        c, n, others, others_sq = _other_counts_terms(true_counts)
        m, k = float(self.width), float(self.num_hashes)
        e = math.exp(self.epsilon / 2.0)
        var_a = n * e / (e - 1.0) ** 2 + others * (m - 1) * (k - 1) / (k * m * m)
        var_a = var_a + self._collision_variance(self.width, self.num_hashes, others_sq)
        return (m / (m - 1)) ** 2 * var_a


@dataclasses.dataclass(frozen=True)
class HCMSSpec(_SketchSpec):
    """Private Hadamard Count Mean Sketch (A_client-HCMS): report (row, column, one bit)."""

    name: ClassVar[str] = "hcms"

    def _validate(self) -> None:
        super()._validate()
        if self.width & (self.width - 1):
            raise SpecError(f"hcms: width must be a power of two (Hadamard size), got {self.width}; try 1024")

    @property
    def flip_probability(self) -> float:
        """1 / (1 + e^ε): the Hadamard coefficient is flipped with this probability."""
        return 1.0 / (1.0 + self.exp_epsilon)

    @property
    def c_eps(self) -> float:
        """c_ε = (e^ε + 1) / (e^ε - 1)."""
        return (self.exp_epsilon + 1.0) / (self.exp_epsilon - 1.0)

    @property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("row", self._row_dtype), ("col", grr_index_dtype(self.width)), ("bit", "u1")])

    def record_bounds(self) -> dict[str, int]:
        return {"row": self.num_hashes, "col": self.width, "bit": 2}

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        v = self.check_values(values)
        n = v.size
        rows = rng.integers(0, self.num_hashes, size=n, dtype=np.uint32)
        cols = rng.integers(0, self.width, size=n, dtype=np.uint32)
        flip = rng.random(n) < self.flip_probability
        pos = hash_to_range(v.astype(np.uint32), self.row_seeds[rows], self.width)
        out = np.empty(n, dtype=self.record_dtype)
        out["row"] = rows
        out["col"] = cols
        out["bit"] = hadamard_bit(pos, cols) ^ flip
        return out

    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        r"""Exact variance of the HCMS estimate of each item, over the device
        randomness and a uniformly random hash family.

        With c = c_ε, the estimator is f̂(d) = m/(m-1)(A - n/m) where
        A = Σ_i Y_i, Y_i = c w̃_i H[h_{j_i}(d), l_i] ∈ {-c, +c}. Given the hashes,
        E[w̃_i] = H[h_{j_i}(x_i), l_i]/c and rows of H are orthogonal, so
        E[Y_i | h] = (1/k)#{j: h_j(x_i) = h_j(d)} = r_i and, since Y_i² = c²,
        Var(Y_i | h) = c² - r_i². With r as in :meth:`CMSSpec.count_variance`
        (r_d = 1; for x ≠ d, E r² = 1/m² + (m-1)/(k m²)):

            Var A = n c² - n_d - (n - n_d)(1/m² + (m-1)/(k m²))
                    + Σ_{x≠d} n_x² (m-1)/(k m²),
            Var f̂(d) = (m/(m-1))² Var A.
        """
        c, n, others, others_sq = _other_counts_terms(true_counts)
        m, k = float(self.width), float(self.num_hashes)
        ce = self.c_eps
        var_a = n * ce * ce - c - others * (1.0 / (m * m) + (m - 1) / (k * m * m))
        var_a = var_a + self._collision_variance(self.width, self.num_hashes, others_sq)
        return (m / (m - 1)) ** 2 * var_a
