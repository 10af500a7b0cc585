"""Count-sketched updates under SecAgg: the ``{"kind": "count_sketch", ...}`` task option (issue 18).

A device sketches its clipped update x (length d) with the round's public hashes
(:class:`ldp_core.fl.compress.CountSketch`, seed from the server), scales the sketch by 1/√rows so
that E‖S‖² = ‖x‖² (each row of a count sketch preserves the squared norm in expectation), clips the
scaled sketch to L2 norm ``clip`` and rounds its rows × cols cells to b-bit codes with the unbiased
stochastic rounding of :class:`ldp_core.fl.compress.StochasticQuantizer` (coordinate bound ``clip``:
no cell of a sketch of norm ≤ clip exceeds it). The codes are masked and summed in Z_{2^ring_bits} like
the quantized option's.

Why clip *in sketch space*: the sketch's worst-case gain ‖S‖/‖x‖ is √(max bucket) (Cauchy–Schwarz in
a cell), which depends on the hashes, i.e. on a seed the server picks. Clipping the sketch itself makes
each device's contribution at most ``clip`` for *any* seed, so the sum of the quantized sketches has
L2 sensitivity ``clip + Δ·√(rows·cols)`` (:meth:`RingCountSketch.sensitivity`; Δ = 2·clip/(2^b − 1)),
and a chosen seed can hurt accuracy (heavier collisions) but not privacy. When the scaled sketch is
inside the ball (the usual case: ‖S‖ ≈ ‖x‖ ≤ C, with spread ∝ 1/√(cols)), the clip changes nothing
and decoding is unbiased; when it is not, the device's contribution shrinks, as clipping does anywhere.

The job adds the Gaussian to the *summed sketch* (the release; sensitivity above), then unsketches:
the row mean of sign·cell, times √rows, an unbiased estimate of the summed update (when no sketch
was clipped) with collision variance Σ_{j≠i} x_j²/(rows·cols) per coordinate over the hashes
(:class:`CountSketch`'s docstring; the 1/√rows and the √rows cancel) and noise variance σ²S² per
coordinate (rows independent cells of variance σ²S² averaged, variance σ²S²/rows, times rows). Unsketching is post-processing, so the accountant's ε for σ holds unchanged.

Uplink: ⌈rows·cols·ring_bits/8⌉ bytes (packed ring words), against 4·d for float32.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ldp_core.fl.compress import CountSketch, RingQuantization, StochasticQuantizer, ring_bits_for
from ldp_core.fl.errors import ModelError
from ldp_core.fl.protocol import packed_size
from ldp_core.fl.secagg import MODULUS_BITS

__all__ = ["RingCountSketch", "ring_compression_for_task", "ring_compression_from_signed"]

KNOWN = ("kind", "rows", "cols", "bits", "clip")


def _positive_int(option: dict[str, Any], name: str, default: int, limit: int) -> int:
    v = option.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit:
        raise ModelError(f"compression 'count_sketch': {name} must be an integer in [1, {limit}], got {v!r}")
    return v


@dataclasses.dataclass(frozen=True)
class RingCountSketch:
    """The count-sketch task option as the signed task configuration fixes it (module docstring):
    ``rows`` × ``cols`` cells, b-bit codes with coordinate bound and sketch clip ``clip``, summed in
    Z_{2^ring_bits}, ring_bits the fewest bits that hold ``max_clients`` codes without wrapping."""

    rows: int
    cols: int
    bits: int
    clip: float
    ring_bits: int

    @classmethod
    def for_task(cls, option: Any, clip_norm: float, max_clients: int, dim: int) -> RingCountSketch:
        if not isinstance(option, dict) or option.get("kind") != "count_sketch":
            raise ModelError(f"expected {{'kind': 'count_sketch', ...}}, got {option!r}")
        unknown = set(option) - set(KNOWN)
        if unknown:
            raise ModelError(
                f"compression 'count_sketch': unknown options {sorted(unknown)}; known: rows, cols, bits, clip"
            )
        rows = _positive_int(option, "rows", 3, 64)
        cols = _positive_int(option, "cols", max(1, dim // 4), 1 << 24)
        if rows * cols >= dim:
            raise ModelError(
                f"compression 'count_sketch': {rows} × {cols} cells do not compress a {dim}-parameter update; "
                "use fewer rows or cols"
            )
        q = StochasticQuantizer(option.get("bits", 8), option.get("clip", clip_norm))
        return cls(rows, cols, q.bits, float(q.clip), ring_bits_for(q.bits, max_clients))

    @classmethod
    def from_signed(cls, d: Any) -> RingCountSketch:
        try:
            if d["kind"] != "count_sketch":
                raise KeyError("kind")
            out = cls(int(d["rows"]), int(d["cols"]), int(d["bits"]), float(d["clip"]), int(d["ring_bits"]))
        except (TypeError, KeyError, ValueError):
            raise ModelError(f"unusable signed compression parameters {d!r}") from None
        StochasticQuantizer(out.bits, out.clip)
        if out.rows < 1 or out.cols < 1 or not out.bits < out.ring_bits <= MODULUS_BITS:
            raise ModelError(f"unusable signed count-sketch parameters {d!r}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "count_sketch",
            "rows": self.rows,
            "cols": self.cols,
            "bits": self.bits,
            "clip": self.clip,
            "ring_bits": self.ring_bits,
        }

    @property
    def quantizer(self) -> StochasticQuantizer:
        return StochasticQuantizer(self.bits, self.clip)

    def sketcher(self, dim: int, seed: int) -> CountSketch:
        """The round's hashes: a :class:`CountSketch` of a length-``dim`` update from the public ``seed``."""
        return CountSketch(dim, self.rows, self.cols, int(seed))

    def length(self, dim: int) -> int:
        """The ring words a device masks: one per cell, whatever ``dim``."""
        return self.rows * self.cols

    def clipped_sketch(self, x: np.ndarray, seed: int) -> np.ndarray:
        """The device's sketch of ``x`` scaled by 1/√rows and clipped to L2 norm ``clip`` (flattened cells)."""
        s = self.sketcher(int(np.asarray(x).size), seed).sketch(np.asarray(x, dtype=np.float64).ravel()).ravel()
        s /= math.sqrt(self.rows)
        norm = float(np.linalg.norm(s))
        if norm > self.clip:
            s *= self.clip / norm
        return s

    def encode(self, x: np.ndarray, seed: int, rng: np.random.Generator) -> np.ndarray:
        """The device's codes (uint32, each < 2^bits), one per cell of its clipped sketch."""
        return self.quantizer.quantize(self.clipped_sketch(x, seed), rng)

    def decode_cells(self, total: np.ndarray, n: int) -> np.ndarray:
        """Σ of the n survivors' quantized sketches (flattened cells) from the unmasked ring sum."""
        t = np.asarray(total, dtype=np.uint64)
        if t.shape != (self.rows * self.cols,):
            raise ModelError(f"count sketch: the ring sum has shape {t.shape}, expected ({self.rows * self.cols},)")
        return self.quantizer.decode_sum(t % (1 << self.ring_bits), n, self.ring_bits)

    def unsketch(self, cells: np.ndarray, seed: int, dim: int) -> np.ndarray:
        """The length-``dim`` estimate of the summed update from (noised) summed cells: row mean × √rows."""
        grid = np.asarray(cells, dtype=np.float64).reshape(self.rows, self.cols)
        return self.sketcher(dim, seed).unsketch(grid) * math.sqrt(self.rows)

    def decode_sum(self, total: np.ndarray, n: int, seed: int, dim: int) -> np.ndarray:
        """The un-noised estimate (no DP release: the job calls :meth:`release`, which noises the cells first)."""
        return self.unsketch(self.decode_cells(total, n), seed, dim)

    def release(
        self, total: np.ndarray, n: int, seed: int, dim: int, noise_stddev: float, rng: np.random.Generator
    ) -> np.ndarray:
        """The job's DP release of a round: the summed cells plus N(0, noise_stddev²) each, unsketched.
        ``noise_stddev`` is σ·:meth:`sensitivity` (0: no noise, no DP)."""
        cells = self.decode_cells(total, n)
        if noise_stddev > 0:
            cells = cells + rng.normal(0.0, noise_stddev, size=cells.shape)
        return self.unsketch(cells, seed, dim)

    def sensitivity(self, clip_norm: float, dim: int) -> float:
        """‖q‖₂ ≤ clip + Δ·√(rows·cols) for every device and every seed: the Gaussian on the summed sketch
        has scale σ times this. ``clip_norm`` (the update's C) does not enter: the sketch is clipped itself."""
        return self.quantizer.norm_bound(self.clip, self.length(dim))

    def payload_bytes(self, dim: int) -> int:
        """⌈rows·cols·ring_bits/8⌉: the packed masked input."""
        return packed_size(self.length(dim), self.ring_bits)


def ring_compression_for_task(option: Any, clip_norm: float, max_clients: int, dim: int) -> Any:
    """The task option's spec: :class:`RingQuantization` for ``quantize``, :class:`RingCountSketch` for
    ``count_sketch`` (``ModelError`` for anything else)."""
    kind = option.get("kind") if isinstance(option, dict) else None
    if kind == "count_sketch":
        return RingCountSketch.for_task(option, clip_norm, max_clients, dim)
    return RingQuantization.for_task(option, clip_norm, max_clients, dim)


def ring_compression_from_signed(d: Any) -> Any:
    """The spec a device takes from the signed task configuration (by its ``kind``)."""
    if isinstance(d, dict) and d.get("kind") == "count_sketch":
        return RingCountSketch.from_signed(d)
    return RingQuantization.from_signed(d)
