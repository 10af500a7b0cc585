r"""Repeated counters: 1BitMean and dBitFlip with α-point rounding and memoization.

Ding, Kulkarni and Yekhanin, "Collecting Telemetry Data Privately", NeurIPS
2017 (Microsoft's Windows telemetry; section numbers below refer to it).
Both collect a bounded number ``x`` in ``[low, high]`` from the same devices
day after day. Fresh randomness each day would let an observer average a
device's reports and recover ``x``; **memoization** makes a device that keeps
reporting the same (rounded) value send the *same* report, so its whole
history reveals what one report does.

**1BitMean** (Sec. 2.1; ``name = "1bitmean"``, kind ``mean``). With
``t = (x − low)/(high − low)`` in ``[0, 1]`` and ``e = e^ε`` one report is one
bit, 1 with probability

    p(t) = 1/(e + 1) + t (e − 1)/(e + 1),

ε-LDP (``p(1)/p(0) = (1 − p(0))/(1 − p(1)) = e``). The server's mean is
``low + (high − low)·(1/n) Σ Y_i`` with ``Y = (b(e + 1) − 1)/(e − 1)``
(``E[Y | t] = t``).

*α-point rounding* (Sec. 3). A device holds a fixed ``α`` uniform on
``[0, 1)`` and the ``s + 1`` grid points ``j/s`` (``s = granularity``). With
``t s = L + r`` (``L`` an integer, ``r`` in ``[0, 1)``) it reports the bit of
the grid point ``j = L + 1[r > α]``, i.e. it rounds up iff ``frac(t s) > α``:
over ``α``, ``P[up] = r``, so ``E[j/s] = t`` and the report stays unbiased.

*Memoization*. The bit of each grid point ``j`` is drawn once, from
Bernoulli(``p(j/s)``), and reused forever. It is *derived*, not stored: the
keystream HMAC-SHA256(device key, label ‖ memo derivation id ‖ ``j``) of
:class:`~ldp_core.mechanisms.rappor._Keystream` (RAPPOR's), and ``α`` the
same way. A device whose rounded value stays at one grid point sends one
identical bit every day: its whole history is ε-LDP. Over any history, a
device reveals one ε-LDP bit per *distinct grid point it used*: at most
``(s + 1)·ε`` however long it reports, and ``2ε`` while its value stays in one
of the ``s`` cells of width ``(high − low)/s`` (it then rounds to one of the
cell's two ends).

*Variance* (one collection, distinct devices). Given the rounded point,
``Var[Y | j] = ((e + 1)/(e − 1))² p(j/s)(1 − p(j/s))``. Because ``p`` is
linear, the report bit's marginal over ``α`` and the coin is exactly
Bernoulli(``p(t)``): ``P[b = 1] = E_α[p(j/s)] = p(E_α[j/s]) = p(t)``. So the
report has *the same distribution as unrounded 1BitMean*, and (law of total
variance) the rounding's own variance ``Var_α[j/s] = r(1 − r)/s²`` is
cancelled exactly by the drop it causes in ``E[Var[Y | j]]`` (``p(1 − p)`` is
concave with curvature ``((e − 1)/(e + 1))²``):

    Var[Y] = (1 + t(e − 1))(e − t(e − 1)) / (e − 1)²,

between ``e/(e − 1)²`` (``t = 0`` or 1) and ``(e + 1)²/(4(e − 1)²)`` (``t = ½``),
whatever ``s`` (:meth:`OneBitMeanSpec.summand_variance`; the tests check it,
and that the naive sum ``Var_unrounded + r(1 − r)/s²`` is rejected). The
estimator's interval uses the sample variance of the unbiased summands
``Y_i``, which estimates whatever their variance is, rounding included.
Across *days* the rounding and the bits are fixed per device, so averaging
the daily estimates of one population does not shrink their variance: the
utility side of what memoization costs (docs/NUMERIC.md, "Repeated
collection").

**dBitFlip** (Sec. 2.2; ``name = "dbitflip"``, kind ``distribution``). The
range is cut into ``k = buckets`` equal buckets (``high`` in the last). A
device samples ``d = sample`` distinct buckets once, uniformly (fixed per
device, derived from its key), and reports, for each sampled bucket ``j``, a
bit that is 1 with probability ``e/(e + 1)`` if ``x``'s bucket is ``j`` and
``1/(e + 1)`` otherwise, now with ``e = e^{ε/2}``. Two inputs change at most
two bits' probabilities, each by at most a factor ``e^{ε/2}``: ε-LDP. The d bits
are memoized per bucket (keystream of (``v``, spec)); a device reporting the
same bucket sends the same report every day, and over any history it
reveals at most one ε-LDP report per distinct bucket it used. No α-point
rounding into buckets is done: a value is *floored* into its bucket, so
values that move within one bucket cost nothing (rounding between bucket
centres would make a device near a centre alternate between two buckets,
doubling its loss, for a histogram that is already bucketed).

*Estimate*. ``h_v = (k/(n d)) Σ_{i: v sampled} (b_{i,v}(e + 1) − 1)/(e − 1)``
estimates the share of bucket ``v``, unbiased (``P[v sampled] = d/k``;
``E[(b(e + 1) − 1)/(e − 1)]`` is 1 for the holder's bucket, 0 otherwise). Per
device the summand ``Z = (k/d) 1[v sampled] Y`` has mean ``1[x ∈ v]`` and

    E[Z²] = (k/d) E[Y²],   E[Y²] = (e² − e + 1)/(e − 1)² (holder),  e/(e − 1)² (other),

so ``n² Var[h_v] = n_v((k/d)(e² − e + 1)/(e − 1)² − 1) + (n − n_v)(k/d)e/(e − 1)²``
(:meth:`DBitFlipSpec.share_variance`). The non-holder term is
``(k/d)·q(1 − q)/(p − q)²`` with ``p, q = e/(e + 1), 1/(e + 1)``; a published
variant divides by ``(p − q)`` instead and understates it by the factor
``p − q = (e − 1)/(e + 1)`` (the tests reject it). Different buckets' estimates
are uncorrelated: see :class:`estimator.mechanisms.repeated.DBitFlipAccumulator`.

**Records.** 1BitMean: ``bit`` (``u1``). dBitFlip: ``bucket`` (``u1``, or ``u2``
above 256 buckets) × d, distinct, and ``bits``: ``ceil(d/8)`` bytes, bit ``i``
(of the ``i``-th sampled bucket) is bit ``i % 8`` of byte ``i // 8``; padding
bits must be 0.

**Batch encoders.** :meth:`encode` simulates one report per *distinct*
device (a fresh ``α`` and bit, fresh buckets and bits); a device reporting
over time uses :meth:`encode_memoized` with its key
(:class:`client_sdk.memo.MemoStore`).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ldp_core.errors import FrameError
from ldp_core.mechanisms.numeric import NumericSpec
from ldp_core.mechanisms.oue import check_padding
from ldp_core.mechanisms.rappor import _as_secret, _Keystream

__all__ = [
    "OneBitMeanSpec",
    "DBitFlipSpec",
    "MAX_GRANULARITY",
    "MAX_BUCKETS",
    "MAX_SAMPLE",
    "keystream_uniform",
    "keystream_index",
]

#: most grid intervals a 1BitMean spec may have (the device's local policy bounds it further)
MAX_GRANULARITY = 1 << 16
#: most buckets and sampled buckets of a dBitFlip spec
MAX_BUCKETS = 1 << 16
MAX_SAMPLE = 256
ENCODE_CHUNK = 1 << 12

_LABEL_ALPHA = b"ldp-telemetry/1bitmean/alpha/v1"
_LABEL_BIT = b"ldp-telemetry/1bitmean/bit/v1"
_LABEL_SAMPLE = b"ldp-telemetry/dbitflip/sample/v1"
_LABEL_BITS = b"ldp-telemetry/dbitflip/bits/v1"


def keystream_uniform(ks: _Keystream) -> float:
    """A uniform float in ``[0, 1)`` with 53 random bits from ``ks``."""
    return (int.from_bytes(ks.take(8), "little") >> 11) / float(1 << 53)


def keystream_index(ks: _Keystream, m: int) -> int:
    """A uniform integer in ``[0, m)`` from ``ks`` (64-bit words, rejection sampling: exactly uniform)."""
    limit = (1 << 64) - ((1 << 64) % m)
    while True:
        r = int.from_bytes(ks.take(8), "little")
        if r < limit:
            return r % m


def _unit(spec: NumericSpec, values: Any) -> np.ndarray:
    """``values`` as ``t = (x − low)/(high − low)`` in ``[0, 1]`` (checked: finite, in range)."""
    return (spec.normalize(np.asarray(values, dtype=np.float64).reshape(-1)) + 1.0) / 2.0


@dataclasses.dataclass(frozen=True)
class OneBitMeanSpec(NumericSpec):
    """1BitMean with α-point rounding to ``granularity + 1`` grid points (module docstring).

    ``granularity`` s defaults to 16: the one-collection variance does not depend on it, a device's
    lifetime loss is at most ``(s + 1)ε`` and ``2ε`` while its value stays within one cell of width
    ``(high − low)/s``; choose cells about as wide as a device's values usually move."""

    granularity: int = 16

    name: ClassVar[str] = "1bitmean"
    kind: ClassVar[str] = "mean"

    def _validate(self) -> None:
        s = self._require_int(self.name, "granularity", self.granularity, 1, MAX_GRANULARITY)
        object.__setattr__(self, "granularity", s)

    @property
    def dims(self) -> int:
        """One attribute (what :class:`~estimator.mechanisms.numeric.MeanEstimate` readers expect)."""
        return 1

    def bit_probability(self, t: Any) -> np.ndarray:
        """``p(t) = 1/(e + 1) + t (e − 1)/(e + 1)`` for ``t`` in ``[0, 1]``."""
        e = self.exp_epsilon
        return 1.0 / (e + 1.0) + np.asarray(t, dtype=np.float64) * (e - 1.0) / (e + 1.0)

    def summand_variance(self, t: Any) -> np.ndarray:
        """``Var[Y] = (1 + t(e − 1))(e − t(e − 1))/(e − 1)²`` of one device's unbiased summand (units of
        ``high − low``), rounding included (module docstring: it adds nothing)."""
        e = self.exp_epsilon
        tt = np.asarray(t, dtype=np.float64)
        return (1.0 + tt * (e - 1.0)) * (e - tt * (e - 1.0)) / (e - 1.0) ** 2

    def worst_case_variance(self) -> float:
        """``Var[Y]`` at ``t = ½``: ``(e + 1)²/(4(e − 1)²)``."""
        return float(self.summand_variance(0.5))

    def unit(self, values: Any) -> np.ndarray:
        """``t = (x − low)/(high − low)``."""
        return _unit(self, values)

    def round_to_grid(self, t: np.ndarray, alpha: Any) -> np.ndarray:
        """The grid index ``j`` of each ``t`` for the device offsets ``alpha``: ``⌊ts⌋ + 1[frac(ts) > α]``."""
        s = self.granularity
        u = np.asarray(t, dtype=np.float64) * s
        low = np.floor(u)
        j = low + ((u - low) > np.asarray(alpha, dtype=np.float64))
        return np.clip(j, 0, s).astype(np.int64)

    @cached_property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("bit", "u1")])

    def check_records(self, records: np.ndarray) -> None:
        if records.size and int(records["bit"].max()) > 1:
            raise FrameError(f"{self.name}: bit must be 0 or 1")

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """One report per distinct simulated device: a fresh α, then a fresh bit of its grid point."""
        t = self.unit(values)
        j = self.round_to_grid(t, rng.random(t.shape))
        out = np.empty(t.size, dtype=self.record_dtype)
        out["bit"] = rng.random(t.shape) < self.bit_probability(j / self.granularity)
        return out

    def encode_one(self, value: Any, rng: np.random.Generator) -> np.ndarray:
        return self.encode(np.asarray([value], dtype=np.float64), rng)

    # -- memoized (one device) -------------------------------------------------------------
    def device_alpha(self, secret: bytes) -> float:
        """The device's rounding offset α in ``[0, 1)``: keystream HMAC-SHA256(key,
        ``ldp-telemetry/1bitmean/alpha/v1`` ‖ 0x00 ‖ memo derivation id (8 bytes) ‖ counter), 53 bits."""
        return keystream_uniform(_Keystream(_as_secret(secret), _LABEL_ALPHA, bytes.fromhex(self.memo_derivation_id)))

    def grid_bit(self, j: int, secret: bytes) -> int:
        """The memoized bit of grid point ``j``: Bernoulli(``p(j/s)``), exactly (bit-sliced comparison), from
        the keystream of (``ldp-telemetry/1bitmean/bit/v1``, memo derivation id, ``j`` as int64 LE)."""
        ctx = bytes.fromhex(self.memo_derivation_id) + struct.pack("<q", int(j))
        ks = _Keystream(_as_secret(secret), _LABEL_BIT, ctx)
        return ks.bernoulli(float(self.bit_probability(j / self.granularity)), 1)

    def encode_memoized(self, values: Any, secret: bytes, rng: np.random.Generator) -> np.ndarray:
        """Reports of one device: its fixed α and the memoized bit of each value's grid point. Nothing is
        drawn from ``rng``: the same rounded value gives the same report (module docstring)."""
        key = _as_secret(secret)
        t = self.unit(values)
        j = self.round_to_grid(t, self.device_alpha(key))
        out = np.empty(t.size, dtype=self.record_dtype)
        bits = {int(u): self.grid_bit(int(u), key) for u in np.unique(j).tolist()}
        out["bit"] = [bits[int(u)] for u in j.tolist()]
        return out


