"""Anonymous upload tokens: Privacy Pass publicly verifiable tokens (RFC 9578 §6, token type 0x0002).

A token lets a device upload one batch of one UTC metric-day without saying who it is. The issuer
(:mod:`collector.issuer`) authenticates the device (its enrollment credential) and blind-signs up to K
tokens per device per key day; it never sees the token it signs (:mod:`ldp_core.tokens.blind_rsa`). The collector
verifies a token with the issuer's public key only and refuses one spent before.

Formats (RFC 9578 §6, with the choices of this project)
------------------------------------------------------
* ``token = token_type (2, 0x0002) ‖ nonce (32) ‖ challenge_digest (32) ‖ token_key_id (32) ‖
  authenticator (Nk = 256)``; the authenticator is the RSABSSA-SHA384-PSS-**Deterministic** signature
  (RFC 9474, salt 48) of the first 98 bytes, the *token input*; the device's 32-byte random nonce makes
  the input unique, as RFC 9578 §6.5 prescribes (hence no randomized preparation).
* ``token_key_id`` = SHA-256 of the issuer key's SubjectPublicKeyInfo in the ``id-RSASSA-PSS`` form
  (parameters SHA-384, MGF1-SHA-384, salt 48; RFC 9578 §6.5, :meth:`ldp_core.tokens.blind_rsa.PublicKey.key_id`),
  which is also the encoding the issuer publishes; checked against RFC 9578 Appendix A.2's vector.
* ``challenge_digest`` = SHA-256 of the TokenChallenge (RFC 9577 §2.1): ``token_type ‖ u16-length ‖
  issuer_name ‖ u8-length ‖ redemption_context ‖ u16-length ‖ origin_info`` with
  ``redemption_context = SHA-256("ldp-token-day-v1" ‖ 0 ‖ day)`` (32 bytes) and ``origin_info`` = the
  collector's name. **The choice:** the challenge binds a UTC day D and the collector, and D's tokens are
  signed with D's key only (:func:`day_key_name`, one key per day): a token pays for batches of metric-day D
  at one collector, and the issuer signs D's tokens while D is today or yesterday, at most K per device and D
  (so one install has at most K tokens, K x r reports, for any one metric-day). The challenge is public and
  the same for every device: it carries nothing that could link a redemption to an issuance.
* Key consistency: :class:`IssuerClient` checks the issuer's key of D against the collector's (and mirrors')
  ``GET /v1/token-keys`` and the key the device pinned for D (:class:`KeyPins`) before it asks for tokens.
* A token request (RFC 9578 §6.1): ``token_type ‖ truncated_token_key_id (1 byte: the last byte of
  token_key_id, as §6.1 says; the Appendix A.2 vector carries the first byte instead, see docs/TOKENS.md) ‖
  blinded_msg (Nk)``; the response (§6.2) is the blind signature (Nk bytes).
* On an upload the token goes in ``Authorization: PrivateToken token=<base64url>`` (RFC 9577 §2.2).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import os
import re
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ldp_core.days import utc_iso_day
from ldp_core.errors import LDPError
from ldp_core.tokens import blind_rsa
from ldp_core.tokens.enrollment import DeviceIdentity

__all__ = [
    "TokenError",
    "TOKEN_TYPE",
    "NONCE_LEN",
    "Token",
    "PendingToken",
    "challenge_digest",
    "token_input",
    "begin",
    "finish",
    "parse_authorization",
    "parse_token_request",
    "authorization_header",
    "day_key_name",
    "public_key_entry",
    "KeyPins",
    "IssuerClient",
]

TOKEN_TYPE = 0x0002
NONCE_LEN = 32
_HEADER_LEN = 2 + NONCE_LEN + 32 + 32
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class TokenError(LDPError, ValueError):
    """A token, token request or header is malformed; ``reason`` is a short machine-readable cause."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_day(day: str) -> str:
    if not isinstance(day, str) or not _DAY.match(day):
        raise TokenError("malformed", f"a day is YYYY-MM-DD (UTC), got {day!r}")
    return day


