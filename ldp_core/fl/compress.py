"""Compressed uplink updates (issue 18; Konečný et al., "Federated Learning: Strategies for Improving
Communication Efficiency", 2016): b-bit stochastic quantization, a public random rotation before it, and
top-k sparsification with error feedback, and count-sketched updates (:class:`CountSketch`).

The first three pieces below, each a frozen spec shared by the device (encode) and the server (decode);
:class:`CountSketch` (a public linear sketch) and :class:`RingQuantization` (the ``"compression"`` task
option under SecAgg) are documented on their classes:

* :class:`StochasticQuantizer`: clip each coordinate to [−c, c] (c a *public* bound, not derived from the
  data), lay the grid g_j = −c + j·Δ, Δ = 2c/(2^b − 1), j = 0 … 2^b − 1, and round x between its grid
  neighbours lo ≤ x ≤ hi to hi with probability (x − lo)/Δ, else to lo. Then E[q] = x (unbiased for
  |x| ≤ c) and Var[q] = (x − lo)(hi − x) ≤ Δ²/4 (a two-point law on {lo, hi}: p(1−p)Δ² with
  p = (x − lo)/Δ). The codes j are what travels, b bits each (:meth:`StochasticQuantizer.pack`).
  Codes sum in the SecAgg ring Z_{2^32}: n devices' sums stay below 2^32 while n·(2^b − 1) < 2^32, and
  Σ q = −n·c + Δ·Σ j (:meth:`StochasticQuantizer.decode_sum`), so the server decodes the unmasked sum
  without ever seeing one device's codes.
* :class:`RotatedQuantizer`: pad to D = 2^⌈log₂ d⌉ and rotate by H·diag(ξ)/√D with signs ξ from a
  public seed (:func:`ldp_core.fl.ddg.rotate`, the same rotation the distributed discrete Gaussian
  uses), then quantize. The rotation is orthogonal and data-independent, so it composes with clipping,
  noise and SecAgg unchanged; it spreads the update's mass over the coordinates, so each rotated
  coordinate is about ‖x‖/√D and a small public c suffices (Suresh et al., ICML 2017, "Distributed Mean
  Estimation with Limited Communication": the error falls from O(d/… ) to O(log d /…) with the rotation).
* :class:`TopKErrorFeedback`: the device sends the k largest-magnitude coordinates of a = g + e and keeps
  the rest, e ← a − topk(a), for the next round (Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory",
  NeurIPS 2018). The selection is data dependent: it cannot go through SecAgg or distributed noise (the
  index sets are the device's own and would be revealed), see :func:`check_composition`.

Conditional rounding (:meth:`StochasticQuantizer.quantize_conditional`, the task option's default):
stochastic rounding is not norm preserving, so the worst-case sensitivity of the codes is C + Δ·√d; redrawing
the rounding until ‖q‖ ≤ B, B a high-probability bound (:meth:`StochasticQuantizer.conditional_bound`), with
a deterministic fallback that meets B, makes B the sensitivity at a small, bounded bias (Kairouz, Liu,
Steinke, ICML 2021, "conditional randomized rounding").

Nothing here draws randomness of its own: the rounding generator is an argument (on a device,
:func:`ldp_core.randomness.secure_generator`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ldp_core.fl.ddg import padded_dimension, rotate, unrotate
from ldp_core.fl.errors import ModelError
from ldp_core.fl.secagg import MODULUS_BITS

__all__ = [
    "StochasticQuantizer",
    "RotatedQuantizer",
    "TopKErrorFeedback",
    "SparseUpdate",
    "CountSketch",
    "RingQuantization",
    "check_composition",
    "dense_bytes",
    "MAX_BITS",
    "MAX_ROUNDING_DRAWS",
    "DEFAULT_ROUNDING_BETA",
    "ROUNDINGS",
    "ring_bits_for",
]

#: codes are carried in uint32 words (the SecAgg ring), so b ≤ 16 leaves room for 2^16 summands
MAX_BITS = 16

#: conditional rounding draws at most this many roundings before its deterministic fallback (each draw is
#: rejected with probability ≤ β, so the fallback runs with probability ≤ β^8: 10⁻¹⁶ at the default β)
MAX_ROUNDING_DRAWS = 8

#: the default per-draw rejection bound β of conditional rounding: small, so its bias bound stays small
DEFAULT_ROUNDING_BETA = 0.01

#: ``"rounding"`` of the task option: conditional (the default for new tasks, S = B) or unbiased (S = C + Δ√D)
ROUNDINGS = ("conditional", "unbiased")


def dense_bytes(d: int) -> int:
    """Uplink payload of an uncompressed float32 update of length d."""
    return 4 * d


@dataclasses.dataclass(frozen=True)
class StochasticQuantizer:
    """b-bit unbiased stochastic rounding on the grid −c + j·2c/(2^b − 1), j = 0 … 2^b − 1."""

    bits: int
    clip: float

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 1 <= self.bits <= MAX_BITS:
            raise ModelError(f"bits must be an integer in [1, {MAX_BITS}], got {self.bits!r}")
        if not (isinstance(self.clip, (int, float)) and math.isfinite(self.clip) and self.clip > 0):
            raise ModelError(f"the clip bound c must be finite and > 0, got {self.clip!r}")

    @property
    def levels(self) -> int:
        return 1 << self.bits

    @property
    def step(self) -> float:
        """Δ = 2c/(2^b − 1), the grid spacing."""
        return 2.0 * self.clip / (self.levels - 1)

    def quantize(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Codes j ∈ {0 … 2^b − 1} (uint32): j = ⌊v + U⌋ with v = (clip(x) + c)/Δ, U ~ U[0, 1), which is
        ⌊v⌋ + 1 with probability v − ⌊v⌋, so E[j] = v."""
        v = np.clip(np.asarray(x, dtype=np.float64), -self.clip, self.clip)
        v += self.clip
        v /= self.step
        v += rng.random(v.shape)
        np.floor(v, out=v)
        # v = 2^b − 1 exactly at x = c gives U < 1 so ⌊v + U⌋ ≤ 2^b − 1 in exact arithmetic; guard rounding
        np.minimum(v, self.levels - 1, out=v)
        return v.astype(np.uint32)

    def dequantize(self, codes: np.ndarray) -> np.ndarray:
        """q = −c + j·Δ."""
        return np.asarray(codes, dtype=np.float64) * self.step - self.clip

    def variance(self, x: np.ndarray) -> np.ndarray:
        """Var[q] = (x − lo)(hi − x) per coordinate, lo ≤ x ≤ hi the grid neighbours of clip(x)."""
        v = (np.clip(np.asarray(x, dtype=np.float64), -self.clip, self.clip) + self.clip) / self.step
        frac = v - np.floor(v)
        return frac * (1.0 - frac) * self.step**2

    def norm_bound(self, clip_norm: float, d: int) -> float:
        """‖q‖₂ ≤ C + Δ·√d for an input of L2 norm ≤ C (each coordinate moves by < Δ): the sensitivity
        a DP accountant must use for quantized updates (rounding is not norm-preserving)."""
        return clip_norm + self.step * math.sqrt(d)

    def conditional_bound(self, clip_norm: float, d: int, beta: float = DEFAULT_ROUNDING_BETA) -> float:
        """B, the norm bound that conditional rounding enforces for inputs of L2 norm ≤ C in d coordinates:

        B² = min(C² + d·Δ²/4 + √(2·ln(1/β))·Δ·(C + Δ·√d/2), (C + Δ·√d)²).

        Derivation (Hoeffding): q_i² − x_i² takes the two values lo_i² − x_i² and hi_i² − x_i², a range of
        Δ·|lo_i + hi_i| ≤ Δ·(2|x_i| + Δ), with mean Var[q_i] ≤ Δ²/4; the d terms are independent, so
        P[‖q‖² ≥ ‖x‖² + Σ Var[q_i] + t] ≤ exp(−2t²/Σ_i Δ²(2|x_i| + Δ)²), and Σ_i (2|x_i| + Δ)² ≤
        (2‖x‖ + Δ√d)² (the triangle inequality). Setting the right side to β gives
        t = √(2 ln(1/β))·Δ·(‖x‖ + Δ√d/2); every term grows with ‖x‖, so ‖x‖ = C is the worst case. The same
        expression as the conditional randomized rounding bound of Kairouz, Liu, Steinke, "The Distributed
        Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation", ICML 2021. One draw
        exceeds B with probability ≤ β for every input with ‖x‖ ≤ C; the second term of the min is the
        bound that always holds (:meth:`norm_bound`)."""
        if not (isinstance(beta, (int, float)) and 0.0 < beta < 1.0):
            raise ModelError(f"the rejection bound beta must be in (0, 1), got {beta!r}")
        step = self.step
        hp = (
            clip_norm**2
            + d * step**2 / 4.0
            + math.sqrt(2.0 * math.log(1.0 / beta)) * step * (clip_norm + step * math.sqrt(d) / 2.0)
        )
        return min(math.sqrt(hp), self.norm_bound(clip_norm, d))

    def round_toward_zero(self, x: np.ndarray) -> np.ndarray:
        """Codes of the grid neighbour of clip(x) nearer to zero (deterministic). The grid is the half-integer
        multiples of Δ (c = (2^b − 1)·Δ/2), so |q_i| ≤ |x_i| where |x_i| ≥ Δ/2 and |q_i| = Δ/2 below it:
        ‖q‖² ≤ ‖x‖² + d·Δ²/4 always."""
        v = np.clip(np.asarray(x, dtype=np.float64), -self.clip, self.clip)
        v = (v + self.clip) / self.step
        near = np.rint(v)
        v = np.where(np.abs(v - near) < 1e-9, near, v)  # a grid point up to float error stays itself
        lo = np.minimum(np.floor(v), self.levels - 1)
        hi = np.minimum(lo + 1, self.levels - 1)
        lo_val = lo * self.step - self.clip
        hi_val = hi * self.step - self.clip
        j = np.where((v > lo) & (np.abs(hi_val) < np.abs(lo_val)), hi, lo)
        return j.astype(np.uint32)

    def quantize_conditional(
        self, x: np.ndarray, rng: np.random.Generator, bound: float, max_draws: int = MAX_ROUNDING_DRAWS
    ) -> tuple[np.ndarray, int]:
        """Conditional (rejection) stochastic rounding: redraw :meth:`quantize` until ‖q‖₂ ≤ ``bound``, at most
        ``max_draws`` times; then fall back to :meth:`round_toward_zero` of x scaled to norm
        √(bound² − d·Δ²/4), whose ‖q‖ ≤ bound always. Returns (codes, draws), draws = max_draws + 1 for the
        fallback. Every output has ‖q‖ ≤ bound, so ``bound`` is the sensitivity (a violation, possible only
        if bound² ≤ d·Δ²/4, the smallest norm on the grid, raises).

        Biased (the conditioning drops the long draws): with p ≤ β the rejection probability of one draw
        (:meth:`conditional_bound`), ‖E[q] − x‖ ≤ :meth:`conditional_bias_bound`."""
        if isinstance(max_draws, bool) or not isinstance(max_draws, int) or max_draws < 1:
            raise ModelError(f"max_draws must be an integer >= 1, got {max_draws!r}")
        v = np.asarray(x, dtype=np.float64)
        for draw in range(1, max_draws + 1):
            codes = self.quantize(v, rng)
            if float(np.linalg.norm(self.dequantize(codes))) <= bound:
                return codes, draw
        room = bound**2 - v.size * self.step**2 / 4.0
        norm = float(np.linalg.norm(v))
        if room > 0:
            target = math.sqrt(room) * (1.0 - 1e-9)  # a margin for the float arithmetic
            codes = self.round_toward_zero(v * min(1.0, target / norm) if norm > 0 else v)
            if float(np.linalg.norm(self.dequantize(codes))) <= bound:
                return codes, max_draws + 1
        raise ModelError(
            f"conditional rounding cannot meet the norm bound {bound:g}: below the grid's smallest norm "
            f"{self.step * math.sqrt(v.size) / 2:g} (√d·Δ/2)"
        )

    def conditional_bias_bound(self, x: np.ndarray, rejection: float, max_draws: int = MAX_ROUNDING_DRAWS) -> float:
        """‖E[q] − x‖ for :meth:`quantize_conditional` of x whose one draw is rejected with probability
        p = ``rejection`` (≤ β for ‖x‖ ≤ C and the bound :meth:`conditional_bound`):

        min(p·Δ√d, √(p·V))/(1 − p) + p^K·(‖x‖ + Δ√d),  V = Σ Var[q_i], K = max_draws.

        Why: with e = q − x (E[e] = 0) and A the acceptance event, E[q | A] − x = −E[e·1_{not A}]/(1 − p), and
        ‖E[e·1_{not A}]‖ ≤ E[‖e‖·1_{not A}] is at most p·Δ√d (each |e_i| < Δ; KLS21's form) and at most
        √(E‖e‖²·p) = √(p·V) (Cauchy–Schwarz). The fallback runs with probability p^K and moves x by at
        most ‖x‖ + Δ√d. Clipped coordinates (|x_i| > c) add their clipping, not counted here."""
        p = float(rejection)
        if not 0.0 <= p < 1.0:
            raise ModelError(f"the rejection probability must be in [0, 1), got {rejection!r}")
        v = np.asarray(x, dtype=np.float64)
        worst = self.step * math.sqrt(v.size)
        var = float(self.variance(v).sum())
        return min(p * worst, math.sqrt(p * var)) / (1.0 - p) + p**max_draws * (float(np.linalg.norm(v)) + worst)

    def max_summands(self, ring_bits: int = MODULUS_BITS) -> int:
        """The most devices whose codes sum in Z_{2^ring_bits} without wrapping: n·(2^b − 1) < 2^ring_bits."""
        return ((1 << ring_bits) - 1) // (self.levels - 1)

    def decode_sum(self, total: np.ndarray, n: int, ring_bits: int = MODULUS_BITS) -> np.ndarray:
        """Σ q from the ring sum of n devices' codes: −n·c + Δ·Σ j."""
        if not 1 <= n <= self.max_summands(ring_bits):
            raise ModelError(
                f"{n} devices × (2^{self.bits} − 1) does not fit Z_(2^{ring_bits}): at most "
                f"{self.max_summands(ring_bits)} devices, or lower bits"
            )
        return np.asarray(total, dtype=np.uint64).astype(np.float64) * self.step - n * self.clip

    def pack(self, codes: np.ndarray) -> bytes:
        """b bits per code, little-endian bit order, zero-padded to whole bytes: ⌈d·b/8⌉ bytes."""
        c = np.asarray(codes, dtype=np.uint32).ravel()
        bits = ((c[:, None] >> np.arange(self.bits, dtype=np.uint32)) & 1).astype(np.uint8)
        return np.packbits(bits.ravel(), bitorder="little").tobytes()

    def unpack(self, data: bytes, d: int) -> np.ndarray:
        """The inverse of :meth:`pack` for d codes."""
        if len(data) != self.payload_bytes(d):
            raise ModelError(f"{len(data)} bytes for {d} codes of {self.bits} bits, expected {self.payload_bytes(d)}")
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")[: d * self.bits]
        weights = np.uint32(1) << np.arange(self.bits, dtype=np.uint32)
        return (bits.reshape(d, self.bits).astype(np.uint32) * weights).sum(axis=1, dtype=np.uint32)

    def payload_bytes(self, d: int) -> int:
        return (d * self.bits + 7) // 8


