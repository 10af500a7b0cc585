"""The checkpointed consume loop of every stream processor, written once.

A *stream processor* reads topics as a member of a consumer group, keeps
state derived from what it read, and now and then makes that state durable
and commits the input offsets it accounts for: a **checkpoint**. The
shuffler, the Parquet sink, the streaming estimator and the FL job are
stream processors. The loop they share -- poll, drop what a rebalance or a
rewind voided, decode (or count what cannot be decoded), checkpoint,
commit, rejoin -- is :class:`StreamProcessor`; a processor supplies only

* its per-record step: :meth:`~StreamProcessor.decode` and
  :meth:`~StreamProcessor.apply` (or all of :meth:`~StreamProcessor.process`);
* how to drop the state of some or all partitions: :meth:`~StreamProcessor.reset`;
* what a checkpoint holds and how it is flushed: :meth:`~StreamProcessor.flush_state`
  (and :meth:`~StreamProcessor.on_committed`, once it is committed);
* when one is due: :meth:`~StreamProcessor.checkpoint_due`.

The model is Quix Streams' ``Checkpoint`` and ``BatchingSink``: records
accumulate in per-partition state; a checkpoint first flushes what that
state must make durable and only then commits the offsets, and a failed
flush aborts the checkpoint, so nothing is committed that is not durable.

**The rules the loop keeps**, for every processor:

1. *A new consumer generation voids everything uncommitted.* After each
   poll the loop compares :attr:`~pipeline.transport.base.Consumer.generation`
   (override :meth:`~StreamProcessor.rewound` for another test): a rebalance
   that rewound delivered, uncommitted records restarted every partition
   from its committed offset, so every partition's state is reset before
   the polled records are applied.
2. *An offset that goes back voids its partition.* A record whose offset is
   below one already delivered on its partition means the consumer
   restarted that partition from its committed offset: that partition's
   state is reset (:meth:`~StreamProcessor.on_partition_rewind`).
3. *A partition no longer owned is dropped* at the next checkpoint, before
   anything is flushed: its next owner reads it again from the committed offset.
4. *A failed flush aborts the checkpoint.* If :meth:`~StreamProcessor.flush_state`
   raises, nothing is committed and the error propagates. A plain-commit
   processor keeps its state (the consumer did not move; the next
   checkpoint retries); a transactional one aborts its transaction, which
   rewinds the consumer, and resets every partition.
5. *A failed commit voids what it would have committed.* On
   :class:`~pipeline.transport.base.CommitFailedError` (the group
   rebalanced) :meth:`~StreamProcessor.on_commit_failed` resets every
   partition and :meth:`~StreamProcessor.checkpoint` returns ``False``; any
   other error of the commit propagates. Either way the commit may still
   have happened: after a group coordinator failover, offsets the old
   coordinator wrote can show at the new one only after the client reported
   the failure (issue 31), and the group then restarts the partitions past
   them. What a plain-commit processor drops on a failed commit must
   therefore be durable elsewhere already: the sink's files are written
   before the commit, and the streaming estimator keeps such tails as
   *uncertain* until the partition is counted again
   (:mod:`estimator.service.engine`). (A transactional processor's outputs
   and checkpoint are in the transaction, so they land with the offsets;
   a commit that got no answer is settled by the transport before it
   rewinds: committed, it is reported as such, see docs/PIPELINE.md.)
6. *Rejoining* (:meth:`~StreamProcessor.rejoin`) drops everything derived
   from uncommitted records and leaves the group; the next poll joins again
   and reads from the committed offsets. Runners rejoin after a transient
   failure (a broker restart, a locked log) and stop on
   :data:`FATAL_ERRORS`: a :class:`~pipeline.errors.ProcessorError` (state
   and log disagree; a retry cannot mend it) or a
   :class:`~pipeline.transport.base.FencedError` (another process took
   this member's name).

**Two commit modes.** A plain-commit processor (``transactional = False``;
the sink, the streaming estimator) writes its outputs outside the log
(files, a snapshot) idempotently and returns from ``flush_state`` the
offsets to commit. A transactional processor (``transactional = True``; the
shuffler, the FL job) publishes its outputs and its checkpoint as records
into the open transaction (:meth:`~StreamProcessor.transaction`); the
checkpoint commits that transaction, which makes the outputs visible and
commits the offsets past every delivered record, atomically.

A processor may count into its ``stats`` object; the loop adds to the
integer fields ``records``, ``undecodable``, ``rejoins`` and
``commit_failures`` where ``stats`` has them.

**Start-up and recovery** (:meth:`~StreamProcessor.connect`,
:meth:`~StreamProcessor.supervise`). Every runner (``ldp shuffler``, ``ldp
sink``, ``ldp estimator``, ``ldp fl job``) joins and runs through these two,
so a broker that is down at start-up or goes away later is handled once, the
same way everywhere: the join is retried with exponential backoff and jitter
(:class:`Backoff`, its random source an explicit argument), capped; a
failure of the running loop drops the uncommitted state, rejoins and runs
again. :data:`FATAL_ERRORS` are never retried. The processor's
:attr:`~StreamProcessor.run_state` is one of :data:`STATES` and only its
changes are logged, one line each, on the ``ldp.status`` logger, without a
traceback (a failure of a type the transport does not raise gets its
traceback once, on the line of that change)::

    Shuffler shuffler-0: transport kafka://127.0.0.1:9092 unreachable (...); retrying every <= 15 s
    Shuffler shuffler-0: connected to kafka://127.0.0.1:9092 as ldp-shuffler/shuffler-0
    Shuffler shuffler-0: lost kafka://127.0.0.1:9092 (...); uncommitted state dropped, retrying every <= 15 s
    Shuffler shuffler-0: recovered: connected to kafka://127.0.0.1:9092 after 12.3 s

:attr:`~StreamProcessor.ready` is true while the processor is joined and
its loop runs; runners expose it (``GET /readyz``, ``--status-file``, see
:mod:`pipeline.status`). Listeners added to
:attr:`~StreamProcessor.state_listeners` are called on each change.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ldp_core.errors import FrameError
from pipeline.errors import ConfigError, ProcessorError
from pipeline.topics import DEFAULT_PARTITIONS
from pipeline.transport.base import (
    CommitFailedError,
    Consumer,
    FencedError,
    Record,
    TopicPartition,
    Transaction,
    Transport,
    TransportError,
)

__all__ = ["FATAL_ERRORS", "STATES", "Backoff", "StreamProcessor"]

log = logging.getLogger(__name__)
#: the logger of state changes (one line each); ``ldp`` shows it at INFO whatever ``--log-level`` says
status_log = logging.getLogger("ldp.status")

#: errors on which a runner stops the processor instead of rejoining and retrying: the state and the log
#: disagree (ProcessorError), another process took this member's name (FencedError), a setting is wrong
#: (ConfigError: e.g. the shuffler's state topic has another partition count than its raw topic)
FATAL_ERRORS: tuple[type[BaseException], ...] = (ProcessorError, FencedError, ConfigError)

#: seconds without a connection to the input stream before a running processor stops being ready
INPUT_GRACE = 2.0

#: the processor's states: not joined yet; joining failed and is retried; joined and running; it was running
#: and failed, the join is retried; stopped
STATES = ("starting", "waiting", "ready", "lost", "stopped")


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: the ``k``-th retry (from 0) waits a uniform draw from
    ``[d/2, d]``, ``d = min(cap, initial * factor**k)`` ("equal jitter": never less than half the step,
    so a fleet restarted together spreads out without any member hammering the broker)."""

    initial: float = 0.5
    cap: float = 15.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (0 < self.initial <= self.cap) or self.factor < 1:
            raise ConfigError(
                f"backoff needs 0 < initial <= cap and factor >= 1, got initial={self.initial!r}, "
                f"cap={self.cap!r}, factor={self.factor!r}"
            )

    def delay(self, attempt: int, rng: np.random.Generator) -> float:
        d = min(self.cap, self.initial * self.factor ** min(attempt, 64))
        return float(d / 2 + rng.uniform(0.0, d / 2))


