"""The uploader: sends outbox batches to the collector over HTTP.

Protocol (what the collector implements):

* ``POST {collector}/v1/reports`` with one binary frame
  (:mod:`ldp_core.wire.frames`) as the body, ``Content-Type:
  application/vnd.ldp.frame`` (:data:`~ldp_core.wire.frames.FRAME_CONTENT_TYPE`) and ``Idempotency-Key`` the batch id in hex
  (the id is also inside the frame). The collector answers ``202`` once it
  has durably accepted the batch, and answers a batch id it has already
  accepted with ``202`` (or ``409``) without counting it again.
* ``GET {collector}/v1/metrics`` returns the metrics document
  (:mod:`ldp_core.metrics`).

Nothing else travels: no device id, no cookie, no timestamp; the
``User-Agent`` is the same for every device.

**Outcomes.** 2xx and 409: delivered, the batch is deleted. 408, 429 and
5xx, a network error or a timeout: transient, the batch keeps its id and
frame and is retried later. Any other 4xx: permanent, the batch is dropped
and counted (``upload_rejected_batches`` / ``_reports``). Other statuses
(redirects) are treated as transient, so data is not lost to a
misconfiguration that can be fixed.

**Backoff.** After the k-th consecutive transient failure (k = 1, 2, ...)
the uploader waits ``U(0, min(max_delay, base * 2**k))`` seconds: "full
jitter" exponential backoff (Brooker, "Exponential Backoff and Jitter", AWS
Architecture Blog, 2015), which spreads a fleet's retries after an outage.
A ``Retry-After`` header (seconds or an HTTP date, RFC 9110 Sec. 10.2.3) on
a 503 or 429 is honored: the wait is at least what the server asked, plus
up to 10 % jitter, capped at ``max_delay``. Jitter is drawn from the OS
CSPRNG (``secrets.SystemRandom``). The wait is stored with the batch, so a
restarted app does not hammer a collector that asked it to wait.

**Tokens** (with a :class:`~client_sdk.upload.token_wallet.TokenWallet`, for a collector run with
``--require-tokens``; docs/TOKENS.md). Each batch is sent with ``Authorization: PrivateToken token=...``,
the same token on every retry of the batch, a token of the batch's own metric-day (today's or yesterday's; a
batch older than yesterday can no longer be paid and is dropped, counted ``upload_rejected_batches``).
Without a token of its day the batch is not sent: it goes back to
the outbox and the uploader waits until the wallet may fetch again (counted ``tokens_exhausted``, not an
upload failure). A 401 whose error is ``token_*`` or a 409 ``token_spent`` drops the token, not the batch:
the batch is retried with another token.

**HTTP transport.** :data:`HttpTransport` is one function, ``HttpRequest ->
HttpResponse``, raising :class:`OSError` on network failures. The default
uses ``urllib``; tests and other runtimes plug in their own. The FL device
(:class:`client_sdk.fl.device.FLDevice`) sends through the same function,
with the same :class:`BackoffPolicy` and :func:`parse_retry_after`.
"""

from __future__ import annotations

import dataclasses
import email.utils
import http.client
import random
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

from client_sdk.outbox import Outbox, PendingBatch
from client_sdk.upload.backoff import BackoffPolicy
from ldp_core.days import iso_day
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, read_header

if TYPE_CHECKING:
    from client_sdk.upload.token_wallet import TokenWallet

__all__ = [
    "HttpRequest",
    "HttpResponse",
    "HttpTransport",
    "urllib_transport",
    "BackoffPolicy",
    "Uploader",
    "UploadResult",
    "parse_retry_after",
    "FRAME_CONTENT_TYPE",
    "USER_AGENT",
]

USER_AGENT = "ldp-telemetry-sdk/1"


@dataclasses.dataclass(frozen=True)
class HttpRequest:
    method: str
    url: str
    body: bytes | None
    headers: Mapping[str, str]
    timeout: float


