"""``POST /v1/reports``: one report batch, read, checked, published, answered.

The body is a binary frame (``Content-Type: application/vnd.ldp.frame``,
:data:`ldp_core.wire.frames.FRAME_CONTENT_TYPE`, or the generic
``application/octet-stream``) or the JSON form (``application/json``); see
:mod:`ldp_core.wire.frames`. An optional ``Idempotency-Key`` header must equal
the frame's batch id.

Answers to an upload
--------------------
=====  =======================================================================
202    published durably to ``ldp.reports.raw`` (``"accepted"``), or a batch id
       accepted before with the same records (``"duplicate"``; nothing is published again)
401    with ``--require-tokens`` only: no token, or a bad, expired (older than yesterday's) or unknown one,
       or one of another day than the batch's (``token_*`` reasons, :mod:`collector.tokens`)
409    ``batch_id_conflict``: the batch id was accepted before with other records;
       nothing of this upload is stored (a new batch needs a fresh batch id); ``token_spent``
       (``--require-tokens``): the token paid for another batch before
400    the body is not a valid frame or JSON form (truncated, bad CRC, bad field,
       record outside the spec's bounds, ``Idempotency-Key`` differing from the batch id)
408    ``body_timeout``: the body did not arrive whole within ``body_timeout`` s; ``body_too_slow`` /
       ``evicted``: below ``min_body_rate`` (:mod:`collector.http.bodies`)
413    the body exceeds ``max_body_bytes`` (from ``Content-Length`` or while
       reading) or the batch holds more than ``max_records`` reports
415    another ``Content-Type``
422    a well-formed batch the collector will not take: unknown metric, spec
       other than the metric's, metric expired on the batch's day, day outside
       ``[today - max_day_age, today + max_days_ahead]``, no reports
503    overloaded (more than ``max_reading`` bodies being read, or ``max_in_flight``
       uploads in progress), the transport known to be down (answered at once,
       see :mod:`collector.ingest`) or not acknowledging; ``Retry-After`` says when to retry
=====  =======================================================================

A refusal sent before the whole body was read carries ``Connection: close``.
An upload is admitted (counted against ``max_in_flight``) only once its body
is read, and the body must arrive within ``body_timeout``; large JSON bodies
are decoded in a decode process, large frames on a thread, so that a few
sockets cannot stall the event loop (docs/COLLECTOR.md, "A few sockets
cannot stall it").

Every error body is ``{"error": <reason>, "message": <what is wrong and how to fix it>}``.

What leaves the collector
-------------------------
Only the batch itself: the records are decoded, checked against the
metric's spec, and **re-encoded** into a fresh frame (metric, spec id, day,
batch id, records), keyed ``"<metric>/<day>"``; a frame body whose head is
already the canonical one is that fresh frame byte for byte, and is forwarded
as it is (``_reencoded``). No IP address, port, header,
user agent or arrival time is read into it; uvicorn's access log is off
(``ldp collector``), so client addresses are not logged either. The batch
id is the device's random idempotency key, not linked to the device.
(The transport itself stamps each record with its publish time; that stays
between the collector and the shuffler, which drops it.)

The answer 202 is sent only after the transport acknowledged the batch
(:mod:`collector.ingest`, group commit); the batch id is then recorded in a
durable store (:mod:`collector.dedup`), whose crash window the shuffler closes.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import concurrent.futures.process
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple, cast

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from collector.errors import RejectedBatch, UnavailableError
from collector.http.admission import Admission
from collector.http.answers import AcceptedBody, Answer, ErrorBody, error_parts
from collector.http.bodies import BodyReaders, BodyTimeout
from collector.http.decode import Checked, decode_body, json_to_frame
from collector.http.monitoring import CollectorMetrics
from collector.ingest import Ingestor, Outcome, SettleCall
from collector.settings import CollectorSettings
from collector.tokens import SpentTokens, TokenRejected, TokenVerifier
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, ReportBatch, VerifiedSpecs, encode_frame, frame_head
from pipeline.topics import metric_day_key

__all__ = [
    "FRAME_CONTENT_TYPES",
    "JSON_CONTENT_TYPE",
    "Pending",
    "UploadHandler",
    "add_upload_route",
]

log = logging.getLogger("ldp.collector")

#: Every media type accepted as a binary frame; the first is its name (what the SDK sends).
FRAME_CONTENT_TYPES = (FRAME_CONTENT_TYPE, "application/octet-stream")
JSON_CONTENT_TYPE = "application/json"


def check_length(length: str | None, max_bytes: int) -> None:
    """Refuse a ``Content-Length`` that is not a number or announces more than ``max_bytes``."""
    if length is None:
        return
    if not length.strip().isdigit():
        raise RejectedBatch(400, "malformed", f"Content-Length {length[:40]!r} is not a number")
    if int(length) > max_bytes:
        raise RejectedBatch(
            413,
            "too_large",
            f"the body has {int(length)} bytes; this collector takes at most {max_bytes}: split the batch",
        )


class _PublishTimeout(Exception):
    """The transport did not acknowledge an upload within ``publish_timeout``."""


class _Deadlines:
    """The publish timeout of the uploads waiting on one event loop: each waiter fails with
    :class:`_PublishTimeout` once ``timeout`` seconds passed (at most ``period`` later). Every upload has the
    same timeout, so the deadlines arrive in order: a queue, and one sweep timer while it is not empty, instead
    of a loop timer armed and cancelled per upload (3 % of the loop's time under upload load). A waiter
    answered in time leaves the queue at the next sweep that reaches it."""

    __slots__ = ("timeout", "period", "_queue", "_loop")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.period = max(0.001, min(0.05, timeout / 4))
        self._queue: collections.deque[tuple[float, asyncio.Future[Outcome] | SettleCall]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop a sweep is scheduled on, if any

    def add(self, loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[Outcome] | SettleCall) -> None:
        self._queue.append((loop.time() + self.timeout, waiter))
        if self._loop is not loop:
            self._loop = loop
            loop.call_later(self.period, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not loop:
            return
        queue, now = self._queue, loop.time()
        while queue and (queue[0][1].done() or queue[0][0] <= now):
            _, waiter = queue.popleft()
            if not waiter.done():
                waiter.set_exception(_PublishTimeout())
        if queue:
            loop.call_later(self.period, self._sweep, loop)
        else:
            self._loop = None


def _reencoded(batch: ReportBatch, body: bytes, kind: str) -> bytes:
    """The frame that leaves the collector: ``encode_frame(batch)``. A frame body ``batch`` was decoded from is
    already that frame, byte for byte, when its head (header and metric name) is what ``encode_frame`` writes:
    its records are ``batch``'s records (``decode_frame`` gives a view of the body) and its CRC was checked. Then
    the body itself is forwarded (no copy of the records, no second CRC); else the frame is encoded afresh.
    Every head ``decode_frame`` accepts is canonical today (each header byte is parsed and checked), so the
    second branch guards a future header field that a reader would ignore."""
    if kind == "frame" and type(body) is bytes:
        head = frame_head(batch)
        if body.startswith(head) and len(body) == len(head) + batch.records.nbytes + 4:
            return body
    return encode_frame(batch)


def _hand_over(
    ingestor: Ingestor, batch: ReportBatch, value: bytes, loop: asyncio.AbstractEventLoop, waiter: Any
) -> None:
    """Submit a checked (and, with a token, paid) batch's frame to the ingestor's group commit."""
    ingestor.submit_async(
        batch.batch_id, metric_day_key(batch.metric, batch.day), value, len(batch), batch.metric, loop, waiter
    )


class Pending(NamedTuple):
    """An upload handed to the ingestor: its batch and the future of its outcome (:meth:`UploadHandler.start`)."""

    batch: ReportBatch
    waiter: asyncio.Future[Outcome] | SettleCall


class _Refused(Exception):
    """An upload answered before it was decoded (and already counted)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer[0])
        self.answer = answer


