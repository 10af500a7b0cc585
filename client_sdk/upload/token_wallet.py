"""The SDK's stock of anonymous upload tokens (docs/TOKENS.md, "The SDK side").

The wallet keeps finalized tokens in the SDK store (table ``tokens``, schema version 3), fetches more from
``ldp issuer`` when the stock runs low, and hands the uploader one per batch. Everything here runs on the
uploader thread: ``record()`` never waits for a token.

* **One token per batch, kept for its retries.** :meth:`TokenWallet.token_for` binds a free token of today to
  the batch id (column ``batch_id``) and returns the same token on every retry of that batch, so a retry is
  answered ``duplicate`` by the collector instead of spending a second token. :meth:`settle` deletes it once
  the batch is delivered or dropped; :meth:`discard` deletes a token the collector refused (the batch then
  takes another).
* **Tokens are for one UTC day.** Each row carries its day; :meth:`token_for` and :meth:`refill` first delete
  the rows of earlier days (counted ``tokens_expired``), so yesterday's stock is never sent (the collector
  would refuse it, and the batch would be lost to a 401).
* **Refill** asks for ``stock - held`` tokens when fewer than ``low_water`` are free; a failure (issuer down,
  429 ``token_limit``) sets :attr:`next_fetch` (backoff, or the issuer's ``Retry-After``), and the uploader
  waits until then instead of uploading without a token.
"""

from __future__ import annotations

import random
import secrets
import sqlite3
import time
from collections.abc import Callable

from client_sdk.store import Store
from client_sdk.upload.backoff import BackoffPolicy
from ldp_core.days import utc_iso_day
from ldp_core.tokens.privacy_pass import IssuerClient, TokenError, authorization_header

__all__ = ["TokenWallet"]


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

    def _expire_in(self, conn: sqlite3.Connection, today: str) -> None:
        n = conn.execute("DELETE FROM tokens WHERE day < ?", (today,)).rowcount
        self._bump("tokens_expired", max(0, n))

    def available(self) -> int:
        """Free tokens of today."""
        today = utc_iso_day(self.clock())
        row = (
            self.store.connection()
            .execute("SELECT COUNT(*) FROM tokens WHERE day = ? AND batch_id IS NULL", (today,))
            .fetchone()
        )
        return int(row[0])

    def refill(self, *, force: bool = False) -> bool:
        """Fetch tokens if the free stock is below the low-water mark (and no backoff holds). ``True`` if the
        wallet then has a free token of today."""
        now = self.clock()
        today = utc_iso_day(now)
        conn = self.store.connection()
        if conn.execute("SELECT 1 FROM tokens WHERE day < ? LIMIT 1", (today,)).fetchone() is not None:
            with self.store.transaction(conn):  # only at a day boundary: the usual call takes no write lock
                self._expire_in(conn, today)
        free = self.available()
        if (free >= self.low_water and not force) or now < self.next_fetch:
            return free > 0
        held = int(conn.execute("SELECT COUNT(*) FROM tokens WHERE day = ?", (today,)).fetchone()[0])
        want = max(1, self.stock - held)
        try:
            got = self.issuer.fetch(want, day=today)
        except (TokenError, KeyError, TypeError, ValueError) as exc:
            self._failures += 1
            self._bump("token_fetch_failed")
            self.last_error = str(exc)
            retry = self.issuer.retry_after if isinstance(exc, TokenError) and exc.reason == "limit" else None
            self.next_fetch = self.clock() + self.backoff.delay(self._failures, self._rng, retry or None)
            return free > 0
        self._failures, self.next_fetch, self.last_error = 0, 0.0, None
        with self.store.transaction(conn):
            conn.executemany(
                "INSERT OR IGNORE INTO tokens (token, day, batch_id, fetched) VALUES (?, ?, NULL, ?)",
                [(t.to_bytes(), today, now) for t in got],
            )
        self._bump("tokens_fetched", len(got))
        return free + len(got) > 0

    def token_for(self, batch_id: bytes) -> str | None:
        """The ``Authorization`` header for ``batch_id``: its token if it has one of today, else a free one
        bound to it now; ``None`` when there is none (the caller waits)."""
        today = utc_iso_day(self.clock())
        conn = self.store.connection()
        with self.store.transaction(conn):
            self._expire_in(conn, today)
            row = conn.execute("SELECT token FROM tokens WHERE batch_id = ?", (batch_id,)).fetchone()
            if row is None:
                row = conn.execute(
                    "SELECT token FROM tokens WHERE day = ? AND batch_id IS NULL ORDER BY fetched LIMIT 1", (today,)
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