@dataclasses.dataclass(frozen=True)
class DBitFlipSpec(NumericSpec):
    """dBitFlip over ``buckets`` equal buckets of ``[low, high]``, ``sample`` of them per device (module
    docstring). ``sample`` defaults to ``min(buckets, 4)``."""

    buckets: int = 32
    sample: int | None = None

    name: ClassVar[str] = "dbitflip"
    kind: ClassVar[str] = "distribution"

    def _validate(self) -> None:
        k = self._require_int(self.name, "buckets", self.buckets, 2, MAX_BUCKETS)
        object.__setattr__(self, "buckets", k)
        d = min(k, 4) if self.sample is None else self.sample
        object.__setattr__(self, "sample", self._require_int(self.name, "sample", d, 1, min(k, MAX_SAMPLE)))

    @property
    def k(self) -> int:
        return int(self.buckets)

    @property
    def d(self) -> int:
        return int(self.sample)  # type: ignore[arg-type]

    @property
    def bins(self) -> int:
        """The histogram's bins: the buckets."""
        return self.k

    @property
    def e_half(self) -> float:
        """``e^{ε/2}``."""
        return math.exp(self.epsilon / 2.0)

    @property
    def p(self) -> float:
        """P[bit = 1] for the holder's bucket: ``e^{ε/2}/(e^{ε/2} + 1)``."""
        return self.e_half / (self.e_half + 1.0)

    @property
    def q(self) -> float:
        """P[bit = 1] for another sampled bucket: ``1/(e^{ε/2} + 1)``."""
        return 1.0 / (self.e_half + 1.0)

    def share_variance(self, true_counts: Any, n: float | None = None) -> np.ndarray:
        """Exact ``Var[h_v]`` of each bucket's estimated share given the true counts (module docstring);
        ``n`` defaults to their sum (the estimator passes the report count with estimated counts)."""
        c = np.asarray(true_counts, dtype=np.float64)
        n = float(c.sum()) if n is None else float(n)
        e, r = self.e_half, self.k / self.d
        hold = r * (e * e - e + 1.0) / (e - 1.0) ** 2 - 1.0
        other = r * e / (e - 1.0) ** 2
        return (c * hold + (n - c) * other) / (n * n)

    @property
    def n_bytes(self) -> int:
        return (self.d + 7) // 8

    @cached_property
    def record_dtype(self) -> np.dtype:
        idx = "u1" if self.k <= 256 else "<u2"
        return np.dtype([("bucket", idx, (self.d,)), ("bits", "u1", (self.n_bytes,))])

    def check_records(self, records: np.ndarray) -> None:
        b = records["bucket"].reshape(records.shape[0], -1)
        if b.size:
            if int(b.max()) >= self.k:
                raise FrameError(f"{self.name}: a bucket index is not below {self.k}")
            srt = np.sort(b, axis=1)
            if self.d > 1 and np.any(srt[:, 1:] == srt[:, :-1]):
                raise FrameError(f"{self.name}: a record samples one bucket twice")
        check_padding(self.name, records["bits"].reshape(records.shape[0], -1), self.d)

    def bucket_of(self, values: Any) -> np.ndarray:
        """The bucket of each value (``high`` in the last)."""
        t = _unit(self, values)
        return np.minimum((t * self.k).astype(np.int64), self.k - 1)

    def bin_edges(self) -> np.ndarray:
        """The ``buckets + 1`` edges, in the value's units."""
        return float(self.low) + np.linspace(0.0, 1.0, self.k + 1) * (float(self.high) - float(self.low))

    def bits_of(self, records: np.ndarray) -> np.ndarray:
        """The d report bits of each record, ``(n, d)`` ``uint8``."""
        packed = records["bits"].reshape(records.shape[0], -1)
        return np.unpackbits(packed, axis=1, bitorder="little")[:, : self.d]

    def _records(self, buckets: np.ndarray, bits: np.ndarray) -> np.ndarray:
        out = np.empty(buckets.shape[0], dtype=self.record_dtype)
        out["bucket"] = buckets.reshape(out["bucket"].shape)
        out["bits"] = np.packbits(bits.astype(np.uint8), axis=1, bitorder="little").reshape(out["bits"].shape)
        return out

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """One report per distinct simulated device: d fresh distinct buckets, fresh bits."""
        v = self.bucket_of(values)
        n, k, d = v.size, self.k, self.d
        buckets = np.empty((n, d), dtype=np.int64)
        for start in range(0, n, ENCODE_CHUNK):
            m = min(n, start + ENCODE_CHUNK) - start
            if d == k:
                buckets[start : start + m] = np.arange(k)
            else:
                buckets[start : start + m] = np.argpartition(rng.random((m, k)), d - 1, axis=1)[:, :d]
        hit = buckets == v[:, None]
        bits = rng.random((n, d)) < np.where(hit, self.p, self.q)
        return self._records(buckets, bits)

    def encode_one(self, value: Any, rng: np.random.Generator) -> np.ndarray:
        return self.encode(np.asarray([value], dtype=np.float64), rng)

    # -- memoized (one device) -------------------------------------------------------------
    def device_buckets(self, secret: bytes) -> np.ndarray:
        """The device's d sampled buckets, a uniform d-subset fixed per (key, spec): a partial Fisher–Yates
        shuffle driven by the keystream of (``ldp-telemetry/dbitflip/sample/v1``, memo derivation id)."""
        ks = _Keystream(_as_secret(secret), _LABEL_SAMPLE, bytes.fromhex(self.memo_derivation_id))
        pool: dict[int, int] = {}
        out = []
        for i in range(self.d):
            j = i + keystream_index(ks, self.k - i)
            out.append(pool.get(j, j))
            pool[j] = pool.get(i, i)
        return np.array(out, dtype=np.int64)

    def memoized_bits(self, bucket: int, sampled: np.ndarray, secret: bytes) -> np.ndarray:
        """The d memoized bits a device with ``sampled`` buckets reports for ``bucket``: from the keystream of
        (``ldp-telemetry/dbitflip/bits/v1``, memo derivation id, ``bucket`` int64 LE), d Bernoulli(q) bits, then
        one Bernoulli(p) bit for the sampled position equal to ``bucket`` (if any)."""
        ctx = bytes.fromhex(self.memo_derivation_id) + struct.pack("<q", int(bucket))
        ks = _Keystream(_as_secret(secret), _LABEL_BITS, ctx)
        word = ks.bernoulli(self.q, self.d)
        hold = ks.bernoulli(self.p, 1)
        bits = np.array([(word >> i) & 1 for i in range(self.d)], dtype=np.uint8)
        at = np.flatnonzero(sampled == bucket)
        if at.size:
            bits[at[0]] = hold
        return bits

    def encode_memoized(self, values: Any, secret: bytes, rng: np.random.Generator) -> np.ndarray:
        """Reports of one device: its fixed buckets and the memoized bits of each value's bucket. Nothing is
        drawn from ``rng``: the same bucket gives the same report."""
        key = _as_secret(secret)
        v = self.bucket_of(values)
        sampled = self.device_buckets(key)
        memo = {int(u): self.memoized_bits(int(u), sampled, key) for u in np.unique(v).tolist()}
        bits = np.array([memo[int(u)] for u in v.tolist()], dtype=np.uint8).reshape(v.size, self.d)
        return self._records(np.tile(sampled, (v.size, 1)), bits)