class UploadHandler:
    """One upload (:meth:`__call__`): media type, token, body, admission, decoding and checks, publishing; or,
    for a body the native front read, the same steps after the body without a coroutine (:meth:`start`).

    ``runtime`` is the app's state while it runs: the ``ingestor``, the ``json_decoder`` process pool
    (replaced by ``new_json_decoder()`` when its process dies), and the ``reading`` and ``in_flight``
    counts. ``tokens`` and ``spent`` are given with ``--require-tokens``.
    """

    def __init__(
        self,
        settings: CollectorSettings,
        declared: MetricSet,
        metrics: CollectorMetrics,
        runtime: dict[str, Any],
        *,
        admission: Admission,
        max_records: int,
        new_json_decoder: Callable[[], concurrent.futures.ProcessPoolExecutor],
        tokens: TokenVerifier | None = None,
        spent: SpentTokens | None = None,
    ) -> None:
        self.settings = settings
        self.declared = declared
        self._verified: VerifiedSpecs = {}  # the specs of pre-checked frames, by their fields (decode_body)
        self.metrics = metrics
        self.runtime = runtime
        self.admission = admission
        self.max_records = max_records
        self.new_json_decoder = new_json_decoder
        self.tokens = tokens
        self.spent = spent
        self.deadlines = _Deadlines(settings.publish_timeout)
        #: uploads whose token is to be spent, with what submits them: see _spend_queued
        self._spends: list[tuple[tuple[bytes, str], ReportBatch, bytes, Ingestor, Any, asyncio.AbstractEventLoop]] = []

    async def __call__(
        self,
        ctype: str,
        length: str | None,
        idempotency_key: str | None,
        chunks: AsyncIterator[bytes],
        authorization: str | None = None,
    ) -> Answer:
        """One upload: ``(status, JSON body, extra headers)``.

        The body is read (within ``body_timeout``) before the upload is admitted: a socket that sends a
        partial body holds no ``max_in_flight`` slot, only one of the ``max_reading`` ones, and for at most
        ``body_timeout``. Large bodies are decoded on the decode threads (``offload_*_bytes``)."""
        try:
            kind, offload = self._media_kind(ctype)
            spend = self._verify_token(authorization)
            body = await self._receive(length, chunks)
            ingestor = self._admit()
        except _Refused as refused:
            return refused.answer
        return await self._ingest(ingestor, body, kind, offload, idempotency_key, spend)

    def start(
        self,
        body: bytes,
        ctype: str,
        idempotency_key: str | None,
        authorization: str | None,
        checked: Checked | None = None,
        then: Callable[[Pending], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Answer | Pending | asyncio.Task[Answer]:
        """One upload whose body was read whole by someone else (the native front, :mod:`collector.http.front_bridge`),
        on the event loop, without a coroutine: the same steps as :meth:`__call__` after the body, and

        * an :data:`Answer` when it is answered at once (media type, token, admission, decoding, checks);
        * a :class:`Pending` once submitted to the ingestor: when its ``waiter`` is done, :meth:`finish` gives
          the answer (the upload counts in ``in_flight`` until then); with ``then``, ``then(pending)`` is called
          on the loop as it is done (the waiter is no asyncio future then: nothing to schedule per upload);
        * a task giving the answer, for a body decoded off the event loop (above ``offload_*_bytes``).

        No refusal carries ``Connection: close``: the whole body was read, the connection can be kept.
        ``checked``: the frame's fields if the front's pre-check passed (:func:`collector.http.decode.frame_specs`):
        its header is not parsed again, nor its CRC or records (when it says so) verified a second time.
        ``loop``: the running loop, if the caller has it (``asyncio.get_running_loop`` makes a ``getpid``
        system call on Python 3.11, a few µs per upload in a sandbox such as gVisor)."""
        try:
            kind, offload = self._media_kind(ctype, early=False)
            spend = self._verify_token(authorization, early=False)
            ingestor = self._admit()
        except _Refused as refused:
            return refused.answer
        if len(body) > offload:
            return asyncio.ensure_future(self._ingest(ingestor, body, kind, offload, idempotency_key, spend))
        runtime = self.runtime
        runtime["in_flight"] += 1
        try:
            step = self._begin(ingestor, body, kind, idempotency_key, spend, checked, then, loop)
        except BaseException:
            runtime["in_flight"] -= 1
            raise
        if not isinstance(step, Pending):
            runtime["in_flight"] -= 1
        return step

    def finish(self, pending: Pending) -> Answer:
        """The answer of an upload :meth:`start` submitted, once ``pending.waiter`` is done."""
        self.runtime["in_flight"] -= 1
        return self._settled(pending)

    # -- before the body is decoded ------------------------------------------------------------------

    def _refuse(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        outcome: str = "rejected",
        retry_after: int | None = None,
        early: bool = True,
    ) -> _Refused:
        """Count a refusal and make its answer. ``early``: sent before the whole body was read, the rest of it
        would be taken for the next request on a keep-alive connection, so the connection is closed after it."""
        self.metrics.reject(reason, None, outcome=outcome)
        answer = error_parts(status, reason, message, retry_after)
        if early:
            answer[2].append((b"connection", b"close"))
        return _Refused(answer)

    def _media_kind(self, ctype: str, *, early: bool = True) -> tuple[str, int]:
        """``("frame" or "json", the size from which such a body is decoded off the event loop)``."""
        ctype = ctype.split(";")[0].strip().lower()
        if ctype in FRAME_CONTENT_TYPES:
            return "frame", self.settings.offload_frame_bytes
        if ctype == JSON_CONTENT_TYPE:
            return "json", self.settings.offload_json_bytes
        raise self._refuse(
            415,
            "unsupported_media_type",
            f"Content-Type {ctype[:80] or '(none)'!r} is not accepted; send a binary frame as "
            f"{FRAME_CONTENT_TYPES[0]} or the JSON form as {JSON_CONTENT_TYPE}",
            early=early,
        )

    def _verify_token(self, authorization: str | None, *, early: bool = True) -> tuple[bytes, str] | None:
        """With ``--require-tokens``: a valid token of today or yesterday, checked before the body is read (its
        day is checked against the batch's once decoded, :meth:`_check_token_day`)."""
        if self.tokens is None:
            return None
        try:
            return self.tokens.verify(authorization)
        except TokenRejected as exc:
            raise self._refuse(exc.status, exc.reason, exc.message, early=early) from None

    async def _receive(self, length: str | None, chunks: AsyncIterator[bytes]) -> bytes:
        """The body, read while one of the ``max_reading`` places is held: whole within ``body_timeout`` and
        at ``min_body_rate`` on average after ``body_grace`` (:mod:`collector.http.bodies`)."""
        settings, runtime = self.settings, self.runtime
        readers: BodyReaders = runtime["readers"]
        if not readers.admit():
            raise self._refuse(
                503,
                "overloaded",
                f"more than {settings.max_reading} request bodies are being read; retry later",
                outcome="unavailable",
                retry_after=settings.retry_after,
            )
        runtime["reading"] += 1  # the gauge is set from this when /metrics is read (not on every upload)
        try:
            check_length(length, settings.max_body_bytes)
            return await readers.read(chunks, settings.max_body_bytes)
        except RejectedBatch as exc:
            raise self._refuse(exc.status, exc.reason, exc.message) from None
        except BodyTimeout as exc:
            raise self._refuse(408, exc.reason, self._slow_message(exc.reason)) from None
        except ClientDisconnect:
            raise self._refuse(
                400, "client_disconnected", "the client closed the connection before the body ended", early=False
            ) from None
        finally:
            runtime["reading"] -= 1

    def _slow_message(self, reason: str) -> str:
        s = self.settings
        if reason == "body_timeout":
            return f"the body did not arrive within {s.body_timeout:g} s of the request's headers; send it at once"
        rate = f"{s.min_body_rate:g} bytes/s on average after the first {s.body_grace:g} s"
        if reason == "evicted":
            return f"the body arrived at less than {rate} and its reading place went to another upload"
        return f"the body arrived at less than {rate}; send it at once"

    def _admit(self) -> Ingestor:
        """The ingestor, once the body is here: unless ``max_in_flight`` uploads are in progress or the
        transport is known to be down."""
        settings = self.settings
        if self.runtime["in_flight"] >= settings.max_in_flight:
            raise self._refuse(
                503,
                "overloaded",
                f"more than {settings.max_in_flight} uploads are in progress; retry later",
                outcome="unavailable",
                retry_after=settings.retry_after,
                early=False,
            )
        ingestor: Ingestor = self.runtime["ingestor"]
        down = ingestor.down
        if down is not None:
            raise self._refuse(
                503,
                "transport_unavailable",
                f"the transport is unavailable ({down}); retry later",
                outcome="unavailable",
                retry_after=settings.retry_after,
                early=False,
            )
        return ingestor

    # -- decoding, checks, publishing ------------------------------------------------------------------

    def prepare(
        self, body: bytes, kind: str, key: str | None, checked: Checked | None = None
    ) -> tuple[ReportBatch, bytes | RejectedBatch]:
        """Decode, check and re-encode one body (on the event loop, or on a decode thread for large ones):
        the batch and its new frame, or the batch and why it is refused (its reports are counted). ``checked``:
        a frame's fields as the native front's pre-check gave them (ignored for another kind of body)."""
        if kind != "frame":
            checked = None
        batch = decode_body(body, kind, self.declared, self.max_records, checked, self._verified)
        try:
            self.admission.check(batch, key, checked is not None and checked[7])  # [7]: records (key ids) checked
        except RejectedBatch as exc:
            return batch, exc
        if checked is not None and type(body) is bytes:
            return batch, body  # the front checked every header field and the length: the frame is canonical
        return batch, _reencoded(batch, body, kind)

    async def _json_in_process(self, body: bytes) -> bytes:
        """A large JSON body as a frame, converted in a decode process (a thread would hold this process's
        interpreter lock while the rows are decoded in Python, and every other upload would wait for it)."""
        runtime = self.runtime
        try:
            frame = await asyncio.get_running_loop().run_in_executor(runtime["json_decoder"], json_to_frame, body)
        except concurrent.futures.process.BrokenProcessPool:
            # the decode process died (killed, out of memory): a new pool for the next upload
            log.error("the JSON decode process died; starting a new one")
            runtime["json_decoder"].shutdown(wait=False)
            runtime["json_decoder"] = self.new_json_decoder()
            raise UnavailableError(
                "internal", "the collector's decode process failed; retry later", self.settings.retry_after
            ) from None
        if isinstance(frame, tuple):
            raise RejectedBatch(*frame)
        return frame

    async def _prepare_off_loop(
        self, body: bytes, kind: str, key: str | None
    ) -> tuple[ReportBatch, bytes | RejectedBatch]:
        """:meth:`prepare` off the event loop, for a body larger than its ``offload_*_bytes`` (large frames decode
        in numpy, on a thread; JSON rows in a decode process)."""
        if kind == "json":
            return self.prepare(await self._json_in_process(body), "frame", key)
        return await asyncio.get_running_loop().run_in_executor(None, self.prepare, body, kind, key)

    def _check_token_day(self, spend: tuple[bytes, str] | None, batch: ReportBatch) -> None:
        """With ``--require-tokens``: a token pays for the metric-day of its key only."""
        if spend is not None and self.tokens is not None:
            try:
                self.tokens.check_day(spend[1], batch.day)
            except TokenRejected as exc:
                raise RejectedBatch(exc.status, exc.reason, exc.message) from None

    def _submit(
        self,
        ingestor: Ingestor,
        batch: ReportBatch,
        value: bytes | RejectedBatch,
        spend: tuple[bytes, str] | None,
        then: Callable[[Pending], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Answer | Pending:
        """A prepared batch: refused (:meth:`prepare`'s checks, the token's day), or its new frame handed to the
        ingestor (group commit), with the publish deadline; with a token, once the token is spent (the tokens of
        one turn of the loop are spent together, :meth:`_spend_queued`; a token spent on another batch settles
        the upload with 409 ``token_spent``). ``then``: called with the :class:`Pending` once its waiter is done
        (the waiter is then a :class:`~collector.ingest.SettleCall`, not a future)."""
        try:
            if isinstance(value, RejectedBatch):
                raise value
            self._check_token_day(spend, batch)
        except RejectedBatch as exc:
            return self._failure(exc, batch)
        if loop is None:
            loop = asyncio.get_running_loop()
        call = SettleCall(then) if then is not None else None
        waiter: Any = call if call is not None else loop.create_future()
        if spend is not None and self.spent is not None:
            if not self._spends:
                loop.call_soon(self._spend_queued)
            self._spends.append((spend, batch, value, ingestor, waiter, loop))
        else:
            _hand_over(ingestor, batch, value, loop, waiter)
        # failing ``waiter`` at its deadline is harmless: the ingestor hands out a future of the caller's own
        self.deadlines.add(loop, waiter)
        pending = Pending(batch, waiter)
        if call is not None:
            call.arg = pending  # settled on a later iteration of the loop at the earliest
        return pending

    def _spend_queued(self) -> None:
        """On the loop: spend the tokens of the uploads :meth:`_submit` queued since the last call, in one
        transaction of the spent-token store, and hand the uploads whose token was new (or a retry of the same
        batch) to the ingestor; the others are refused 409 ``token_spent``."""
        queued, self._spends = self._spends, []
        live = [q for q in queued if not q[4].done()]  # (a waiter failed at its deadline meanwhile)
        if not live or self.spent is None:
            return
        try:
            verdicts = self.spent.spend_many([(spend[0], batch.batch_id, spend[1]) for spend, batch, *_ in live])
        except Exception as exc:  # the store failed: nothing of these uploads was published
            log.exception("the spent-token store failed")
            for q in live:
                q[4].set_exception(exc)
            return
        for (_, batch, value, ingestor, waiter, loop), ok in zip(live, verdicts, strict=True):
            if not ok:
                waiter.set_exception(
                    RejectedBatch(409, "token_spent", "this token was redeemed before (for another batch)")
                )
                continue
            _hand_over(ingestor, batch, value, loop, waiter)

    def _begin(
        self,
        ingestor: Ingestor,
        body: bytes,
        kind: str,
        key: str | None,
        spend: tuple[bytes, str] | None,
        checked: Checked | None = None,
        then: Callable[[Pending], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Answer | Pending:
        """:meth:`prepare` on the event loop, then :meth:`_submit`."""
        try:
            batch, value = self.prepare(body, kind, key, checked)
        except RejectedBatch as exc:
            return self._failure(exc, None)
        return self._submit(ingestor, batch, value, spend, then, loop)

    def _failure(self, exc: RejectedBatch | UnavailableError, batch: ReportBatch | None) -> Answer:
        """Count a refusal of a body that was read (and its reports, once decoded) and make its answer."""
        reports = len(batch) if batch is not None else None
        if isinstance(exc, UnavailableError):
            self.metrics.reject(exc.reason, reports, outcome="unavailable")
            return error_parts(503, exc.reason, exc.message, exc.retry_after)
        self.metrics.reject(exc.reason, reports)
        return error_parts(exc.status, exc.reason, exc.message)

    def _settled(self, pending: Pending) -> Answer:
        """The answer of a submitted upload whose waiter is done: 202 (``accepted`` or ``duplicate``), 409 (its
        batch id taken with other records) or 503 (transport down, not acknowledged in time)."""
        batch, waiter = pending
        exc = waiter.exception()
        if isinstance(exc, _PublishTimeout):
            exc = UnavailableError(
                "timeout",
                f"the transport did not acknowledge the batch within {self.settings.publish_timeout:g} s; retry later",
                self.settings.retry_after,
            )
        if isinstance(exc, RejectedBatch | UnavailableError):
            return self._failure(exc, batch)
        if exc is not None:
            raise exc
        outcome = waiter.result()
        if outcome != "accepted":  # accepted ones were counted with their ids, in the store's transaction
            self.metrics.batches.labels(outcome=outcome, reason="ok").inc()
            self.metrics.reports.labels(outcome=outcome, reason="ok").inc(len(batch))
        return (
            202,
            b'{"status":"%s","batch_id":"%s","reports":%d}'
            % (outcome.encode(), batch.batch_id.hex().encode(), len(batch)),
            [],
        )

    async def _ingest(
        self,
        ingestor: Ingestor,
        body: bytes,
        kind: str,
        offload: int,
        key: str | None,
        spend: tuple[bytes, str] | None,
    ) -> Answer:
        """Decode, check and publish an admitted body, counted in ``in_flight`` meanwhile; the answer."""
        runtime = self.runtime
        runtime["in_flight"] += 1  # the gauge is set from this when /metrics is read (not on every upload)
        try:
            if len(body) <= offload:
                step = self._begin(ingestor, body, kind, key, spend)
            else:
                try:
                    batch, value = await self._prepare_off_loop(body, kind, key)
                except (RejectedBatch, UnavailableError) as exc:
                    return self._failure(exc, None)
                step = self._submit(ingestor, batch, value, spend)
            if not isinstance(step, Pending):
                return step
            waiter = cast("asyncio.Future[Outcome]", step.waiter)  # submitted without ``then``: a future
            with contextlib.suppress(Exception):  # the outcome is read from the waiter (_settled)
                await waiter
            return self._settled(step)
        finally:
            runtime["in_flight"] -= 1


_JSON_FORM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["version", "metric", "spec_id", "day", "batch_id", "records"],
    "properties": {
        "version": {"type": "integer", "enum": [1]},
        "metric": {"type": "string", "pattern": "^[A-Za-z0-9_.:\\-]{1,255}$"},
        "spec_id": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
        "day": {"type": "integer", "minimum": 0, "description": "days since 1970-01-01 (UTC)"},
        "batch_id": {"type": "string", "pattern": "^[0-9a-fA-F]{32}$"},
        "records": {
            "type": "array",
            "items": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
        },
    },
}

_REPORTS_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            **{ct: {"schema": {"type": "string", "format": "binary"}} for ct in FRAME_CONTENT_TYPES},
            JSON_CONTENT_TYPE: {"schema": _JSON_FORM_SCHEMA},
        },
    },
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "the batch id in hex (optional)",
        }
    ],
}

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "malformed body"},
    413: {"model": ErrorBody, "description": "body or batch too large"},
    409: {"model": ErrorBody, "description": "batch id accepted before with other records"},
    415: {"model": ErrorBody, "description": "unsupported Content-Type"},
    422: {"model": ErrorBody, "description": "unknown metric, spec mismatch, expired metric or day out of range"},
    503: {"model": ErrorBody, "description": "overloaded or transport unavailable; see Retry-After"},
}


def add_upload_route(app: FastAPI, upload: UploadHandler) -> None:
    """The framework's route for ``POST /v1/reports``: it documents the upload in the OpenAPI schema (the
    collector's ASGI app serves uploads before they reach the framework, with the same handler)."""

    @app.post(
        "/v1/reports",
        status_code=202,
        response_model=AcceptedBody,
        responses=_ERROR_RESPONSES,
        openapi_extra=_REPORTS_OPENAPI,
        summary="Upload one report batch",
    )
    async def post_reports(request: Request) -> Response:
        status, body, extra = await upload(
            request.headers.get("content-type", ""),
            request.headers.get("content-length"),
            request.headers.get("idempotency-key"),
            request.stream(),
            request.headers.get("authorization"),
        )
        return Response(
            body, status_code=status, media_type="application/json", headers={k.decode(): v.decode() for k, v in extra}
        )
