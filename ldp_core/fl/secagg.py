"""Secure aggregation, device side (SecAgg+ style).

The server learns the *sum* of the round's quantized updates and nothing
else about any one of them, even when clients drop out after masking
(Bonawitz et al., "Practical secure aggregation for privacy-preserving
machine learning", CCS 2017 — below "B17"; Bell, Bonawitz, Gascón, Lepoint,
Raykova, "Secure single-server aggregation with (poly)logarithmic overhead",
CCS 2020 — "B20", whose sparse neighbour graph this follows).

Protocol, for client u with index u ∈ {1..n} (indices are Shamir x-coordinates):

1. *Advertise keys* (B17 §4, round 0): two X25519 key pairs, (c_u, C_u) to
   encrypt shares and (s_u, S_u) to derive masks; the public keys go to the
   server, which forwards each to u's neighbours N(u).
2. *Share keys* (round 1): a fresh self-mask seed b_u (32 bytes) and the mask
   secret key s_u are each split t-of-|N(u)| with Shamir's scheme over the
   prime field GF(2^521 − 1) among the neighbours; the share for v is
   encrypted with AES-256-GCM under HKDF-SHA256(X25519(c_u, C_v)) and sent
   through the server.
3. *Masked input* (round 2): with x_u the quantized update in Z_{2^32}^d,
       y_u = x_u + PRG(b_u) + Σ_{v ∈ N'(u), v > u} PRG(k_uv) − Σ_{v ∈ N'(u), v < u} PRG(k_uv)  (mod 2^32),
   where N'(u) are the neighbours that completed round 1 and
   k_uv = HKDF-SHA256(X25519(s_u, S_v), info = round ‖ min ‖ max), the same
   for u and v. Each pairwise mask cancels in the sum when both ends send.
4. *Unmasking* (round 3): for each neighbour v, u reveals v's share of b_v if
   v sent its masked input, or v's share of s_v if v dropped — never both
   for the same v (refused: both would unmask v's input). The server
   rebuilds b_v of survivors and s_v of dropped clients from t shares each,
   subtracts the self masks and the pairwise masks survivors shared with
   dropped clients.

PRG: AES-256 in counter mode keyed by the 32-byte seed, nonce 0, every seed
used for one stream only (each is fresh or HKDF-derived with the round in
``info``). No Mersenne Twister, no 32-bit seeds.

Quantization (:class:`Quantizer`): values are clipped to [−R, R], scaled by s
and stochastically rounded (unbiased), q ∈ [−⌈Rs⌉, ⌈Rs⌉], stored mod 2^32.
The sum of n of them is exact as a signed 32-bit integer when
n·(Rs + 1) ≤ 2^31 − 1 (the overflow bound); :meth:`Quantizer.for_clients`
picks the largest such s for n clients.

Trust assumptions: the server is honest-but-curious and picks the neighbour
graph at random (B20's random Harary graph) without colluding with clients;
a server that chose the graph adversarially could surround a client with
colluding neighbours (B20 derive the graph from public randomness to prevent
this). Fewer than t colluding neighbours of u learn nothing about b_u or s_u.
Against a server that also lies about who survived, c colluding holders suffice
once holders + c >= 2t, so a client shares only when 2t > holders + c for the
collusion bound c its signed task states (:func:`split_attack_possible`).
This module needs the ``cryptography`` package (the ``fl`` extra); importing
:mod:`client_sdk` or :mod:`client_sdk.fl` does not import it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ldp_core.fl.errors import SecAggError

__all__ = [
    "PRIME",
    "MODULUS_BITS",
    "Share",
    "shamir_split",
    "shamir_combine",
    "prg_words",
    "add_masks",
    "pairwise_seed",
    "Quantizer",
    "SecAggConfig",
    "KeyAdvert",
    "SecAggClient",
    "public_bytes",
    "share_commitment",
    "SURVIVORS_TAG",
    "survivors_message",
    "CollusionBoundError",
    "split_attack_possible",
    "threshold_for_colluders",
]

#: The Mersenne prime 2^521 − 1: Shamir's field, larger than any 32-byte secret.
PRIME = (1 << 521) - 1
MODULUS_BITS = 32
RandomBytes = Callable[[int], bytes]


class CollusionBoundError(SecAggError):
    """The round's threshold, holder count and stated collusion bound would let a server that controls
    ``max_colluders`` share holders rebuild both of a client's secrets (see :func:`split_attack_possible`)."""

    reason = "collusion_bound"


