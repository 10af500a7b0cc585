"""Group commit: the collector's publisher threads.

Request handlers hand each validated batch to :class:`Ingestor` and wait on
a future. A publisher thread takes every submission queued so far (up to
``max_group``) and handles them together:

1. ids already in the :class:`~collector.dedup.BatchIdStore`, or repeated
   in the group, are duplicates: they are answered without publishing if
   their content (a digest of the re-encoded frame) is the same, and refused
   with a 409 :class:`~collector.errors.RejectedBatch` if it differs;
2. the rest are published with **one** ``Transport.publish_many`` call,
   which returns once every record is durable (one fsync for the embedded
   log, one flush for Kafka);
3. their ids are recorded in the store (one SQLite transaction), and the
   accepted batches and reports counted in the same transaction (the
   collector's durable counters, :mod:`collector.dedup`);
4. the futures resolve: ``"accepted"`` or ``"duplicate"``, or an
   :class:`~collector.errors.UnavailableError` if the transport failed, in
   which case nothing of the group was acknowledged to anyone.

Batching the durable step is what lets one worker accept thousands of
uploads a second while answering each only after its batch is durable
(the same idea as a database's group commit). ``threads`` publisher threads
(default 2) run group commits concurrently, so the next group travels while
the previous one waits for its acknowledgement (on Kafka the wait, not the
work, dominates). An upload whose batch id is being published by another
group at that moment is not published again: it is answered when that
publish ends (``"duplicate"`` if it succeeded).

**Group commits on the event loop.** A transport with ``publish_nowait``
(Kafka: librdkafka's ``produce`` does not block) needs no publisher thread:
the uploads :meth:`Ingestor.submit_async` collects during one iteration of
the event loop form a group that is committed on the loop itself (steps 1
to 4, the publish handing the records over and returning; the delivery
report of the whole group comes back to the loop once). At most
``threads`` such groups are in flight per loop; what arrives meanwhile
waits and forms the next group. The first group (which creates the topic)
still goes through the threads, and so does everything on the embedded log
(whose fsync blocks) and :meth:`Ingestor.submit`.

**A transport that is down.** A watcher thread probes the transport
(:meth:`Transport.health <pipeline.transport.Transport.health>`) when the
ingestor starts, when a group commit fails, and when one is still running
after ``probe_after`` seconds (a stopped Kafka broker does not fail a
publish: the producer retries for its whole request timeout). While a probe
fails the ingestor is **down** (:attr:`Ingestor.down`): every waiting upload
and every new submission is answered at once with an
:class:`~collector.errors.UnavailableError` (503 with ``Retry-After``),
queued submissions are dropped unpublished, and the transport is probed
every ``probe_interval`` seconds until it answers. A failed publish alone
does not mark the transport down (one bad record, or a broker hiccup, would
otherwise refuse everyone): only the probe decides. An upload answered 503
whose publish was already under way may still be published; its retry
carries the same batch id and is answered ``"duplicate"`` (the store, the
running-publish table or the shuffler's id window catch it), so nothing is
lost and nothing is counted twice. Nothing is answered 202 before the
transport acknowledged it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, NamedTuple

from collector.dedup import BatchIdStore, content_digest, same_content
from collector.errors import RejectedBatch, UnavailableError
from pipeline.prometheus import stored_key
from pipeline.transport import Transport

__all__ = [
    "Ingestor",
    "SettleCall",
    "Outcome",
    "Submission",
    "GroupStats",
    "BATCHES_TOTAL",
    "REPORTS_TOTAL",
    "METRIC_REPORTS_TOTAL",
]

#: the Prometheus families the collector counts (the accepted samples are added here, see ``_commit``)
BATCHES_TOTAL = "ldp_collector_batches_total"
REPORTS_TOTAL = "ldp_collector_reports_total"
METRIC_REPORTS_TOTAL = "ldp_collector_accepted_reports_total"

log = logging.getLogger("ldp.collector")

Outcome = Literal["accepted", "duplicate"]


class _OneShot:
    """An outcome settled once: the part of a future the ingestor and its callers use (``done``, ``cancelled``,
    ``set_result``, ``set_exception``, and ``result`` / ``exception`` once done). Subclasses say what settling
    does (``_finish``) and which error a second settling raises (``_invalid``)."""

    __slots__ = ("_state", "_value")
    _invalid: type[Exception] = concurrent.futures.InvalidStateError

    def __init__(self) -> None:
        self._state = 0  # 0 pending, 1 result, 2 exception
        self._value: Any = None

    def done(self) -> bool:
        return self._state != 0

    def cancelled(self) -> bool:
        return False

    def _finish(self, state: int, value: Any) -> None:
        raise NotImplementedError

    def set_result(self, result: Outcome) -> None:
        self._finish(1, result)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(2, exc)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._state:
            raise self._invalid("the outcome is not settled yet")
        return self._value if self._state == 2 else None

    def result(self, timeout: float | None = None) -> Outcome:
        exc = self.exception()
        if exc is not None:
            raise exc
        return self._value


class _Result(_OneShot):
    """A one-shot outcome resolved by a publisher thread: the part of :class:`concurrent.futures.Future` the
    ingestor uses (:class:`_OneShot`'s, and ``add_done_callback``), without its condition variable, which cost
    more per upload than decoding the frame. Never cancelled; callbacks run on the thread that resolves it (or
    at once if done)."""

    __slots__ = ("_lock", "_callbacks", "_public")

    def __init__(self, public: Any = None) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[Any], object]] = []
        #: the caller's future, settled with the same outcome first (a callback cost four calls per upload)
        self._public = public

    def _finish(self, state: int, value: Any) -> None:
        with self._lock:
            if self._state:
                raise concurrent.futures.InvalidStateError("the outcome is settled already")
            self._state, self._value = state, value
            callbacks, self._callbacks = self._callbacks, []
        if self._public is not None:
            if state == 2:
                _settle(self._public, exc=value)
            else:
                _settle(self._public, value)
        for cb in callbacks:
            _run_callback(cb, self)

    def add_done_callback(self, cb: Callable[[Any], object]) -> None:
        with self._lock:
            if not self._state:
                self._callbacks.append(cb)
                return
        _run_callback(cb, self)


def _called(arg: Any) -> None:
    raise AssertionError("a SettleCall's call was made already")


class SettleCall(_OneShot):
    """The outcome of an upload submitted from an event loop, for a caller that wants a call rather than an
    awaitable (the native front's bridge): the part of :class:`asyncio.Future` the ingestor and the publish
    deadline use (:class:`_OneShot`'s), calling ``fn(arg)`` as soon as it is settled. It is always settled on
    its loop (the loop's :class:`_Outbox` delivers every outcome there, and the deadline's sweep runs there), so
    the call needs no scheduling: an asyncio future would schedule its done callback as one more handle of the
    loop per upload. ``arg`` may be set after submitting (before the loop runs again)."""

    __slots__ = ("fn", "arg")
    _invalid = asyncio.InvalidStateError

    def __init__(self, fn: Callable[[Any], object], arg: Any = None) -> None:
        super().__init__()
        self.fn, self.arg = fn, arg

    def _finish(self, state: int, value: Any) -> None:
        if self._state:
            raise asyncio.InvalidStateError("the outcome is settled already")
        self._state, self._value = state, value
        # called once: let go of both, for ``arg`` (the caller's Pending) holds this object, a cycle per upload
        # that only the cyclic GC reclaimed (about 6 µs per upload behind the native front, issue 31)
        fn, arg, self.fn, self.arg = self.fn, self.arg, _called, None
        try:
            fn(arg)
        except Exception:  # the other outcomes of the delivery must still be delivered
            log.exception("a callback of an upload's outcome failed")


class _Outbox:
    """Outcomes bound for one event loop, handed over in bulk: an outcome put while no delivery is scheduled
    schedules one ``call_soon_threadsafe`` (one write to the loop's wake-up pipe), and every outcome put
    before the loop drains it rides along. A group's outcomes are settled inside :func:`_one_delivery`, which
    schedules the delivery only once all are in: otherwise, on a loaded machine, the loop drained each
    outcome as it arrived (one wake-up and one iteration per upload, seen as 64 answers of the native front
    in 64 ``answer_many`` calls). An outcome settled on the loop's own thread (a group commit on the loop,
    :meth:`Ingestor._commit_on_loop`) does not pass through it: :class:`_LoopWaiter` delivers it at once."""

    __slots__ = ("_loop", "_lock", "_items", "_scheduled", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        #: the loop's thread (an outbox is made on its loop): an outcome settled there is delivered at once
        self.thread = threading.get_ident()
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Future[Outcome], Outcome | None, BaseException | None]] = []
        self._scheduled = False

    def put(self, waiter: asyncio.Future[Outcome], result: Outcome | None, exc: BaseException | None) -> None:
        held: set[_Outbox] | None = getattr(_delivering, "held", None)
        with self._lock:
            self._items.append((waiter, result, exc))
            if self._scheduled:
                return
            if held is not None:
                held.add(self)
                return
            self._scheduled = True
        self._schedule()

    def kick(self) -> None:
        """Schedule the delivery of what was put meanwhile, unless it is scheduled already."""
        with self._lock:
            if self._scheduled or not self._items:
                return
            self._scheduled = True
        self._schedule()

    def _schedule(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody waits any more
            with self._lock:
                self._items.clear()
                self._scheduled = False

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for waiter, result, exc in items:
            _deliver(waiter, result, exc)


#: per thread: the outboxes whose delivery waits for the end of :func:`_one_delivery`
_delivering = threading.local()


@contextlib.contextmanager
def _one_delivery() -> Iterator[None]:
    """The outcomes settled on this thread meanwhile reach each event loop in one delivery, after the block."""
    if getattr(_delivering, "held", None) is not None:  # nested: the outer block delivers
        yield
        return
    held: set[_Outbox] = set()
    _delivering.held = held
    try:
        yield
    finally:
        _delivering.held = None
        for outbox in held:
            outbox.kick()


class _LoopWaiter:
    """The caller's side of an upload submitted from an event loop: settling it (once; a second time raises
    :class:`concurrent.futures.InvalidStateError`, which :func:`_settle` ignores) puts the outcome into the
    loop's :class:`_Outbox` (or, settled on the loop's thread, delivers it at once), without a lock or a
    callback list of its own, and takes it out of the ingestor's set of waiting uploads."""

    __slots__ = ("_outbox", "_waiter", "_waiting", "_sent")

    def __init__(self, outbox: _Outbox, waiter: asyncio.Future[Outcome], waiting: set[Any]) -> None:
        self._outbox, self._waiter, self._waiting, self._sent = outbox, waiter, waiting, False

    def _send(self, result: Outcome | None, exc: BaseException | None) -> None:
        if self._sent:  # the probe and the group commit may both settle it: the first one counts
            raise concurrent.futures.InvalidStateError("the outcome is settled already")
        self._sent = True
        self._waiting.discard(self)
        if threading.get_ident() == self._outbox.thread:  # settled on its loop (a group commit on the loop)
            _deliver(self._waiter, result, exc)
        else:
            self._outbox.put(self._waiter, result, exc)

    def set_result(self, result: Outcome) -> None:
        self._send(result, None)

    def set_exception(self, exc: BaseException) -> None:
        self._send(None, exc)


def _deliver(waiter: asyncio.Future[Outcome], result: Outcome | None, exc: BaseException | None) -> None:
    """On the waiter's loop: the outcome, unless its caller gave up (cancelled it) or timed out."""
    if waiter.done():
        return
    if exc is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(result)  # type: ignore[arg-type]


def _run_callback(cb: Callable[[Any], object], fut: _Result) -> None:
    try:
        cb(fut)
    except Exception:
        log.exception("a callback of an upload's outcome failed")


class Submission(NamedTuple):
    batch_id: bytes
    key: bytes
    value: bytes
    reports: int
    future: Any  # a _Result (or a concurrent.futures.Future): the publish's outcome
    digest: bytes = b""
    metric: str = ""


class GroupStats(NamedTuple):
    """What one group commit did (passed to the ``on_group`` callback)."""

    published: int
    duplicates: int
    failed: int
    seconds: float


def _settle(fut: Any, result: Outcome | None = None, exc: BaseException | None = None) -> None:
    """Resolve ``fut`` unless it is already resolved or cancelled (its waiter gave up): the publish's outcome
    does not depend on anyone still waiting for it."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def _internal_message(exc: BaseException) -> str:
    return f"the collector failed to store the batch ({type(exc).__name__}); retry later"


def _conflict(batch_id: bytes) -> RejectedBatch:
    return RejectedBatch(
        409,
        "batch_id_conflict",
        f"batch id {batch_id.hex()} was already accepted with other records; nothing of this upload "
        "was stored: give a new batch a fresh random batch id",
    )


def _follow(
    done: Any,
    fut: Any,
    same: bool = True,
    batch_id: bytes = b"",
) -> None:
    """Resolve ``fut`` (a retry that arrived while ``done`` was being published) from ``done``'s outcome:
    a duplicate if it carries the same content (``same``), a conflict if the first one was published."""
    exc = done.exception()
    if exc is not None:
        _settle(fut, exc=exc)
    elif same:
        _settle(fut, "duplicate")
    else:
        _settle(fut, exc=_conflict(batch_id))


_ACCEPTED_BATCHES = stored_key(BATCHES_TOTAL, ("accepted", "ok"))
_ACCEPTED_REPORTS = stored_key(REPORTS_TOTAL, ("accepted", "ok"))


@functools.lru_cache(maxsize=1024)
def _metric_key(metric: str) -> str:
    """The stored key of a metric's accepted-reports sample (a JSON encoding per upload cost more than the
    store's lookup; the metrics are few and declared)."""
    return stored_key(METRIC_REPORTS_TOTAL, (metric,))


def _accepted_counts(subs: Iterable[Submission]) -> dict[str, int]:
    """The counter samples (:func:`pipeline.prometheus.stored_key`) of published batches."""
    batches = reports = 0
    per_metric: dict[str, int] = {}
    for s in subs:
        batches += 1
        reports += s.reports
        per_metric[s.metric] = per_metric.get(s.metric, 0) + s.reports
    out = {_ACCEPTED_BATCHES: batches, _ACCEPTED_REPORTS: reports}
    for metric, n in per_metric.items():
        key = _metric_key(metric)
        out[key] = out.get(key, 0) + n
    return out


class Ingestor:
    """Publishes submitted batches to ``topic`` in group commits on ``threads`` background threads."""

    def __init__(
        self,
        transport: Transport,
        topic: str,
        dedup: BatchIdStore,
        *,
        partitions: int,
        max_group: int = 512,
        retry_after: int = 2,
        threads: int = 2,
        on_group: Callable[[GroupStats], None] | None = None,
        probe_after: float = 1.0,
        probe_interval: float = 1.0,
        probe_timeout: float = 2.0,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if not (probe_after > 0 and probe_interval > 0 and probe_timeout > 0):
            raise ValueError("probe_after, probe_interval and probe_timeout must be positive")
        self.probe_after = float(probe_after)
        self.probe_interval = float(probe_interval)
        self.probe_timeout = float(probe_timeout)
        self.threads = int(threads)
        self.transport = transport
        self.topic = topic
        self.dedup = dedup
        self.partitions = int(partitions)
        self.max_group = int(max_group)
        self.retry_after = int(retry_after)
        self.on_group = on_group
        self._queue: deque[Submission] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._topic_ready = False
        self._topic_lock = threading.Lock()
        self._inflight: dict[bytes, Submission] = {}
        self._workers: list[threading.Thread] = []
        #: the last transport failure, ``None`` once a publish succeeds again
        self.last_error: str | None = None
        self._down: str | None = None
        self._waiting: set[Any] = set()  # the futures callers hold, settled if the transport goes down
        self._publishing: dict[int, float] = {}  # publisher thread id -> when its publish started (monotonic)
        self._wake = threading.Event()
        self._probe_soon = False
        self._next_probe = 0.0
        self._watcher: threading.Thread | None = None
        #: per event loop: the uploads submitted since its last flush, and the outbox of their outcomes
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[bytes, bytes, bytes, int, str, _LoopWaiter]]] = {}
        self._outboxes: dict[asyncio.AbstractEventLoop, _Outbox] = {}
        #: a transport that publishes without blocking (Kafka): group commits run on the event loop
        self._direct = callable(getattr(transport, "publish_nowait", None))
        self._held: dict[asyncio.AbstractEventLoop, list[Submission]] = {}  # in flight, waiting for a group
        self._on_loop: dict[asyncio.AbstractEventLoop, int] = {}  # group commits in flight, per event loop

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        if self._workers:
            raise RuntimeError("the ingestor is already started")
        self._workers = [
            threading.Thread(target=self._run, name=f"ldp-ingest-{i}", daemon=True) for i in range(self.threads)
        ]
        for t in self._workers:
            t.start()
        self._watcher = threading.Thread(target=self._watch, name="ldp-ingest-probe", daemon=True)
        self._watcher.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Publish what is queued, then stop the threads."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._wake.set()
        end = time.monotonic() + timeout
        for t in self._workers:
            t.join(max(0.0, end - time.monotonic()))
        if self._watcher is not None:
            self._watcher.join(max(0.0, end - time.monotonic()))

    @property
    def down(self) -> str | None:
        """Why the transport is taken to be down (its last failed probe), or ``None`` while it is up."""
        return self._down

    @property
    def alive(self) -> bool:
        return bool(self._workers) and all(t.is_alive() for t in self._workers)

    def queued(self) -> int:
        return len(self._queue)

    # -- producer side -----------------------------------------------------------

    def submit(
        self, batch_id: bytes, key: bytes, value: bytes, reports: int, metric: str = ""
    ) -> concurrent.futures.Future[Outcome]:
        """Queue a batch; the returned future resolves to its outcome. Cancelling it (a waiter that gives up)
        changes nothing for the publish or for a retry of the same batch id that follows it."""
        public: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
        self._submit(batch_id, key, value, reports, metric, public)
        return public

    def submit_async(
        self,
        batch_id: bytes,
        key: bytes,
        value: bytes,
        reports: int,
        metric: str,
        loop: asyncio.AbstractEventLoop,
        waiter: Any = None,
    ) -> Any:
        """:meth:`submit` for a caller on ``loop`` (the collector's uploads): an asyncio future of the loop, or
        ``waiter`` if given (a :class:`SettleCall`); cancelling it changes nothing for the publish. The uploads
        submitted during one iteration of the loop reach the publisher threads together (one lock, one
        wake-up), at the start of the next iteration, and their outcomes come back through the loop's
        :class:`_Outbox` (one wake-up of the loop per group)."""
        if waiter is None:
            waiter = loop.create_future()
        pending = self._pending.get(loop)
        if pending is None:
            pending = self._pending[loop] = []
            self._outboxes[loop] = _Outbox(loop)
        if not pending:
            loop.call_soon(self._flush, loop)
        pending.append(
            (batch_id, key, value, reports, metric, _LoopWaiter(self._outboxes[loop], waiter, self._waiting))
        )
        return waiter

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: queue the uploads :meth:`submit_async` collected since the last flush, in one go."""
        pending = self._pending[loop]
        self._pending[loop] = []
        subs = [(bytes(b), k, v, n, m, p, content_digest(v), _Result(p)) for b, k, v, n, m, p in pending]
        direct = self._direct and self._topic_ready
        group: list[Submission] | None = self._held.setdefault(loop, []) if direct else None
        notify = False
        with self._cond:
            for batch_id, key, value, reports, metric, public, digest, fut in subs:
                notify |= self._enqueue(batch_id, key, value, reports, metric, public, digest, fut, group)
            if notify:
                self._cond.notify()
        if group and self._on_loop.get(loop, 0) < self.threads:
            self._next_group(loop)

    def _next_group(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: commit the uploads held for it as one group. At most ``threads`` groups are in flight
        at once, as with the publisher threads: what arrives meanwhile waits and forms the next, larger group
        (one store transaction and one delivery report per group, not per upload)."""
        group = self._held.get(loop)
        if not group:
            return
        self._held[loop] = []
        if self._down is not None:  # answered 503 already by the probe (they were waiting): never published
            self._fail_group(group, "transport_unavailable", self._down_message())
            self._release(group)
            return
        for k in range(0, len(group), self.max_group):
            self._commit_on_loop(group[k : k + self.max_group], loop)

    def _submit(self, batch_id: bytes, key: bytes, value: bytes, reports: int, metric: str, public: Any) -> None:
        fut = _Result(public)
        digest = content_digest(value)
        with self._cond:
            if self._enqueue(bytes(batch_id), key, value, reports, metric, public, digest, fut):
                self._cond.notify()

    def _enqueue(
        self,
        batch_id: bytes,
        key: bytes,
        value: bytes,
        reports: int,
        metric: str,
        public: Any,
        digest: bytes,
        fut: Any,
        group: list[Submission] | None = None,
    ) -> bool:
        """Under ``self._cond``: queue one submission for the publisher threads (True), or settle or attach it
        at once (False). With ``group``, a list, it joins that group commit on the event loop instead (and is
        in flight from now on: a repeat of its batch id follows it)."""
        if self._stopping:
            fut.set_exception(
                UnavailableError("shutting_down", "the collector is shutting down; retry later", self.retry_after)
            )
            return False
        if self._down is not None:
            fut.set_exception(self._down_error())
            return False
        self._waiting.add(public)
        if not isinstance(public, _LoopWaiter):  # a _LoopWaiter leaves the set itself when settled
            public.add_done_callback(self._waiting.discard)
        running = self._inflight.get(batch_id)
        if running is not None:
            same = running.digest == digest
            running.future.add_done_callback(functools.partial(_follow, fut=fut, same=same, batch_id=batch_id))
            return False
        sub = Submission(batch_id, key, value, reports, fut, digest, metric)
        if group is not None:
            self._inflight[batch_id] = sub
            group.append(sub)
            return False
        self._queue.append(sub)
        return True

    # -- the thread ------------------------------------------------------------

    def _take(self) -> list[Submission] | None:
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return None
            n = min(len(self._queue), self.max_group)
            group: list[Submission] = []
            for _ in range(n):
                s = self._queue.popleft()
                running = self._inflight.get(s.batch_id)
                if running is not None and all(g is not running for g in group):
                    running.future.add_done_callback(
                        functools.partial(_follow, fut=s.future, same=running.digest == s.digest, batch_id=s.batch_id)
                    )
                    continue
                self._inflight.setdefault(s.batch_id, s)
                group.append(s)
            return group

    def _run(self) -> None:
        while True:
            group = self._take()
            if group is None:
                return
            if not group:
                continue
            try:
                self._commit(group)
            except BaseException as exc:  # never leave a request waiting
                log.exception("group commit failed unexpectedly")
                self._fail_group(group, "internal", _internal_message(exc))
            finally:
                self._release(group)

    # -- the watcher -----------------------------------------------------------

    def _down_message(self) -> str:
        return f"the transport is unavailable ({self._down}); retry later"

    def _down_error(self) -> UnavailableError:
        return UnavailableError("transport_unavailable", self._down_message(), self.retry_after)

    def _watch(self) -> None:
        self._probe()  # a collector started while the transport is down answers 503 from its first upload
        while True:
            wait = self.probe_interval if self._down is not None else min(self.probe_after, self.probe_interval) / 4
            self._wake.wait(wait)
            self._wake.clear()
            if self._stopping:
                return
            now = time.monotonic()
            if now < self._next_probe:
                continue
            if self._down is not None:
                self._probe()
                continue
            stalled = any(now - t0 >= self.probe_after for t0 in list(self._publishing.values()))
            if stalled or self._probe_soon:
                self._probe_soon = False
                self._probe()

    def _probe(self) -> None:
        try:
            ok, detail = self.transport.health(self.topic, timeout=self.probe_timeout)
        except Exception as exc:  # health() should never raise; a transport that does is down
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        self._next_probe = time.monotonic() + self.probe_interval
        if ok:
            if self._down is not None:
                log.warning("the transport answers again (%s); accepting uploads", detail)
                self._down = None
            return
        if self._down is None:
            log.warning("the transport is down (%s); answering uploads 503 until it answers", detail)
        with self._cond:
            self._down = detail
            dropped = list(self._queue)
            self._queue.clear()
            waiting = list(self._waiting)
        err = self._down_error()
        with _one_delivery():
            for s in dropped:  # never published: the 503 is the whole truth
                _settle(s.future, exc=err)
            for fut in waiting:  # their publish may still end well: a retry is then answered "duplicate"
                _settle(fut, exc=err)

    def _ensure_topic(self) -> None:
        if self._topic_ready:
            return
        with self._topic_lock:
            self.transport.ensure_topic(self.topic, self.partitions)
            self._topic_ready = True

    def _split(self, group: list[Submission]) -> tuple[dict[bytes, Submission], list[Submission], list[Submission]]:
        """The group's new batches (by id), its duplicates (same content) and its conflicts (other content)."""
        fresh: dict[bytes, Submission] = {}
        dups: list[Submission] = []
        conflicts: list[Submission] = []
        try:
            known = self.dedup.lookup(s.batch_id for s in group)
        except Exception as exc:  # the store is only an optimization: fall back to publishing
            log.warning("batch-id store unreadable (%r); publishing without the duplicate check", exc)
            known = {}
        for s in group:
            if s.batch_id in known or s.batch_id in fresh:
                before = known[s.batch_id] if s.batch_id in known else fresh[s.batch_id].digest
                # an id from the store's first schema has no content digest: answered as before (duplicate)
                (dups if same_content(before, s.digest, s.value) else conflicts).append(s)
            else:
                fresh[s.batch_id] = s
        return fresh, dups, conflicts

    def _failed(self, group: list[Submission], fresh: int, error: str, t0: float) -> None:
        """The transport did not take the group's new batches: probe it soon, answer everyone 503."""
        self._probe_soon = True
        self._wake.set()
        self.last_error = error
        log.warning("the transport refused %d batches: %s", fresh, self.last_error)
        self._fail_group(
            group, "transport_unavailable", f"the transport did not accept the batch ({self.last_error}); retry later"
        )
        self._report(GroupStats(0, 0, len(group), time.perf_counter() - t0))

    def _done(
        self, fresh: dict[bytes, Submission], dups: list[Submission], conflicts: list[Submission], t0: float
    ) -> None:
        """The new batches are durable (or there were none): record their ids and counts, answer everyone."""
        if fresh:
            self.last_error = None
            counts = _accepted_counts(fresh.values())
            try:
                self.dedup.add({b: s.digest for b, s in fresh.items()}, counts)
            except Exception as exc:  # published: answer 202; a retry is caught by the shuffler's id window
                log.warning(
                    "could not record %d batch ids (%r); a retry of them will reach the shuffler", len(fresh), exc
                )
                self.dedup.add_counts(counts)  # counted in memory, written when the store works again
        with _one_delivery():
            for s in fresh.values():
                _settle(s.future, "accepted")
            for s in dups:
                _settle(s.future, "duplicate")
            for s in conflicts:
                _settle(s.future, exc=_conflict(s.batch_id))
        self._report(GroupStats(len(fresh), len(dups) + len(conflicts), 0, time.perf_counter() - t0))

    def _commit(self, group: list[Submission]) -> None:
        t0 = time.perf_counter()
        fresh, dups, conflicts = self._split(group)
        if fresh:
            me = threading.get_ident()
            self._publishing[me] = time.monotonic()
            try:
                self._ensure_topic()
                self.transport.publish_many(self.topic, [(s.key, s.value) for s in fresh.values()])
            except Exception as exc:
                self._failed(group, len(fresh), f"{type(exc).__name__}: {exc}", t0)
                return
            finally:
                self._publishing.pop(me, None)
        self._done(fresh, dups, conflicts, t0)

    # -- group commits on the event loop (a transport with ``publish_nowait``) -----------------------------

    def _commit_on_loop(self, group: list[Submission], loop: asyncio.AbstractEventLoop) -> None:
        """A group commit without a thread: the store's lookup, then one ``publish_nowait`` of the new batches
        (librdkafka's ``produce`` does not block); its delivery report comes back to ``loop`` once for the
        whole group (:meth:`_landed`), which records the ids and answers everyone, as :meth:`_commit` does."""
        t0 = time.perf_counter()
        try:
            fresh, dups, conflicts = self._split(group)
            if not fresh:
                self._done(fresh, dups, conflicts, t0)
                self._release(group)
                return
            token = object()
            state: list[Any] = [False, None, loop]  # settled, its timer, the loop

            def landed(error: str | None) -> None:  # on the producer's poll thread, or on the loop
                try:
                    loop.call_soon_threadsafe(self._landed, group, fresh, dups, conflicts, t0, token, state, error)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    self._release(group)

            self._publishing[id(token)] = time.monotonic()
            try:
                self.transport.publish_nowait(  # type: ignore[attr-defined]
                    self.topic, [(s.key, s.value) for s in fresh.values()], landed
                )
            except Exception as exc:
                self._publishing.pop(id(token), None)
                state[0] = True
                self._failed(group, len(fresh), f"{type(exc).__name__}: {exc}", t0)
                self._release(group)
                return
            self._on_loop[loop] = self._on_loop.get(loop, 0) + 1
            # librdkafka fails each record after its message timeout; this margin covers a poll thread that died
            wait = float(getattr(self.transport, "request_timeout", 30.0)) + 5.0
            state[1] = loop.call_later(
                wait,
                self._landed,
                group,
                fresh,
                dups,
                conflicts,
                t0,
                token,
                state,
                f"TransportError: Kafka did not acknowledge {len(fresh)} record(s) in {wait - 5.0:g} s",
            )
        except BaseException as exc:  # never leave a request waiting
            self._broken(group, exc)

    def _landed(
        self,
        group: list[Submission],
        fresh: dict[bytes, Submission],
        dups: list[Submission],
        conflicts: list[Submission],
        t0: float,
        token: object,
        state: list[Any],
        error: str | None,
    ) -> None:
        """On the loop: the delivery report of a group published by :meth:`_commit_on_loop` (or its timeout)."""
        if state[0]:
            return
        state[0] = True
        if state[1] is not None:
            state[1].cancel()
        self._publishing.pop(id(token), None)
        loop = state[2]  # not asyncio.get_running_loop(): a getpid system call on Python 3.11
        self._on_loop[loop] -= 1
        try:
            if error is not None:
                self._failed(group, len(fresh), error, t0)
            else:
                self._done(fresh, dups, conflicts, t0)
        except BaseException as exc:  # never leave a request waiting
            self._broken(group, exc)
        self._release(group)
        if self._held.get(loop):
            self._next_group(loop)

    def _broken(self, group: list[Submission], exc: BaseException) -> None:
        """A group commit on the loop failed unexpectedly: answer everyone 503, as :meth:`_run` does."""
        log.error("group commit failed unexpectedly", exc_info=exc)
        self._fail_group(group, "internal", _internal_message(exc))
        self._release(group)

    def _fail_group(self, group: list[Submission], code: str, message: str) -> None:
        """Answer every upload of ``group`` 503 (``code``, ``message``, ``Retry-After``); none of it was
        acknowledged to anyone (the one 503 path of the thread and the loop group commits)."""
        err = UnavailableError(code, message, self.retry_after)
        with _one_delivery():
            for s in group:
                _settle(s.future, exc=err)

    def _release(self, group: list[Submission]) -> None:
        """The group's batch ids are no longer in flight."""
        with self._cond:
            for s in group:
                if self._inflight.get(s.batch_id) is s:
                    del self._inflight[s.batch_id]

    def _report(self, stats: GroupStats) -> None:
        if self.on_group is not None:
            try:
                self.on_group(stats)
            except Exception:
                log.exception("on_group callback failed")
