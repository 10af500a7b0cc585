r"""Hadamard response, device side.

Acharya, Sun and Zhang, "Hadamard Response: Estimating Distributions
Privately, Efficiently, and with Little Communication" (AISTATS 2019).

**Basic version** (``variant="basic"``, the default; the paper's scheme for
the high-privacy regime, ε-LDP for every ε). Let K be the smallest power of
two *greater than* d and H_K the Sylvester Hadamard matrix,
H[i, y] = (-1)^popcount(i & y). Input x uses row x + 1 (row 0 is all ones and
is skipped) and its set C_x = {y in [K]: H[x+1, y] = +1}, |C_x| = K/2. The
device outputs y ∈ C_x with probability p = e^ε/(1+e^ε), uniform within
C_x, and otherwise y uniform in the complement. Every output has
probability 2p/K or 2(1-p)/K, whose ratio is e^ε: ε-LDP. A report is
log2 K bits. For x ≠ x', rows x+1 and x'+1 are orthogonal, so
|C_x ∩ C_x'| = K/4 and a user holding x' lands in C_x with probability
exactly 1/2: a pure protocol with p* = p, q* = 1/2, estimated by
n̂_x = (T_x - n/2)/(p - 1/2) with T_x = #{i: y_i ∈ C_x}.

**Block version** (``variant="blocks"``, the paper's general-ε scheme). With
B = 2^(⌈log2 min(e^ε, 2d)⌉ - 1) blocks (the largest power of two below
min(e^ε, 2d)) and block size b, the smallest power of two > ⌈d/B⌉, input x
belongs to block β(x) = x // (b-1) and uses row r(x) = x mod (b-1) + 1 of H_b;
outputs are pairs (block, y) ∈ [B]×[b], sent as block·b + y. C_x is the half
{(β(x), y): H_b[r(x), y] = +1} of x's block, |C_x| = b/2. Each output in C_x
has probability e^ε p₀ and every other one (in any block) p₀, with
p₀ = 1/((b/2) e^ε + Bb - b/2): ε-LDP. With B = 1 this is the basic version.

Sampling never materializes H: draw y0 uniform in [b]; if the parity of
r & y0 is not the wanted one (0 to land in C_x, 1 for the other half of the
block), flip in y0 the lowest set bit of r. That toggles the parity and is a
bijection between the two halves, so y is uniform on the wanted half.

The estimator (``estimator/oracles/hr.py``) transforms the histogram of each
block with one fast Walsh–Hadamard transform; :meth:`HRSpec.count_variance`
derives the variance.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from ldp_core.errors import SpecError
from ldp_core.hadamard import hadamard_bit, lowest_set_bit
from ldp_core.mechanisms.base import MechanismSpec, pure_protocol_variance
from ldp_core.mechanisms.grr import grr_index_dtype

__all__ = ["HRSpec", "HR_VARIANTS", "MAX_HR_OUTPUTS"]

#: the estimator keeps a histogram of at most this many int64 counts (512 MiB)
MAX_HR_OUTPUTS = 1 << 26
HR_VARIANTS = ("basic", "blocks")


@dataclasses.dataclass(frozen=True)
class HRSpec(MechanismSpec):
    """Hadamard response over ``domain_size`` values (``variant`` "basic" or "blocks")."""

    variant: str = "basic"
    name: ClassVar[str] = "hr"

    def _validate(self) -> None:
        if self.variant not in HR_VARIANTS:
            raise SpecError(f"hr: variant must be one of {HR_VARIANTS}, got {self.variant!r}")
        if self.output_size > MAX_HR_OUTPUTS:
            raise SpecError(
                f"hr: {self.output_size} outputs exceed {MAX_HR_OUTPUTS}; hash values into a smaller domain or use hcms"
            )

    # -- layout -----------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """B: 1 for the basic version, else the largest power of two below min(e^ε, 2d)."""
        if self.variant == "basic":
            return 1
        target = min(self.exp_epsilon, 2.0 * self.domain_size)
        return 1 << (math.ceil(math.log2(target)) - 1)

    @property
    def block_size(self) -> int:
        """b: the smallest power of two greater than ⌈d/B⌉ (each block holds b - 1 values)."""
        per_block = -(-self.domain_size // self.num_blocks)
        return 1 << per_block.bit_length()

    @property
    def output_size(self) -> int:
        """K = B·b outputs (basic: the smallest power of two greater than d)."""
        return self.num_blocks * self.block_size

    def block_and_row(self, items: Any) -> tuple[np.ndarray, np.ndarray]:
        """(β(x), r(x)) = (x // (b-1), x mod (b-1) + 1) as ``uint32`` arrays."""
        x = np.asarray(items, dtype=np.int64)
        per = self.block_size - 1
        return (x // per).astype(np.uint32), (x % per + 1).astype(np.uint32)

    def support_sets(self, items: Any) -> np.ndarray:
        """Boolean ``(len(items), K)`` membership of each output in C_x (tests and audits; O(dK))."""
        block, row = self.block_and_row(np.asarray(items).reshape(-1))
        out = np.arange(self.output_size)
        same_block = (out[None, :] // self.block_size) == block[:, None]
        return same_block & (hadamard_bit(row[:, None], out[None, :] % self.block_size) == 0)

    # -- probabilities ------------------------------------------------------------
    @property
    def response_ratio(self) -> float:
        """P[output | output in C_x] / P[output | output not in C_x] = e^ε."""
        return self.exp_epsilon

    @property
    def _base_probability(self) -> float:
        """p₀ = 1/((b/2) e^ε + Bb - b/2): the probability of each output outside C_x."""
        b, k = self.block_size, self.output_size
        return 1.0 / (b / 2 * self.response_ratio + k - b / 2)

    @property
    def p(self) -> float:
        """P[y ∈ C_x | x] = (b/2) e^ε p₀ (basic: e^ε/(1+e^ε))."""
        if self.num_blocks == 1:
            r = self.response_ratio
            return r / (1.0 + r)
        return self.block_size / 2 * self.response_ratio * self._base_probability

    @property
    def block_outside_probability(self) -> float:
        """P[y in x's block but not in C_x | x] = (b/2) p₀ (basic: 1 - p)."""
        if self.num_blocks == 1:
            return 1.0 - self.p
        return self.block_size / 2 * self._base_probability

    @property
    def gain(self) -> float:
        """g = E[H_b[r(x), y] 1{y in β(x)} | x] = p - (b/2) p₀; n̂_x = F_x / g (basic: 2p - 1)."""
        return self.p - self.block_outside_probability

    def support_probabilities(self) -> tuple[float, float]:
        """(p*, q*) = (e^ε/(1+e^ε), 1/2) of the basic version (a pure protocol)."""
        if self.num_blocks != 1:
            raise SpecError("hr: the block version is not a pure protocol; use gain and count_variance")
        return self.p, 0.5

    # -- reports ------------------------------------------------------------------
    @property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("y", grr_index_dtype(self.output_size))])

    def record_bounds(self) -> dict[str, int]:
        return {"y": self.output_size}

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        v = self.check_values(values)
        n, b, blocks = v.size, self.block_size, self.num_blocks
        block, row = self.block_and_row(v)
        u = rng.random(n)
        y = rng.integers(0, b, size=n, dtype=np.uint32)
        outside = (u >= self.p).astype(np.uint8)
        wrong = hadamard_bit(row, y) != outside
        if blocks > 1:
            own = u < self.p + self.block_outside_probability
            other = rng.integers(0, blocks - 1, size=n, dtype=np.uint32)
            other += other >= block
            block = np.where(own, block, other)
            wrong &= own
        y ^= lowest_set_bit(row) * wrong.astype(np.uint32)
        out = np.empty(n, dtype=self.record_dtype)
        out["y"] = block * np.uint32(b) + y
        return out

    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        r"""Variance of n̂_x = F_x / g, F_x = Σ_i H_b[r(x), y_i] 1{y_i in block β(x)}.

        Basic version: the pure-protocol variance with p* = e^ε/(1+e^ε), q* = 1/2,
        [n_x p*(1-p*) + (n - n_x)/4] / (p* - 1/2)².

        Block version: let Z_i be user i's term, a = p + (b/2)p₀ (probability of
        landing in one's own block), c = b p₀ (landing in a given other block).
        E Z_i = g if x_i = x and 0 otherwise (other rows of H_b sum to zero over
        C_{x_i} and over its complement; other blocks are hit uniformly), and
        Z_i² = 1{y_i in β(x)}. With n_β the users in x's block,

            Var F_x = n_β a + (n - n_β) c - n_x g²,   Var n̂_x = Var F_x / g².

        With B = 1 (a = 1) this equals the basic formula.
        """
        c_true = np.asarray(true_counts, dtype=np.float64)
        if self.num_blocks == 1:
            return pure_protocol_variance(c_true, self.p, 0.5)
        n = float(c_true.sum())
        block, _ = self.block_and_row(np.arange(c_true.size))
        n_block = np.bincount(block, weights=c_true, minlength=self.num_blocks)[block]
        g = self.gain
        a = self.p + self.block_outside_probability
        c = self.block_size * self._base_probability
        return (n_block * a + (n - n_block) * c - c_true * g * g) / (g * g)
