r"""RAPPOR, device side, and the least-squares decoding math both sides share.

Erlingsson, Pihur and Korolova, "RAPPOR: Randomized Aggregatable
Privacy-Preserving Ordinal Response", CCS 2014 (section numbers below refer
to it).

**Encoding** (Sec. 3). A device belongs to one of m cohorts. Its value x is
hashed into a Bloom filter B of k bits with h hash functions of its cohort c:

    bit i of the filter:  pos_i(x, c) = hash_to_range(x, seed_{c,i}, k),
    seed_{c,i} = XXH32 of the 4-byte little-endian integer c·h + i under the
                 spec's ``hash_seed`` (``xxh32_u32(c*h + i, hash_seed)``),

(XXH32 and the multiply-shift reduction of :mod:`ldp_core.hashing`; never
Python's ``hash``). Two hashes may land on the same bit; the filter then has
fewer than h ones.

* Permanent randomized response (PRR): each bit B_j becomes 1 with
  probability f/2, 0 with probability f/2, and stays B_j otherwise. It is
  memoized: a device reports the *same* PRR for the same value forever.
* Instantaneous randomized response (IRR), fresh for every report: bit S_j is
  1 with probability q if the PRR bit is 1 and with probability p if it is 0.

Given B, the report bits are independent with
q* = P[S_j = 1 | B_j = 1] = (1 - f/2) q + (f/2) p and
p* = P[S_j = 1 | B_j = 0] = (f/2) q + (1 - f/2) p (Sec. 4).

**What ``epsilon`` means.** ``epsilon`` is the *permanent* (longitudinal)
guarantee ε∞ of Sec. 3.1: whatever number of reports a device sends about one
value, an observer of all of them learns no more than ε∞-LDP allows, because
they are all functions of one PRR and two filters differ in at most 2h bits:

    ε∞ = 2h ln((1 - f/2) / (f/2)),   so   f = 2 / (1 + e^{ε∞ / (2h)}).

``f`` is therefore derived from ``epsilon`` and ``num_hashes``, not a
parameter. One report on its own satisfies the (smaller) one-report bound of
Sec. 3.1, :attr:`RapporSpec.epsilon_one_report`:

    ε1 = h ln( q*(1 - p*) / (p*(1 - q*)) ),

with equality when the two values' filters are disjoint with h bits each.
(With p = 0 and q = 1 there is no IRR and ε1 = ε∞.) A budget ledger that
charges ``epsilon`` per report is conservative: ε∞ bounds the whole history.

**Memoization.** :meth:`RapporSpec.permanent_bits` derives a device's PRR
deterministically from a device secret and the value with HMAC-SHA256 used as
a keystream (key = secret, message = a label, the spec id, the value and a
block counter), so the same (secret, spec, value) always yields the same
permanent bits and nothing needs storing: the memo keeps no plaintext value.
The device's cohort is derived from the secret the same way
(:meth:`RapporSpec.cohort_of`). :meth:`RapporSpec.encode_memoized` draws
fresh IRR noise per report. The batch encoder :meth:`RapporSpec.encode`
simulates one report per *distinct* user: a uniform cohort and a fresh PRR
per report. A fresh PRR followed by an IRR makes the report bits independent
given the filter, 1 with probability q* on filter bits and p* elsewhere, so
the batch encoder draws them in that single stage (the same distribution, at
a third of the random bits): every bit from Bernoulli(p*), then the filter
bits again from Bernoulli(q*).

**Decoding** (Sec. 4, least squares instead of the paper's Lasso + OLS
two-step). Let N_c be the number of reports of cohort c and Y_{c,j} how many
of them set bit j. Then t_{c,j} = (Y_{c,j} - p* N_c) / (q* - p*) has mean
Σ_v X[(c,j), v] n_v / m over uniformly random cohorts, where X is the
(m·k) × d design matrix, X[(c,j), v] = 1 iff bit j is in the filter of v in
cohort c, and n_v the true counts. The least-squares estimate

    n̂ = m (XᵀX)⁻¹ Xᵀ t

is exactly unbiased for any fixed hash functions as long as X has full column
rank (checked when the design is built; d ≤ m·k is necessary and is checked
at construction). See :class:`RapporDesign` for its exact variance.

**Record.** ``cohort`` (``<u2``) and ``bits``: ceil(k/8) bytes, bit j is bit
``j % 8`` of byte ``j // 8``; padding bits above k - 1 must be 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import math
import struct
from collections.abc import Callable
from functools import cached_property
from typing import Any, ClassVar, cast

import numpy as np

from ldp_core.bernoulli import bernoulli_words, probability_digits
from ldp_core.errors import DomainError, SpecError
from ldp_core.hashing import hash_to_range, xxh32_u32
from ldp_core.mechanisms.base import MechanismSpec
from ldp_core.mechanisms.oue import check_padding, write_packed

__all__ = [
    "RapporSpec",
    "RapporDesign",
    "check_gram_factor",
    "design_positions",
    "default_num_bits",
    "default_num_cohorts",
    "MAX_BITS",
    "MAX_COHORTS",
    "MAX_DESIGN_CANDIDATES",
    "MIN_SECRET_BYTES",
]

MAX_BITS = 8192
MAX_COHORTS = 1 << 16
MAX_HASHES = 64
#: Decoding keeps three d × d matrices; above this many candidates, pass an explicit candidate list.
MAX_DESIGN_CANDIDATES = 4096
MIN_SECRET_BYTES = 16
_DEFAULT_COHORTS = 8
_LABEL_PRR = b"ldp-telemetry/rappor/prr/v1"
_LABEL_COHORT = b"ldp-telemetry/rappor/cohort/v1"


def default_num_bits(domain_size: int) -> int:
    """Default k: about d bits rounded up to a whole byte, at least 16 and at most 4096.

    With the default 8 cohorts this gives m·k ≥ 8d up to d = 4096 (then the
    cohorts grow instead): the least-squares variance is within about 15 % of
    what collision-free filters would give (numerical study of (XᵀX)⁻¹_vv for
    random filters: the excess is about 1.2·d/(m·k))."""
    return int(min(4096, max(16, 8 * math.ceil(domain_size / 8))))


def default_num_cohorts(domain_size: int, num_bits: int) -> int:
    """Default m: 8, or enough cohorts that m·k ≥ 8d when k is capped."""
    return int(max(_DEFAULT_COHORTS, math.ceil(8 * domain_size / num_bits)))


def _as_secret(secret: Any) -> bytes:
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise DomainError(f"rappor: the device secret must be bytes, got {type(secret).__name__}")
    key = bytes(secret)
    if len(key) < MIN_SECRET_BYTES:
        raise DomainError(
            f"rappor: the device secret has {len(key)} bytes; use at least {MIN_SECRET_BYTES} "
            "bytes from a CSPRNG (e.g. secrets.token_bytes(32)) and keep it on the device"
        )
    return key


def _bernoulli(prob: float, n_words: int, rng: np.random.Generator) -> np.ndarray:
    """:func:`bernoulli_words`, also for prob = 1."""
    if prob >= 1.0:
        return np.full(n_words, np.uint64(0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
    return bernoulli_words(prob, n_words, rng)


class _Keystream:
    """HMAC-SHA256(key, label ‖ context ‖ counter) for counter = 0, 1, ..., read as one byte stream."""

    def __init__(self, key: bytes, label: bytes, context: bytes) -> None:
        self._key, self._prefix = key, label + b"\x00" + context
        self._counter = 0
        self._buf = b""

    def take(self, nbytes: int) -> bytes:
        while len(self._buf) < nbytes:
            block = hmac.new(self._key, self._prefix + struct.pack("<Q", self._counter), hashlib.sha256).digest()
            self._buf += block
            self._counter += 1
        out, self._buf = self._buf[:nbytes], self._buf[nbytes:]
        return out

    def bits(self, nbits: int) -> int:
        """``nbits`` uniform bits as a non-negative int."""
        nbytes = (nbits + 7) // 8
        return int.from_bytes(self.take(nbytes), "little") & ((1 << nbits) - 1)

    def bernoulli(self, prob: float, nbits: int) -> int:
        """``nbits`` independent Bernoulli(prob) bits as an int, each 1 with probability
        exactly the float ``prob``: the bit-sliced comparison of uniforms with prob's
        binary digits described in :mod:`ldp_core.bernoulli`, on Python ints."""
        if prob >= 1.0:
            return (1 << nbits) - 1
        undecided, result = (1 << nbits) - 1, 0
        for digit in probability_digits(prob):
            if not undecided:
                break
            u = self.bits(nbits)
            if digit:
                result |= undecided & ~u
                undecided &= u
            else:
                undecided &= ~u
        return result


@dataclasses.dataclass(frozen=True)
class RapporSpec(MechanismSpec):
    """RAPPOR with Bloom filters of ``num_bits`` bits and ``num_hashes`` hashes in
    ``num_cohorts`` cohorts; ``epsilon`` is the permanent ε∞ (module docstring).

    ``num_bits`` and ``num_cohorts`` default from the domain size
    (:func:`default_num_bits`, :func:`default_num_cohorts`); ``p`` and ``q``
    (the IRR) default to the paper's 0.5 and 0.75; ``num_hashes`` to 2.

    :meth:`encode` and :meth:`encode_one` draw a fresh cohort and PRR per call,
    so each report is ε1-LDP on its own (≤ ε∞, what a ledger charging
    ``epsilon`` per report assumes) but repeated reports of one value compose;
    a device that reports a value repeatedly uses :meth:`encode_memoized` to
    keep the whole history within ε∞."""

    # None (the default) asks for default_num_bits / default_num_cohorts, which _validate stores in
    # its place: a constructed spec always holds ints, so that is the type its readers see.
    num_bits: int = None  # type: ignore[assignment]
    num_hashes: int = 2
    num_cohorts: int = None  # type: ignore[assignment]
    p: float = 0.5
    q: float = 0.75
    hash_seed: int = 0

    name: ClassVar[str] = "rappor"

    def _validate(self) -> None:
        n = self.name
        d = self.domain_size
        # As given to the constructor, where None still means "the default" (see the fields).
        bits, cohorts = cast("int | None", self.num_bits), cast("int | None", self.num_cohorts)
        k = default_num_bits(d) if bits is None else self._require_int(n, "num_bits", bits, 1, MAX_BITS)
        h = self._require_int(n, "num_hashes", self.num_hashes, 1, min(MAX_HASHES, k))
        if cohorts is None:
            m = default_num_cohorts(d, k)
            if m > MAX_COHORTS:
                raise SpecError(f"{n}: a domain of {d} values needs num_bits*num_cohorts >= {d}; set both explicitly")
        else:
            m = self._require_int(n, "num_cohorts", cohorts, 1, MAX_COHORTS)
        s = self._require_int(n, "hash_seed", self.hash_seed, 0, 2**32 - 1)
        probs = {}
        for field in ("p", "q"):
            val = getattr(self, field)
            if isinstance(val, bool) or not isinstance(val, (int, float, np.integer, np.floating)):
                raise SpecError(f"{n}: {field} must be a probability, got {val!r}")
            val = float(val)
            if not 0.0 <= val <= 1.0:
                raise SpecError(f"{n}: {field} must be in [0, 1], got {val}")
            probs[field] = val
        if not probs["p"] < probs["q"]:
            raise SpecError(
                f"{n}: the IRR needs p < q (p = P[1 | PRR bit 0], q = P[1 | PRR bit 1]), got p={probs['p']}, "
                f"q={probs['q']}; the paper's values are p=0.5, q=0.75"
            )
        if d > m * k:
            raise SpecError(
                f"{n}: {d} values cannot be told apart by least squares from {m} cohorts x {k} bits "
                f"(needs domain_size <= num_cohorts*num_bits = {m * k}); raise num_bits or num_cohorts"
            )
        for field, val in (("num_bits", k), ("num_hashes", h), ("num_cohorts", m), ("hash_seed", s)):
            object.__setattr__(self, field, val)
        object.__setattr__(self, "p", probs["p"])
        object.__setattr__(self, "q", probs["q"])
        if not 0.0 < self.f < 1.0 or self.q_star == self.p_star:
            raise SpecError(f"{n}: epsilon {self.epsilon} with num_hashes {h} leaves no signal; raise epsilon")

    # -- probabilities ----------------------------------------------------
    @property
    def f(self) -> float:
        """PRR noise f = 2 / (1 + e^{ε∞/(2h)}), from ε∞ = 2h ln((1 - f/2)/(f/2))."""
        return 2.0 / (1.0 + math.exp(self.epsilon / (2.0 * self.num_hashes)))

    @property
    def q_star(self) -> float:
        """P[report bit = 1 | filter bit = 1] = (1 - f/2) q + (f/2) p."""
        half = self.f / 2.0
        return (1.0 - half) * self.q + half * self.p

    @property
    def p_star(self) -> float:
        """P[report bit = 1 | filter bit = 0] = (f/2) q + (1 - f/2) p."""
        half = self.f / 2.0
        return half * self.q + (1.0 - half) * self.p

    @property
    def epsilon_permanent(self) -> float:
        """ε∞, the bound over all reports of one value (= ``epsilon``)."""
        return self.epsilon

    @property
    def irr_epsilon(self) -> float:
        """Per-bit ε of the instantaneous randomization alone, ln(q(1-p) / (p(1-q))): how much one
        report reveals about one bit of the permanent response (infinite with p = 0 or q = 1, when
        every report of a value is the permanent response itself). The device's
        :class:`~client_sdk.policy.LocalPolicy` bounds it (``max_irr_epsilon``)."""
        if self.p <= 0.0 or self.q >= 1.0:
            return math.inf
        return math.log(self.q * (1.0 - self.p) / (self.p * (1.0 - self.q)))

    @property
    def epsilon_one_report(self) -> float:
        """ε1 = h ln(q*(1-p*) / (p*(1-q*))), the bound for a single report (Sec. 3.1)."""
        qs, ps = self.q_star, self.p_star
        if qs >= 1.0 or ps <= 0.0:
            return self.epsilon
        return self.num_hashes * math.log(qs * (1.0 - ps) / (ps * (1.0 - qs)))

    # -- layout -------------------------------------------------------------
    @property
    def n_bytes(self) -> int:
        return (self.num_bits + 7) // 8

    @property
    def n_words(self) -> int:
        return (self.num_bits + 63) // 64

    @property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("cohort", "<u2"), ("bits", "u1", (self.n_bytes,))])

    def record_bounds(self) -> dict[str, int]:
        return {"cohort": self.num_cohorts}

    def check_records(self, records: np.ndarray) -> None:
        super().check_records(records)
        check_padding(self.name, records["bits"], self.num_bits)

    # -- hashing --------------------------------------------------------------
    @cached_property
    def cohort_seeds(self) -> np.ndarray:
        """``seed[c, i] = xxh32_u32(c*h + i, hash_seed)``, shape (m, h), ``uint32``."""
        m, h = self.num_cohorts, self.num_hashes
        seeds = xxh32_u32(np.arange(m * h, dtype=np.uint64).astype(np.uint32), np.uint32(self.hash_seed)).reshape(m, h)
        seeds.setflags(write=False)
        return seeds

    def bloom_positions(self, values: Any, cohorts: Any) -> np.ndarray:
        """Bit positions of each (value, cohort): ``(..., h)`` ``int64``; ``values`` and
        ``cohorts`` broadcast together."""
        v = np.asarray(values, dtype=np.int64).astype(np.uint32)
        c = np.asarray(cohorts, dtype=np.int64)
        return hash_to_range(v[..., None], self.cohort_seeds[c], self.num_bits).astype(np.int64)

    def _irr(self, prr: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        ones = _bernoulli(self.q, prr.size, rng)
        zeros = _bernoulli(self.p, prr.size, rng)
        return (prr & ones) | (~prr & zeros)

    def _records(self, cohorts: np.ndarray, words: np.ndarray) -> np.ndarray:
        out = np.empty(cohorts.size, dtype=self.record_dtype)
        out["cohort"] = cohorts
        write_packed(out["bits"], words, self.num_bits)
        return out

    # -- device side ----------------------------------------------------------
    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """One report per distinct simulated user: a uniform cohort, then a fresh PRR and
        IRR, drawn as one stage (module docstring): bit j is Bernoulli(q*) on the
        filter and Bernoulli(p*) off it, independently."""
        v = self.check_values(values)
        n, w, h = v.size, self.n_words, self.num_hashes
        cohorts = rng.integers(0, self.num_cohorts, size=n, dtype=np.int64)
        pos = self.bloom_positions(v, cohorts)
        words = _bernoulli(self.p_star, n * w, rng)
        on = _bernoulli(self.q_star, (n * h + 63) // 64, rng).astype("<u8", copy=False).view(np.uint8)
        on = np.unpackbits(on, bitorder="little")
        on = on[: n * h].reshape(n, h).astype(bool)
        base = np.arange(n, dtype=np.int64) * w
        for i in range(h):
            at = base + (pos[:, i] >> 6)
            mask = np.left_shift(np.uint64(1), (pos[:, i] & 63).astype(np.uint64))
            words[at] = np.where(on[:, i], words[at] | mask, words[at] & ~mask)
        return self._records(cohorts, words)

    def cohort_of(self, secret: bytes) -> int:
        """The device's cohort, uniform on [0, m) and fixed per (secret, spec).

        Keystream HMAC-SHA256(secret, ``ldp-telemetry/rappor/cohort/v1`` ‖ 0x00 ‖
        memo derivation id (8 bytes) ‖ counter (uint64 LE)), read as 64-bit little-endian
        words; the first word below 2^64 - (2^64 mod m), reduced mod m (rejection
        sampling, so exactly uniform)."""
        ks = _Keystream(_as_secret(secret), _LABEL_COHORT, bytes.fromhex(self.memo_derivation_id))
        m = self.num_cohorts
        limit = (1 << 64) - ((1 << 64) % m)
        while True:
            r = int.from_bytes(ks.take(8), "little")
            if r < limit:
                return r % m

    def _permanent_int(self, value: int, cohort: int, key: bytes) -> int:
        k = self.num_bits
        bloom = 0
        for j in set(self.bloom_positions(value, cohort).tolist()):
            bloom |= 1 << j
        ks = _Keystream(key, _LABEL_PRR, bytes.fromhex(self.memo_derivation_id) + struct.pack("<q", value))
        fake = ks.bernoulli(self.f, k)
        coin = ks.bits(k)
        return (fake & coin) | (~fake & bloom & ((1 << k) - 1))

    def permanent_bits(self, value: int, secret: bytes) -> np.ndarray:
        """The memoized PRR of ``value`` for the device holding ``secret``: ``ceil(k/8)``
        packed bytes (little-endian bit order), a pure function of (secret, spec, value).

        Keystream: HMAC-SHA256(secret, ``ldp-telemetry/rappor/prr/v1`` ‖ 0x00 ‖ memo derivation id
        (8 bytes) ‖ value (int64 LE) ‖ counter (uint64 LE)). From it, k Bernoulli(f)
        bits F (exact bit-sliced comparison, :meth:`_Keystream.bernoulli`), then k fair
        bits R; PRR = (F & R) | (~F & B), i.e. 1 w.p. f/2, 0 w.p. f/2, B otherwise."""
        key = _as_secret(secret)
        v = int(self.check_values(np.array([value]))[0])
        bits = self._permanent_int(v, self.cohort_of(key), key)
        return np.frombuffer(bits.to_bytes(self.n_bytes, "little"), dtype=np.uint8).copy()

    def encode_memoized(self, values: Any, secret: bytes, rng: np.random.Generator) -> np.ndarray:
        """Reports of one device: its fixed cohort, the memoized PRR of each value and a
        fresh IRR per report drawn from ``rng``."""
        key = _as_secret(secret)
        v = self.check_values(values)
        cohort = self.cohort_of(key)
        w = self.n_words
        prr = np.zeros((v.size, w), dtype=np.uint64)
        uniq, inverse = np.unique(v, return_inverse=True)
        for u_idx, value in enumerate(uniq.tolist()):
            bits = self._permanent_int(value, cohort, key).to_bytes(8 * w, "little")
            prr[inverse == u_idx] = np.frombuffer(bits, dtype="<u8")
        cohorts = np.full(v.size, cohort, dtype=np.int64)
        return self._records(cohorts, self._irr(prr.reshape(-1), rng))

    # -- server-side math shared with the estimator ------------------------------
    def design(self, candidates: Any = None) -> RapporDesign:
        """The least-squares decoding design over ``candidates`` (default: the whole
        domain, built once and cached on the spec)."""
        if candidates is None:
            return self._full_design
        return RapporDesign(self, candidates)

    @cached_property
    def _full_design(self) -> RapporDesign:
        return RapporDesign(self, np.arange(self.domain_size, dtype=np.int64))

    def adopt_full_design(self, design: RapporDesign) -> None:
        """Use ``design`` (the whole domain, built elsewhere, e.g. loaded from the
        estimator's disk cache) as this spec's cached design, so that
        :meth:`count_variance` does not build it again. Ignored once built."""
        if design.spec != self or not np.array_equal(design.candidates, np.arange(self.domain_size)):
            raise SpecError("rappor: adopt_full_design needs a design of this spec over the whole domain")
        self.__dict__.setdefault("_full_design", design)

    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        """Exact variance of the least-squares estimates given the true counts, over
        uniformly random cohorts and the PRR/IRR noise, for this spec's hash
        functions: :meth:`RapporDesign.variance` over the whole domain."""
        return self._full_design.variance(true_counts)


def design_positions(spec: RapporSpec, candidates: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked ``candidates`` (``int64``) with their filter bits in every cohort:
    ``positions`` (m, d, h) and ``valid`` (m, d, h), False where hash i repeats
    an earlier hash's bit (that bit counts once in the design X)."""
    cand = np.asarray(candidates)
    if cand.ndim != 1 or cand.size == 0 or cand.dtype.kind not in "iu":
        raise SpecError("rappor: candidates must be a non-empty 1-d array of integer domain indices")
    cand = cand.astype(np.int64)
    if cand.min() < 0 or cand.max() >= spec.domain_size:
        raise SpecError(f"rappor: candidates must lie in [0, {spec.domain_size})")
    if np.unique(cand).size != cand.size:
        raise SpecError("rappor: candidates must be distinct")
    d, m, k, h = cand.size, spec.num_cohorts, spec.num_bits, spec.num_hashes
    if d > MAX_DESIGN_CANDIDATES:
        raise SpecError(
            f"rappor: decoding {d} candidates at once needs d x d matrices; "
            f"pass at most {MAX_DESIGN_CANDIDATES} candidates (e.g. estimate(candidates=...))"
        )
    if d > m * k:
        raise SpecError(f"rappor: {d} candidates exceed num_cohorts*num_bits = {m * k}; they cannot be separated")
    pos = spec.bloom_positions(cand[None, :], np.arange(m)[:, None])  # (m, d, h)
    valid = np.ones(pos.shape, dtype=bool)
    for i in range(1, h):
        valid[..., i] = ~np.any(pos[..., :i] == pos[..., i : i + 1], axis=-1)
    return cand, pos, valid


def check_gram_factor(gram: np.ndarray, cholesky: Callable[[np.ndarray], np.ndarray], d: int) -> np.ndarray:
    """The lower Cholesky factor L of the Gram matrix G = XᵀX (G = L Lᵀ) from
    ``cholesky``, or :class:`SpecError` when G is rank-deficient: the
    factorization fails or a pivot L_ii² falls below 1e-9 · max_i G_ii."""
    try:
        chol = cholesky(gram)
        pivots = np.diag(chol) ** 2
        if pivots.min() <= 1e-9 * np.diag(gram).max():
            raise np.linalg.LinAlgError
    except np.linalg.LinAlgError:
        raise SpecError(
            f"rappor: the Bloom-filter design over {d} candidates is rank-deficient (some candidates' "
            f"filters are linear combinations of others in every cohort); raise num_cohorts or num_bits, "
            f"or change hash_seed"
        ) from None
    return chol


class RapporDesign:
    r"""Least-squares decoding of RAPPOR over a candidate set, with its exact variance.

    Notation of the module docstring; d candidates, design X ((m·k) × d), G = XᵀX,
    A = G⁻¹Xᵀ (d × m·k), δ = q* - p*, and A_c, X_c the columns/rows of cohort c.
    The estimate is n̂ = m A t.

    **Variance.** Each user u adds Z_u to t, Z_u[(c,j)] = [c_u = c](S_{u,j} - p*)/δ;
    users are independent, so Cov t = Σ_v n_v Cov(Z | v). For a user holding v,
    with b = b_{c,v} its filter in cohort c and π_j = p* + δ b_j:
    E Z = x_v / m (x_v = column v of X); E[Z Zᵀ] is block-diagonal over cohorts
    with blocks (1/m)(b bᵀ + diag(π(1-π))/δ²) (report bits are independent given
    the filter, and (S_j - p*)²/δ² has mean π_j(1-π_j)/δ² + b_j). Since A x_v = e_v,

        Var n̂_i = m Σ_v H[i,v] n_v + m Σ_{c,j} A[i,(c,j)]² w_{c,j} - n_i,
        H[i,v] = Σ_c (A_c X_c)[i,v]²,
        w = α n + β X n,  α = p*(1-p*)/δ²,  β = (q*(1-q*) - p*(1-p*))/δ²,

    i.e. Var n̂ = m H n + m α n diag(G⁻¹) + m β K n - n with K = (A∘A) X (using
    Σ_{c,j} A[i,(c,j)]² = (A Aᵀ)_ii = G⁻¹_ii). With m = 1 and X = I this is the
    pure-protocol variance [n_v q*(1-q*) + (n - n_v) p*(1-p*)]/δ². The first and
    last terms are the cohort-sampling part (they cancel when cohorts separate
    values perfectly); the middle ones are the randomized-response noise.

    Building the design costs O(m·h·d²) plus one d × d Cholesky factorization;
    the matrices H and K (d × d each) are kept so that :meth:`variance` is two
    matrix-vector products. A rank-deficient design raises :class:`SpecError`.
    This numpy build is the reference; the estimator builds the same matrices
    faster (and caches them on disk) and hands them in through
    :meth:`from_matrices`.
    """

    def __init__(self, spec: RapporSpec, candidates: Any) -> None:
        self._locate(spec, candidates)
        d, m = self.candidates.size, spec.num_cohorts
        gram = np.zeros((d, d))
        for c in range(m):
            gram += self._gather(self._cohort_matrix(c), c)
        check_gram_factor(gram, np.linalg.cholesky, d)
        gram_inv = np.linalg.inv(gram)
        gram_inv = (gram_inv + gram_inv.T) / 2.0
        self.gram_inv = gram_inv
        self.gram_solve: Callable[[np.ndarray], np.ndarray] = gram_inv.__matmul__

        h_t = np.zeros((d, d))
        k_t = np.zeros((d, d))
        for c in range(m):
            a_ct = self._scatter(gram_inv, c)  # rows (c, j) of Aᵀ
            p_c = self._gather(a_ct, c)  # (A_c X_c)ᵀ
            h_t += p_c * p_c
            k_t += self._gather(a_ct * a_ct, c)
        self.h_matrix = np.ascontiguousarray(h_t.T)
        self.k_matrix = np.ascontiguousarray(k_t.T)
        self.gram_inv_diag = np.diag(gram_inv).copy()

    @classmethod
    def from_matrices(
        cls,
        spec: RapporSpec,
        candidates: Any,
        *,
        h_matrix: np.ndarray,
        k_matrix: np.ndarray,
        gram_inv_diag: np.ndarray,
        gram_solve: Callable[[np.ndarray], np.ndarray],
    ) -> RapporDesign:
        """A design whose H, K, diag(G⁻¹) and solver ``b ↦ G⁻¹ b`` were computed
        elsewhere (same definitions as the class docstring); only the Bloom
        positions are recomputed here. Shapes are checked, values are trusted."""
        self = cls.__new__(cls)
        self._locate(spec, candidates)
        d = self.candidates.size
        for name, arr, shape in (
            ("h_matrix", h_matrix, (d, d)),
            ("k_matrix", k_matrix, (d, d)),
            ("gram_inv_diag", gram_inv_diag, (d,)),
        ):
            if np.shape(arr) != shape or np.asarray(arr).dtype != np.float64:
                raise SpecError(f"rappor: {name} must be float64 of shape {shape} for {d} candidates")
        self.h_matrix, self.k_matrix, self.gram_inv_diag = h_matrix, k_matrix, gram_inv_diag
        self.gram_solve = gram_solve
        return self

    def _locate(self, spec: RapporSpec, candidates: Any) -> None:
        self.spec = spec
        self.candidates, self.positions, self.valid = design_positions(spec, candidates)
        self._weights = self.valid.astype(np.float64)

    def _cohort_matrix(self, c: int) -> np.ndarray:
        """X_c, (k × d) 0/1."""
        xc = np.zeros((self.spec.num_bits, self.candidates.size))
        cols = np.arange(self.candidates.size)
        for i in range(self.spec.num_hashes):
            xc[self.positions[c, :, i], cols] = 1.0
        return xc

    def _gather(self, rows: np.ndarray, c: int) -> np.ndarray:
        """X_cᵀ R for R with k rows: row v is the sum of R's rows at v's filter bits."""
        out = rows[self.positions[c, :, 0]].copy()
        for i in range(1, self.spec.num_hashes):
            out += self._weights[c, :, i, None] * rows[self.positions[c, :, i]]
        return out

    def _scatter(self, mat: np.ndarray, c: int) -> np.ndarray:
        """X_c M for M with d rows: row j is the sum of M's rows over candidates with bit j."""
        out = np.zeros((self.spec.num_bits, mat.shape[1]))
        for i in range(self.spec.num_hashes):
            sel = self.valid[c, :, i]
            np.add.at(out, self.positions[c, sel, i], mat[sel])
        return out

    def unbiased_bits(self, ones: np.ndarray, cohort_counts: np.ndarray) -> np.ndarray:
        """t[c, j] = (Y[c, j] - p* N_c) / (q* - p*)."""
        s = self.spec
        return (
            np.asarray(ones, dtype=np.float64) - s.p_star * np.asarray(cohort_counts, dtype=np.float64)[:, None]
        ) / (s.q_star - s.p_star)

    def counts(self, ones: np.ndarray, cohort_counts: np.ndarray) -> np.ndarray:
        """n̂ = m (XᵀX)⁻¹ Xᵀ t from per-cohort bit counts ``ones`` (m × k) and report
        counts per cohort ``cohort_counts`` (m)."""
        t = self.unbiased_bits(ones, cohort_counts)
        xt = np.zeros(self.candidates.size)
        for c in range(self.spec.num_cohorts):
            xt += (t[c][self.positions[c]] * self._weights[c]).sum(axis=1)
        return self.spec.num_cohorts * self.gram_solve(xt)

    def variance(self, true_counts: np.ndarray) -> np.ndarray:
        """Var n̂ given the true counts of the candidates (class docstring)."""
        s = self.spec
        nv = np.asarray(true_counts, dtype=np.float64)
        if nv.shape != self.candidates.shape:
            raise ValueError(f"true_counts must have shape {self.candidates.shape}, got {nv.shape}")
        n = float(nv.sum())
        qs, ps = s.q_star, s.p_star
        delta2 = (qs - ps) ** 2
        alpha = ps * (1.0 - ps) / delta2
        beta = (qs * (1.0 - qs) - ps * (1.0 - ps)) / delta2
        m = float(s.num_cohorts)
        return m * (self.h_matrix @ nv) + m * alpha * n * self.gram_inv_diag + m * beta * (self.k_matrix @ nv) - nv
