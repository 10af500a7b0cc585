r"""Optimized unary encoding (OUE), device side.

Wang, Blocki, Li and Jha, "Locally Differentially Private Protocols for
Frequency Estimation", USENIX Security 2017, Sec. 4.3. A value v in [d] is
one-hot encoded as d bits; bit v is then reported as 1 with probability
p = 1/2 and every other bit as 1 with probability q = 1/(e^ε + 1), all
independently.

**Privacy.** Two inputs v, v' change only bits v and v'. For an output y the
ratio P[y | v] / P[y | v'] is at most (p/q)·((1-q)/(1-p)) = (1-q)/q = e^ε,
reached by y_v = 1, y_{v'} = 0 (Sec. 4.3): the mechanism is ε-LDP.

**Estimation.** Bit v of a report "supports" v with probability p* = p if
the user holds v and q* = q otherwise, so OUE is a pure protocol: with C_v
the number of reports with bit v set, (C_v - n q)/(p - q) is unbiased with
variance [n_v p(1-p) + (n - n_v) q(1-q)]/(p - q)^2 (Sec. 3; for n_v << n it
is about 4 n e^ε/(e^ε - 1)^2, the minimum over unary encodings, Sec. 4.3).

**Record.** One field ``bits``: ceil(d/8) bytes, bit i of the report is bit
``i % 8`` of byte ``i // 8`` (numpy ``packbits(bitorder="little")``). The
padding bits of the last byte (positions d .. 8·ceil(d/8)-1) are 0;
:meth:`OUESpec.check_records` rejects frames that set them.

**Encoder.** The d-1 bits drawn with probability q are generated 64 at a
time by :func:`ldp_core.bernoulli.bernoulli_words` (each bit is 1 with
probability exactly the float q), then bit v is overwritten by a fair coin.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from ldp_core.bernoulli import bernoulli_words
from ldp_core.errors import FrameError
from ldp_core.mechanisms.base import MechanismSpec, pure_protocol_variance

__all__ = ["OUESpec", "write_packed", "check_padding", "MAX_OUE_DOMAIN"]

#: A report costs d bits; above this a report is over 8 KiB and OLH/HR are the right tools.
MAX_OUE_DOMAIN = 1 << 16


def write_packed(dst: np.ndarray, words: np.ndarray, nbits: int) -> None:
    """Write ``n·ceil(nbits/64)`` ``uint64`` words into ``dst``, ``(n, ceil(nbits/8))``
    ``uint8`` (a record field), as little-endian packed bits: bit i of row r is
    bit ``i % 64`` of word ``r·ceil(nbits/64) + i // 64``. Padding bits at and
    above ``nbits`` are cleared."""
    n, nbytes = dst.shape
    per_row = (nbits + 63) // 64
    dst[...] = words.astype("<u8", copy=False).view(np.uint8).reshape(n, per_row * 8)[:, :nbytes]
    if nbits % 8:
        dst[:, -1] &= np.uint8((1 << (nbits % 8)) - 1)


def check_padding(name: str, bits: np.ndarray, nbits: int) -> None:
    """Raise :class:`FrameError` if any row of packed ``bits`` sets a bit at or above ``nbits``."""
    pad = nbits % 8
    if pad and bits.shape[0]:
        bad = (bits[:, -1] >> np.uint8(pad)) != 0
        if bad.any():
            i = int(np.argmax(bad))
            raise FrameError(
                f"{name}: record {i} sets padding bits above bit {nbits - 1} in its last byte; they must be 0"
            )


@dataclasses.dataclass(frozen=True)
class OUESpec(MechanismSpec):
    """Optimized unary encoding over ``domain_size`` values (see the module docstring)."""

    name: ClassVar[str] = "oue"

    def _validate(self) -> None:
        self._require_int(self.name, "domain_size", self.domain_size, 2, MAX_OUE_DOMAIN)

    @property
    def p(self) -> float:
        """P[bit v = 1 | value v] = 1/2."""
        return 0.5

    @property
    def q(self) -> float:
        """P[bit u = 1 | value v ≠ u] = 1/(e^ε + 1)."""
        return 1.0 / (self.exp_epsilon + 1.0)

    def support_probabilities(self) -> tuple[float, float]:
        return self.p, self.q

    @property
    def n_bytes(self) -> int:
        return (self.domain_size + 7) // 8

    @property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("bits", "u1", (self.n_bytes,))])

    def check_records(self, records: np.ndarray) -> None:
        super().check_records(records)
        check_padding(self.name, records["bits"], self.domain_size)

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        v = self.check_values(values)
        n, d = v.size, self.domain_size
        per_row = (d + 63) // 64
        words = bernoulli_words(self.q, n * per_row, rng)
        at = np.arange(n, dtype=np.int64) * per_row + (v >> 6)
        mask = np.left_shift(np.uint64(1), (v & 63).astype(np.uint64))
        coin = rng.integers(0, 2, size=n, dtype=np.uint64).astype(bool)
        words[at] = np.where(coin, words[at] | mask, words[at] & ~mask)
        out = np.empty(n, dtype=self.record_dtype)
        write_packed(out["bits"], words, d)
        return out

    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        """[n_v p(1-p) + (n - n_v) q(1-q)] / (p - q)^2 (Wang et al. 2017, Sec. 3)."""
        return pure_protocol_variance(true_counts, self.p, self.q)