def split_attack_possible(holders: int, threshold: int, colluders: int) -> bool:
    """Whether a server that controls ``colluders`` of a client's ``holders`` share holders can rebuild both
    its self-mask seed b_u and its mask key s_u: the colluders give it c shares of each; it tells one set of
    honest holders "u survived" (they reveal shares of b_u) and a disjoint set "u dropped" (shares of s_u),
    so it needs t − c honest holders on each side: possible iff holders − c ≥ 2(t − c), i.e.
    holders + c ≥ 2t. Also possible outright when c ≥ t. Safe iff 2t > holders + c (docs/fl/SECAGG.md)."""
    return colluders >= threshold or holders + colluders >= 2 * threshold


def threshold_for_colluders(degree: int, colluders: int) -> int:
    """The smallest t with 2t > degree + colluders: ⌊(k + c)/2⌋ + 1 (it must still be ≤ k to be usable)."""
    return (degree + colluders) // 2 + 1


# -- Shamir secret sharing ---------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Share:
    """The point (x, f(x)) of a degree t−1 polynomial with f(0) the secret."""

    x: int
    y: int
    threshold: int


def _below(p: int, random_bytes: RandomBytes) -> int:
    """Uniform in [0, p) by rejection sampling."""
    bits = p.bit_length()
    nbytes = (bits + 7) // 8
    while True:
        v = int.from_bytes(random_bytes(nbytes), "little") & ((1 << bits) - 1)
        if v < p:
            return v


def shamir_split(
    secret: int, threshold: int, xs: list[int], random_bytes: RandomBytes = os.urandom, prime: int = PRIME
) -> list[Share]:
    """Shares of ``secret`` at the points ``xs`` (distinct, nonzero mod p): any
    ``threshold`` of them determine it, fewer are uniformly distributed
    whatever the secret (Shamir, "How to share a secret", CACM 1979)."""
    if not 0 <= secret < prime:
        raise SecAggError(f"secret must be in [0, prime), got a {secret.bit_length()}-bit value")
    if not 1 <= threshold <= len(xs):
        raise SecAggError(f"threshold must be in [1, {len(xs)}] for {len(xs)} shares, got {threshold}")
    if len({x % prime for x in xs}) != len(xs) or any(x % prime == 0 for x in xs):
        raise SecAggError("share points must be distinct and nonzero in the field")
    coeffs = [secret] + [_below(prime, random_bytes) for _ in range(threshold - 1)]
    shares = []
    for x in xs:
        acc = 0
        for c in reversed(coeffs):
            acc = (acc * x + c) % prime
        shares.append(Share(x, acc, threshold))
    return shares


def shamir_combine(shares: list[Share], prime: int = PRIME) -> int:
    """f(0) by Lagrange interpolation from at least ``threshold`` shares."""
    if not shares:
        raise SecAggError("no shares to combine")
    t = shares[0].threshold
    pts = {s.x % prime: s.y for s in shares}
    if len(pts) < t:
        raise SecAggError(f"need {t} shares with distinct points to reconstruct, got {len(pts)}")
    xs = list(pts)[:t]
    nums, dens = [], []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * (-xj) % prime
                den = den * (xi - xj) % prime
        nums.append(num)
        dens.append(den)
    # one modular inversion for all t denominators (Montgomery's batch-inversion trick)
    prefix = [1]
    for den in dens:
        prefix.append(prefix[-1] * den % prime)
    inv = pow(prefix[-1], -1, prime)
    secret = 0
    for i in range(len(xs) - 1, -1, -1):
        secret = (secret + pts[xs[i]] * nums[i] * (inv * prefix[i] % prime)) % prime
        inv = inv * dens[i] % prime
    return secret


