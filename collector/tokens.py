"""The collector's side of anonymous upload tokens (``--require-tokens``): verify, then spend once.

:class:`TokenVerifier` checks an ``Authorization: PrivateToken token=...`` header against the issuer's day
keys (the JSON files of the issuer's ``public`` folder, :mod:`collector.issuer`; re-read when a token names a
key not seen yet, at most every ``reload_interval`` seconds): the token's key must be **today's** (UTC, the
collector's clock), its challenge must bind today and this collector's name, and its authenticator must be the
issuer's RSASSA-PSS signature. :class:`SpentTokens` records each redeemed token, atomically across workers.

Answers (``{"error", "message"}``): 401 ``token_missing``, ``token_malformed``, ``token_unknown_key``,
``token_expired`` (a key of another day), ``token_wrong_challenge`` (another collector or day),
``token_bad_signature``; 409 ``token_spent`` (redeemed before with another batch).

**Retries.** A device retries an upload with the same batch id and the same token until it gets an answer; a
token is therefore recorded *with the batch id it paid for*: the same token with the same batch id again is a
retry (the dedup store then answers it), with any other batch id it is a double spend (409). The record is
written before the batch is published, so a spend is never lost to a crash between the two; a batch refused
after that (say 503) is retried with its token.

**The store.** ``spent(digest, batch_id, day)`` in SQLite (WAL) beside the dedup store; the digest is SHA-256
of the token; one ``INSERT ... ON CONFLICT DO NOTHING`` decides, so two workers (processes) that receive the
same token at once cannot both accept it. Rows are purged once their day is two days old (a token is good on
its own day only).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ldp_core.days import day_of_iso, iso_day, utc_iso_day
from ldp_core.tokens import blind_rsa
from ldp_core.tokens import privacy_pass as tokens

__all__ = ["TokenRejected", "TokenVerifier", "SpentTokens", "DEFAULT_SPENT_PATH"]

DEFAULT_SPENT_PATH = "ldp-data/collector-spent-tokens.sqlite3"


class TokenRejected(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class TokenVerifier:
    def __init__(
        self,
        keys_dir: str | os.PathLike[str],
        *,
        issuer_name: str,
        origin: str,
        clock: Callable[[], float] = time.time,
        reload_interval: float = 2.0,
    ) -> None:
        self.dir = Path(keys_dir)
        if not self.dir.is_dir():
            raise ValueError(
                f"the token key folder {os.fspath(keys_dir)!r} does not exist (the issuer's public folder)"
            )
        self.issuer_name, self.origin, self.clock = issuer_name, origin, clock
        self.reload_interval = reload_interval
        self._keys: dict[bytes, tuple[str, blind_rsa.PublicKey]] = {}
        self._loaded = -1e18
        self._lock = threading.Lock()
        self._digests: dict[str, bytes] = {}
        self._reload()

    def _reload(self) -> None:
        keys: dict[bytes, tuple[str, blind_rsa.PublicKey]] = {}
        for p in sorted(self.dir.glob("token-key-*.json")):
            try:
                d = json.loads(p.read_text())
                pk = blind_rsa.PublicKey.from_der(base64.b64decode(d["public_key"], validate=True))
                keys[pk.key_id()] = (tokens.check_day(d["day"]), pk)
            except (OSError, ValueError, KeyError, TypeError, binascii.Error, blind_rsa.BlindRSAError):
                continue  # a file being written, or not a key: the next reload sees it
        self._keys = keys
        self._loaded = time.monotonic()

    def _key(self, key_id: bytes) -> tuple[str, blind_rsa.PublicKey] | None:
        with self._lock:
            hit = self._keys.get(key_id)
            if hit is None and time.monotonic() - self._loaded >= self.reload_interval:
                self._reload()
                hit = self._keys.get(key_id)
            return hit

    def _digest(self, day: str) -> bytes:
        d = self._digests.get(day)
        if d is None:
            d = tokens.challenge_digest(self.issuer_name, day, self.origin)
            self._digests = {day: d}
        return d

    def verify(self, authorization: str | None) -> tuple[bytes, str]:
        """``(sha256 of the token, its day)``, or :class:`TokenRejected` (401)."""
        try:
            raw = tokens.parse_authorization(authorization)
            tok = tokens.Token.from_bytes(raw)
        except tokens.TokenError as exc:
            raise TokenRejected(
                401, "token_missing" if exc.reason == "missing" else "token_malformed", str(exc)
            ) from None
        hit = self._key(tok.token_key_id)
        if hit is None:
            raise TokenRejected(401, "token_unknown_key", "the token's key is not one of the issuer's day keys")
        day, pk = hit
        today = utc_iso_day(self.clock())
        if day != today:
            raise TokenRejected(
                401, "token_expired", f"the token is for {day}; this collector takes tokens of {today} (UTC) only"
            )
        if tok.challenge_digest != self._digest(today):
            raise TokenRejected(
                401, "token_wrong_challenge", f"the token was made for another collector or day than {self.origin!r}"
            )
        if not tok.verify(pk):
            raise TokenRejected(401, "token_bad_signature", "the token's signature does not verify")
        return hashlib.sha256(raw).digest(), day


class SpentTokens:
    """Redeemed tokens (see the module docstring); ``path`` may be ``":memory:"`` for tests."""

    def __init__(self, path: str | os.PathLike[str], *, keep_days: int = 2) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        self.keep_days = keep_days
        self._conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        if self.path != ":memory:":
            self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS spent(digest BLOB PRIMARY KEY, batch_id BLOB NOT NULL, day TEXT NOT NULL)"
            " WITHOUT ROWID"
        )
        self._purged_for = ""

    def spend(self, digest: bytes, batch_id: bytes, day: str) -> bool:
        """True if the token is new (now recorded) or a retry for the same ``batch_id``; False if it was spent on
        another batch. One statement decides, so this is atomic across processes sharing the file."""
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO spent(digest, batch_id, day) VALUES (?, ?, ?) ON CONFLICT(digest) DO NOTHING",
                (digest, batch_id, day),
            )
            if cur.rowcount == 1:
                if self._purged_for != day:
                    cutoff = iso_day(day_of_iso(day) - self.keep_days)
                    self._conn.execute("DELETE FROM spent WHERE day < ?", (cutoff,))
                    self._purged_for = day
                return True
            row = self._conn.execute("SELECT batch_id FROM spent WHERE digest = ?", (digest,)).fetchone()
        return row is not None and bytes(row[0]) == batch_id

    def close(self) -> None:
        with self._lock:
            self._conn.close()