def _expected_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is what a transport raises when its broker or file is unavailable (logged without a
    traceback); anything else gets its traceback once."""
    return isinstance(exc, (TransportError, OSError, TimeoutError)) or type(exc).__module__.startswith("kafka")


def _brief(exc: BaseException) -> str:
    """One line for ``exc``, without the chain of causes."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class _Abort(Exception):
    """Raised into an open transaction to abort it."""


class StreamProcessor(abc.ABC):
    """One member of a consumer group running the checkpointed consume loop (see the module docstring).

    Subclasses call ``super().__init__`` and implement :meth:`reset` and
    :meth:`flush_state`, and either :meth:`decode` and :meth:`apply` or
    :meth:`process`. ``lock`` is held while records are applied and while
    the state is reset or folded after a commit, so another thread (an
    HTTP server) can read the state under it.
    """

    #: commit through the consumer's transaction (outputs and offsets atomically) instead of a plain commit
    transactional: ClassVar[bool] = False
    #: errors of :meth:`decode` that make a record undecodable (counted, handed to :meth:`on_undecodable`)
    undecodable_errors: ClassVar[tuple[type[BaseException], ...]] = (FrameError,)

    stats: Any = None

    def __init__(
        self,
        transport: Transport,
        topics: str | Sequence[str],
        group: str,
        member: str,
        *,
        session_timeout: float = 10.0,
        partitions: int = DEFAULT_PARTITIONS,
        checkpoint_seconds: float = 1.0,
        poll_records: int = 500,
    ) -> None:
        self.transport = transport
        self.topics: tuple[str, ...] = (topics,) if isinstance(topics, str) else tuple(topics)
        self.group = group
        self.member = member
        self.session_timeout = float(session_timeout)
        self.partitions = int(partitions)
        self.checkpoint_seconds = float(checkpoint_seconds)
        self.poll_records = int(poll_records)
        self.lock = threading.RLock()
        self._consumer: Consumer | None = None
        self._generation = 0
        self._next: dict[TopicPartition, int] = {}  # per partition: just past the last record delivered
        self._tx_ctx: Any = None
        self._tx: Transaction | None = None
        self._last_checkpoint = time.monotonic()
        #: join as a static member (Kafka's ``group.instance.id`` = ``member``): set when the name was given
        #: explicitly (``--member``), so it is stable across restarts
        self.static_member = False
        self._input_checked = 0.0
        self._watch_lock = threading.Lock()
        self._unreachable_since: float | None = None
        self._input_down = False  # the run state is "waiting" because the input stream stopped answering
        self._state = "starting"
        self._state_since = time.time()
        self._state_detail = ""
        #: called as ``listener(processor, state)`` after each change of :attr:`run_state`
        self.state_listeners: list[Callable[[StreamProcessor, str], None]] = []

    # -- what a processor supplies -----------------------------------------------------------

    def ensure_topics(self) -> None:
        """Create missing input topics before joining (default: each of ``topics`` with ``partitions``)."""
        for topic in self.topics:
            self.transport.ensure_topic(topic, self.partitions)

    def on_join(self, consumer: Consumer) -> None:  # noqa: B027 (an optional hook: a no-op by default)
        """Called once a new consumer has joined the group, before its first poll."""

    def decode(self, rec: Record) -> Any:
        """The record's value as the processor works with it; raise one of ``undecodable_errors`` if it is not one."""
        raise NotImplementedError(f"{type(self).__name__} implements neither decode() nor process()")

    def apply(self, rec: Record, value: Any | None) -> None:
        """Fold ``value`` (``decode(rec)``, or ``None`` for an undecodable record) into the partition's state."""
        raise NotImplementedError(f"{type(self).__name__} implements neither apply() nor process()")

    def on_undecodable(self, rec: Record, exc: BaseException) -> None:
        """An undecodable record (already counted in ``stats.undecodable``): log it; a processor may keep it."""
        log.error(
            "%s %s: %s[%d]@%d cannot be decoded: %s",
            type(self).__name__,
            self.member,
            rec.topic,
            rec.partition,
            rec.offset,
            exc,
        )

    def process(self, rec: Record) -> bool | None:
        """The per-record step: count it, decode it (counting an undecodable one), apply it.

        Return ``False`` to stop applying the rest of this poll's records
        (a processor that rewound its consumer: they come again).
        """
        self._count("records")
        try:
            value = self.decode(rec)
        except self.undecodable_errors as exc:
            self._count("undecodable")
            self.on_undecodable(rec, exc)
            value = None
        self.apply(rec, value)
        return None

    @abc.abstractmethod
    def reset(self, partitions: Collection[TopicPartition] | None) -> None:
        """Drop the state derived from uncommitted records of ``partitions`` (``None``: of every partition).

        Their records are delivered again from the committed offsets.
        """

    @abc.abstractmethod
    def flush_state(self, tx: Transaction | None) -> Mapping[TopicPartition, int] | None:
        """Make what the checkpoint holds durable; return the offsets it accounts for, or ``None`` to skip the commit.

        Plain-commit processors get ``tx=None`` and return the offsets to
        commit; transactional ones publish into ``tx`` (the transaction then
        commits the offsets past every delivered record) and return the
        offsets they account for (``{}`` will do). Raising aborts the
        checkpoint: nothing is committed. A processor that finds it must
        rejoin may call :meth:`rejoin` and return ``None``.
        """

    def on_committed(self, offsets: Mapping[TopicPartition, int]) -> None:  # noqa: B027 (an optional hook: a no-op by default)
        """The checkpoint's offsets are committed: fold what it held into the committed state."""

    def on_commit_failed(self, exc: CommitFailedError) -> None:
        """The group rebalanced before the commit: nothing was committed; default: reset every partition."""
        log.info(
            "%s %s: commit failed (%s); uncommitted state dropped, its records come again",
            type(self).__name__,
            self.member,
            exc,
        )
        self._count("commit_failures")
        self.rewind_all()

    def on_poll(self, consumer: Consumer) -> None:  # noqa: B027 (an optional hook: a no-op by default)
        """Called after every poll, before its records are applied (e.g. to follow the assignment)."""

    def rewound(self, consumer: Consumer, records: Sequence[Record]) -> bool:
        """Whether the consumer restarted every partition from its committed offsets since the last poll."""
        return consumer.generation != self._generation

    def on_partition_rewind(self, tp: TopicPartition, rec: Record) -> bool:
        """``rec`` is below what ``tp`` already delivered: ``tp`` restarted from its committed offset.

        Default: reset ``tp`` and go on (a transactional processor rewinds
        everything and stops applying the poll, whose records come again).
        Return whether to apply ``rec`` and the rest of the poll.
        """
        log.info(
            "%s %s: %s[%d] came again from offset %d; dropping its uncommitted state",
            type(self).__name__,
            self.member,
            tp.topic,
            tp.partition,
            rec.offset,
        )
        if self.transactional:
            self.rewind_all()
            return False
        self._next.pop(tp, None)
        self.reset([tp])
        return True

    def checkpoint_due(self) -> bool:
        """Whether :meth:`step` checkpoints now (default: ``checkpoint_seconds`` after the last one)."""
        return time.monotonic() - self._last_checkpoint >= self.checkpoint_seconds

    def settled(self) -> bool:
        """Whether nothing waits for a checkpoint, so that :meth:`run` may stop when idle (default: yes)."""
        return True

    def final_checkpoint(self) -> None:
        """The checkpoint :meth:`run` takes before it returns."""
        self.checkpoint()

    # -- the consumer --------------------------------------------------------------------------

    @property
    def consumer(self) -> Consumer:
        """The group member, joining (after :meth:`ensure_topics`, then :meth:`on_join`) if there is none.

        A new member reads every partition from its committed offset: state
        left from an earlier consumer is reset first.
        """
        if self._consumer is None:
            self.ensure_topics()
            static = {"static": True} if self.static_member else {}  # only then: test doubles need not know it
            consumer = self.transport.consume(
                list(self.topics), self.group, member=self.member, session_timeout=self.session_timeout, **static
            )
            with self.lock:
                self._consumer = consumer
                self._generation = consumer.generation
                self._next.clear()
                self.reset(None)
            self.on_join(consumer)
        return self._consumer

    def transaction(self) -> Transaction:
        """The open transaction (opened on first use): what is published into it shows after the next checkpoint."""
        if self._tx is None:
            ctx = self.consumer.transaction()
            self._tx = ctx.__enter__()
            self._tx_ctx = ctx
        return self._tx

    def _abort_transaction(self) -> None:
        """Abort the open transaction (or an empty one): the consumer rewinds to the committed offsets."""
        consumer = self._consumer
        if consumer is None:
            return
        ctx, self._tx_ctx, self._tx = self._tx_ctx, None, None
        try:
            if ctx is None:
                ctx = consumer.transaction()
                ctx.__enter__()
            ctx.__exit__(_Abort, _Abort(), None)
        except FencedError:
            raise
        except TransportError as exc:
            log.warning(
                "%s %s: aborting the transaction failed (%s); the transport rewinds regardless",
                type(self).__name__,
                self.member,
                exc,
            )

    def rewind_all(self) -> None:
        """Drop every partition's uncommitted state; a transactional processor first aborts its transaction."""
        with self.lock:
            if self.transactional:
                self._abort_transaction()
            self._next.clear()
            self.reset(None)

    def rejoin(self, why: str, *, level: int = logging.WARNING) -> None:
        """Drop everything derived from uncommitted records and leave the group; the next poll joins again.

        Runners call it after a transient failure (see :data:`FATAL_ERRORS`);
        :meth:`supervise` logs it at ``level`` INFO (its state line says it already).
        """
        log.log(
            level,
            "%s %s: %s; dropping uncommitted state and rejoining group %s",
            type(self).__name__,
            self.member,
            why,
            self.group,
        )
        self._count("rejoins")
        try:
            self.rewind_all()
        finally:
            self._leave()

    def _leave(self) -> None:
        """Close the consumer (leaving the group at once) without committing anything."""
        consumer, self._consumer = self._consumer, None
        self._generation = 0
        self._next.clear()
        self._tx_ctx = self._tx = None
        if consumer is not None:
            consumer.close()

    def close(self) -> None:
        """Leave the group without a checkpoint: uncommitted records go again to the partitions' next owner."""
        try:
            if self._tx_ctx is not None:
                self._abort_transaction()
        finally:
            with self.lock:
                self._next.clear()
                self.reset(None)
            try:
                self._leave()
            finally:
                self._set_run_state("stopped")

    def __enter__(self) -> StreamProcessor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- start-up, recovery, readiness ----------------------------------------------------------

    @property
    def run_state(self) -> str:
        """One of :data:`STATES`: ``starting``, ``waiting`` (the join fails and is retried), ``ready``,
        ``lost`` (the running loop failed; the join is retried), ``stopped``."""
        return self._state

    @property
    def ready(self) -> bool:
        """Whether the processor is joined and its loop runs (what ``GET /readyz`` and status files report)."""
        return self._state == "ready"

    def run_status(self) -> dict[str, Any]:
        """``state``, ``ready``, ``since`` (POSIX time of the last change), ``detail`` (why) and the
        transport's URL: what :class:`pipeline.status.StatusFile` writes (with the runner's counters).
        Checks the input stream first (:meth:`watch_input`): the polling thread may be blocked in a call to a
        stopped broker."""
        self.watch_input()
        return {
            "state": self._state,
            "ready": self.ready,
            "since": round(self._state_since, 3),
            "detail": self._state_detail,
            "transport": getattr(self.transport, "url", ""),
            "group": self.group,
            "member": self.member,
        }

    def _set_run_state(self, state: str, detail: str = "", exc: BaseException | None = None) -> None:
        before, since = self._state, self._state_since
        if state == before:
            return
        now = time.time()
        self._state, self._state_since, self._state_detail = state, now, detail
        who = f"{type(self).__name__} {self.member}"
        url = getattr(self.transport, "url", "the transport")
        trace = exc is not None and not _expected_failure(exc)  # an unexpected error: its traceback, once
        if state == "waiting":
            status_log.warning(
                "%s: transport %s unreachable (%s); retrying every <= %g s", who, url, detail, self._cap, exc_info=trace
            )
        elif state == "lost":
            status_log.warning(
                "%s: lost %s (%s); uncommitted state dropped, retrying every <= %g s",
                who,
                url,
                detail,
                self._cap,
                exc_info=trace,
            )
        elif state == "ready":
            if before == "lost":
                status_log.warning("%s: recovered: connected to %s after %.1f s", who, url, now - since)
            elif before == "waiting":
                status_log.info(
                    "%s: connected to %s as %s/%s after %.1f s", who, url, self.group, self.member, now - since
                )
            else:
                status_log.info("%s: connected to %s as %s/%s", who, url, self.group, self.member)
        elif state == "stopped" and before != "starting":
            status_log.info("%s: stopped", who)
        for listener in list(self.state_listeners):
            try:
                listener(self, state)
            except Exception:  # a status file that cannot be written must not stop the processor
                log.exception("%s: a state listener failed", who)

    _cap: float = Backoff.cap

    def join(self) -> None:
        """Create the topics and join the group (:attr:`consumer`); a processor may do more (the shuffler
        starts its warm-up). :meth:`connect` calls it, retrying its failures."""
        self.consumer  # noqa: B018 - joins: ensure_topics, then on_join

    def connect(
        self,
        stop: threading.Event | None = None,
        *,
        backoff: Backoff | None = None,
        rng: np.random.Generator | None = None,
    ) -> bool:
        """:meth:`join`, retrying a failure with ``backoff`` (draws from ``rng``; default a fresh
        :func:`numpy.random.default_rng`) until it succeeds or ``stop`` is set; return whether it joined.

        :data:`FATAL_ERRORS` propagate at once. The first failure logs one
        line (state ``waiting``, or ``lost`` if it already was), success one
        more (``ready``); the retries between log nothing.
        """
        backoff = backoff or Backoff()
        rng = rng if rng is not None else np.random.default_rng()
        self._cap = backoff.cap
        attempt = 0
        while stop is None or not stop.is_set():
            try:
                self.join()
            except FATAL_ERRORS:
                self._drop_consumer()
                raise
            except Exception as exc:  # the broker is down or not ready: wait and try again
                self._drop_consumer()
                log.debug("join attempt %d failed", attempt + 1, exc_info=True)
                if self._state not in ("waiting", "lost"):
                    self._set_run_state("waiting", _brief(exc), exc)
                pause = backoff.delay(attempt, rng)
                attempt += 1
                if stop is None:
                    time.sleep(pause)
                elif stop.wait(pause):
                    return False
                continue
            self._set_run_state("ready")
            return True
        return False

    def _drop_consumer(self) -> None:
        """Forget a consumer left by a failed join (closing it may fail too: the broker is gone)."""
        try:
            self._leave()
        except Exception:  # noqa: BLE001 - closing a client of an unreachable broker
            log.debug("closing the consumer of a failed join failed", exc_info=True)

    def supervise(
        self,
        body: Callable[[], Any],
        stop: threading.Event,
        *,
        backoff: Backoff | None = None,
        rng: np.random.Generator | None = None,
    ) -> Any:
        """:meth:`connect`, then run ``body`` (the processor's loop) until it returns, and return what it
        returned (``None`` if ``stop`` was set first).

        A failure of ``body`` other than :data:`FATAL_ERRORS` sets the state
        ``lost``, drops the uncommitted state and leaves the group
        (:meth:`rejoin`), waits a backoff step and connects again. A body that
        fails again within ``backoff.cap`` seconds of its start keeps
        climbing the backoff; one that ran longer starts it over.
        """
        backoff = backoff or Backoff()
        rng = rng if rng is not None else np.random.default_rng()
        attempt = 0
        while not stop.is_set():
            if not self.connect(stop, backoff=backoff, rng=rng):
                break
            started = time.monotonic()
            try:
                return body()
            except FATAL_ERRORS:
                raise
            except Exception as exc:  # a broker restart, a locked log: rejoin and go on
                self._set_run_state("lost", _brief(exc), exc)
                try:
                    self.rejoin(f"transport failure {_brief(exc)}", level=logging.INFO)
                except FATAL_ERRORS:
                    raise
                except Exception:  # noqa: BLE001 - closing a consumer of a dead broker may fail too
                    log.debug("leaving the group failed too", exc_info=True)
                    self._drop_consumer()
                if time.monotonic() - started > backoff.cap:
                    attempt = 0
                if stop.wait(backoff.delay(attempt, rng)):
                    break
                attempt += 1
        return None

    # -- the loop ------------------------------------------------------------------------------

    def poll_and_apply(self, *, max_records: int | None = None, timeout: float = 0.2) -> list[Record]:
        """Poll once and apply what came (rules 1 and 2); return the records applied."""
        consumer = self.consumer
        recs = consumer.poll(max_records=max_records or self.poll_records, timeout=timeout)
        applied: list[Record] = []
        with self.lock:
            if self.rewound(consumer, recs):
                self._generation = consumer.generation
                log.info(
                    "%s %s: the group rewound uncommitted records; dropping every partition's state",
                    type(self).__name__,
                    self.member,
                )
                self.rewind_all()
                if self.transactional:
                    return applied  # the abort rewound the consumer: these records come again
            self._generation = consumer.generation
            self.on_poll(consumer)
            for rec in recs:
                tp = TopicPartition(rec.topic, rec.partition)
                nxt = self._next.get(tp)
                if nxt is not None and rec.offset < nxt and not self.on_partition_rewind(tp, rec):
                    break
                self._next[tp] = rec.offset + 1
                applied.append(rec)
                if self.process(rec) is False:
                    break
        return applied

    def poll_once(self, *, max_records: int | None = None, timeout: float = 0.2) -> int:
        """Poll once and apply what came; return the number of records applied."""
        return len(self.poll_and_apply(max_records=max_records, timeout=timeout))

    def checkpoint(self) -> bool:
        """Drop partitions no longer owned, flush the state, commit; return whether offsets were committed.

        A failed flush aborts the checkpoint (nothing is committed; the
        error propagates); a failed commit resets the state (see the module docstring).
        """
        self._last_checkpoint = time.monotonic()
        consumer = self._consumer
        if consumer is None:
            return False
        owned = consumer.assignment()
        with self.lock:
            lost = [tp for tp in self._next if tp not in owned]
            for tp in lost:
                del self._next[tp]
            if lost:
                self.reset(lost)
        tx = self.transaction() if self.transactional else None
        try:
            offsets = self.flush_state(tx)
            if offsets is None or self._consumer is not consumer:  # nothing to commit, or the flush rejoined
                return False
            if tx is None:
                consumer.commit(offsets)
            else:
                ctx, self._tx_ctx, self._tx = self._tx_ctx, None, None
                ctx.__exit__(None, None, None)  # commits the outputs and the offsets of every delivered record
        except CommitFailedError as exc:
            with self.lock:
                self.on_commit_failed(exc)
            return False
        except BaseException:
            if tx is not None and self._consumer is consumer:
                self.rewind_all()  # aborts the transaction: its outputs never become visible
            raise
        with self.lock:
            self.on_committed(offsets)
        return True

    def step(self, timeout: float = 0.2, *, max_records: int | None = None) -> int:
        """Poll once, apply what came, checkpoint if one is due; return the number of records applied."""
        n = self.poll_once(max_records=max_records, timeout=timeout)
        self.watch_input()
        if self.checkpoint_due():
            self.checkpoint()
        return n

    def watch_input(self, *, grace: float = INPUT_GRACE) -> None:
        """Follow the input stream in the run state: ``ready`` becomes ``waiting`` once the consumer has
        not :meth:`~pipeline.transport.base.Consumer.reachable` its source for ``grace`` seconds (a broker
        outage: the Kafka client keeps polling without raising), and ``ready`` again when it has. Checked at
        most every 0.25 s, from the polling thread after each poll and from :meth:`run_status` (readiness
        probes, the status file); one log line per change."""
        if not self._watch_lock.acquire(blocking=False):  # another thread is checking right now
            return
        try:
            self._watch_input(grace)
        finally:
            self._watch_lock.release()

    def _watch_input(self, grace: float) -> None:
        now = time.monotonic()
        consumer = self._consumer
        if consumer is None or now - self._input_checked < 0.25:
            return
        self._input_checked = now
        if consumer.reachable():
            self._unreachable_since = None
            if self._input_down:
                self._input_down = False
                if self._state == "waiting":
                    self._set_run_state("ready")
            return
        if self._unreachable_since is None:
            self._unreachable_since = now
        elif now - self._unreachable_since >= grace and self._state == "ready":
            self._input_down = True
            self._set_run_state("waiting", "the input stream does not answer (no connection to the group coordinator)")

    def run(
        self, stop: threading.Event | None = None, *, idle_timeout: float | None = None, max_records: int | None = None
    ) -> Any:
        """Loop :meth:`step` until ``stop`` is set, or nothing came for ``idle_timeout`` s and the state is
        :meth:`settled`; take the :meth:`final_checkpoint`; return ``stats``."""
        idle_since = time.monotonic()
        while stop is None or not stop.is_set():
            if self.step(max_records=max_records):
                idle_since = time.monotonic()
            if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout and self.settled():
                break
        self.final_checkpoint()
        return self.stats

    def _count(self, name: str, n: int = 1) -> None:
        stats = self.stats
        if stats is not None and isinstance(getattr(stats, name, None), int):
            setattr(stats, name, getattr(stats, name) + n)
