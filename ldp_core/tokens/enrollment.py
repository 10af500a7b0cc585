"""Device enrollment: an Ed25519 signing key per install, vouched for by the operator's authority key.

Shared by everything that must know *which enrolled device* sent a request without trusting the
network: federated-learning requests and SecAgg key adverts (:mod:`client_sdk.fl`), and later the
issuer of anonymous upload tokens (issue 12), which authenticates devices with the same credential.

Roles
-----
* The **authority** (:class:`EnrollmentAuthority`) is the operator's offline Ed25519 key. It signs a
  :class:`Credential` binding a device id to the device's public key (with an issue and an expiry
  time), and signs documents devices must trust (an FL task's security configuration:
  :meth:`EnrollmentAuthority.sign_document`). How an install proves it deserves a credential
  (attestation, an account login, a one-time code) is the operator's decision; ``ldp fl enroll``
  mints credentials for tests, the demo and operators without an attestation service yet.
* A **device** (:class:`DeviceIdentity`) holds its private key, its credential and the authority's
  public key (to check documents and its peers' credentials). Its key never leaves it: when the
  operator's enrollment flow lets the device make its own key, only the public key is sent to be
  signed (:meth:`EnrollmentAuthority.certify`).
* A **verifier** (a collector, a job, a peer, an issuer) holds only authority public keys. It checks a
  credential (:meth:`Credential.verify`), then a signature by the credential's key. A request over
  HTTP is checked by :class:`RequestVerifier` (freshness window and a nonce cache against replay).

Formats (version 1)
-------------------
Signatures are Ed25519 (RFC 8032) over a domain tag, a NUL byte and the canonical JSON (sorted keys,
no spaces, UTF-8) of what is signed, so a signature for one purpose is never valid for another:

* credential: tag ``ldp-enrollment-credential-v1`` over ``{v, device_id, public_key (base64), issued_at,
  expires_at, authority (key id)}``; the key id is the first 16 hex digits of SHA-256 of the authority's
  raw public key;
* document: tag ``ldp-document-v1`` over the document;
* request (:meth:`DeviceIdentity.sign_request`): tag ``ldp-request-v1`` over ``[method, target, ts,
  nonce, sha256(body) hex]``; sent as two headers, :data:`CREDENTIAL_HEADER` (base64url of the
  credential's JSON) and :data:`SIGNATURE_HEADER` (``ts=<unix seconds>;nonce=<32 hex>;sig=<base64>``);
* any other message a protocol signs (:meth:`DeviceIdentity.sign`) with its own tag.

Files: an authority key file and a device bundle are JSON written with mode 0600; a missing or
unreadable file is a clear :class:`EnrollmentError`.

Needs the ``cryptography`` package (the ``fl`` extra).
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import hashlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ldp_core.errors import LDPError
from ldp_core.files import write_atomic

__all__ = [
    "EnrollmentError",
    "Credential",
    "EnrollmentAuthority",
    "DeviceIdentity",
    "RequestVerifier",
    "key_id",
    "canonical",
    "verify_signature",
    "verify_document",
    "CREDENTIAL_HEADER",
    "SIGNATURE_HEADER",
]

CREDENTIAL_HEADER = "X-LDP-Device-Credential"
SIGNATURE_HEADER = "X-LDP-Device-Signature"
_VERSION = 1
_DEVICE_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
_CRED_TAG = b"ldp-enrollment-credential-v1"
_DOC_TAG = b"ldp-document-v1"
_REQ_TAG = b"ldp-request-v1"
_DEFAULT_LIFETIME = 365 * 86400


class EnrollmentError(LDPError):
    """A credential, signature or key file is missing, malformed, expired or does not verify.

    ``reason`` is a short machine-readable cause (``malformed``, ``unknown_authority``, ``bad_signature``,
    ``expired``, ``not_yet_valid``, ``stale``, ``replayed``, ``missing``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def canonical(obj: Any) -> bytes:
    """The canonical JSON of ``obj``: sorted keys, no spaces, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _tagged(tag: bytes, payload: bytes) -> bytes:
    return tag + b"\x00" + payload


def key_id(public_key: bytes) -> str:
    """The id of an authority key: the first 16 hex digits of SHA-256 of its raw 32 bytes."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(text: object, size: int | None, what: str) -> bytes:
    if not isinstance(text, str):
        raise EnrollmentError("malformed", f"{what} must be a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise EnrollmentError("malformed", f"{what} is not valid base64") from None
    if size is not None and len(raw) != size:
        raise EnrollmentError("malformed", f"{what} must be {size} bytes, got {len(raw)}")
    return raw


def _public_raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _private_raw(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())


def verify_signature(public_key: bytes, signature: bytes, tag: bytes, payload: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``tag ‖ 0 ‖ payload`` by ``public_key``."""
    if len(public_key) != 32 or len(signature) != 64:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, _tagged(tag, payload))
    except (InvalidSignature, ValueError):
        return False
    return True


def verify_document(authority_key: bytes, document: Any, signature: bytes) -> bool:
    """Whether ``signature`` is the authority's signature of ``document`` (:meth:`EnrollmentAuthority.sign_document`)."""
    return verify_signature(authority_key, signature, _DOC_TAG, canonical(document))


def _check_device_id(device_id: object) -> str:
    if not isinstance(device_id, str) or not _DEVICE_ID.match(device_id):
        raise EnrollmentError("malformed", "a device id is 1-128 characters from letters, digits, '_', '.', ':', '-'")
    return device_id


# -- credentials --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Credential:
    """The authority's statement "``device_id``'s signing key is ``public_key``", valid from ``issued_at`` to
    ``expires_at`` (unix seconds), signed by the authority whose key id is ``authority``."""

    device_id: str
    public_key: bytes
    issued_at: int
    expires_at: int
    authority: str
    signature: bytes

    def _body(self) -> dict[str, Any]:
        return {
            "v": _VERSION,
            "device_id": self.device_id,
            "public_key": _b64(self.public_key),
            "issued_at": self.issued_at,
            "expires_at": self.expires_at,
            "authority": self.authority,
        }

    def signed_bytes(self) -> bytes:
        return canonical(self._body())

    def to_dict(self) -> dict[str, Any]:
        return {**self._body(), "signature": _b64(self.signature)}

    @classmethod
    def from_dict(cls, d: object) -> Credential:
        if not isinstance(d, Mapping) or d.get("v") != _VERSION:
            raise EnrollmentError("malformed", f"a credential is a JSON object with v = {_VERSION}")
        ints = [d.get("issued_at"), d.get("expires_at")]
        if any(isinstance(i, bool) or not isinstance(i, int) for i in ints):
            raise EnrollmentError("malformed", "issued_at and expires_at must be integers (unix seconds)")
        auth = d.get("authority")
        if not isinstance(auth, str) or not re.fullmatch(r"[0-9a-f]{16}", auth):
            raise EnrollmentError("malformed", "authority must be a key id of 16 hex digits")
        return cls(
            _check_device_id(d.get("device_id")),
            _unb64(d.get("public_key"), 32, "public_key"),
            int(ints[0]),  # type: ignore[arg-type]
            int(ints[1]),  # type: ignore[arg-type]
            auth,
            _unb64(d.get("signature"), 64, "signature"),
        )

    def to_header(self) -> str:
        """base64url (unpadded) of the credential's canonical JSON: one HTTP header value."""
        return base64.urlsafe_b64encode(canonical(self.to_dict())).rstrip(b"=").decode("ascii")

    @classmethod
    def from_header(cls, value: str) -> Credential:
        if not isinstance(value, str) or len(value) > 4096:
            raise EnrollmentError("malformed", "the credential header is missing or too long")
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            obj = json.loads(raw)
        except (binascii.Error, ValueError):
            raise EnrollmentError("malformed", "the credential header is not base64url of JSON") from None
        return cls.from_dict(obj)

    def verify(self, authority_keys: Iterable[bytes], now: float | None = None) -> None:
        """Raise :class:`EnrollmentError` unless one of ``authority_keys`` signed this credential and it is valid
        at ``now`` (default: the wall clock)."""
        keys = {key_id(k): k for k in authority_keys}
        k = keys.get(self.authority)
        if k is None:
            raise EnrollmentError(
                "unknown_authority", f"the credential of {self.device_id!r} is not from a known authority"
            )
        if not verify_signature(k, self.signature, _CRED_TAG, self.signed_bytes()):
            raise EnrollmentError("bad_signature", f"the credential of {self.device_id!r} does not verify")
        t = time.time() if now is None else now
        if t < self.issued_at - 300:
            raise EnrollmentError("not_yet_valid", f"the credential of {self.device_id!r} is not valid yet")
        if t >= self.expires_at:
            raise EnrollmentError("expired", f"the credential of {self.device_id!r} expired; enroll the device again")


# -- the authority ------------------------------------------------------------------------------
class EnrollmentAuthority:
    """The operator's signing key (keep it offline; see the module docstring)."""

    def __init__(self, private_key: bytes) -> None:
        if len(private_key) != 32:
            raise EnrollmentError("malformed", "an Ed25519 private key is 32 bytes")
        self._key = Ed25519PrivateKey.from_private_bytes(private_key)
        self.public_key = _public_raw(self._key.public_key())
        self.key_id = key_id(self.public_key)

    @classmethod
    def generate(cls, random_bytes: Callable[[int], bytes] = os.urandom) -> EnrollmentAuthority:
        return cls(random_bytes(32))

    def certify(
        self,
        device_id: str,
        device_public_key: bytes,
        *,
        lifetime: float = _DEFAULT_LIFETIME,
        now: float | None = None,
    ) -> Credential:
        """A credential for a device that made its own key and sent only ``device_public_key``."""
        _check_device_id(device_id)
        if len(device_public_key) != 32:
            raise EnrollmentError("malformed", "a device public key is 32 raw bytes (Ed25519)")
        if not (math.isfinite(lifetime) and lifetime > 0):
            raise EnrollmentError("malformed", f"lifetime must be a positive number of seconds, got {lifetime!r}")
        t = int(time.time() if now is None else now)
        unsigned = Credential(device_id, bytes(device_public_key), t, t + int(lifetime), self.key_id, bytes(64))
        sig = self._key.sign(_tagged(_CRED_TAG, unsigned.signed_bytes()))
        return dataclasses.replace(unsigned, signature=sig)

    def enroll(
        self,
        device_id: str,
        *,
        lifetime: float = _DEFAULT_LIFETIME,
        now: float | None = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> DeviceIdentity:
        """Mint a device key and its credential (for tests, the demo, and operators who provision devices)."""
        key = Ed25519PrivateKey.from_private_bytes(random_bytes(32))
        cred = self.certify(device_id, _public_raw(key.public_key()), lifetime=lifetime, now=now)
        return DeviceIdentity(_private_raw(key), cred, self.public_key)

    def sign_document(self, document: Any) -> bytes:
        """The authority's signature of a JSON document (devices check it with :func:`verify_document`)."""
        return self._key.sign(_tagged(_DOC_TAG, canonical(document)))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key file (JSON, mode 0600)."""
        obj = {"kind": "ldp-enrollment-authority", "v": _VERSION, "private_key": _b64(_private_raw(self._key))}
        write_atomic(path, canonical(obj), mode=0o600)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EnrollmentAuthority:
        obj = _read_json(path, "ldp-enrollment-authority", "authority key file")
        return cls(_unb64(obj.get("private_key"), 32, "private_key"))


def _read_json(path: str | os.PathLike[str], kind: str, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(Path(path).read_text())
    except OSError as exc:
        raise EnrollmentError("missing", f"cannot read the {what} {os.fspath(path)!r}: {exc.strerror or exc}") from None
    except ValueError:
        raise EnrollmentError("malformed", f"the {what} {os.fspath(path)!r} is not JSON") from None
    if not isinstance(obj, dict) or obj.get("kind") != kind or obj.get("v") != _VERSION:
        raise EnrollmentError("malformed", f"{os.fspath(path)!r} is not an {kind} file of version {_VERSION}")
    return obj


# -- a device -----------------------------------------------------------------------------------
class DeviceIdentity:
    """A device's signing key, its credential and the authority's public key."""

    def __init__(self, private_key: bytes, credential: Credential, authority_key: bytes) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(private_key)
        if _public_raw(self._key.public_key()) != credential.public_key:
            raise EnrollmentError("malformed", "the credential is for another key than this device's")
        if len(authority_key) != 32 or key_id(authority_key) != credential.authority:
            raise EnrollmentError("malformed", "the authority key does not match the credential's authority")
        self.credential = credential
        self.authority_key = bytes(authority_key)

    @property
    def device_id(self) -> str:
        return self.credential.device_id

    def sign(self, tag: bytes, payload: bytes) -> bytes:
        """Ed25519 signature of ``tag ‖ 0 ‖ payload`` (each protocol has its own tag)."""
        return self._key.sign(_tagged(tag, payload))

    def sign_request(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        *,
        now: float | None = None,
        nonce: str | None = None,
    ) -> dict[str, str]:
        """The two headers that authenticate one HTTP request (``target``: path and query as sent)."""
        ts = int(time.time() if now is None else now)
        n = os.urandom(16).hex() if nonce is None else nonce
        sig = self.sign(_REQ_TAG, _request_payload(method, target, ts, n, body))
        return {CREDENTIAL_HEADER: self.credential.to_header(), SIGNATURE_HEADER: f"ts={ts};nonce={n};sig={_b64(sig)}"}

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "ldp-device-identity",
            "v": _VERSION,
            "private_key": _b64(_private_raw(self._key)),
            "credential": self.credential.to_dict(),
            "authority_key": _b64(self.authority_key),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceIdentity:
        if d.get("kind") != "ldp-device-identity" or d.get("v") != _VERSION:
            raise EnrollmentError("malformed", f"not an ldp-device-identity bundle of version {_VERSION}")
        return cls(
            _unb64(d.get("private_key"), 32, "private_key"),
            Credential.from_dict(d.get("credential")),
            _unb64(d.get("authority_key"), 32, "authority_key"),
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the bundle (JSON, mode 0600): the device's private key is in it."""
        write_atomic(path, canonical(self.to_dict()), mode=0o600)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DeviceIdentity:
        return cls.from_dict(_read_json(path, "ldp-device-identity", "device identity"))


def _request_payload(method: str, target: str, ts: int, nonce: str, body: bytes) -> bytes:
    return canonical([method.upper(), target, ts, nonce, hashlib.sha256(body).hexdigest()])


# -- verifying requests -------------------------------------------------------------------------
class RequestVerifier:
    """Checks the headers of :meth:`DeviceIdentity.sign_request` (a collector's or an issuer's side).

    A request is accepted when its credential verifies under one of the authority keys, its timestamp is
    within ``max_skew`` seconds of the verifier's clock, its nonce was not seen within that window (kept in
    memory, at most ``max_nonces``; a verifier that forgot a nonce still refuses anything older than the
    window) and the signature covers the method, target and body."""

    def __init__(
        self,
        authority_keys: Iterable[bytes] = (),
        *,
        max_skew: float = 300.0,
        max_nonces: int = 1 << 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.authority_keys = list(authority_keys)
        self.max_skew = max_skew
        self.max_nonces = max_nonces
        self.clock = clock
        self._nonces: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._lock = threading.Lock()

    def verify(
        self,
        method: str,
        target: str,
        body: bytes,
        headers: Mapping[str, str],
        authority_keys: Iterable[bytes] | None = None,
    ) -> Credential:
        """The verified credential of the request's sender, or :class:`EnrollmentError`."""
        lower = {k.lower(): v for k, v in headers.items()}
        cred_h, sig_h = lower.get(CREDENTIAL_HEADER.lower()), lower.get(SIGNATURE_HEADER.lower())
        if not cred_h or not sig_h:
            raise EnrollmentError(
                "missing",
                f"this request needs the {CREDENTIAL_HEADER} and {SIGNATURE_HEADER} headers of an enrolled device",
            )
        cred = Credential.from_header(cred_h)
        now = self.clock()
        cred.verify(self.authority_keys if authority_keys is None else authority_keys, now)
        parts = dict(p.split("=", 1) for p in sig_h.split(";") if "=" in p)
        ts_s, nonce, sig_s = parts.get("ts", ""), parts.get("nonce", ""), parts.get("sig", "")
        if not ts_s.isdigit() or not re.fullmatch(r"[0-9a-f]{32}", nonce):
            raise EnrollmentError(
                "malformed", f"{SIGNATURE_HEADER} must be ts=<unix seconds>;nonce=<32 hex>;sig=<base64>"
            )
        ts = int(ts_s)
        if abs(now - ts) > self.max_skew:
            raise EnrollmentError("stale", f"the request was signed at {ts}, more than {self.max_skew:g} s from now")
        sig = _unb64(sig_s, 64, "sig")
        if not verify_signature(cred.public_key, sig, _REQ_TAG, _request_payload(method, target, ts, nonce, body)):
            raise EnrollmentError("bad_signature", "the request's signature does not verify")
        key = f"{cred.device_id}/{nonce}"
        with self._lock:
            while self._nonces and (
                len(self._nonces) >= self.max_nonces or next(iter(self._nonces.values())) < now - 2 * self.max_skew
            ):
                self._nonces.popitem(last=False)
            if key in self._nonces:
                raise EnrollmentError("replayed", "this signed request was already received")
            self._nonces[key] = now
        return cred