def day_key_name(day: str) -> str:
    """The file stem of the issuer key that signs the tokens of ``day``."""
    return f"token-key-{check_day(day)}"


def challenge_digest(issuer_name: str, day: str, origin: str) -> bytes:
    """SHA-256 of the TokenChallenge binding ``day`` (UTC) and the collector ``origin`` (module docstring)."""
    issuer = issuer_name.encode()
    origin_b = origin.encode()
    if not 1 <= len(issuer) < 1 << 16 or len(origin_b) >= 1 << 16:
        raise TokenError("malformed", "the issuer name must be 1-65535 bytes and the origin at most 65535")
    context = hashlib.sha256(b"ldp-token-day-v1\x00" + check_day(day).encode()).digest()
    challenge = (
        struct.pack(">HH", TOKEN_TYPE, len(issuer))
        + issuer
        + bytes([len(context)])
        + context
        + struct.pack(">H", len(origin_b))
        + origin_b
    )
    return hashlib.sha256(challenge).digest()


def public_key_entry(day: str, pk: blind_rsa.PublicKey) -> dict[str, str]:
    """One ``keys`` entry of a token-key document (the issuer's and the collector's ``GET /v1/token-keys``, the
    issuer's ``public/`` files): ``public_key`` is the RFC 9578 §6.5 encoding (``id-RSASSA-PSS``
    SubjectPublicKeyInfo, base64), whose SHA-256 is ``token_key_id``."""
    return {
        "day": check_day(day),
        "token_key_id": pk.key_id().hex(),
        "public_key": base64.b64encode(pk.to_pss_spki()).decode(),
    }


def token_input(nonce: bytes, digest: bytes, key_id: bytes) -> bytes:
    return struct.pack(">H", TOKEN_TYPE) + nonce + digest + key_id


@dataclasses.dataclass(frozen=True)
class Token:
    """A finalized token (:meth:`to_bytes` is what the collector receives)."""

    nonce: bytes
    challenge_digest: bytes
    token_key_id: bytes
    authenticator: bytes

    def to_bytes(self) -> bytes:
        return token_input(self.nonce, self.challenge_digest, self.token_key_id) + self.authenticator

    @property
    def signed_part(self) -> bytes:
        return token_input(self.nonce, self.challenge_digest, self.token_key_id)

    @classmethod
    def from_bytes(cls, raw: bytes, nk: int = 256) -> Token:
        if len(raw) != _HEADER_LEN + nk:
            raise TokenError("malformed", f"a token is {_HEADER_LEN + nk} bytes, got {len(raw)}")
        (ttype,) = struct.unpack(">H", raw[:2])
        if ttype != TOKEN_TYPE:
            raise TokenError("malformed", f"token type {ttype:#06x} is not {TOKEN_TYPE:#06x} (blind RSA)")
        return cls(raw[2:34], raw[34:66], raw[66:98], raw[98:])

    def verify(self, pk: blind_rsa.PublicKey) -> bool:
        """Whether the authenticator is the issuer's signature of the token input (``pk``: the token's key)."""
        return blind_rsa.verify(pk, self.signed_part, self.authenticator)


@dataclasses.dataclass(frozen=True)
class PendingToken:
    """What the device keeps between the request and the issuer's answer (``inv`` is secret)."""

    day: str
    nonce: bytes
    challenge_digest: bytes
    token_key_id: bytes
    inv: bytes
    request: bytes  # the token request sent to the issuer


