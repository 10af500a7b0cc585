"""The SDK's stock of anonymous upload tokens (docs/TOKENS.md, "The SDK side").

The wallet keeps finalized tokens in the SDK store (table ``tokens``), fetches more from ``ldp issuer`` when
the stock runs low, and hands the uploader one per batch. Everything here runs on the uploader thread:
``record()`` never waits for a token.

* **A token pays for the metric-day of its key.** Each row carries the UTC day D its token is for, and a batch
  of day D takes a token of D only (the collector refuses another day's: 401 ``token_wrong_day``).
  :meth:`TokenWallet.token_for` binds a free token of the batch's day to the batch id (column ``batch_id``) and
  returns the same token on every retry of that batch, so a retry is answered ``duplicate`` by the collector
  instead of spending a second token. :meth:`settle` deletes it once the batch is delivered or dropped;
  :meth:`discard` deletes a token the collector refused (the batch then takes another).
* **Grace.** The issuer signs D's tokens and the collector takes them while D is today or yesterday: a batch
  of yesterday is still paid (with a token of yesterday, fetched on demand). Rows older than yesterday are
  deleted (counted ``tokens_expired``); a batch older than yesterday can no longer be paid
  (:meth:`too_late`) and the uploader drops it (counted ``upload_rejected_batches``).
* **Key consistency.** Before a token request, the issuer's key of D must be the one the collector's
  ``GET /v1/token-keys`` (and every ``token_key_mirrors`` URL) lists for D, and the one pinned for D in the
  store's ``token_key_pins`` table if one is; it is then pinned
  (:class:`~ldp_core.tokens.privacy_pass.IssuerClient`). A refusal counts ``token_key_inconsistent`` and
  nothing is requested under that key.
* **Refill** asks for ``stock - held`` tokens of today when fewer than ``low_water`` are free; a failure
  (issuer down, 429 ``token_limit``, an inconsistent key) sets :attr:`next_fetch` (backoff, or the issuer's
  ``Retry-After``), and the uploader waits until then instead of uploading without a token.
"""

from __future__ import annotations

import random
import secrets
import sqlite3
import time
from collections.abc import Callable

from client_sdk.store import Store
from client_sdk.upload.backoff import BackoffPolicy
from ldp_core.days import iso_day, utc_day
from ldp_core.tokens.privacy_pass import IssuerClient, TokenError, authorization_header

__all__ = ["TokenWallet", "StoreKeyPins"]


class StoreKeyPins:
    """The token key a device accepted for each day, in the SDK store (``token_key_pins``): a later different
    key for a pinned day is refused (:class:`~ldp_core.tokens.privacy_pass.KeyPins`)."""

    def __init__(self, store: Store, *, keep_days: int = 7) -> None:
        self.store, self.keep_days = store, keep_days

    def pinned(self, day: str) -> tuple[str, str] | None:
        row = (
            self.store.connection()
            .execute("SELECT token_key_id, public_key FROM token_key_pins WHERE day = ?", (day,))
            .fetchone()
        )
        return None if row is None else (str(row[0]), str(row[1]))

    def pin(self, day: str, token_key_id: str, public_key: str) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO token_key_pins (day, token_key_id, public_key, pinned) VALUES (?, ?, ?, ?)",
                (day, token_key_id, public_key, time.time()),
            )
            conn.execute("DELETE FROM token_key_pins WHERE day < date(?, ?)", (day, f"-{self.keep_days} days"))


