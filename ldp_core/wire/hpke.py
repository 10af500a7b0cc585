"""HPKE (RFC 9180), base mode, for DHKEM(X25519, HKDF-SHA256) with HKDF-SHA256.

Sealed reports (:mod:`ldp_core.wire.sealing`) are single-shot HPKE messages:
``enc || Seal(key, nonce, aad, pt)`` for a fresh ephemeral key per message.
This module is a small, dependency-light implementation built from
``cryptography``'s primitives (X25519, AES-128-GCM, ChaCha20-Poly1305) and
the standard library's HMAC-SHA256, so that it runs wherever the SDK runs,
whatever the installed ``cryptography`` offers. It implements exactly what
RFC 9180 §4 and §5 specify for the base mode (mode 0):

* ``DeriveKeyPair`` / ``Encap`` / ``Decap`` of DHKEM(X25519, HKDF-SHA256)
  (KEM id 0x0020), with the labelled extract and expand of §4,
* ``KeySchedule`` (§5.1) with an empty PSK, and the context's ``Seal``,
  ``Open`` (sequence-numbered nonces, §5.2) and ``Export`` (§5.3),
* AEADs AES-128-GCM (0x0001) and ChaCha20-Poly1305 (0x0003).

It passes RFC 9180's own test vectors (appendix A.1.1 and A.2.1;
``ldp_core/vectors/hpke_rfc9180.json``, ``tests/sdk/test_sealed_hpke.py``) and
interoperates with ``cryptography.hazmat.primitives.hpke`` where that exists
(``cryptography`` >= 46), which the analyzer uses to open reports when it is
installed: :func:`fast_suite`.

Only what the pipeline needs is here: no PSK or auth modes, no other KEMs.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

__all__ = [
    "KEM_X25519_SHA256",
    "KDF_HKDF_SHA256",
    "AEAD_AES_128_GCM",
    "AEAD_CHACHA20_POLY1305",
    "HPKEError",
    "HPKEPointError",
    "Context",
    "Suite",
    "derive_key_pair",
    "fast_suite",
    "single_shot_opener",
]

KEM_X25519_SHA256 = 0x0020
KDF_HKDF_SHA256 = 0x0001
AEAD_AES_128_GCM = 0x0001
AEAD_CHACHA20_POLY1305 = 0x0003

_NH = 32  # HKDF-SHA256 output size
_NENC = 32  # X25519 public key
_NSECRET = 32
_AEADS: dict[int, tuple[int, Any]] = {AEAD_AES_128_GCM: (16, AESGCM), AEAD_CHACHA20_POLY1305: (32, ChaCha20Poly1305)}
_NN = 12
_NT = 16
_MODE_BASE = 0
_V1 = b"HPKE-v1"


class HPKEError(ValueError):
    """A message does not open (wrong key, wrong info or aad, tampered bytes) or a parameter is invalid."""


class HPKEPointError(HPKEError):
    """The X25519 exchange refused an ``enc``: a low-order point, whose shared secret is all zeros (RFC 9180
    §7.1.4 says abort)."""


def _extract(salt: bytes, ikm: bytes) -> bytes:
    return hmac.digest(salt or bytes(_NH), ikm, "sha256")


def _expand(prk: bytes, info: bytes, length: int) -> bytes:
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.digest(prk, block + info + bytes([i]), "sha256")
        out += block
        i += 1
    return out[:length]


def _labeled_extract(suite_id: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
    return _extract(salt, _V1 + suite_id + label + ikm)


def _labeled_expand(suite_id: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
    return _expand(prk, struct.pack(">H", length) + _V1 + suite_id + label + info, length)


_KEM_SUITE_ID = b"KEM" + struct.pack(">H", KEM_X25519_SHA256)


def derive_key_pair(ikm: bytes) -> tuple[bytes, bytes]:
    """RFC 9180 §7.1.3 DeriveKeyPair for X25519: ``(skm, pkm)`` (raw 32-byte private and public keys)."""
    if len(ikm) < _NSECRET:
        raise HPKEError(f"DeriveKeyPair needs at least {_NSECRET} bytes of input keying material, got {len(ikm)}")
    prk = _labeled_extract(_KEM_SUITE_ID, b"", b"dkp_prk", ikm)
    sk = _labeled_expand(_KEM_SUITE_ID, prk, b"sk", b"", 32)
    return sk, public_bytes(sk)


def public_bytes(sk: bytes) -> bytes:
    """The raw X25519 public key of a raw private key."""
    return X25519PrivateKey.from_private_bytes(sk).public_key().public_bytes_raw()


def _extract_and_expand(dh: bytes, kem_context: bytes) -> bytes:
    eae_prk = _labeled_extract(_KEM_SUITE_ID, b"", b"eae_prk", dh)
    return _labeled_expand(_KEM_SUITE_ID, eae_prk, b"shared_secret", kem_context, _NSECRET)


def _dh(sk: X25519PrivateKey, pk: bytes) -> bytes:
    try:
        return sk.exchange(X25519PublicKey.from_public_bytes(pk))
    except ValueError as exc:  # a low-order point gives the all-zero output: RFC 9180 §7.1.4 says abort
        raise HPKEPointError(f"X25519 exchange failed: {exc}") from None


class Context:
    """An HPKE encryption context (RFC 9180 §5.2): ``seal``/``open`` with a sequence number, ``export``."""

    __slots__ = ("_aead", "_base_nonce", "_exporter_secret", "_seq", "_suite_id")

    def __init__(self, aead: Any, base_nonce: bytes, exporter_secret: bytes, suite_id: bytes) -> None:
        self._aead = aead
        self._base_nonce = base_nonce
        self._exporter_secret = exporter_secret
        self._suite_id = suite_id
        self._seq = 0

    @property
    def seq(self) -> int:
        return self._seq

    def _nonce(self, seq: int) -> bytes:
        if seq >= 1 << (8 * _NN):
            raise HPKEError("the context's sequence number overflowed")
        return bytes(a ^ b for a, b in zip(self._base_nonce, seq.to_bytes(_NN, "big"), strict=True))

    def nonce(self, seq: int) -> bytes:
        """``base_nonce XOR I2OSP(seq, Nn)`` (RFC 9180 §5.2)."""
        return self._nonce(seq)

    def seal(self, pt: bytes, aad: bytes = b"", *, seq: int | None = None) -> bytes:
        """Encrypt at the next sequence number (or at ``seq``, for test vectors); the counter advances."""
        s = self._seq if seq is None else seq
        ct: bytes = self._aead.encrypt(self._nonce(s), pt, aad)
        self._seq = s + 1
        return ct

    def open(self, ct: bytes, aad: bytes = b"", *, seq: int | None = None) -> bytes:
        s = self._seq if seq is None else seq
        try:
            pt: bytes = self._aead.decrypt(self._nonce(s), ct, aad)
        except InvalidTag:
            raise HPKEError("the message does not open: wrong key, info or aad, or altered bytes") from None
        self._seq = s + 1
        return pt

    def export(self, exporter_context: bytes, length: int) -> bytes:
        return _labeled_expand(self._suite_id, self._exporter_secret, b"sec", exporter_context, length)


class Suite:
    """One HPKE ciphersuite: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and ``aead_id``.

    ``info`` values that repeat (one per metric, spec, day and key in the
    pipeline) have their ``info_hash`` cached, so opening a message costs one
    X25519 exchange, five HMAC-SHA256 and one AEAD call.
    """

    def __init__(self, aead_id: int = AEAD_AES_128_GCM) -> None:
        if aead_id not in _AEADS:
            raise HPKEError(f"unsupported AEAD id 0x{aead_id:04x}; supported: AES-128-GCM (1), ChaCha20-Poly1305 (3)")
        self.aead_id = aead_id
        self.nk, self._aead_cls = _AEADS[aead_id]
        self.suite_id = b"HPKE" + struct.pack(">HHH", KEM_X25519_SHA256, KDF_HKDF_SHA256, aead_id)
        self._psk_id_hash = _labeled_extract(self.suite_id, b"", b"psk_id_hash", b"")
        self._ksc: dict[bytes, bytes] = {}

    def key_schedule_context(self, info: bytes) -> bytes:
        ksc = self._ksc.get(info)
        if ksc is None:
            info_hash = _labeled_extract(self.suite_id, b"", b"info_hash", info)
            ksc = bytes([_MODE_BASE]) + self._psk_id_hash + info_hash
            if len(self._ksc) < 4096:
                self._ksc[info] = ksc
        return ksc

    def _schedule(self, shared_secret: bytes, info: bytes) -> tuple[bytes, bytes, bytes]:
        ksc = self.key_schedule_context(info)
        secret = _labeled_extract(self.suite_id, shared_secret, b"secret", b"")
        key = _labeled_expand(self.suite_id, secret, b"key", ksc, self.nk)
        base_nonce = _labeled_expand(self.suite_id, secret, b"base_nonce", ksc, _NN)
        return key, base_nonce, secret

    def _context(self, shared_secret: bytes, info: bytes) -> Context:
        key, base_nonce, secret = self._schedule(shared_secret, info)
        exporter_secret = _labeled_expand(self.suite_id, secret, b"exp", self.key_schedule_context(info), _NH)
        return Context(self._aead_cls(key), base_nonce, exporter_secret, self.suite_id)

    # -- the KEM -----------------------------------------------------------------------------------
    @staticmethod
    def encap(pkr: bytes, ikm_e: bytes | None = None) -> tuple[bytes, bytes]:
        """``(shared_secret, enc)``; a fresh ephemeral key (from the OS CSPRNG) unless ``ikm_e`` is given
        (deterministic: RFC 9180's test vectors, never for real messages)."""
        ske = (
            X25519PrivateKey.generate()
            if ikm_e is None
            else X25519PrivateKey.from_private_bytes(derive_key_pair(ikm_e)[0])
        )
        enc = ske.public_key().public_bytes_raw()
        return _extract_and_expand(_dh(ske, pkr), enc + pkr), enc

    @staticmethod
    def decap(enc: bytes, skr: X25519PrivateKey, pkr: bytes) -> bytes:
        if len(enc) != _NENC:
            raise HPKEError(f"enc must be {_NENC} bytes, got {len(enc)}")
        return _extract_and_expand(_dh(skr, enc), enc + pkr)

    # -- setup and single shot ---------------------------------------------------------------------
    def setup_sender(self, pkr: bytes, info: bytes, ikm_e: bytes | None = None) -> tuple[bytes, Context]:
        shared_secret, enc = self.encap(pkr, ikm_e)
        return enc, self._context(shared_secret, info)

    def setup_receiver(self, enc: bytes, skr: X25519PrivateKey, pkr: bytes, info: bytes) -> Context:
        return self._context(self.decap(enc, skr, pkr), info)

    def seal(self, pkr: bytes, info: bytes, pt: bytes, aad: bytes = b"") -> bytes:
        """Single-shot ``enc || ct`` (RFC 9180 §6.1) under a fresh ephemeral key."""
        shared_secret, enc = self.encap(pkr)
        key, base_nonce, _ = self._schedule(shared_secret, info)
        ct: bytes = self._aead_cls(key).encrypt(base_nonce, pt, aad)
        return enc + ct

    def open(self, skr: X25519PrivateKey, pkr: bytes, info: bytes, message: bytes, aad: bytes = b"") -> bytes:
        """Open a single-shot ``enc || ct``; :class:`HPKEError` if it does not open."""
        if len(message) < _NENC + _NT:
            raise HPKEError(f"a sealed message has at least {_NENC + _NT} bytes, got {len(message)}")
        key, base_nonce, _ = self._schedule(self.decap(message[:_NENC], skr, pkr), info)
        try:
            pt: bytes = self._aead_cls(key).decrypt(base_nonce, message[_NENC:], aad)
        except InvalidTag:
            raise HPKEError("the message does not open: wrong key, info or aad, or altered bytes") from None
        return pt


_IPAD = int.from_bytes(b"\x36" * 64, "big")
_OPAD = int.from_bytes(b"\x5c" * 64, "big")


_XOR36 = bytes(b ^ 0x36 for b in range(256))  # bytes.translate tables: XOR every byte with HMAC's ipad / opad
_XOR5C = bytes(b ^ 0x5C for b in range(256))
_PAD36 = b"\x36" * 32  # the zero right-padding of a 32-byte key to SHA-256's 64-byte block, XORed
_PAD5C = b"\x5c" * 32


def _pads(key: bytes) -> tuple[bytes, bytes]:
    """HMAC-SHA256's inner and outer padded keys (RFC 2104) of a 32-byte key, by integer XOR."""
    x = int.from_bytes(key, "big") << 256  # the key, right-padded with zeros to the 64-byte block
    return (x ^ _IPAD).to_bytes(64, "big"), (x ^ _OPAD).to_bytes(64, "big")


def single_shot_opener(suite: Suite, skr: X25519PrivateKey, pkr: bytes, info: bytes) -> Any:
    """A function ``open(message) -> plaintext`` for single-shot messages to ``(skr, pkr)`` under ``info``
    with an empty aad: :meth:`Suite.open` with every constant of the key schedule precomputed (the
    analyzer's hot path: one X25519 exchange, five HMAC-SHA256 and one AEAD call per message). The
    HMACs are computed from ``hashlib.sha256`` over RFC 2104's padded keys (the zero-key one from saved
    states), which costs less than five ``hmac.digest`` calls; the results are the same (tested against
    :meth:`Suite.seal` and ``cryptography``'s HPKE). :class:`HPKEError` if a message does not open."""
    sha = hashlib.sha256
    v1, ksuite, hsuite = _V1, _KEM_SUITE_ID, suite.suite_id
    zero_in, zero_out = _pads(bytes(_NH))
    z_in, z_out = sha(zero_in), sha(zero_out)  # LabeledExtract's salt is empty: HMAC's key is zeros
    eae_prefix = v1 + ksuite + b"eae_prk"
    ss_prefix = struct.pack(">H", _NSECRET) + v1 + ksuite + b"shared_secret"
    ss_suffix = pkr + b"\x01"
    secret_msg = v1 + hsuite + b"secret"
    ksc = suite.key_schedule_context(info)
    key_msg = struct.pack(">H", suite.nk) + v1 + hsuite + b"key" + ksc + b"\x01"
    nonce_msg = struct.pack(">H", _NN) + v1 + hsuite + b"base_nonce" + ksc + b"\x01"
    nk = suite.nk
    aead_cls = suite._aead_cls
    exchange = skr.exchange
    from_public = X25519PublicKey.from_public_bytes

    eae_in = z_in.copy()
    eae_in.update(eae_prefix)  # the eae_prk extract's inner hash up to the shared point
    ss_tail = ss_suffix
    i36, i5c = _XOR36, _XOR5C
    p36, p5c = _PAD36, _PAD5C

    def open_message(message: bytes) -> bytes:
        if len(message) < _NENC + _NT:
            raise HPKEError(f"a sealed message has at least {_NENC + _NT} bytes, got {len(message)}")
        enc = message[:_NENC]
        try:
            dh = exchange(from_public(enc))
        except ValueError as exc:
            raise HPKEPointError(f"X25519 exchange failed: {exc}") from None
        inner = eae_in.copy()
        inner.update(dh)
        outer = z_out.copy()
        outer.update(inner.digest())
        k = outer.digest()  # eae_prk; each HMAC below keys on a 32-byte key, padded by byte translation
        k = sha(k.translate(i5c) + p5c + sha(k.translate(i36) + p36 + ss_prefix + enc + ss_tail).digest()).digest()
        k = sha(k.translate(i5c) + p5c + sha(k.translate(i36) + p36 + secret_msg).digest()).digest()  # secret
        ik, ok = k.translate(i36) + p36, k.translate(i5c) + p5c
        key = sha(ok + sha(ik + key_msg).digest()).digest()[:nk]
        nonce = sha(ok + sha(ik + nonce_msg).digest()).digest()[:_NN]
        try:
            pt: bytes = aead_cls(key).decrypt(nonce, message[_NENC:], b"")
        except InvalidTag:
            raise HPKEError("the message does not open: wrong key, info or aad, or altered bytes") from None
        return pt

    return open_message


def fast_suite(aead_id: int = AEAD_AES_128_GCM) -> Any | None:
    """``cryptography``'s own (Rust) HPKE suite for the same ciphersuite, or ``None`` if this
    ``cryptography`` has none. Its single-shot ``encrypt``/``decrypt`` use an empty aad, which is how
    sealed reports are made (their context is bound through ``info``), so both produce and open the
    same messages (tested in ``tests/sdk/test_sealed_hpke.py``)."""
    try:
        from cryptography.hazmat.primitives import hpke as _hpke
    except ImportError:
        return None
    aead = {AEAD_AES_128_GCM: _hpke.AEAD.AES_128_GCM, AEAD_CHACHA20_POLY1305: _hpke.AEAD.CHACHA20_POLY1305}[aead_id]
    return _hpke.Suite(_hpke.KEM.X25519, _hpke.KDF.HKDF_SHA256, aead)
