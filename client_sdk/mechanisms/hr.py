r"""Hadamard response (basic version), device side.

Acharya, Sun and Zhang, "Hadamard Response: Estimating Distributions
Privately, Efficiently, and with Little Communication" (AISTATS 2019): the
basic construction the paper gives for the high-privacy regime. It is
ε-LDP for every ε; the paper's block variant is better for large ε.

Let K be the smallest power of two *greater than* d and H_K the Sylvester
Hadamard matrix, H[i, y] = (-1)^popcount(i & y). Input x uses row x + 1
(row 0 is all ones and is skipped) and its set
C_x = {y in [K]: H[x+1, y] = +1}, |C_x| = K/2. The device outputs y ∈ C_x
with probability p = e^ε/(1+e^ε), uniform within C_x, and otherwise y
uniform in the complement. Every output has probability 2p/K or 2(1-p)/K,
whose ratio is e^ε: ε-LDP. A report is log2 K bits.

Sampling without materializing H: draw y0 uniform in [K]; if the parity of
(x+1) & y0 is not the wanted one (0 to land in C_x, 1 for its complement),
flip in y0 the lowest set bit of x+1. That toggles the parity and is a
bijection between C_x and its complement, so y is uniform on the wanted
half.

For x ≠ x', rows x+1 and x'+1 are orthogonal, so |C_x ∩ C_x'| = K/4 and a
user holding x' lands in C_x with probability exactly 1/2: a pure protocol
with p* = p, q* = 1/2. The estimator (``estimator/oracles/hr.py``) counts
T_x = #{i: y_i ∈ C_x} for all x with one Walsh–Hadamard transform of the
histogram of y and returns n̂_x = (T_x - n/2)/(p - 1/2).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from client_sdk.errors import SpecError
from client_sdk.hadamard import hadamard_bit, lowest_set_bit
from client_sdk.mechanisms.base import MechanismSpec, pure_protocol_variance
from client_sdk.mechanisms.grr import grr_index_dtype

__all__ = ["HRSpec", "MAX_HR_DOMAIN"]

#: the estimator keeps a histogram of K ≤ 2**26 int64 counts (512 MiB)
MAX_HR_DOMAIN = (1 << 26) - 1


@dataclasses.dataclass(frozen=True)
class HRSpec(MechanismSpec):
    """Hadamard response over ``domain_size`` values (basic version)."""

    name: ClassVar[str] = "hr"

    def _validate(self) -> None:
        if self.domain_size > MAX_HR_DOMAIN:
            raise SpecError(
                f"hr: domain_size {self.domain_size} is above {MAX_HR_DOMAIN}; "
                "hash values into a smaller domain or use hcms"
            )

    @property
    def output_size(self) -> int:
        """K: the smallest power of two greater than ``domain_size``."""
        return 1 << self.domain_size.bit_length()

    @property
    def p(self) -> float:
        """e^ε / (1 + e^ε): probability that the output lies in C_x."""
        return self.exp_epsilon / (1.0 + self.exp_epsilon)

    def support_probabilities(self) -> tuple[float, float]:
        """(p*, q*) = (e^ε/(1+e^ε), 1/2)."""
        return self.p, 0.5

    def support_sets(self, items: Any) -> np.ndarray:
        """Boolean ``(len(items), K)`` membership of y in C_x (for tests and audits; O(d K))."""
        x = np.asarray(items, dtype=np.int64).reshape(-1, 1) + 1
        return hadamard_bit(x, np.arange(self.output_size)[None, :]) == 0

    @property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("y", grr_index_dtype(self.output_size))])

    def record_bounds(self) -> dict[str, int]:
        return {"y": self.output_size}

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        v = self.check_values(values)
        n = v.size
        row = (v + 1).astype(np.uint32)
        y = rng.integers(0, self.output_size, size=n, dtype=np.uint32)
        outside = (rng.random(n) >= self.p).astype(np.uint8)
        wrong = hadamard_bit(row, y) != outside
        y ^= lowest_set_bit(row) * wrong.astype(np.uint32)
        out = np.empty(n, dtype=self.record_dtype)
        out["y"] = y
        return out

    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        """[n_x p(1-p) + (n - n_x)/4] / (p - 1/2)²: the pure-protocol variance with q* = 1/2."""
        return pure_protocol_variance(true_counts, self.p, 0.5)
