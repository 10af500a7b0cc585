r"""Heavy-hitter discovery over strings, device side: PEM and Apple's SFP.

A heavy-hitter metric's values are strings nobody listed in advance. A
device turns its value into ``length`` bytes (UTF-8, padded with 0x00;
:func:`pad_value`) and privatizes a *piece* of it with a frequency oracle the
project already has; the server (:mod:`estimator.mechanisms.heavy_hitters`) grows
candidates piece by piece.

**PEM** (prefix extending; Wang, Li, Yang, Wang, Jha, Yang, "Locally
Differentially Private Heavy Hitter Identification", IEEE TDSC 2019). The
m = 8·length bits of the padded value are read most significant first. Level
j ∈ [0, L) covers the prefix of b_j = min(m, s + j·η) bits (s start bits, η
bits per step, L = 1 + ⌈(m - s)/η⌉ levels). A device belongs to one level for
good (:meth:`PEMSpec.level_for_device`: an HMAC of its device secret, so the
same device reports the same level every day and repeated days never spread
its value over more prefixes) and reports its prefix at that level through
OLH (:class:`ldp_core.mechanisms.olh.OLHSpec`, same encoder, same ε): the
record is ``(level, seed, y)``. The level does not depend on the value, so
the report is ε-LDP exactly when OLH's is.

The OLH domain is the prefix's 31-bit *key* (:func:`prefix_keys`): the
prefix itself when b_j ≤ 31 (injective), otherwise XXH32 folded over the
prefix's 4-byte words, seeded by b_j, shifted right by one. Two distinct
prefixes share a key with probability 2^-31, so a candidate's estimate
counts, besides its own holders, the holders of a colliding prefix: in
expectation at most n·2^-31 of them (< 0.001 users at n = 10^6).

**SFP** (Apple's Sequence Fragment Puzzle; Apple's Differential Privacy
Team, "Learning with Privacy at Scale", 2017). A device sends two sketches
of its word: a *fragment* report, the Count Mean Sketch (or Hadamard CMS) of
``(r(w), w[2l : 2l+2])`` at a position l drawn uniformly and sent in the
clear, where r is an 8-bit hash of the whole word (so the server can tell
fragments of different words apart), and a *word* report, the sketch of the
whole word's key. The two share the device's ε (``word_share`` of it to the
word report, the rest to the fragment report), so the pair is ε-LDP by basic
composition; the estimator debiases each sketch with the ε it was encoded
with (one public implementation encodes with one ε and debiases with
another).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import math
from functools import cached_property
from typing import Any, ClassVar, Literal

import numpy as np

from ldp_core.errors import DomainError, SpecError
from ldp_core.hashing import xxh32_u32
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.mechanisms.cms import CMSSpec, HCMSSpec
from ldp_core.mechanisms.grr import grr_index_dtype
from ldp_core.mechanisms.olh import OLHSpec, default_g

__all__ = [
    "KEY_DOMAIN",
    "MAX_LENGTH",
    "Overflow",
    "END_MARKERS",
    "check_end_marker",
    "pad_value",
    "pad_values",
    "reserved_byte_mask",
    "unpad",
    "prefix_keys",
    "PEMSpec",
    "SFPSpec",
    "pem_parameters",
    "pem_alphabet_parameters",
]

#: Keys of prefixes and words lie in [0, 2^31): the largest domain a frequency oracle spec accepts.
KEY_DOMAIN = 2**31
#: Longest declared value length, in bytes.
MAX_LENGTH = 64
#: What a value longer than the declared length becomes.
Overflow = Literal["truncate", "refuse"]

_LEVEL_CONTEXT = b"ldp/pem-level/v1/"

#: End-of-value marker versions (docs/HEAVY_HITTERS.md, *The end of a value*): 0, the first padding
#: byte 0x00 ends a value; 1, the same byte, with the rest of its block (control characters
#: U+0001..U+001F and U+007F) refused in values, so that no candidate but the value itself can follow
#: a word's last character.
END_MARKERS = (0, 1)


def reserved_byte_mask() -> np.ndarray:
    """A 256-entry bool array: the control bytes a value may not contain under ``end_marker`` 1 (0x01..0x1F,
    0x7F; 0x00, refused in every value, is the padding and the marker)."""
    mask = np.zeros(256, dtype=bool)
    mask[1:0x20] = True
    mask[0x7F] = True
    return mask


def check_end_marker(value: Any, where: str) -> int:
    """``value`` as an end-marker version (0 or 1), or :class:`SpecError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in END_MARKERS:
        raise SpecError(f"{where}: end_marker must be 0 or 1, got {value!r}")
    return int(value)


def pad_value(value: str | bytes, length: int, overflow: Overflow = "truncate", end_marker: int = 0) -> bytes:
    """``value`` as exactly ``length`` bytes: UTF-8, padded with 0x00.

    A value longer than ``length`` bytes is cut at the last UTF-8 character
    boundary at or before ``length`` (``overflow="truncate"``) or refused
    (``"refuse"``). A NUL character is refused (it would read as padding);
    under ``end_marker=1`` so is any control character U+0001..U+001F or
    U+007F, anywhere in the value (before any cut).
    Raises :class:`DomainError`; the SDK counts that instead of raising.
    """
    if isinstance(value, str):
        data = value.encode("utf-8")
    elif isinstance(value, bytes):
        data = value
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DomainError(f"value is not UTF-8 ({exc.reason})") from None
    else:
        raise DomainError(f"a heavy-hitter value is a string, got {type(value).__name__}")
    if b"\x00" in data:
        raise DomainError("a heavy-hitter value may not contain NUL characters (NUL is the padding)")
    if end_marker and any(b < 0x20 or b == 0x7F for b in data):
        raise DomainError(
            "a heavy-hitter value may not contain control characters (U+0001..U+001F, U+007F) under end_marker 1"
        )
    if not data:
        raise DomainError("a heavy-hitter value may not be empty")
    if len(data) > length:
        if overflow == "refuse":
            raise DomainError(f"value is {len(data)} bytes long, above the declared length {length}")
        cut = length
        while cut > 0 and (data[cut] & 0xC0) == 0x80:  # data[cut] continues a character begun before it
            cut -= 1
        data = data[:cut]
        if not data:
            raise DomainError(f"value's first character is longer than the declared length {length}")
    return data + b"\x00" * (length - len(data))


def pad_values(values: Any, length: int, overflow: Overflow = "truncate", end_marker: int = 0) -> np.ndarray:
    """A ``(n, length)`` uint8 array of :func:`pad_value` of each value (raises on the first bad one)."""
    rows = [pad_value(v, length, overflow, end_marker) for v in values]
    if not rows:
        return np.zeros((0, length), dtype=np.uint8)
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), length).copy()


def unpad(padded: bytes) -> str:
    """The string a padded value stands for (undecodable bytes, from noise, become U+FFFD)."""
    return padded.rstrip(b"\x00").decode("utf-8", errors="replace")


def _prefix_bytes(padded: np.ndarray, bits: int) -> np.ndarray:
    """The first ``bits`` bits of each row, the rest zeroed: ``(n, length)`` uint8."""
    out = np.zeros_like(padded)
    full, rest = divmod(bits, 8)
    out[:, :full] = padded[:, :full]
    if rest:
        out[:, full] = padded[:, full] & np.uint8((0xFF << (8 - rest)) & 0xFF)
    return out


def prefix_keys(padded: np.ndarray, bits: int) -> np.ndarray:
    """The OLH key in [0, 2^31) of each row's ``bits``-bit prefix (module docstring); uint32.

    ``padded`` is ``(n, length)`` uint8 (rows beyond ``bits`` need not be zero)."""
    rows = np.ascontiguousarray(padded, dtype=np.uint8)
    n, length = rows.shape
    if not 1 <= bits <= 8 * length:
        raise SpecError(f"prefix bits must be between 1 and {8 * length}, got {bits}")
    pre = _prefix_bytes(rows, bits)
    if bits <= 31:
        acc = np.zeros(n, dtype=np.uint64)
        for i in range(-(-bits // 8)):
            acc = (acc << np.uint64(8)) | pre[:, i].astype(np.uint64)
        return (acc >> np.uint64(8 * -(-bits // 8) - bits)).astype(np.uint32)
    words = -(-length // 4)
    wide = np.zeros((n, 4 * words), dtype=np.uint8)
    wide[:, :length] = pre
    lanes = wide.view("<u4")
    h = np.full(n, bits, dtype=np.uint32)
    prefix_bytes = -(-bits // 8)
    for w in range(-(-prefix_bytes // 4)):  # only the words the prefix reaches
        h = xxh32_u32(lanes[:, w], h)
    return h >> np.uint32(1)


def _hmac_uniform(secret: bytes, context: bytes, modulus: int) -> int:
    """A uniform integer in [0, modulus) from HMAC-SHA256(secret, context) (bias below 2^-200)."""
    digest = hmac.new(secret, context, hashlib.sha256).digest()
    return int.from_bytes(digest, "big") % modulus


def pem_parameters(
    users: int, epsilon: float, length: int, top: int, work: float = 2.0**33, alphabet_size: int | None = None
) -> tuple[int, int, int]:
    """``(start_bits s, step_bits η, keep c)`` for PEM over ``users`` devices (docs/HEAVY_HITTERS.md).

    With ``alphabet_size`` a (the server prunes candidates to values over a known alphabet of a bytes,
    ``discover_pem(alphabet=...)``) see :func:`pem_alphabet_parameters`; without, the rule below.

    The server checks each report against its level's c·2^η candidates, so
    decoding costs about n·c·2^η hash evaluations, held below ``work``. The
    rule, from the sweep in docs/HEAVY_HITTERS.md (n = 10^6, ε = 2, 4, 8):

    * η = 8 (whole bytes) where ``work`` allows 256·c candidates (n up to
      about 2.6·10^5 at c = 128): at small n every level is starved of
      devices, and halving the levels (5 instead of 10 for six letters)
      doubles each level's devices; that wins more than 16 times the noise
      candidates costs (recall@32 at n = 10^5: 0.19 against 0.12 at ε = 2,
      0.41 against 0.34 at ε = 4; docs/HEAVY_HITTERS.md).
    * otherwise η = 4: fewer bits per step means more levels (fewer devices, more
      noise per level) and, worse, real neighbouring prefixes competing for
      the kept places; more bits means 2^η more noise candidates per kept
      one. η = 4 was best or within noise of best at every ε at n = 10^6; it drops
      (to 3, 2, 1) only where ``work`` forbids 16·c candidates.
    * c = 4·top: the kept places beyond ``top`` are what a heavy prefix
      ranked low by noise survives in; where noise is small (large ε or n)
      they cost only time. Halved (down to ``top``) where ``work`` forbids.
    * s = m - η·⌊(m - s₀)/η⌋ with s₀ = η + ⌈log₂ c⌉ (so the first level ranks
      at least c·2^η prefixes and the last level extends by a full η; a
      short last step spends a whole level's devices on a few bits), at most 20.

    ε does not move the choice: it scales every level's noise by the same
    factor (OLH's per-report variance) and leaves the ranking structure
    alone; it sets OLH's g (:func:`default_g`).
    """
    if users < 1 or top < 1:
        raise SpecError(f"pem parameters need users >= 1 and top >= 1, got {users}, {top}")
    if alphabet_size is not None:
        found = pem_alphabet_parameters(users, length, top, alphabet_size, work)
        if found is not None:
            return found
    m = 8 * length
    c, eta = 4 * top, 8
    if users * c * 2**eta > work or m < 2 * eta:
        eta = 4
    while users * c * 2**eta > work and (c > top or eta > 1):
        if c > top:
            c = max(top, c // 2)
        else:
            eta -= 1
    s0 = min(m, eta + math.ceil(math.log2(c)))
    s = m - eta * ((m - s0) // eta)
    return min(s, 20, m), eta, c


def pem_alphabet_parameters(
    users: int, length: int, top: int, alphabet_size: int, work: float = 2.0**33
) -> tuple[int, int, int] | None:
    """``(s, η, c = 4·top)`` with the **fewest levels** whose decoding fits ``work`` when every byte of a
    value is one of ``alphabet_size`` (a) known bytes; the cheapest of those; ``None`` if none fits.

    Under the alphabet a level of b bits has about a^(b/8) candidates (not 2^b), so level 0 costs
    (n/L)·a^(s/8) and each later level (n/L)·c·a^(η/8) hash evaluations. Fewer levels give every level
    more devices (the count's standard deviation falls as √L), which is what decides recall where
    n·ε² is small (docs/HEAVY_HITTERS.md, *A known alphabet*); s ≤ 24 and η ≤ 16 bound the enumeration."""
    if not 1 <= alphabet_size <= 255:
        raise SpecError(f"pem alphabet size must be between 1 and 255, got {alphabet_size}")
    m, c = 8 * length, 4 * top
    a = float(max(alphabet_size, 2))
    best: tuple[int, float, int, int] | None = None
    for s in range(1, min(24, m) + 1):
        for eta in range(1, 17):
            if (m - s) % eta or (s == m and eta != min(16, m)):
                continue
            levels = 1 + (m - s) // eta
            cost = users / levels * (a ** (s / 8) + (levels - 1) * c * a ** (eta / 8))
            if cost <= work and (best is None or (levels, cost) < best[:2]):
                best = (levels, cost, s, eta)
    return None if best is None else (best[2], best[3], c)


@dataclasses.dataclass(frozen=True)
class PEMSpec(ReportSpec):
    """PEM over strings of ``length`` bytes: ``start_bits`` (s), ``step_bits`` (η), and the frequency
    oracle every level reports through: ``oracle="olh"`` (OLH with ``g``, the default) or ``"hcms"``
    (Hadamard response into a count-mean sketch of ``num_hashes`` rows of ``width`` columns: one bit per
    report, decoded for all candidates with one fast Walsh–Hadamard transform per level).

    :meth:`for_population` derives s and η from the expected number of devices.
    """

    length: int = 6
    start_bits: int = 12
    step_bits: int = 4
    g: int | None = None
    overflow: Overflow = "truncate"
    oracle: Literal["olh", "hcms"] = "olh"
    num_hashes: int | None = None
    width: int | None = None
    hash_seed: int | None = None
    end_marker: int = 0

    name: ClassVar[str] = "pem"
    kind: ClassVar[str] = "heavy_hitters"

    def _validate(self) -> None:
        length = self._require_int("pem", "length", self.length, 1, MAX_LENGTH)
        m = 8 * length
        s = self._require_int("pem", "start_bits", self.start_bits, 1, min(m, 24))
        eta = self._require_int("pem", "step_bits", self.step_bits, 1, 16)
        if self.overflow not in ("truncate", "refuse"):
            raise SpecError(f"pem: overflow must be 'truncate' or 'refuse', got {self.overflow!r}")
        g = default_g(self.epsilon) if self.g is None else self._require_int("pem", "g", self.g, 2, 2**24)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "start_bits", s)
        object.__setattr__(self, "step_bits", eta)
        object.__setattr__(self, "g", g)
        object.__setattr__(self, "end_marker", check_end_marker(self.end_marker, "pem"))
        if self.oracle not in ("olh", "hcms"):
            raise SpecError(f"pem: oracle must be 'olh' or 'hcms', got {self.oracle!r}")
        if self.oracle == "hcms":
            k = 64 if self.num_hashes is None else self._require_int("pem", "num_hashes", self.num_hashes, 1, 2**16)
            w = 1024 if self.width is None else self._require_int("pem", "width", self.width, 2, 2**20)
            hs = 0 if self.hash_seed is None else self._require_int("pem", "hash_seed", self.hash_seed, 0, 2**32 - 1)
            object.__setattr__(self, "num_hashes", k)
            object.__setattr__(self, "width", w)
            object.__setattr__(self, "hash_seed", hs)
            _ = self.hcms  # validates the sketch (width a power of two)
        elif self.num_hashes is not None or self.width is not None or self.hash_seed is not None:
            raise SpecError(
                "pem: num_hashes, width and hash_seed are parameters of oracle 'hcms'; this spec's oracle is 'olh'"
            )
        if self.num_levels > 255:
            raise SpecError(f"pem: {self.num_levels} levels is above 255; raise step_bits")

    @classmethod
    def for_population(
        cls,
        epsilon: float,
        length: int,
        users: int,
        top: int,
        overflow: Overflow = "truncate",
        oracle: Literal["olh", "hcms"] = "olh",
        end_marker: int = 0,
    ) -> PEMSpec:
        """The spec :func:`pem_parameters` chooses for ``users`` devices and the ``top`` values sought."""
        s, eta, _ = pem_parameters(users, epsilon, length, top)
        return cls(
            epsilon=epsilon,
            length=length,
            start_bits=s,
            step_bits=eta,
            overflow=overflow,
            oracle=oracle,
            end_marker=end_marker,
        )

    @property
    def total_bits(self) -> int:
        return 8 * self.length

    @property
    def num_levels(self) -> int:
        """L = 1 + ⌈(m - s)/η⌉."""
        return 1 + -(-(self.total_bits - self.start_bits) // self.step_bits)

    def level_bits(self, level: int) -> int:
        """b_j = min(m, s + j·η): the prefix length reported at ``level``."""
        return min(self.total_bits, self.start_bits + level * self.step_bits)

    @cached_property
    def olh(self) -> OLHSpec:
        """The frequency oracle every level reports through (one ε, one g)."""
        return OLHSpec(epsilon=self.epsilon, domain_size=KEY_DOMAIN, g=self.g)

    @cached_property
    def hcms(self) -> HCMSSpec:
        """The Hadamard count-mean sketch every level reports through when ``oracle == "hcms"``."""
        if self.oracle != "hcms":
            raise SpecError("pem: this spec reports through OLH (oracle 'olh'), not HCMS")
        assert self.num_hashes is not None and self.width is not None and self.hash_seed is not None  # _validate
        return HCMSSpec(
            epsilon=self.epsilon,
            domain_size=KEY_DOMAIN,
            num_hashes=self.num_hashes,
            width=self.width,
            hash_seed=self.hash_seed,
        )

    def params(self) -> dict[str, Any]:
        """The parameters, without the HCMS ones under OLH and without ``end_marker`` 0 (so older specs
        keep the ids they always had)."""
        out = super().params()
        if self.oracle == "olh":
            for k in ("oracle", "num_hashes", "width", "hash_seed"):
                out.pop(k)
        if not self.end_marker:
            out.pop("end_marker")
        return out

    @cached_property
    def record_dtype(self) -> np.dtype:
        if self.oracle == "hcms":
            return np.dtype([("level", "u1"), *[(f, self.hcms.record_dtype[f]) for f in ("row", "col", "bit")]])
        return np.dtype([("level", "u1"), ("seed", "<u4"), ("y", grr_index_dtype(self.olh.hash_range))])

    def record_bounds(self) -> dict[str, int]:
        if self.oracle == "hcms":
            return {"level": self.num_levels, **self.hcms.record_bounds()}
        return {"level": self.num_levels, "y": self.olh.hash_range}

    def level_for_device(self, device_secret: bytes) -> int:
        """The device's level, for good: HMAC-SHA256(secret, context ‖ spec id) mod L.

        A pseudorandom function of the secret, uniform over the levels across
        devices and the same for a device every day."""
        if len(device_secret) < 16:
            raise SpecError("a device secret must be at least 16 bytes")
        return _hmac_uniform(device_secret, _LEVEL_CONTEXT + self.spec_id.encode(), self.num_levels)

    def pad(self, values: Any) -> np.ndarray:
        """Values as a ``(n, length)`` uint8 array (see :func:`pad_values`)."""
        if isinstance(values, np.ndarray) and values.dtype == np.uint8 and values.ndim == 2:
            if values.shape[1] != self.length:
                raise DomainError(f"pem: padded values must have {self.length} bytes, got {values.shape[1]}")
            return values
        return pad_values(values, self.length, self.overflow, self.end_marker)

    def encode(self, values: Any, rng: np.random.Generator, levels: Any = None) -> np.ndarray:
        """Privatize a batch: each value's prefix at its level, through OLH.

        ``values`` are strings or an already padded ``(n, length)`` uint8
        array; ``levels`` (one per value) default to independent uniform
        draws from ``rng`` (what :meth:`level_for_device` gives a population)."""
        padded = self.pad(values)
        n = padded.shape[0]
        lv: np.ndarray
        if levels is None:
            lv = np.asarray(rng.integers(0, self.num_levels, size=n), dtype=np.int64)
        else:
            lv = np.asarray(levels, dtype=np.int64).reshape(-1)
        if lv.shape[0] != n or (n and (lv.min() < 0 or lv.max() >= self.num_levels)):
            raise DomainError(f"pem: need one level in [0, {self.num_levels}) per value")
        keys = np.empty(n, dtype=np.uint32)
        for level in np.unique(lv):
            sel = lv == level
            keys[sel] = prefix_keys(padded[sel], self.level_bits(int(level)))
        out = np.empty(n, dtype=self.record_dtype)
        out["level"] = lv
        if self.oracle == "hcms":
            inner = self.hcms.encode(keys.astype(np.int64), rng)
            for f in ("row", "col", "bit"):
                out[f] = inner[f]
            return out
        inner = self.olh.encode(keys.astype(np.int64), rng)
        out["seed"] = inner["seed"]
        out["y"] = inner["y"]
        return out

    def encode_one(self, value: str | bytes, rng: np.random.Generator, level: int) -> np.ndarray:
        """One device's report of ``value`` at its ``level`` (a length-1 record array)."""
        return self.encode([value], rng, levels=[level])


@dataclasses.dataclass(frozen=True)
class SFPSpec(ReportSpec):
    """Apple's SFP over strings of ``length`` bytes (an even number): fragments of 2 bytes.

    ``sketch`` is ``"cms"`` or ``"hcms"``; both sketches use ``num_hashes``
    rows of ``width`` columns. ``word_share`` of ε goes to the word report.
    """

    length: int = 6
    sketch: Literal["cms", "hcms"] = "hcms"
    num_hashes: int = 256
    width: int = 1024
    hash_bits: int = 8
    word_share: float = 0.5
    overflow: Overflow = "truncate"
    end_marker: int = 0

    name: ClassVar[str] = "sfp"
    kind: ClassVar[str] = "heavy_hitters"

    #: bytes per fragment (Apple: two characters)
    FRAGMENT: ClassVar[int] = 2

    def _validate(self) -> None:
        length = self._require_int("sfp", "length", self.length, 2, MAX_LENGTH)
        if length % self.FRAGMENT:
            raise SpecError(f"sfp: length must be a multiple of {self.FRAGMENT} bytes, got {length}")
        if self.sketch not in ("cms", "hcms"):
            raise SpecError(f"sfp: sketch must be 'cms' or 'hcms', got {self.sketch!r}")
        self._require_int("sfp", "hash_bits", self.hash_bits, 1, 15)
        share = self.word_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < float(share) < 1.0:
            raise SpecError(f"sfp: word_share must be a number strictly between 0 and 1, got {share!r}")
        if self.overflow not in ("truncate", "refuse"):
            raise SpecError(f"sfp: overflow must be 'truncate' or 'refuse', got {self.overflow!r}")
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "word_share", float(share))
        object.__setattr__(self, "end_marker", check_end_marker(self.end_marker, "sfp"))
        _ = self.fragment_spec, self.word_spec  # validates the sketch parameters

    def params(self) -> dict[str, Any]:
        """The parameters, without ``end_marker`` 0 (so older specs keep their ids)."""
        out = super().params()
        if not self.end_marker:
            out.pop("end_marker")
        return out

    @property
    def num_positions(self) -> int:
        return self.length // self.FRAGMENT

    def _sketch(self, epsilon: float, seed: int) -> CMSSpec | HCMSSpec:
        cls = CMSSpec if self.sketch == "cms" else HCMSSpec
        return cls(
            epsilon=epsilon, domain_size=KEY_DOMAIN, num_hashes=self.num_hashes, width=self.width, hash_seed=seed
        )

    @cached_property
    def fragment_spec(self) -> CMSSpec | HCMSSpec:
        """The sketch of (r(w), fragment) keys, at ε·(1 - word_share)."""
        return self._sketch(self.epsilon * (1.0 - self.word_share), 0x5F5F0001)

    @cached_property
    def word_spec(self) -> CMSSpec | HCMSSpec:
        """The sketch of whole-word keys, at ε·word_share."""
        return self._sketch(self.epsilon * self.word_share, 0x5F5F0002)

    @cached_property
    def record_dtype(self) -> np.dtype:
        fields: list[tuple[str, Any]] = [("position", "u1")]
        for prefix, spec in (("f_", self.fragment_spec), ("w_", self.word_spec)):
            for name in spec.record_dtype.names or ():
                sub = spec.record_dtype.fields[name]  # type: ignore[index]
                fields.append((prefix + name, sub[0]))
        return np.dtype(fields)

    def record_bounds(self) -> dict[str, int]:
        out = {"position": self.num_positions}
        for prefix, spec in (("f_", self.fragment_spec), ("w_", self.word_spec)):
            out.update({prefix + k: v for k, v in spec.record_bounds().items()})
        return out

    def word_keys(self, padded: np.ndarray) -> np.ndarray:
        """The whole word's key in [0, 2^31) (:func:`prefix_keys` of all m bits)."""
        return prefix_keys(padded, 8 * self.length)

    def word_tags(self, padded: np.ndarray) -> np.ndarray:
        """r(w): the top ``hash_bits`` bits of an XXH32 of the word key (uint32)."""
        return xxh32_u32(self.word_keys(padded), np.uint32(0x5F5F0003)) >> np.uint32(32 - self.hash_bits)

    def fragment_keys(self, tags: np.ndarray, fragments: np.ndarray) -> np.ndarray:
        """``r << 16 | fragment`` (fragment as a big-endian 16-bit number)."""
        return (np.asarray(tags, dtype=np.uint32) << np.uint32(16)) | np.asarray(fragments, dtype=np.uint32)

    def pad(self, values: Any) -> np.ndarray:
        if isinstance(values, np.ndarray) and values.dtype == np.uint8 and values.ndim == 2:
            if values.shape[1] != self.length:
                raise DomainError(f"sfp: padded values must have {self.length} bytes, got {values.shape[1]}")
            return values
        return pad_values(values, self.length, self.overflow, self.end_marker)

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """A fragment report at a uniform position and a word report, per value."""
        padded = self.pad(values)
        n = padded.shape[0]
        pos = rng.integers(0, self.num_positions, size=n)
        tags = self.word_tags(padded)
        rows = np.arange(n)
        frag = padded[rows, 2 * pos].astype(np.uint32) << np.uint32(8) | padded[rows, 2 * pos + 1].astype(np.uint32)
        f_rec = self.fragment_spec.encode(self.fragment_keys(tags, frag).astype(np.int64), rng)
        w_rec = self.word_spec.encode(self.word_keys(padded).astype(np.int64), rng)
        out = np.empty(n, dtype=self.record_dtype)
        out["position"] = pos
        for prefix, rec in (("f_", f_rec), ("w_", w_rec)):
            for name in rec.dtype.names or ():
                out[prefix + name] = rec[name]
        return out

    def encode_one(self, value: str | bytes, rng: np.random.Generator) -> np.ndarray:
        return self.encode([value], rng)

    def part_records(self, records: np.ndarray, part: Literal["f_", "w_"]) -> np.ndarray:
        """The fragment (``"f_"``) or word (``"w_"``) sketch records inside SFP records."""
        spec = self.fragment_spec if part == "f_" else self.word_spec
        out = np.empty(records.shape[0], dtype=spec.record_dtype)
        for name in spec.record_dtype.names or ():
            out[name] = records[part + name]
        return out