def begin(
    pk: blind_rsa.PublicKey,
    *,
    issuer_name: str,
    origin: str,
    day: str,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> PendingToken:
    """A fresh token request for ``day`` under the issuer's day key ``pk``."""
    nonce = random_bytes(NONCE_LEN)
    digest = challenge_digest(issuer_name, day, origin)
    key_id = pk.key_id()
    blinded, inv = blind_rsa.blind(pk, token_input(nonce, digest, key_id), random_bytes=random_bytes)
    request = struct.pack(">HB", TOKEN_TYPE, key_id[-1]) + blinded
    return PendingToken(day, nonce, digest, key_id, inv, request)


def finish(pk: blind_rsa.PublicKey, pending: PendingToken, blind_sig: bytes) -> Token:
    """The token from the issuer's blind signature (:class:`~ldp_core.tokens.blind_rsa.BlindRSAError` if it does not
    verify: an issuer that signed something else, or with another key, is caught here)."""
    msg = token_input(pending.nonce, pending.challenge_digest, pending.token_key_id)
    sig = blind_rsa.finalize(pk, msg, blind_sig, pending.inv)
    return Token(pending.nonce, pending.challenge_digest, pending.token_key_id, sig)


def parse_token_request(raw: bytes, nk: int = 256) -> tuple[int, bytes]:
    """``(truncated_token_key_id, blinded_msg)`` of a token request."""
    if len(raw) != 3 + nk:
        raise TokenError("malformed", f"a token request is {3 + nk} bytes, got {len(raw)}")
    ttype, truncated = struct.unpack(">HB", raw[:3])
    if ttype != TOKEN_TYPE:
        raise TokenError("malformed", f"token type {ttype:#06x} is not {TOKEN_TYPE:#06x}")
    return truncated, raw[3:]


def authorization_header(token: Token | bytes) -> str:
    raw = token.to_bytes() if isinstance(token, Token) else token
    return "PrivateToken token=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def parse_authorization(value: str | None) -> bytes:
    """The raw token of an ``Authorization: PrivateToken token=...`` header (:class:`TokenError` ``missing`` /
    ``malformed``)."""
    if not value:
        raise TokenError("missing", "this collector requires a token: send Authorization: PrivateToken token=...")
    scheme, _, params = value.strip().partition(" ")
    if scheme.lower() != "privatetoken":
        raise TokenError("malformed", "the Authorization scheme must be PrivateToken")
    fields = dict(p.strip().split("=", 1) for p in params.split(",") if "=" in p)
    b64 = fields.get("token", "").strip().strip('"')
    if not b64 or len(b64) > 1024:
        raise TokenError("malformed", "the PrivateToken header has no token= parameter")
    try:
        return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
    except (binascii.Error, ValueError):
        raise TokenError("malformed", "the token is not base64url") from None


# -- the device's side of issuance ----------------------------------------------------------------
class KeyPins(Protocol):
    """Where a device keeps the token key it accepted for each day (the SDK's durable store)."""

    def pinned(self, day: str) -> tuple[str, str] | None:
        """``(token_key_id hex, public_key base64)`` pinned for ``day``, if any."""

    def pin(self, day: str, token_key_id: str, public_key: str) -> None:
        """Remember the key of ``day`` (called once it passed every check)."""


def _day_entry(doc: Any, day: str, source: str) -> tuple[str, bytes] | None:
    """``(token_key_id, public key DER)`` of ``day`` in a token-key document, None if it lists no key of that
    day; :class:`TokenError` ``inconsistent_key`` if it lists several (a consistent source lists one a day)."""
    try:
        found = [(str(e["token_key_id"]), base64.b64decode(e["public_key"])) for e in doc["keys"] if e["day"] == day]
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise TokenError("refused", f"{source} did not serve a token-key document") from None
    if len(set(found)) > 1:
        raise TokenError("inconsistent_key", f"{source} lists {len(set(found))} keys for {day}")
    return found[0] if found else None


class IssuerClient:
    """Fetches tokens from ``ldp issuer`` at ``base_url`` as the enrolled device ``identity`` (urllib).

    **Key consistency** (docs/TOKENS.md): before asking for tokens of a day, the key the issuer names for it
    must be the one every URL of ``key_sources`` lists for that day (the collector's ``GET /v1/token-keys``, and
    mirrors), same ``token_key_id`` and same public key bytes, and the one ``pins`` holds for that day if it
    holds one; it is then pinned. Otherwise :class:`TokenError` ``inconsistent_key`` and no request is sent.

    :meth:`fetch` raises :class:`TokenError` with reason ``limit`` (the device's K tokens of that day are
    issued; ``retry_after`` seconds to the next day), ``unavailable`` (the issuer or a key source cannot be
    reached or failed), ``inconsistent_key``, ``unauthenticated`` or ``refused`` (any other answer)."""

    def __init__(
        self,
        base_url: str,
        identity: DeviceIdentity,
        *,
        origin: str,
        timeout: float = 10.0,
        random_bytes: Callable[[int], bytes] = os.urandom,
        clock: Callable[[], float] | None = None,
        key_sources: Sequence[str] = (),
        pins: KeyPins | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.clock = clock  # the time the requests are signed at (default: now); for tests
        self.identity, self.origin, self.timeout, self.random_bytes = identity, origin, timeout, random_bytes
        self.key_sources, self.pins = tuple(key_sources), pins
        self.retry_after = 0.0

    def _call(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
        url = path if "://" in path else self.base_url + path
        req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                err = json.loads(exc.read())
            except ValueError:
                err = {}
            reason = {401: "unauthenticated", 429: "limit"}.get(
                exc.code, "refused" if exc.code < 500 else "unavailable"
            )
            self.retry_after = float(exc.headers.get("Retry-After") or 0)
            raise TokenError(reason, f"{url} answered {exc.code}: {err.get('message', '')}") from None
        except (OSError, ValueError) as exc:
            raise TokenError("unavailable", f"{url} cannot be reached: {exc}") from None

    def check_key(self, issuer_doc: Any, day: str) -> blind_rsa.PublicKey:
        """The issuer's key of ``day`` once it agrees with every key source and the pin (class docstring)."""
        entry = _day_entry(issuer_doc, day, "the issuer")
        if entry is None:
            raise TokenError("refused", f"the issuer has no key for {day}")
        kid, der = entry
        pk = blind_rsa.PublicKey.from_der(der)
        if pk.key_id().hex() != kid:
            raise TokenError("refused", "the issuer's key does not match its key id")
        for url in self.key_sources:
            seen = _day_entry(self._call("GET", url), day, url)
            if seen != entry:
                raise TokenError(
                    "inconsistent_key",
                    f"the issuer's key of {day} ({kid[:16]}...) is not the one {url} lists"
                    f" ({seen[0][:16] + '...' if seen else 'none'}): no token is requested under it",
                )
        public = base64.b64encode(der).decode()
        if self.pins is not None:
            pinned = self.pins.pinned(day)
            if pinned is not None and (pinned[0], base64.b64decode(pinned[1])) != entry:
                raise TokenError(
                    "inconsistent_key",
                    f"the issuer's key of {day} differs from the one this device pinned for that day",
                )
            if pinned is None:
                self.pins.pin(day, kid, public)
        return pk

    def fetch(self, n: int, *, day: str | None = None) -> list[Token]:
        """Up to ``n`` tokens of ``day`` (default: today by the device's clock; the issuer also signs for
        yesterday), fewer when the device's K of that day runs out."""
        keys = self._call("GET", "/v1/token-keys")
        want = check_day(day if day is not None else utc_iso_day(self.clock() if self.clock else time.time()))
        issuer_name = keys["issuer_name"]
        pk = self.check_key(keys, want)
        pending = [
            begin(pk, issuer_name=issuer_name, origin=self.origin, day=want, random_bytes=self.random_bytes)
            for _ in range(max(1, min(n, int(keys["tokens_per_day"]))))
        ]
        body = json.dumps(
            {"day": want, "requests": [base64.urlsafe_b64encode(p.request).rstrip(b"=").decode() for p in pending]}
        ).encode()
        path = "/v1/token-requests"
        headers = {
            "Content-Type": "application/json",
            **self.identity.sign_request("POST", path, body, now=self.clock() if self.clock else None),
        }
        got = self._call("POST", path, body, headers)
        sigs = [base64.urlsafe_b64decode(s + "=" * (-len(s) % 4)) for s in got["blind_sigs"]]
        return [finish(pk, p, s) for p, s in zip(pending, sigs, strict=False)]