@dataclasses.dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for k, v in self.headers.items():
            if k.lower() == lname:
                return v
        return None


#: The SDK's HTTP function: one request in, its response out; :class:`OSError` on a network failure.
HttpTransport = Callable[[HttpRequest], HttpResponse]


def urllib_transport(request: HttpRequest) -> HttpResponse:
    """The default transport (``urllib.request``); HTTP errors become responses,
    network failures raise :class:`OSError`."""
    req = urllib.request.Request(request.url, data=request.body, method=request.method, headers=dict(request.headers))
    try:
        with urllib.request.urlopen(req, timeout=request.timeout) as resp:
            return HttpResponse(resp.status, dict(resp.headers.items()), resp.read())
    except urllib.error.HTTPError as exc:
        body = b""
        try:
            body = exc.read()
        except (OSError, http.client.HTTPException):
            pass
        return HttpResponse(exc.code, dict(exc.headers.items()) if exc.headers else {}, body)
    except http.client.HTTPException as exc:  # malformed response, connection dropped mid-reply
        raise OSError(f"HTTP error: {exc!r}") from exc


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


UploadResult = Literal["idle", "delivered", "rejected", "retry", "no_token"]


def _token_refusal(resp: HttpResponse) -> bool:
    """Whether a 401/409 answer refuses the token (``token_*`` error), not the batch."""
    if resp.status not in (401, 409):
        return False
    try:
        import json

        err = json.loads(resp.body or b"{}").get("error", "")
    except (ValueError, AttributeError):
        return resp.status == 401
    return isinstance(err, str) and err.startswith("token_")