@dataclasses.dataclass(frozen=True)
class RotatedQuantizer:
    """Pad to D = 2^⌈log₂ d⌉, rotate with the public seed, quantize; decode inverts in the other order."""

    quantizer: StochasticQuantizer
    rotation_seed: int

    def __post_init__(self) -> None:
        s = self.rotation_seed
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ModelError(f"the rotation seed must be an integer >= 0, got {s!r}")

    def rotated(self, x: np.ndarray) -> np.ndarray:
        """H·diag(ξ)·pad(x)/√D (orthogonal: ‖rotated(x)‖ = ‖x‖)."""
        x = np.asarray(x, dtype=np.float64)
        padded = np.zeros(padded_dimension(x.shape[-1]))
        padded[: x.shape[-1]] = x
        return rotate(padded, self.rotation_seed)

    def encode(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.quantizer.quantize(self.rotated(x), rng)

    def decode(self, codes: np.ndarray, d: int) -> np.ndarray:
        return self.unrotate(self.quantizer.dequantize(codes), d)

    def unrotate(self, y: np.ndarray, d: int) -> np.ndarray:
        """The inverse rotation, padding dropped (also for a decoded *sum*: the rotation is linear)."""
        return unrotate(np.asarray(y, dtype=np.float64), self.rotation_seed)[:d]

    def payload_bytes(self, d: int) -> int:
        return self.quantizer.payload_bytes(padded_dimension(d))


@dataclasses.dataclass(frozen=True)
class SparseUpdate:
    """k (index, value) pairs of a length-d update: 4-byte indices and float32 values on the wire."""

    d: int
    indices: np.ndarray
    values: np.ndarray

    def dense(self) -> np.ndarray:
        out = np.zeros(self.d)
        out[self.indices] = self.values
        return out

    @property
    def payload_bytes(self) -> int:
        return 8 * len(self.indices)


class TopKErrorFeedback:
    """One device's top-k sparsifier with its residual e (kept on the device, never sent).

    Each call sends topk(g + e) and keeps e ← (g + e) − topk(g + e). Invariants: Σ_t sent_t + e_T = Σ_t g_t
    exactly (nothing is lost, only delayed), and with δ = k/d, ‖a − topk(a)‖ ≤ √(1 − δ)·‖a‖ (the d − k
    dropped coordinates are the smallest), so with ‖g_t‖ ≤ G the residual stays below
    √(1 − δ)·G / (1 − √(1 − δ)) (the fixed point of E ≤ √(1 − δ)(G + E); Stich et al. 2018, Lemma 3.2's
    contraction argument). Mutable by design: the residual is the device's state across rounds.
    """

    def __init__(self, d: int, k: int) -> None:
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ModelError(f"the update length d must be an integer >= 1, got {d!r}")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d:
            raise ModelError(f"k must be an integer in [1, d = {d}], got {k!r}")
        self.d = d
        self.k = k
        self.residual = np.zeros(d)

    def residual_bound(self, max_input_norm: float) -> float:
        r = math.sqrt(1.0 - self.k / self.d)
        return r * max_input_norm / (1.0 - r) if r < 1.0 else math.inf

    def step(self, update: np.ndarray) -> SparseUpdate:
        g = np.asarray(update, dtype=np.float64)
        if g.shape != (self.d,):
            raise ModelError(f"the update has shape {g.shape}, expected ({self.d},)")
        a = g + self.residual
        idx = np.argpartition(np.abs(a), self.d - self.k)[self.d - self.k :]
        idx.sort()
        sent = a[idx].astype(np.float32).astype(np.float64)  # what the wire carries
        self.residual = a
        self.residual[idx] -= sent
        return SparseUpdate(self.d, idx.astype(np.uint32), sent)


@dataclasses.dataclass(frozen=True)
class CountSketch:
    """A count sketch of a length-d update: ``rows`` × ``cols`` float32 cells (Charikar, Chen, Farach-Colton
    2002; for FL updates, Konečný et al. 2016 and FetchSGD, Rothchild et al., ICML 2020).

    Row r hashes coordinate i to bucket h_r(i) ∈ [0, cols) with sign s_r(i) = ±1, both drawn from the
    *public* ``seed`` (shared by every device and the server, never from the data):
    S[r, h_r(i)] += s_r(i)·x_i. The map x ↦ S is linear, so the sum of the devices' sketches is the sketch
    of the sum of their updates: sketches go through SecAgg (after quantizing the cells) and DP noise added
    to the summed sketch is noise on a data-independent projection.

    Decoding: row r's estimate of x_i is s_r(i)·S[r, h_r(i)] = x_i + Σ_{j≠i, h_r(j)=h_r(i)} s_r(i)s_r(j)x_j;
    over the random hashes and signs the collision term has mean 0 and variance Σ_{j≠i} x_j²/cols (each j
    collides with probability 1/cols, pairwise-independent signs). The mean over the rows
    (:meth:`unsketch`) is therefore unbiased with variance Σ_{j≠i} x_j²/(rows·cols); the median over the
    rows (:meth:`unsketch_median`, FetchSGD's choice) is robust to one heavy collision but biased, and
    :meth:`heavy` keeps the k largest median estimates (the server's top-k of heavy coordinates)."""

    d: int
    rows: int
    cols: int
    seed: int

    def __post_init__(self) -> None:
        for name in ("d", "rows", "cols"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ModelError(f"count sketch: {name} must be an integer >= 1, got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ModelError(f"count sketch: the hash seed must be an integer >= 0, got {self.seed!r}")

    def _hashes(self) -> tuple[np.ndarray, np.ndarray]:
        """(buckets, signs), each rows × d: fully random hashes from the public seed (the server regenerates them)."""
        g = np.random.default_rng(self.seed)
        buckets = g.integers(0, self.cols, size=(self.rows, self.d))
        signs = g.integers(0, 2, size=(self.rows, self.d)) * 2.0 - 1.0
        return buckets, signs

    def sketch(self, x: np.ndarray) -> np.ndarray:
        """S (rows × cols, float64; the wire carries it as float32)."""
        v = np.asarray(x, dtype=np.float64)
        if v.shape != (self.d,):
            raise ModelError(f"count sketch: the update has shape {v.shape}, expected ({self.d},)")
        buckets, signs = self._hashes()
        out = np.zeros((self.rows, self.cols))
        for r in range(self.rows):
            out[r] = np.bincount(buckets[r], weights=signs[r] * v, minlength=self.cols)
        return out

    def _row_estimates(self, s: np.ndarray) -> np.ndarray:
        s = np.asarray(s, dtype=np.float64)
        if s.shape != (self.rows, self.cols):
            raise ModelError(f"count sketch: the sketch has shape {s.shape}, expected ({self.rows}, {self.cols})")
        buckets, signs = self._hashes()
        return signs * np.take_along_axis(s, buckets, axis=1)

    def unsketch(self, s: np.ndarray) -> np.ndarray:
        """The unbiased estimate of x (or of a sum of updates from the summed sketch): the row mean."""
        return self._row_estimates(s).mean(axis=0)

    def unsketch_median(self, s: np.ndarray) -> np.ndarray:
        """The row median of the estimates (robust to a heavy collision in a minority of rows; biased)."""
        return np.median(self._row_estimates(s), axis=0)

    def heavy(self, s: np.ndarray, k: int) -> np.ndarray:
        """A dense length-d vector holding the k largest-magnitude median estimates, zeros elsewhere."""
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.d:
            raise ModelError(f"count sketch: k must be an integer in [1, d = {self.d}], got {k!r}")
        est = self.unsketch_median(s)
        out = np.zeros(self.d)
        idx = np.argpartition(np.abs(est), self.d - k)[self.d - k :]
        out[idx] = est[idx]
        return out

    def max_bucket(self) -> int:
        """The largest number of coordinates one cell sums: ‖S_r‖₂ ≤ √(max bucket)·‖x‖₂ (Cauchy–Schwarz in
        each cell), so the sketch's L2 sensitivity is at most √(rows · max bucket)·C for ‖x‖ ≤ C."""
        buckets, _ = self._hashes()
        return int(max(np.bincount(b, minlength=self.cols).max() for b in buckets))

    def norm_bound(self, clip_norm: float) -> float:
        """‖S‖_F ≤ √(rows · max bucket)·C, the sensitivity an accountant must use for sketched updates."""
        return math.sqrt(self.rows * self.max_bucket()) * clip_norm

    def payload_bytes(self) -> int:
        return 4 * self.rows * self.cols


def ring_bits_for(bits: int, max_clients: int) -> int:
    """The fewest ring bits r in which ``max_clients`` b-bit codes sum without wrapping: b + bit_length(n)
    (n·(2^b − 1) < 2^r); ``ModelError`` past the 32-bit SecAgg ring."""
    ring = bits + max(1, int(max_clients)).bit_length()
    if ring > MODULUS_BITS:
        raise ModelError(f"{max_clients} clients × {bits}-bit codes do not fit the 32-bit SecAgg ring")
    return ring


def check_composition(kind: str, *, secagg: bool, distributed_noise: bool, local_noise: bool = False) -> None:
    """Refuse the combinations that break privacy or cannot be summed.

    ``kind``: ``"none"``, ``"quantize"``, ``"rotate_quantize"``, ``"count_sketch"`` or ``"topk"``.
    Quantization (with or without the public rotation) and the count sketch (a public linear projection:
    sketches sum to the sketch of the sum; sensitivity :meth:`CountSketch.norm_bound`) are data independent and its codes sum in the SecAgg ring, so it composes
    with everything (its sensitivity is :meth:`StochasticQuantizer.norm_bound`). Top-k picks coordinates
    from the data: under SecAgg or distributed noise the server would see each device's index set, so it
    is refused; with local noise the noise must come first (a selection on noised values is
    post-processing), which this sparsifier does not do, so it is refused too. With central DP alone it is
    allowed on one condition the caller must meet: clip the *sent* vector to C after the selection (the
    residual carries earlier rounds' mass, so ‖topk(g + e)‖ can exceed C).
    """
    if kind not in ("none", "quantize", "rotate_quantize", "count_sketch", "topk"):
        raise ModelError(f"unknown compression {kind!r}: one of none, quantize, rotate_quantize, count_sketch, topk")
    if kind == "topk" and (secagg or distributed_noise):
        raise ModelError(
            "top-k sparsification is data dependent: its index sets would reach the server, which SecAgg and "
            "distributed noise are there to prevent; use quantize or rotate_quantize"
        )
    if kind == "topk" and local_noise:
        raise ModelError("top-k after local noise only: add the noise before any data-dependent selection")


@dataclasses.dataclass(frozen=True)
class RingQuantization:
    """The ``"compression": {"kind": "quantize", "bits": b, "rotate": bool, "rounding": ..., "beta": β}`` task
    option under SecAgg, as the signed task configuration fixes it: b-bit codes (after the public rotation
    when ``rotate``) with coordinate bound ``clip``, masked and summed in Z_{2^ring_bits}, ring_bits the
    fewest bits that hold ``max_clients`` codes without wrapping.

    ``rounding``: ``"conditional"`` (the default for new tasks) redraws the rounding until ‖q‖ ≤
    ``norm_bound`` = B (:meth:`StochasticQuantizer.conditional_bound` at β, for the task's C and vector
    length), with a fallback that keeps ‖q‖ ≤ B, so the job's sensitivity is B; ``"unbiased"`` is plain
    stochastic rounding with the worst-case sensitivity C + Δ·√D. B is in the signed configuration: the
    device enforces the signed value, whatever the server says. The rotation seed is per round (public,
    from the server: neither bound depends on it, so a chosen seed cannot raise the sensitivity)."""

    bits: int
    rotate: bool
    clip: float
    ring_bits: int
    rounding: str = "unbiased"
    beta: float = DEFAULT_ROUNDING_BETA
    norm_bound: float = math.inf

    @classmethod
    def for_task(cls, option: Any, clip_norm: float, max_clients: int, dim: int) -> RingQuantization:
        if not isinstance(option, dict) or option.get("kind") != "quantize":
            raise ModelError(f"compression under secagg must be {{'kind': 'quantize', ...}}, got {option!r}")
        unknown = set(option) - {"kind", "bits", "rotate", "clip", "rounding", "beta"}
        if unknown:
            raise ModelError(
                f"compression 'quantize': unknown options {sorted(unknown)}; known: bits, rotate, clip, rounding, beta"
            )
        rotate = option.get("rotate", False)
        if not isinstance(rotate, bool):
            raise ModelError(f"compression 'quantize': rotate must be true or false, got {rotate!r}")
        rounding = option.get("rounding", "conditional")
        if rounding not in ROUNDINGS:
            raise ModelError(
                f"compression 'quantize': rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}"
            )
        beta = option.get("beta", DEFAULT_ROUNDING_BETA)
        if rounding == "unbiased" and "beta" in option:
            raise ModelError("compression 'quantize': beta applies to conditional rounding only")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 < beta < 1.0:
            raise ModelError(f"compression 'quantize': beta must be a number in (0, 1), got {beta!r}")
        # the public coordinate bound: C without the rotation; 4C/√D after it (rotated coordinates are ≈ ‖x‖/√D)
        default = clip_norm if not rotate else 4.0 * clip_norm / math.sqrt(padded_dimension(dim))
        q = StochasticQuantizer(option.get("bits", 8), option.get("clip", default))
        ring = ring_bits_for(q.bits, max_clients)
        length = padded_dimension(dim) if rotate else dim
        if rounding == "unbiased":
            return cls(q.bits, rotate, float(q.clip), ring, "unbiased")
        bound = q.conditional_bound(float(clip_norm), length, float(beta))
        return cls(q.bits, rotate, float(q.clip), ring, "conditional", float(beta), bound)

    @classmethod
    def from_signed(cls, d: Any) -> RingQuantization:
        """From the signed configuration; one signed before conditional rounding existed (no ``rounding``)
        means unbiased rounding, the only one there was."""
        try:
            rounding = str(d.get("rounding", "unbiased"))
            cond = rounding == "conditional"  # only conditional rounding signs β and B
            beta = float(d["beta"]) if cond else DEFAULT_ROUNDING_BETA
            bound = float(d["norm_bound"]) if cond else math.inf
            out = cls(int(d["bits"]), bool(d["rotate"]), float(d["clip"]), int(d["ring_bits"]), rounding, beta, bound)
        except (AttributeError, TypeError, KeyError, ValueError):
            raise ModelError(f"unusable signed compression parameters {d!r}") from None
        StochasticQuantizer(out.bits, out.clip)
        if not out.bits < out.ring_bits <= MODULUS_BITS:
            raise ModelError(f"unusable signed compression ring of {out.ring_bits} bits")
        if out.rounding not in ROUNDINGS:
            raise ModelError(f"unusable signed compression rounding {out.rounding!r}")
        if out.rounding == "conditional" and not (
            0.0 < out.beta < 1.0 and math.isfinite(out.norm_bound) and out.norm_bound > 0
        ):
            raise ModelError(f"unusable signed conditional rounding (beta {out.beta!r}, bound {out.norm_bound!r})")
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "quantize",
            "bits": self.bits,
            "rotate": self.rotate,
            "clip": self.clip,
            "ring_bits": self.ring_bits,
            "rounding": self.rounding,
        }
        if self.rounding == "conditional":
            out["beta"] = self.beta
            out["norm_bound"] = self.norm_bound
        return out

    @property
    def quantizer(self) -> StochasticQuantizer:
        return StochasticQuantizer(self.bits, self.clip)

    def length(self, dim: int) -> int:
        return padded_dimension(dim) if self.rotate else dim

    def encode(self, x: np.ndarray, rotation_seed: int, rng: np.random.Generator) -> np.ndarray:
        """The device's codes (uint32, each < 2^bits) for its clipped update x; with conditional rounding
        their dequantized norm is ≤ ``norm_bound`` for any x (:meth:`StochasticQuantizer.quantize_conditional`)."""
        y = RotatedQuantizer(self.quantizer, rotation_seed).rotated(x) if self.rotate else np.asarray(x, np.float64)
        if self.rounding == "conditional":
            return self.quantizer.quantize_conditional(y, rng, self.norm_bound)[0]
        return self.quantizer.quantize(y, rng)

    def decode_sum(self, total: np.ndarray, n: int, rotation_seed: int, dim: int) -> np.ndarray:
        """Σ of the n survivors' dequantized (and unrotated) updates from the unmasked ring sum."""
        s = self.quantizer.decode_sum(np.asarray(total, dtype=np.uint64) % (1 << self.ring_bits), n, self.ring_bits)
        return RotatedQuantizer(self.quantizer, rotation_seed).unrotate(s, dim) if self.rotate else s

    def release(
        self, total: np.ndarray, n: int, rotation_seed: int, dim: int, noise_stddev: float, rng: np.random.Generator
    ) -> np.ndarray:
        """The job's DP release of a round: :meth:`decode_sum` plus N(0, noise_stddev²) per parameter
        (``noise_stddev`` = σ·:meth:`sensitivity`; the inverse rotation is orthogonal, so noise after it is
        noise of the same scale on the codes). 0: no noise."""
        s = self.decode_sum(total, n, rotation_seed, dim)
        return s + (rng.normal(0.0, noise_stddev, size=s.shape) if noise_stddev > 0 else 0.0)

    def sensitivity(self, clip_norm: float, dim: int) -> float:
        """The codes' L2 bound, so the Gaussian's scale σ times this gives the float path's ε for σ: B (the
        signed ``norm_bound``, enforced by every honest device) with conditional rounding, else the
        worst case C + Δ·√(length)."""
        if self.rounding == "conditional":
            return self.norm_bound
        return self.quantizer.norm_bound(clip_norm, self.length(dim))

    def payload_bytes(self, dim: int) -> int:
        """⌈length·ring_bits/8⌉: the packed masked input (:func:`ldp_core.fl.protocol.packed_size`)."""
        from ldp_core.fl.protocol import packed_size

        return packed_size(self.length(dim), self.ring_bits)