class TokenWallet:
    """Durable token stock in ``store``, refilled from ``issuer`` (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        issuer: IssuerClient,
        *,
        stock: int = 16,
        low_water: int | None = None,
        clock: Callable[[], float] = time.time,
        backoff: BackoffPolicy | None = None,
        jitter_rng: random.Random | None = None,
    ) -> None:
        if stock < 1:
            raise ValueError(f"the token stock must be at least 1, got {stock}")
        self.store, self.issuer, self.stock, self.clock = store, issuer, int(stock), clock
        if issuer.pins is None:
            issuer.pins = StoreKeyPins(store)
        self.backoff = backoff if backoff is not None else BackoffPolicy()
        self.low_water = max(1, min(self.stock, low_water if low_water is not None else max(1, self.stock // 4)))
        self._rng = jitter_rng if jitter_rng is not None else secrets.SystemRandom()
        self._failures = 0
        #: No issuer request before this clock time (backoff after a failure, or the issuer's Retry-After).
        self.next_fetch = 0.0
        self.last_error: str | None = None
        #: Tallies since the last :meth:`take_tallies` (the client adds them to its own).
        self.tallies: dict[str, int] = {}

    def _bump(self, name: str, n: int = 1) -> None:
        if n:
            self.tallies[name] = self.tallies.get(name, 0) + n

    def take_tallies(self) -> dict[str, int]:
        out, self.tallies = self.tallies, {}
        return out

    def _days(self) -> tuple[str, str]:
        """``(yesterday, today)`` by the wallet's clock: the days whose tokens can be had and spent."""
        today = utc_day(self.clock())
        return iso_day(today - 1), iso_day(today)

    def payable(self, day: str) -> bool:
        """Whether a batch of ``day`` can be paid now: its day is today or yesterday (grace)."""
        return day in self._days()

    def too_late(self, day: str) -> bool:
        """Whether a batch of ``day`` can never be paid: its day is older than yesterday. (A batch dated after
        today, after the clock went back, waits instead.)"""
        return day < self._days()[0]

    def _expire_in(self, conn: sqlite3.Connection, oldest: str) -> None:
        n = conn.execute("DELETE FROM tokens WHERE day < ?", (oldest,)).rowcount
        self._bump("tokens_expired", max(0, n))

    def available(self, day: str | None = None) -> int:
        """Free tokens of ``day`` (default today)."""
        day = day if day is not None else self._days()[1]
        row = (
            self.store.connection()
            .execute("SELECT COUNT(*) FROM tokens WHERE day = ? AND batch_id IS NULL", (day,))
            .fetchone()
        )
        return int(row[0])

    def refill(self, *, force: bool = False, day: str | None = None) -> bool:
        """Fetch tokens of ``day`` (default today; yesterday for a late batch) if its free stock is below the
        low-water mark (and no backoff holds). ``True`` if the wallet then has a free token of that day."""
        now = self.clock()
        yesterday, today = self._days()
        day = day if day is not None else today
        if day not in (yesterday, today):
            return False
        conn = self.store.connection()
        if conn.execute("SELECT 1 FROM tokens WHERE day < ? LIMIT 1", (yesterday,)).fetchone() is not None:
            with self.store.transaction(conn):  # only at a day boundary: the usual call takes no write lock
                self._expire_in(conn, yesterday)
        free = self.available(day)
        if (free >= self.low_water and not force) or now < self.next_fetch:
            return free > 0
        held = int(conn.execute("SELECT COUNT(*) FROM tokens WHERE day = ?", (day,)).fetchone()[0])
        want = max(1, self.stock - held) if day == today else self.low_water  # a late day needs only a few
        try:
            got = self.issuer.fetch(want, day=day)
        except (TokenError, KeyError, TypeError, ValueError) as exc:
            self._failures += 1
            self._bump("token_fetch_failed")
            if isinstance(exc, TokenError) and exc.reason == "inconsistent_key":
                self._bump("token_key_inconsistent")
            self.last_error = str(exc)
            retry = self.issuer.retry_after if isinstance(exc, TokenError) and exc.reason == "limit" else None
            self.next_fetch = self.clock() + self.backoff.delay(self._failures, self._rng, retry or None)
            return free > 0
        self._failures, self.next_fetch, self.last_error = 0, 0.0, None
        with self.store.transaction(conn):
            conn.executemany(
                "INSERT OR IGNORE INTO tokens (token, day, batch_id, fetched) VALUES (?, ?, NULL, ?)",
                [(t.to_bytes(), day, now) for t in got],
            )
        self._bump("tokens_fetched", len(got))
        return free + len(got) > 0

    def token_for(self, batch_id: bytes, day: str | None = None) -> str | None:
        """The ``Authorization`` header for ``batch_id`` of metric-day ``day`` (default today): its token if it
        has one, else a free one of that day bound to it now; ``None`` when there is none (the caller waits)."""
        yesterday, today = self._days()
        day = day if day is not None else today
        conn = self.store.connection()
        with self.store.transaction(conn):
            self._expire_in(conn, yesterday)
            row = conn.execute("SELECT token, day FROM tokens WHERE batch_id = ?", (batch_id,)).fetchone()
            if row is not None and row[1] != day:  # bound before under another day (an older SDK): free it
                conn.execute("UPDATE tokens SET batch_id = NULL WHERE batch_id = ?", (batch_id,))
                row = None
            if row is None:
                row = conn.execute(
                    "SELECT token, day FROM tokens WHERE day = ? AND batch_id IS NULL ORDER BY fetched LIMIT 1", (day,)
                ).fetchone()
                if row is None:
                    return None
                conn.execute("UPDATE tokens SET batch_id = ? WHERE token = ?", (batch_id, row[0]))
        return authorization_header(bytes(row[0]))

    def settle(self, batch_id: bytes) -> None:
        """The batch was delivered or dropped: its token is spent."""
        with self.store.transaction(durable=False) as conn:
            conn.execute("DELETE FROM tokens WHERE batch_id = ?", (batch_id,))

    def discard(self, batch_id: bytes) -> None:
        """The collector refused the batch's token (401 ``token_*``, 409 ``token_spent``): drop it, so the
        batch's retry takes another."""
        with self.store.transaction() as conn:
            n = conn.execute("DELETE FROM tokens WHERE batch_id = ?", (batch_id,)).rowcount
        self._bump("tokens_refused", max(0, n))