class Uploader:
    """Moves batches from an :class:`Outbox` to the collector, one at a time."""

    def __init__(
        self,
        outbox: Outbox,
        collector_url: str,
        *,
        transport: HttpTransport = urllib_transport,
        batch_size: int = 500,
        max_age: float = 3600.0,
        timeout: float = 30.0,
        backoff: BackoffPolicy = BackoffPolicy(),
        clock: Callable[[], float] = time.time,
        jitter_rng: random.Random | None = None,
        wallet: TokenWallet | None = None,
    ) -> None:
        if not 1 <= batch_size <= 1 << 20:
            raise ValueError(f"batch_size must be between 1 and {1 << 20}, got {batch_size}")
        self.outbox = outbox
        self.reports_url = collector_url.rstrip("/") + "/v1/reports"
        self.transport = transport
        self.batch_size = int(batch_size)
        self.max_age = float(max_age)
        self.timeout = float(timeout)
        self.backoff = backoff
        self.clock = clock
        self._rng = jitter_rng if jitter_rng is not None else secrets.SystemRandom()
        self._failures = 0
        #: No attempt before this time (set by transient failures; in memory,
        #: the per-batch wait is also stored in the outbox).
        self.blocked_until = 0.0
        self.last_status: int | None = None
        self.last_error: str | None = None
        self.failures_total = 0
        self.wallet = wallet
        #: Times a batch was held back for want of a token (``tokens_exhausted``).
        self.token_waits = 0

    def _send(self, batch: PendingBatch, authorization: str | None = None) -> HttpResponse:
        headers = {
            "Content-Type": FRAME_CONTENT_TYPE,
            "Idempotency-Key": batch.batch_id.hex(),
            "User-Agent": USER_AGENT,
        }
        if authorization is not None:
            headers["Authorization"] = authorization
        return self.transport(HttpRequest("POST", self.reports_url, batch.frame, headers, self.timeout))

    def _deliver(self, batch: PendingBatch) -> UploadResult:
        """Send one claimed batch and record the outcome in the outbox."""
        retry_after: float | None = None
        authorization: str | None = None
        if self.wallet is not None:
            day = iso_day(read_header(batch.frame).day)  # a token pays for its key's metric-day only
            if self.wallet.too_late(day):  # older than yesterday: no token of its day can be had any more
                self.outbox.reject(batch.batch_id)
                self.wallet.settle(batch.batch_id)
                self.last_status, self.last_error = None, f"dropped: no token of {day} can be had any more"
                return "rejected"
            authorization = self.wallet.token_for(batch.batch_id, day)
            if authorization is None and self.wallet.refill(force=True, day=day):
                authorization = self.wallet.token_for(batch.batch_id, day)
            if authorization is None:  # no token: the batch waits, it is never sent without one
                self.token_waits += 1
                self.outbox.release([batch.batch_id])
                self.blocked_until = max(self.wallet.next_fetch, self.clock() + 0.05)
                return "no_token"
        try:
            resp = self._send(batch, authorization)
        except (OSError, ValueError) as exc:  # URLError, timeouts, refused connections, bad URL
            self.last_status, self.last_error = None, f"{type(exc).__name__}: {exc}"
        else:
            status = resp.status
            self.last_status = status
            self.last_error = None if status < 300 else resp.body[:200].decode("utf-8", "replace")
            if self.wallet is not None and _token_refusal(resp):
                self.wallet.discard(batch.batch_id)  # the batch is retried below with another token
            elif 200 <= status < 300 or status == 409:
                self._failures = 0
                self.outbox.ack(batch.batch_id)
                if self.wallet is not None:
                    self.wallet.settle(batch.batch_id)
                return "delivered"
            elif 400 <= status < 500 and status not in (408, 429):
                self._failures = 0
                self.outbox.reject(batch.batch_id)
                if self.wallet is not None:
                    self.wallet.settle(batch.batch_id)
                return "rejected"
            if status in (429, 503):
                retry_after = parse_retry_after(resp.header("Retry-After"), self.clock())
        self._failures += 1
        self.failures_total += 1
        wait = self.backoff.delay(self._failures, self._rng, retry_after)
        self.blocked_until = self.clock() + wait
        self.outbox.defer(batch.batch_id, self.blocked_until)
        return "retry"

    def upload_one(self, *, force: bool = False) -> UploadResult:
        """Claim one batch (formed now if ``force``, else only if due) and send it."""
        now = self.clock()
        if now < self.blocked_until:
            return "idle"
        batch = self.outbox.claim(now, batch_size=self.batch_size, max_age=self.max_age, force=force)
        return "idle" if batch is None else self._deliver(batch)

    def upload_all(self, *, force: bool = False, deadline: float | None = None, claim: int = 8) -> UploadResult:
        """Send batches (claimed ``claim`` at a time) until none is due ("idle"), a
        transient failure ("retry") or ``deadline`` (a ``time.monotonic()`` value)."""
        result: UploadResult = "idle"
        while deadline is None or time.monotonic() < deadline:
            now = self.clock()
            if now < self.blocked_until:
                return "retry"
            batches = self.outbox.claim_batches(
                now, batch_size=self.batch_size, max_age=self.max_age, force=force, limit=claim
            )
            if not batches:
                return "idle"
            for i, batch in enumerate(batches):
                result = self._deliver(batch)
                stop = result in ("retry", "no_token")
                if stop or (deadline is not None and time.monotonic() >= deadline):
                    if batches[i + 1 :]:
                        self.outbox.release([b.batch_id for b in batches[i + 1 :]])
                    if stop:
                        return result
                    break
        return result

    def fetch_metrics_document(self, metrics_url: str) -> bytes | None:
        """``GET`` the metrics document; ``None`` on any failure (counted by the caller)."""
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        try:
            resp = self.transport(HttpRequest("GET", metrics_url, None, headers, self.timeout))
        except (OSError, ValueError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None
        if resp.status != 200:
            self.last_status = resp.status
            return None
        return resp.body

    def next_wakeup(self) -> float | None:
        """When there may be work next (a clock time), or ``None`` if the outbox is empty."""
        due = self.outbox.next_due(self.clock(), batch_size=self.batch_size, max_age=self.max_age)
        if due is None:
            return None
        return max(due, self.blocked_until)