# -- masks ------------------------------------------------------------------------
_ZEROS = bytes(1 << 20)


def prg_words(seed: bytes, d: int, out: np.ndarray | None = None) -> np.ndarray:
    """d uint32 words of AES-256-CTR keystream under the 32-byte ``seed`` (nonce 0),
    little-endian. Written into ``out`` (a uint32 buffer of length ≥ d + 4: the
    cipher wants a block of slack) and returned as its first d words."""
    if len(seed) != 32:
        raise SecAggError(f"a mask seed must be 32 bytes, got {len(seed)}")
    buf = np.empty(d + 4, np.uint32) if out is None else out
    if buf.dtype != np.uint32 or buf.shape[0] < d + 4 or not buf.flags.c_contiguous:
        raise SecAggError(f"the PRG buffer must be a contiguous uint32 array of length >= {d + 4}")
    global _ZEROS
    n = 4 * d
    if len(_ZEROS) < n:
        _ZEROS = bytes(n)
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    enc.update_into(memoryview(_ZEROS)[:n], buf.data.cast("B"))
    if sys.byteorder == "big":
        buf[:d].byteswap(inplace=True)
    return buf[:d]


_CHUNK = 1 << 15


def add_masks(acc: np.ndarray, masks: Sequence[tuple[bytes, int]], start: int = 0) -> np.ndarray:
    """acc ← acc + Σ sign·PRG(seed)[start : start + len(acc)] (mod 2^32) in place, for
    (seed, sign ∈ {+1, −1}) pairs.

    Equal to adding ``prg_words(seed, start + len(acc))[start:]`` one seed at a time, but
    walks the vector in cache-sized chunks with one keystream per seed, so each chunk of
    keystream is added while still in cache (about 40 % less time than whole-vector
    passes, measured in benchmarks/bench_secagg.py). ``start`` (a multiple of 4: one
    AES block is 4 words) starts each keystream at block start/4 by setting the CTR
    counter, so slices of a vector can be masked separately (the server does, in
    parallel: estimator.fl.parallel_masks)."""
    if acc.dtype != np.uint32 or acc.ndim != 1 or not acc.flags.c_contiguous:
        raise SecAggError("the accumulator must be a contiguous 1-d uint32 array")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0 or start % 4:
        raise SecAggError(f"start must be a non-negative multiple of 4 words (one AES block), got {start!r}")
    counter = (start // 4).to_bytes(16, "big")
    encs = []
    for seed, sign in masks:
        if len(seed) != 32 or sign not in (1, -1):
            raise SecAggError("each mask needs a 32-byte seed and a sign of +1 or -1")
        encs.append((Cipher(algorithms.AES(seed), modes.CTR(counter)).encryptor(), sign))
    d = acc.shape[0]
    buf = np.empty(_CHUNK + 4, np.uint32)
    raw = buf.data.cast("B")
    zeros = memoryview(bytes(4 * _CHUNK))
    swap = sys.byteorder == "big"
    for start in range(0, d, _CHUNK):
        n = min(_CHUNK, d - start)
        a, b, z = acc[start : start + n], buf[:n], zeros[: 4 * n]
        for enc, sign in encs:
            enc.update_into(z, raw)
            if swap:
                b.byteswap(inplace=True)
            if sign > 0:
                np.add(a, b, out=a)
            else:
                np.subtract(a, b, out=a)
    return acc


def share_commitment(round: int, owner: int, holder: int, kind: str, share: Share) -> bytes:
    """SHA-256 of one Shamir share (the owner's secret ``kind`` "b" or "s", held by ``holder``): the owner
    sends it with its shares, so the server can tell a bad revealed share from a good one and exclude it.
    A share is uniform in GF(2^521 − 1), so its hash reveals nothing about it."""
    h = hashlib.sha256(b"ldp-secagg share")
    h.update(round.to_bytes(8, "little") + owner.to_bytes(4, "little") + holder.to_bytes(4, "little"))
    h.update(kind.encode() + share.x.to_bytes(4, "little") + share.threshold.to_bytes(4, "little"))
    h.update(share.y.to_bytes(66, "little"))
    return h.digest()


def _hkdf(key: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key)


def pairwise_seed(secret: X25519PrivateKey, peer: X25519PublicKey, round: int, u: int, v: int) -> bytes:
    """k_uv = HKDF-SHA256(X25519(s_u, S_v), info = "ldp-secagg mask" ‖ round ‖ min(u,v) ‖ max(u,v))."""
    lo, hi = min(u, v), max(u, v)
    info = b"ldp-secagg mask" + round.to_bytes(8, "little") + lo.to_bytes(4, "little") + hi.to_bytes(4, "little")
    return _hkdf(secret.exchange(peer), info)


def _share_key(secret: X25519PrivateKey, peer: X25519PublicKey, round: int) -> bytes:
    return _hkdf(secret.exchange(peer), b"ldp-secagg shares" + round.to_bytes(8, "little"))


def public_bytes(key: X25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())


# -- quantization -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Quantizer:
    """Fixed-point encoding in Z_{2^32}: clip to [−clip_range, clip_range], multiply
    by ``scale``, round stochastically; sums of up to ``max_clients`` values decode
    exactly (n·(R·s + 1) ≤ 2^31 − 1)."""

    clip_range: float
    scale: float
    max_clients: int

    def __post_init__(self) -> None:
        if not (
            math.isfinite(self.clip_range) and self.clip_range > 0 and math.isfinite(self.scale) and self.scale > 0
        ):
            raise SecAggError(f"clip_range and scale must be finite and > 0, got {self.clip_range}, {self.scale}")
        if self.max_clients * (self.clip_range * self.scale + 1) > 2**31 - 1:
            raise SecAggError(
                f"{self.max_clients} clients × (R·s + 1) = {self.max_clients * (self.clip_range * self.scale + 1):.4g} "
                f"exceeds 2^31 − 1: the sum would wrap; lower scale or use Quantizer.for_clients"
            )

    @classmethod
    def for_clients(cls, max_clients: int, clip_range: float) -> Quantizer:
        """The finest scale whose sums of ``max_clients`` values cannot overflow."""
        s = ((2**31 - 1) / max_clients - 1) / clip_range
        return cls(clip_range, s * (1 - 1e-12), max_clients)

    def quantize(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """uint32 words: stochastic rounding of v = clip(x)·s as ⌊v + U⌋, U ~ U[0, 1),
        which is ⌊v⌋ + 1 with probability v − ⌊v⌋ (so E[q] = v)."""
        v = np.clip(np.asarray(x, np.float64), -self.clip_range, self.clip_range)
        v *= self.scale
        v += rng.random(v.shape)
        np.floor(v, out=v)
        return v.astype(np.int64).astype(np.uint32)

    def decode_sum(self, total: np.ndarray) -> np.ndarray:
        """The float sum from the ring sum: read as signed 32-bit, divide by s."""
        return np.asarray(total, np.uint32).view(np.int32).astype(np.float64) / self.scale


# -- protocol ---------------------------------------------------------------------
#: the domain tag of a survivor's Ed25519 signature of the survivor set it was shown (B17's
#: consistency check); the same bytes as ldp_core.fl.protocol.CONSISTENCY_TAG
SURVIVORS_TAG = b"ldp-secagg-consistency-v1"


def survivors_message(context: str, round: int, survivors: Sequence[int]) -> bytes:
    """What a survivor signs: the task (``context``), the round and the sorted survivor indices."""
    return (
        context.encode()
        + b"\x00"
        + int(round).to_bytes(8, "little")
        + b"".join(int(u).to_bytes(4, "little") for u in sorted(set(survivors)))
    )


@dataclasses.dataclass(frozen=True)
class SecAggConfig:
    """The round's public parameters, chosen by the server.

    ``neighbors[u]`` lists u's neighbours (a symmetric graph on 1..n);
    ``threshold`` is t, the shares needed to rebuild a secret (at most the
    smallest degree). ``vector_length`` is d."""

    round: int
    num_clients: int
    neighbors: Mapping[int, tuple[int, ...]]
    threshold: int
    vector_length: int

    def __post_init__(self) -> None:
        n = self.num_clients
        if set(self.neighbors) != set(range(1, n + 1)):
            raise SecAggError(f"neighbors must list exactly the clients 1..{n}")
        for u, vs in self.neighbors.items():
            if u in vs or len(set(vs)) != len(vs):
                raise SecAggError(f"client {u}'s neighbour list has itself or duplicates")
            for v in vs:
                if u not in self.neighbors.get(v, ()):
                    raise SecAggError(f"the neighbour graph is not symmetric: {u}–{v}")
        mindeg = min(len(vs) for vs in self.neighbors.values())
        if not 2 <= self.threshold <= mindeg:
            raise SecAggError(f"threshold must be in [2, smallest degree {mindeg}], got {self.threshold}")
        if self.vector_length < 1:
            raise SecAggError(f"vector_length must be >= 1, got {self.vector_length}")


@dataclasses.dataclass(frozen=True)
class KeyAdvert:
    """Round 0 upload: the two X25519 public keys (32 bytes each)."""

    index: int
    share_key: bytes
    mask_key: bytes


@dataclasses.dataclass(frozen=True)
class _SharePair:
    b: Share
    s: Share


def _encode_pair(u: int, v: int, b: Share, s: Share) -> bytes:
    return (
        b"".join(i.to_bytes(4, "little") for i in (u, v, b.x, b.threshold))
        + b.y.to_bytes(66, "little")
        + s.y.to_bytes(66, "little")
    )


def _decode_pair(data: bytes) -> tuple[int, int, _SharePair]:
    u, v, x, t = (int.from_bytes(data[i : i + 4], "little") for i in range(0, 16, 4))
    by = int.from_bytes(data[16:82], "little")
    sy = int.from_bytes(data[82:148], "little")
    return u, v, _SharePair(Share(x, by, t), Share(x, sy, t))


class SecAggClient:
    """One device's side of one round (see the module docstring for the rounds).

    ``random_bytes`` supplies every secret (keys, seeds, Shamir coefficients);
    it is ``os.urandom`` unless a test fixes it."""

    def __init__(
        self,
        index: int,
        config: SecAggConfig,
        random_bytes: RandomBytes = os.urandom,
        required_threshold: int | None = None,
        max_colluders: int = 0,
    ) -> None:
        if isinstance(max_colluders, bool) or not isinstance(max_colluders, int) or max_colluders < 0:
            raise SecAggError(f"max_colluders must be an integer >= 0, got {max_colluders!r}")
        if index not in config.neighbors:
            raise SecAggError(f"client index {index} is not in the round's graph")
        if required_threshold is not None and config.threshold != required_threshold:
            raise SecAggError(
                f"the server asks for t = {config.threshold}; the signed task configuration fixes t = {required_threshold}"
            )
        self.index = index
        self.config = config
        #: c, the colluding share holders this client's secrets must withstand (from the signed task)
        self.max_colluders = max_colluders
        #: SHA-256 commitments to the shares sent (recipient → 32 bytes for b ‖ 32 bytes for s), see share_keys
        self.commitments: dict[int, bytes] = {}
        self._rb = random_bytes
        self._c = X25519PrivateKey.from_private_bytes(random_bytes(32))
        self._s = X25519PrivateKey.from_private_bytes(random_bytes(32))
        self._b = random_bytes(32)
        self._peers: dict[int, KeyAdvert] = {}
        self._held: dict[int, _SharePair] = {}
        self._masked_with: tuple[int, ...] = ()
        self._revealed: dict[int, str] = {}
        self._signed: frozenset[int] | None = None

    def advertise_keys(self) -> KeyAdvert:
        return KeyAdvert(self.index, public_bytes(self._c.public_key()), public_bytes(self._s.public_key()))

    def share_keys(self, adverts: Mapping[int, KeyAdvert]) -> dict[int, bytes]:
        """Encrypted shares of b_u and s_u for each neighbour whose keys arrived."""
        mine = set(self.config.neighbors[self.index])
        peers = {v: a for v, a in adverts.items() if v in mine}
        if len(peers) < self.config.threshold:
            raise SecAggError(f"only {len(peers)} neighbours advertised keys, fewer than t = {self.config.threshold}")
        if len({a.mask_key for a in peers.values()} | {public_bytes(self._s.public_key())}) != len(peers) + 1:
            raise SecAggError("two parties advertised the same mask key")
        t, c = self.config.threshold, self.max_colluders
        if split_attack_possible(len(peers), t, c):
            # c colluding holders give the server c shares of both secrets; two disjoint sets of t − c honest
            # holders, each told a different story ("u survived" / "u dropped"), would give it the rest
            raise CollusionBoundError(
                f"t = {t} with {len(peers)} share holders and up to {c} colluding: secrets are shared only "
                f"when 2t > holders + colluders ({2 * t} <= {len(peers) + c}); a server asking for this could "
                "rebuild both this client's seeds"
            )
        self._peers = dict(peers)
        xs = sorted(peers)
        b_sh = shamir_split(int.from_bytes(self._b, "little"), t, xs, self._rb)
        s_sh = shamir_split(int.from_bytes(_private_bytes(self._s), "little"), t, xs, self._rb)
        out = {}
        for v, bs, ss in zip(xs, b_sh, s_sh):
            self.commitments[v] = share_commitment(self.config.round, self.index, v, "b", bs) + share_commitment(
                self.config.round, self.index, v, "s", ss
            )
            key = _share_key(self._c, X25519PublicKey.from_public_bytes(peers[v].share_key), self.config.round)
            nonce = self._rb(12)
            aad = self._aad(self.index, v)
            out[v] = nonce + AESGCM(key).encrypt(nonce, _encode_pair(self.index, v, bs, ss), aad)
        return out

    def _aad(self, u: int, v: int) -> bytes:
        return self.config.round.to_bytes(8, "little") + u.to_bytes(4, "little") + v.to_bytes(4, "little")

    def masked_input(self, x: np.ndarray, ciphertexts: Mapping[int, bytes], bits: int = MODULUS_BITS) -> np.ndarray:
        """y_u for the quantized update ``x`` (uint32); ``ciphertexts`` are the shares
        addressed to u, keyed by sender: their senders are N'(u).

        ``bits`` < 32: the ring is Z_{2^bits} (the distributed discrete Gaussian, :mod:`ldp_core.fl.ddg`):
        ``x`` must lie in [0, 2^bits) and y_u is reduced mod 2^bits. The masks are uniform mod 2^32, hence
        mod 2^bits, so y_u is a uniform word whatever x_u, and the server's unmasked sum is Σ x_u only mod
        2^bits (a 32-bit y_u = x_u + mask would carry more: Σ (x_u mod 2^bits) without the reduction)."""
        d = self.config.vector_length
        x = np.asarray(x)
        if x.dtype != np.uint32 or x.shape != (d,):
            raise SecAggError(f"the quantized update must be uint32 of shape ({d},), got {x.dtype} {x.shape}")
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= MODULUS_BITS:
            raise SecAggError(f"bits must be an integer in [1, {MODULUS_BITS}], got {bits!r}")
        if bits < MODULUS_BITS and int(x.max(initial=0)) >> bits:
            raise SecAggError(f"the input has words outside the ring Z_(2^{bits})")
        for v, ct in ciphertexts.items():
            if v not in self._peers:
                raise SecAggError(f"a share from {v}, who is not a neighbour with advertised keys")
            key = _share_key(self._c, X25519PublicKey.from_public_bytes(self._peers[v].share_key), self.config.round)
            try:
                plain = AESGCM(key).decrypt(ct[:12], ct[12:], self._aad(v, self.index))
            except Exception:
                raise SecAggError(f"the share from {v} does not decrypt: tampered or misrouted") from None
            su, sv, pair = _decode_pair(plain)
            if (su, sv) != (v, self.index) or pair.b.x != self.index:
                raise SecAggError(f"the share from {v} is addressed to someone else")
            self._held[v] = pair
        if len(self._held) < self.config.threshold:
            raise SecAggError(
                f"only {len(self._held)} neighbours completed key sharing, fewer than t = "
                f"{self.config.threshold}: this input could never be unmasked; not sending it"
            )
        self._masked_with = tuple(sorted(self._held))
        masks = [(self._b, 1)]
        for v in self._masked_with:
            k = pairwise_seed(
                self._s, X25519PublicKey.from_public_bytes(self._peers[v].mask_key), self.config.round, self.index, v
            )
            masks.append((k, 1 if v > self.index else -1))
        y = add_masks(x.copy(), masks)
        if bits < MODULUS_BITS:
            y &= np.uint32((1 << bits) - 1)
        return y

    def _check_survivors(self, survivors: set[int]) -> None:
        if self.index not in survivors:
            raise SecAggError("the server lists this client as not having sent its masked input")
        if len(survivors) < self.config.threshold:
            raise SecAggError(
                f"only {len(survivors)} survivors, fewer than t = {self.config.threshold}: revealing nothing"
            )

    def sign_survivors(self, survivors: set[int], sign: Callable[[bytes], bytes], context: str = "") -> bytes:
        """B17's consistency check, first half: this client's signature (``sign``: its device key over
        :data:`SURVIVORS_TAG`) of the survivor set the server showed it. An honest client signs one set per
        round: asked to sign a different one it refuses."""
        self._check_survivors(survivors)
        shown = frozenset(survivors)
        if self._signed is not None and self._signed != shown:
            raise SecAggError("the server shows a second, different survivor set: refusing to sign it")
        self._signed = shown
        return sign(survivors_message(context, self.config.round, sorted(shown)))

    def unmask(
        self,
        survivors: set[int],
        dropped: set[int],
        signatures: Mapping[int, bytes],
        verify_keys: Mapping[int, bytes],
        context: str = "",
    ) -> dict[int, tuple[str, Share]]:
        """For each neighbour v held: ("b", share of b_v) if v survived, ("s", share of s_v) if it dropped;
        only for the survivor set this client signed and after checking ``signatures`` (survivor index →
        Ed25519 signature of that set) by at least t *other* survivors among its verified neighbours
        (``verify_keys``: index → the device public key of its credential). Honest clients sign one set,
        so a server that shows different sets to different clients cannot show each t signatures from
        others on its own (B17's consistency check; see docs/fl/SECAGG.md for what it adds to 2t > holders)."""
        from ldp_core.tokens.enrollment import verify_signature

        if survivors & dropped:
            raise SecAggError("a client cannot be both a survivor and dropped")
        self._check_survivors(survivors)
        if self._signed is None or self._signed != frozenset(survivors):
            raise SecAggError("the unmask request's survivor set is not the one this client signed: revealing nothing")
        message = survivors_message(context, self.config.round, sorted(survivors))
        valid = [
            v
            for v, sig in signatures.items()
            if v != self.index
            and v in survivors
            and v in verify_keys
            and verify_signature(verify_keys[v], sig, SURVIVORS_TAG, message)
        ]
        if len(valid) < self.config.threshold:
            raise SecAggError(
                f"only {len(valid)} other survivors signed the survivor set this client was shown, fewer than "
                f"t = {self.config.threshold}: the server may be showing different sets; revealing nothing"
            )
        out: dict[int, tuple[str, Share]] = {}
        for v, pair in self._held.items():
            kind = "b" if v in survivors else "s" if v in dropped else None
            if kind is None:
                continue
            if self._revealed.get(v, kind) != kind:
                raise SecAggError(f"refusing to reveal both secrets of client {v}: that would unmask its input")
            self._revealed[v] = kind
            out[v] = (kind, pair.b if kind == "b" else pair.s)
        return out

    @property
    def masked_with(self) -> tuple[int, ...]:
        """N'(u): the neighbours whose pairwise masks y_u carries."""
        return self._masked_with
