"""RSA blind signatures, RSABSSA-SHA384-PSS (RFC 9474), on top of ``cryptography``'s RSA keys.

The four steps of RFC 9474 §4, with the hash fixed to SHA-384, MGF1-SHA-384 and a 48-byte salt
(the ``PSS`` variants; ``salt_len=0`` gives the ``PSSZERO`` ones):

* :func:`prepare` (client): the *randomized* preparation prepends a fresh 32-byte ``msg_prefix``
  (RSABSSA-SHA384-PSS-Randomized, RFC 9474 §4.1); ``randomized=False`` is the identity
  (RSABSSA-SHA384-PSS-Deterministic, which Privacy Pass token type 0x0002 uses, RFC 9578 §6.1: its
  token input already carries a 32-byte client nonce);
* :func:`blind` (client): EMSA-PSS-encode the prepared message (RFC 8017 §9.1.1), multiply by
  ``r^e`` for a uniform ``r`` in ``[1, n)`` with an inverse; returns the blinded message and ``inv``;
* :func:`blind_sign` (issuer): RSASP1 of the blinded message, checked by RSAVP1 before it leaves;
* :func:`finalize` (client): multiply by ``inv``, check the result is a valid RSASSA-PSS signature
  of the prepared message; :func:`verify` is plain RSASSA-PSS verification (anyone holding the
  public key: the collector).

Side channels. Python integers are **not constant time**: ``pow`` and the multiplications leak timing
that depends on their operands. On the client this is harmless (its secrets are ``r`` and the message,
and the blinded message it sends is uniform anyway). On the issuer the private exponent is the
secret: :func:`blind_sign` therefore uses *base blinding* — it signs ``m·u^e`` for a fresh uniform
``u`` and divides by ``u`` afterwards, so that the operand of the exponentiation with ``d`` is
independent of the request an attacker chose — and does the CRT exponentiations with Python's
``pow``. Exponent-dependent timing remains (square-and-multiply over ``d mod (p-1)``); an issuer
exposed to precise remote timing measurements should sign in a constant-time library
(``cryptography`` exposes no raw RSA private operation, which is why this module exists). This is the
choice recorded in docs/TOKENS.md.

Blindness. The blinded message is ``m·r^e mod n`` with ``r`` uniform among the units mod ``n``;
``r ↦ r^e`` is a permutation of the units, so the blinded message is a uniform unit whatever ``m`` is:
the issuer's view is independent of the token (tests/sdk/test_blind_rsa.py tests this).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
from collections.abc import Callable
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ldp_core.errors import LDPError
from ldp_core.files import write_atomic

__all__ = [
    "BlindRSAError",
    "PublicKey",
    "PrivateKey",
    "HASH_LEN",
    "SALT_LEN",
    "PREFIX_LEN",
    "mgf1",
    "emsa_pss_encode",
    "prepare",
    "blind",
    "blind_sign",
    "finalize",
    "verify",
]

HASH_LEN = 48  # SHA-384
SALT_LEN = 48  # the PSS variants; PSSZERO uses 0
PREFIX_LEN = 32  # the randomized preparation's msg_prefix
_MIN_BITS = 2048

RandomBytes = Callable[[int], bytes]


class BlindRSAError(LDPError):
    """A blind-signature step failed: a message out of range, a signature that does not verify, a bad key."""


def _i2osp(x: int, length: int) -> bytes:
    return x.to_bytes(length, "big")


def _os2ip(b: bytes) -> int:
    return int.from_bytes(b, "big")


def _der(tag: int, body: bytes) -> bytes:
    """One DER TLV (definite length, short or long form)."""
    n = len(body)
    if n < 0x80:
        return bytes([tag, n]) + body
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(raw)]) + raw + body


def _der_uint(x: int) -> bytes:
    raw = x.to_bytes(x.bit_length() // 8 + 1, "big")  # a leading 0 byte keeps the top bit clear
    return _der(0x02, raw)


# AlgorithmIdentifier { id-RSASSA-PSS, RSASSA-PSS-params { hashAlgorithm [0] sha384, maskGenAlgorithm [1]
# mgf1(sha384), saltLength [2] 48 } } (RFC 4055 §3.1, RFC 5756 §2; the hash AlgorithmIdentifiers carry an
# explicit NULL, as RFC 9578 Appendix A.2's pkS does).
_OID_RSASSA_PSS = bytes.fromhex("2a864886f70d01010a")  # 1.2.840.113549.1.1.10
_OID_MGF1 = bytes.fromhex("2a864886f70d010108")  # 1.2.840.113549.1.1.8
_OID_SHA384 = bytes.fromhex("608648016503040202")  # 2.16.840.1.101.3.4.2.2
_SHA384_ALG = _der(0x30, _der(0x06, _OID_SHA384) + b"\x05\x00")
_PSS_ALG_ID = _der(
    0x30,
    _der(0x06, _OID_RSASSA_PSS)
    + _der(
        0x30,
        _der(0xA0, _SHA384_ALG)
        + _der(0xA1, _der(0x30, _der(0x06, _OID_MGF1) + _SHA384_ALG))
        + _der(0xA2, _der(0x02, bytes([SALT_LEN]))),
    ),
)


def _der_read(buf: bytes, pos: int, tag: int) -> tuple[bytes, int]:
    """The body of the TLV with ``tag`` at ``pos`` and the position after it (strict DER lengths)."""
    if pos + 2 > len(buf) or buf[pos] != tag:
        raise BlindRSAError(f"malformed DER: expected tag {tag:#04x} at byte {pos}")
    first = buf[pos + 1]
    pos += 2
    if first < 0x80:
        n = first
    else:
        k = first & 0x7F
        if not 1 <= k <= 4 or pos + k > len(buf) or buf[pos] == 0:
            raise BlindRSAError("malformed DER: bad length")
        n = int.from_bytes(buf[pos : pos + k], "big")
        if n < 0x80:
            raise BlindRSAError("malformed DER: non-minimal length")
        pos += k
    if pos + n > len(buf):
        raise BlindRSAError("malformed DER: truncated")
    return buf[pos : pos + n], pos + n


def _der_read_uint(buf: bytes, pos: int) -> tuple[int, int]:
    body, end = _der_read(buf, pos, 0x02)
    if not body or body[0] & 0x80 or (len(body) > 1 and body[0] == 0 and not body[1] & 0x80):
        raise BlindRSAError("malformed DER: not a minimal non-negative INTEGER")
    return int.from_bytes(body, "big"), end


def _spki_algorithm(der: bytes) -> bytes | None:
    """The algorithm OID of a SubjectPublicKeyInfo (``None`` if it does not parse that far)."""
    try:
        spki, _ = _der_read(der, 0, 0x30)
        alg, _ = _der_read(spki, 0, 0x30)
        oid, _ = _der_read(alg, 0, 0x06)
    except BlindRSAError:
        return None
    return oid


def mgf1(seed: bytes, length: int) -> bytes:
    """MGF1 with SHA-384 (RFC 8017 B.2.1)."""
    out = bytearray()
    counter = 0
    while len(out) < length:
        out += hashlib.sha384(seed + counter.to_bytes(4, "big")).digest()
        counter += 1
    return bytes(out[:length])


def emsa_pss_encode(msg: bytes, em_bits: int, salt: bytes) -> bytes:
    """EMSA-PSS-ENCODE (RFC 8017 §9.1.1) with SHA-384 and MGF1-SHA-384; ``salt`` is given (its length is sLen)."""
    em_len = (em_bits + 7) // 8
    m_hash = hashlib.sha384(msg).digest()
    if em_len < HASH_LEN + len(salt) + 2:
        raise BlindRSAError("encoding error: the modulus is too small for SHA-384 and this salt")
    h = hashlib.sha384(b"\x00" * 8 + m_hash + salt).digest()
    ps = b"\x00" * (em_len - len(salt) - HASH_LEN - 2)
    db = ps + b"\x01" + salt
    mask = mgf1(h, em_len - HASH_LEN - 1)
    masked = bytearray(a ^ b for a, b in zip(db, mask, strict=True))
    masked[0] &= 0xFF >> (8 * em_len - em_bits)
    return bytes(masked) + h + b"\xbc"


# -- keys ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PublicKey:
    """An RSA public key (``n``, ``e``) for RSABSSA; ``modulus_len`` is kLen in bytes."""

    n: int
    e: int

    def __post_init__(self) -> None:
        if self.n.bit_length() < _MIN_BITS or self.n % 2 == 0:
            raise BlindRSAError(f"an RSA modulus of at least {_MIN_BITS} bits is needed, got {self.n.bit_length()}")
        if self.e < 3 or self.e % 2 == 0:
            raise BlindRSAError(f"the public exponent must be odd and >= 3, got {self.e}")

    @property
    def modulus_len(self) -> int:
        return (self.n.bit_length() + 7) // 8

    @classmethod
    def from_cryptography(cls, key: rsa.RSAPublicKey) -> PublicKey:
        nums = key.public_numbers()
        return cls(nums.n, nums.e)

    def to_cryptography(self) -> rsa.RSAPublicKey:
        return rsa.RSAPublicNumbers(self.e, self.n).public_key()

    @functools.cached_property
    def verifier(self) -> rsa.RSAPublicKey:
        """:meth:`to_cryptography`, made once per key: OpenSSL keeps the key's Montgomery context with it, so a
        token's verification with it costs about 70 % of one with a fresh key object (39 against 56 µs on the
        machine of docs/benchmarks/PIPELINE.md, "Session 12"), which a collector pays per upload with
        ``--require-tokens``. Not pickled (OpenSSL's object is not): made again after unpickling."""
        return self.to_cryptography()

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state.pop("verifier", None)
        return state

    def to_der(self) -> bytes:
        """The SubjectPublicKeyInfo (DER) with the generic ``rsaEncryption`` algorithm identifier."""
        return self.to_cryptography().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def to_pss_spki(self) -> bytes:
        """The SubjectPublicKeyInfo (DER) with the ``id-RSASSA-PSS`` algorithm identifier and its parameters
        SHA-384, MGF1-SHA-384, salt 48: the Issuer Public Key encoding of RFC 9578 §6.5 (and of the token type
        registry entry for 0x0002, RFC 9578 §8.2.2), which ``token_key_id`` hashes."""
        rsa_public_key = _der(0x30, _der_uint(self.n) + _der_uint(self.e))
        return _der(0x30, _PSS_ALG_ID + _der(0x03, b"\x00" + rsa_public_key))

    @classmethod
    def from_der(cls, der: bytes) -> PublicKey:
        """A key from either SubjectPublicKeyInfo form: :meth:`to_pss_spki` (what the issuer publishes) or
        :meth:`to_der`. An ``id-RSASSA-PSS`` key with other parameters than SHA-384/MGF1-SHA-384/48 is refused:
        its signatures are not RSABSSA-SHA384-PSS ones."""
        if _spki_algorithm(der) == _OID_RSASSA_PSS:
            return cls._from_pss_spki(der)
        try:
            key = serialization.load_der_public_key(der)
        except ValueError as exc:
            raise BlindRSAError(f"not an RSA public key (SubjectPublicKeyInfo DER): {exc}") from None
        if not isinstance(key, rsa.RSAPublicKey):
            raise BlindRSAError("the public key is not an RSA key")
        return cls.from_cryptography(key)

    @classmethod
    def _from_pss_spki(cls, der: bytes) -> PublicKey:
        spki, end = _der_read(der, 0, 0x30)
        if end != len(der):
            raise BlindRSAError("malformed DER: bytes after the SubjectPublicKeyInfo")
        if not spki.startswith(_PSS_ALG_ID):
            raise BlindRSAError(
                "an id-RSASSA-PSS key must have the parameters SHA-384, MGF1-SHA-384 and salt length 48 (RFC 9578 §6.5)"
            )
        bits, end = _der_read(spki, len(_PSS_ALG_ID), 0x03)
        if end != len(spki) or not bits or bits[0] != 0:
            raise BlindRSAError("malformed DER: the subjectPublicKey BIT STRING")
        body, end = _der_read(bits, 1, 0x30)
        if end != len(bits):
            raise BlindRSAError("malformed DER: bytes after the RSAPublicKey")
        n, pos = _der_read_uint(body, 0)
        e, pos = _der_read_uint(body, pos)
        if pos != len(body):
            raise BlindRSAError("malformed DER: bytes after the RSAPublicKey's exponent")
        return cls(n, e)

    def key_id(self) -> bytes:
        """``token_key_id`` = SHA-256 of :meth:`to_pss_spki` (RFC 9578 §6.5); a token request carries its last
        byte (``truncated_token_key_id``, RFC 9578 §6.1)."""
        return hashlib.sha256(self.to_pss_spki()).digest()


class PrivateKey:
    """An RSA private key for the issuer (wraps ``cryptography``'s key; the raw operation is here)."""

    def __init__(self, key: rsa.RSAPrivateKey) -> None:
        nums = key.private_numbers()
        self._key = key
        self.public_key = PublicKey(nums.public_numbers.n, nums.public_numbers.e)
        self._d = nums.d
        self._p, self._q = nums.p, nums.q
        self._dp, self._dq, self._qinv = nums.dmp1, nums.dmq1, nums.iqmp

    @classmethod
    def generate(cls, bits: int = 2048) -> PrivateKey:
        """A fresh key (``cryptography`` draws the primes from the OS CSPRNG)."""
        if bits < _MIN_BITS:
            raise BlindRSAError(f"an issuer key needs at least {_MIN_BITS} bits, got {bits}")
        return cls(rsa.generate_private_key(public_exponent=65537, key_size=bits))

    @classmethod
    def from_numbers(cls, p: int, q: int, e: int, d: int) -> PrivateKey:
        """A key from its primes and exponents (the test vectors give these)."""
        n = p * q
        nums = rsa.RSAPrivateNumbers(
            p,
            q,
            d,
            rsa.rsa_crt_dmp1(d, p),
            rsa.rsa_crt_dmq1(d, q),
            rsa.rsa_crt_iqmp(p, q),
            rsa.RSAPublicNumbers(e, n),
        )
        return cls(nums.private_key())

    def to_pem(self) -> bytes:
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @classmethod
    def from_pem(cls, data: bytes) -> PrivateKey:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise BlindRSAError(f"not an unencrypted PEM private key: {exc}") from None
        if not isinstance(key, rsa.RSAPrivateKey):
            raise BlindRSAError("the private key is not an RSA key")
        return cls(key)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key (PKCS#8 PEM) with mode 0600."""
        write_atomic(path, self.to_pem(), mode=0o600)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PrivateKey:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise BlindRSAError(f"cannot read the issuer key {os.fspath(path)!r}: {exc.strerror or exc}") from None
        return cls.from_pem(data)

    def raw_sign(self, m: int, random_bytes: RandomBytes = os.urandom) -> int:
        """RSASP1(m) = m^d mod n by CRT, with base blinding by a fresh uniform unit ``u`` (module docstring)."""
        n, e = self.public_key.n, self.public_key.e
        u = _random_unit(n, random_bytes)
        mb = (m * pow(u, e, n)) % n
        s1 = pow(mb % self._p, self._dp, self._p)
        s2 = pow(mb % self._q, self._dq, self._q)
        h = (self._qinv * (s1 - s2)) % self._p
        sb = s2 + h * self._q
        return (sb * pow(u, -1, n)) % n


def _random_unit(n: int, random_bytes: RandomBytes) -> int:
    """A uniform integer in [1, n) coprime to n (rejection sampling over kLen bytes, masked to n's bit length)."""
    k = (n.bit_length() + 7) // 8
    top = n.bit_length() % 8
    while True:
        raw = bytearray(random_bytes(k))
        if top:
            raw[0] &= (1 << top) - 1
        r = _os2ip(bytes(raw))
        if 1 <= r < n and math.gcd(r, n) == 1:
            return r


# -- the protocol -------------------------------------------------------------------------------
def prepare(msg: bytes, *, randomized: bool = True, random_bytes: RandomBytes = os.urandom) -> bytes:
    """The message that is signed: ``msg_prefix ‖ msg`` with a fresh 32-byte prefix, or ``msg`` itself."""
    if not randomized:
        return bytes(msg)
    prefix = random_bytes(PREFIX_LEN)
    if len(prefix) != PREFIX_LEN:
        raise BlindRSAError("random_bytes returned the wrong number of bytes")
    return bytes(prefix) + bytes(msg)


def blind(
    pk: PublicKey,
    prepared_msg: bytes,
    *,
    salt_len: int = SALT_LEN,
    random_bytes: RandomBytes = os.urandom,
    salt: bytes | None = None,
    r: int | None = None,
) -> tuple[bytes, bytes]:
    """``(blinded_msg, inv)`` (RFC 9474 §4.2). ``salt`` and ``r`` are for test vectors only; by default both
    are drawn from ``random_bytes`` (a CSPRNG: the blindness rests on ``r`` being uniform and secret)."""
    k = pk.modulus_len
    s = random_bytes(salt_len) if salt is None else salt
    if len(s) != salt_len:
        raise BlindRSAError(f"the salt must be {salt_len} bytes, got {len(s)}")
    em = emsa_pss_encode(prepared_msg, pk.n.bit_length() - 1, s)
    m = _os2ip(em)
    if math.gcd(m, pk.n) != 1:
        raise BlindRSAError("invalid input: the encoded message is not a unit mod n")
    rr = _random_unit(pk.n, random_bytes) if r is None else r
    if not (1 <= rr < pk.n) or math.gcd(rr, pk.n) != 1:
        raise BlindRSAError("the blinding factor must be a unit mod n")
    inv = pow(rr, -1, pk.n)
    z = (m * pow(rr, pk.e, pk.n)) % pk.n
    return _i2osp(z, k), _i2osp(inv, k)


def blind_sign(sk: PrivateKey, blinded_msg: bytes, *, random_bytes: RandomBytes = os.urandom) -> bytes:
    """The issuer's blind signature of ``blinded_msg`` (RFC 9474 §4.3), checked before it is returned."""
    pk = sk.public_key
    k = pk.modulus_len
    if len(blinded_msg) != k:
        raise BlindRSAError(f"a blinded message is {k} bytes for this key, got {len(blinded_msg)}")
    m = _os2ip(blinded_msg)
    if m >= pk.n:
        raise BlindRSAError("message representative out of range")
    s = sk.raw_sign(m, random_bytes)
    if pow(s, pk.e, pk.n) != m:
        raise BlindRSAError("signing failure: the signature does not verify (fault); nothing was returned")
    return _i2osp(s, k)


def finalize(pk: PublicKey, prepared_msg: bytes, blind_sig: bytes, inv: bytes, *, salt_len: int = SALT_LEN) -> bytes:
    """The RSASSA-PSS signature of ``prepared_msg`` from the issuer's ``blind_sig`` (RFC 9474 §4.4), verified."""
    k = pk.modulus_len
    if len(blind_sig) != k or len(inv) != k:
        raise BlindRSAError(f"a blind signature and inv are {k} bytes for this key")
    z = _os2ip(blind_sig)
    if z >= pk.n:
        raise BlindRSAError("the blind signature is out of range")
    sig = _i2osp((z * _os2ip(inv)) % pk.n, k)
    if not verify(pk, prepared_msg, sig, salt_len=salt_len):
        raise BlindRSAError("the finalized signature does not verify: the issuer signed something else")
    return sig


def verify(pk: PublicKey | rsa.RSAPublicKey, prepared_msg: bytes, sig: bytes, *, salt_len: int = SALT_LEN) -> bool:
    """Whether ``sig`` is a valid RSASSA-PSS (SHA-384, MGF1-SHA-384, ``salt_len``) signature of ``prepared_msg``."""
    key = pk.verifier if isinstance(pk, PublicKey) else pk
    try:
        key.verify(
            sig,
            prepared_msg,
            padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=salt_len),
            hashes.SHA384(),
        )
    except InvalidSignature:
        return False
    return True
