"""The collector's side of anonymous upload tokens (``--require-tokens``): verify, then spend once.

:class:`TokenVerifier` checks an ``Authorization: PrivateToken token=...`` header against the issuer's day
keys (the JSON files of the issuer's ``public`` folder, :mod:`collector.issuer`; re-read when a token names a
key not seen yet, at most every ``reload_interval`` seconds):

* **One key per day.** A day for which the folder holds more than one key is refused whole: none of its keys
  is accepted (logged once per day, counted ``ldp_collector_token_key_days_refused_total``). A consistent
  issuer writes one key a day; several would let it tell devices apart by the key it gave each
  (docs/TOKENS.md, "Key consistency"). :meth:`TokenVerifier.key_document` is what ``GET /v1/token-keys``
  serves: exactly the keys this collector accepts, one per day, so a device can check the issuer's against it.
* **Grace.** The token's key must be of today or yesterday (UTC, the collector's clock), else 401
  ``token_expired``; its challenge must bind that key's day and this collector's name, and its authenticator
  must be the issuer's RSASSA-PSS signature.
* **A token pays for the metric-day of its key.** :meth:`TokenVerifier.check_day` (after the batch is
  decoded) refuses a batch whose day is not the token's key day: 401 ``token_wrong_day``. With the issuer's
  K per (device, key day) this bounds one install's reports in one metric-day by K x r.

:class:`SpentTokens` records each redeemed token, atomically across workers and collector processes that
share its file.

Answers (``{"error", "message"}``): 401 ``token_missing``, ``token_malformed``, ``token_unknown_key`` (also a
key of a day refused for having several keys), ``token_expired`` (a key older than yesterday),
``token_wrong_challenge`` (another collector or day), ``token_bad_signature``, ``token_wrong_day`` (the batch's
day is not the token's); 409 ``token_spent`` (redeemed before with another batch).

**Retries.** A device retries an upload with the same batch id and the same token until it gets an answer; a
token is therefore recorded *with the batch id it paid for*: the same token with the same batch id again is a
retry (the dedup store then answers it), with any other batch id it is a double spend (409). The record is
written before the batch is published, so a spend is never lost to a crash between the two; a batch refused
after that (say 503) is retried with its token.

**The store.** :class:`SpentTokens` (:mod:`collector.spent_tokens`), SQLite (WAL) beside the dedup store,
keyed by the token's SHA-256: the spends of the uploads of one turn of the event loop are decided in one
write transaction, so two workers or two collector processes that receive the same token at once cannot both
accept it, **provided they share the file on one host** (SQLite's locking is not safe over network file
systems; docs/COLLECTOR.md, "Several collectors"). A token day's records are dropped once it is three days old
(a token is good on its own day and the next).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from collector.spent_tokens import SpentTokens
from ldp_core.days import day_of_iso, iso_day, utc_day
from ldp_core.tokens import blind_rsa
from ldp_core.tokens import privacy_pass as tokens

__all__ = ["TokenRejected", "TokenVerifier", "SpentTokens", "DEFAULT_SPENT_PATH"]

log = logging.getLogger("ldp.collector.tokens")

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
        on_refused_day: Callable[[str, int], None] | None = None,
    ) -> None:
        self.dir = Path(keys_dir)
        if not self.dir.is_dir():
            raise ValueError(
                f"the token key folder {os.fspath(keys_dir)!r} does not exist (the issuer's public folder)"
            )
        self.issuer_name, self.origin, self.clock = issuer_name, origin, clock
        self.reload_interval = reload_interval
        #: called once per day refused for having ``n`` keys (the app counts it)
        self.on_refused_day = on_refused_day
        self._keys: dict[bytes, tuple[str, blind_rsa.PublicKey]] = {}
        self._by_day: dict[str, blind_rsa.PublicKey] = {}
        #: days whose folder holds several keys: none of them is accepted
        self.refused_days: dict[str, int] = {}
        self._loaded = -1e18
        self._lock = threading.Lock()
        self._digests: dict[str, bytes] = {}
        self._reload()

    def _reload(self) -> None:
        per_day: dict[str, dict[bytes, blind_rsa.PublicKey]] = {}
        for p in sorted(self.dir.glob("token-key-*.json")):
            try:
                d = json.loads(p.read_text())
                pk = blind_rsa.PublicKey.from_der(base64.b64decode(d["public_key"], validate=True))
                per_day.setdefault(tokens.check_day(d["day"]), {})[pk.key_id()] = pk
            except (OSError, ValueError, KeyError, TypeError, binascii.Error, blind_rsa.BlindRSAError):
                continue  # a file being written, or not a key: the next reload sees it
        keys: dict[bytes, tuple[str, blind_rsa.PublicKey]] = {}
        by_day: dict[str, blind_rsa.PublicKey] = {}
        for day, found in per_day.items():
            if len(found) > 1:
                if day not in self.refused_days:
                    self.refused_days[day] = len(found)
                    log.error(
                        "the token key folder holds %d keys for %s: no token of that day is accepted "
                        "(a consistent issuer writes one key a day)",
                        len(found),
                        day,
                    )
                    if self.on_refused_day is not None:
                        self.on_refused_day(day, len(found))
                continue
            ((kid, pk),) = found.items()
            keys[kid] = (day, pk)
            by_day[day] = pk
        self._keys, self._by_day = keys, by_day
        self._loaded = time.monotonic()

    def _fresh(self, interval: float | None = None) -> None:
        if time.monotonic() - self._loaded >= (self.reload_interval if interval is None else interval):
            self._reload()

    def _key(self, key_id: bytes) -> tuple[str, blind_rsa.PublicKey] | None:
        with self._lock:
            hit = self._keys.get(key_id)
            if hit is None:
                self._fresh()
                hit = self._keys.get(key_id)
            return hit

    def accepted_days(self) -> tuple[str, str]:
        """``(yesterday, today)`` by the collector's clock: the key days whose tokens it takes."""
        today = utc_day(self.clock())
        return iso_day(today - 1), iso_day(today)

    def key_document(self, tokens_per_day: int | None = None) -> dict[str, object]:
        """What ``GET /v1/token-keys`` serves: the keys this collector accepts, one per day (the issuer's
        document's shape, :func:`ldp_core.tokens.privacy_pass.public_key_entry`)."""
        days = self.accepted_days()
        with self._lock:
            if any(d not in self._by_day and d not in self.refused_days for d in days):
                # the issuer may have written it since: a device asks us right after the issuer made it
                self._fresh(min(self.reload_interval, 0.1))
            entries = [tokens.public_key_entry(d, self._by_day[d]) for d in days if d in self._by_day]
        return {"issuer_name": self.issuer_name, "tokens_per_day": tokens_per_day, "keys": entries}

    def _digest(self, day: str) -> bytes:
        d = self._digests.get(day)
        if d is None:
            d = tokens.challenge_digest(self.issuer_name, day, self.origin)
            if len(self._digests) > 4:
                self._digests = {}
            self._digests[day] = d
        return d

    def verify(self, authorization: str | None) -> tuple[bytes, str]:
        """``(sha256 of the token, its key day)``, or :class:`TokenRejected` (401)."""
        try:
            raw = tokens.parse_authorization(authorization)
            tok = tokens.Token.from_bytes(raw)
        except tokens.TokenError as exc:
            raise TokenRejected(
                401, "token_missing" if exc.reason == "missing" else "token_malformed", str(exc)
            ) from None
        hit = self._key(tok.token_key_id)
        if hit is None:
            raise TokenRejected(
                401, "token_unknown_key", "the token's key is not one this collector lists (GET /v1/token-keys)"
            )
        day, pk = hit
        yesterday, today = self.accepted_days()
        if day not in (yesterday, today):
            raise TokenRejected(
                401,
                "token_expired",
                f"the token is for {day}; this collector takes tokens of {yesterday} and {today} (UTC) only",
            )
        if tok.challenge_digest != self._digest(day):
            raise TokenRejected(
                401, "token_wrong_challenge", f"the token was made for another collector or day than {self.origin!r}"
            )
        if not tok.verify(pk):
            raise TokenRejected(401, "token_bad_signature", "the token's signature does not verify")
        return hashlib.sha256(raw).digest(), day

    @staticmethod
    def check_day(token_day: str, batch_day: int) -> None:
        """A token pays for the metric-day of its key: 401 ``token_wrong_day`` if ``batch_day`` (days since
        1970-01-01) is another."""
        if day_of_iso(token_day) != batch_day:
            raise TokenRejected(
                401,
                "token_wrong_day",
                f"the batch is for {iso_day(batch_day)} and needs a token of that day; this token is for {token_day}",
            )
