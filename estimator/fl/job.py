"""The federated aggregation job: rounds over the pipeline, exactly once across crashes.

The job owns one *task* (a model, a client population, a number of rounds,
sampling, DP and optionally secure aggregation; :class:`~estimator.fl.task.FLTaskSpec`,
re-exported here). It
publishes each round's state (:class:`ldp_core.fl.protocol.RoundState`) to
``ldp.fl.rounds``; collectors serve it to devices and publish their checked
uploads to ``ldp.fl.updates``; the job consumes them, advances the phases,
aggregates with the task's stack (by default ``ValidatingAggregator(
FixedClippingDP(WeightedMean(), C, σ, accountant))``; adaptive clipping or a
robust aggregator as :class:`FLTaskSpec` describes; or the SecAgg+ server
followed by the same Gaussian noise, or by DP-FTRL's tree increment for a
``dp_ftrl`` task), reports ε after every round and opens the next round.

Exactly once
------------
The job's whole state (model, round, phase, sample, the round's accepted
uploads or SecAgg running sum, seen upload ids, counters, the seeded
generator's state, the noise of every past round for the accountant) is a
function of the last **checkpoint** and of the update records after the
offsets that checkpoint accounts for. Every commit is one transport
transaction (:meth:`~pipeline.transport.base.Consumer.transaction`) that
publishes the new round states, one checkpoint to ``ldp.fl.state``
(carrying the update offsets it covers) and commits the consumer's offsets
on ``ldp.fl.updates`` — together or not at all. So after a SIGKILL at any
point, a restart loads the newest checkpoint, whose offsets equal the
group's committed offsets, and re-reads exactly the update records that the
lost in-memory state had seen: none is lost, none counted twice. What the
crashed process had computed but not committed (a round's aggregate, its
noise, the next sample) was never visible, and with a seed the restart
computes the same values again.

The checkpoint's form, and how a restore finds the newest one and checks it
against the group's committed offsets, are :mod:`estimator.fl.checkpoint`;
the consume loop (rewinds, the transaction, the commit) is the shared
:class:`pipeline.processor.StreamProcessor`; this module holds the job's
settings and its lifecycle (join, restore, step, commit, what each checkpoint
publishes) and wires the parts of a round together: an upload's checks
(:mod:`estimator.fl.uploads`), the phases (:mod:`estimator.fl.phases`), the
release of a round's aggregate (:mod:`estimator.fl.release`), the ε figures
(:mod:`estimator.fl.privacy`) and what the job shows (:mod:`estimator.fl.status`).

Records: checkpoints and round states are chunked documents
(:mod:`pipeline.fl_records`) of at most ``JobSettings.max_record_bytes``
each, all chunks in the commit's transaction; a restore loads only a
complete, consistent set (and still checks its offsets against the group's).

Idempotence of uploads: a re-sent upload of the current round is a
**duplicate** (counted, changing nothing); one accepted in a recent round is
refused as ``replayed`` (:mod:`estimator.fl.uploads`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

from estimator.errors import JobStateError
from estimator.fl.aggregator_specs import FLAccountant
from estimator.fl.aggregators import Aggregator, RoundContext
from estimator.fl.checkpoint import CheckpointLog, JobState
from estimator.fl.dp import AdaptiveClippingDP
from estimator.fl.ftrl import DPFTRL
from estimator.fl.phases import Move, next_move, open_round
from estimator.fl.privacy import PrivacyFigures
from estimator.fl.release import VoteRelease, close_pate, close_plain, close_secagg, record_release
from estimator.fl.status import ProcessorCounters, public_stats, round_state, status_document
from estimator.fl.task import FLTaskSpec
from estimator.fl.uploads import take_upload
from ldp_core.files import write_atomic
from ldp_core.fl.errors import FLError
from ldp_core.fl.protocol import RoundState
from ldp_core.randomness import secure_generator
from pipeline.errors import ConfigError
from pipeline.fl_records import DEFAULT_MAX_RECORD_BYTES, MIN_RECORD_BYTES, encode_chunks, pack_document
from pipeline.processor import StreamProcessor
from pipeline.settings import check_names, check_ranges, check_topics, settings_from_env
from pipeline.topics import FL_ROUNDS_TOPIC, FL_STATE_TOPIC, FL_UPDATES_TOPIC
from pipeline.transport import CommitFailedError, Consumer, FencedError, TopicPartition, Transport, TransportError
from pipeline.transport.base import Record, Transaction

__all__ = [
    "FL_ROUNDS_TOPIC",
    "FL_UPDATES_TOPIC",
    "FL_STATE_TOPIC",
    "JobSettings",
    "JobStateError",
    "AggregationJob",
    "ENV_PREFIX",
]

log = logging.getLogger("ldp.fl.job")

#: environment variables of :meth:`JobSettings.from_env`: ``LDP_FL_JOB_<FIELD>``
ENV_PREFIX = "LDP_FL_JOB_"


class _Rewind(Exception):
    """Raised inside a transaction to abort it (which rewinds the consumer to the committed offsets)."""


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """Where the job reads and writes (frozen, range-checked; :meth:`from_env` for CLI over environment over
    defaults). ``group`` names its consumer group (one per task);
    ``member`` should stay the same across restarts (Kafka fences the predecessor's
    transaction by it). Mid-phase checkpoints are committed every ``checkpoint_interval``
    seconds while uploads arrive; ``status_path`` receives the JSON status. Checkpoints and round
    states are split into records of at most ``max_record_bytes`` (keep it under the broker's
    ``message.max.bytes``). Every invalid value is a :class:`~pipeline.errors.ConfigError`."""

    group: str
    member: str = "fl-job-0"
    rounds_topic: str = FL_ROUNDS_TOPIC
    updates_topic: str = FL_UPDATES_TOPIC
    state_topic: str = FL_STATE_TOPIC
    updates_partitions: int = 1
    session_timeout: float = 10.0
    checkpoint_interval: float = 1.0
    restore_timeout: float = 120.0
    status_path: str | None = None
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES

    def __post_init__(self) -> None:
        check_names(self, "group", "member")
        check_topics(self, "rounds_topic", "updates_topic", "state_topic")
        if self.status_path is not None and (not isinstance(self.status_path, str) or not self.status_path):
            raise ConfigError(f"status_path must be a file path or None, got {self.status_path!r}")
        if (
            isinstance(self.max_record_bytes, int)
            and not isinstance(self.max_record_bytes, bool)
            and self.max_record_bytes < MIN_RECORD_BYTES
        ):
            raise ConfigError(
                f"max_record_bytes must be an integer >= {MIN_RECORD_BYTES}, got "
                f"{self.max_record_bytes!r}; keep it below the broker's message.max.bytes"
            )
        check_ranges(
            self,
            {
                "updates_partitions": (1, 10_000),
                "session_timeout": (0.1, 3600.0),
                "checkpoint_interval": (0.0, 3600.0),
                "restore_timeout": (0.1, 86400.0),
                "max_record_bytes": (MIN_RECORD_BYTES, 1 << 30),
            },
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> JobSettings:
        """Settings from ``overrides`` (``None`` values ignored), then ``environ`` (default ``os.environ``,
        ``LDP_FL_JOB_<FIELD>``, e.g. ``LDP_FL_JOB_CHECKPOINT_INTERVAL=2``), then defaults."""
        return settings_from_env(cls, ENV_PREFIX, environ, overrides)


class AggregationJob(StreamProcessor):
    """Runs one task's rounds over ``transport`` (see the module docstring).

    A transactional :class:`~pipeline.processor.StreamProcessor` on the updates topic: the shared loop
    tracks the group (a rewinding rebalance, a partition restarting from its committed offset, a lost
    partition, a failed commit) and commits each checkpoint in the consumer's transaction; the job
    supplies the per-upload step (:meth:`process`), what a checkpoint publishes (:meth:`flush_state`:
    the newest round state and the checkpoint), and how its state is dropped (:meth:`reset`: the whole
    state, reloaded from the committed checkpoint before the next step)."""

    transactional = True

    def __init__(
        self,
        transport: Transport,
        spec: FLTaskSpec,
        settings: JobSettings,
        clock: Any = time.time,
        vote_release: VoteRelease | None = None,
    ) -> None:
        if spec.pate is not None and vote_release is None:
            raise FLError(
                "a pate task needs its vote release (estimator.pate.fl_task.PateVoteRelease): run it with "
                "`ldp fl job`, which wires it, or pass vote_release="
            )
        #: a PATE task's answer to the unmasked vote histograms (:func:`estimator.fl.release.close_pate`)
        self.vote_release = vote_release
        if spec.local_dp_sgd is not None and spec.task_signature is None:
            raise FLError(
                "local_dp_sgd needs task_signature: devices take their DP-SGD parameters only from the signed "
                "task configuration (sign it with `ldp fl sign-task`)"
            )
        s = settings
        super().__init__(
            transport,
            [s.updates_topic],
            s.group,
            s.member,
            session_timeout=s.session_timeout,
            partitions=s.updates_partitions,
            checkpoint_seconds=s.checkpoint_interval,
            poll_records=500,
        )
        self.spec = spec
        self.settings = settings
        self.clock = clock
        self.model = spec.build_model()
        self.sampling = spec.build_sampling()
        self.strategy = spec.build_strategy()
        self.payload_size = spec.payload_size()
        self.key = spec.task.encode()
        self.restores = 0
        self.aborted = 0
        self._checkpoints = CheckpointLog(
            transport,
            task=spec.task,
            group=s.group,
            member=s.member,
            state_topic=s.state_topic,
            session_timeout=s.session_timeout,
            restore_timeout=s.restore_timeout,
            max_record_bytes=s.max_record_bytes,
        )
        self._adaptive: AdaptiveClippingDP | None = None
        self._st = JobState()
        self._rng = self._new_rng()
        self._accountant: FLAccountant | None = None
        self._ftrl: DPFTRL | None = None
        self._aggregator: Aggregator | None = None
        self._outbox: list[RoundState] = []
        self._committed: dict[int, int] = {}
        self._stale = False  # the state holds uncommitted records the group rewound: restore before going on
        self._dirty = False
        self._failures = 0
        self._last_commit = 0.0
        self._last_status = 0.0
        self._published_stats: dict[str, Any] | None = None
        self._privacy = PrivacyFigures(spec, self.payload_size)
        #: called with each round's history record (``round``, ``clients`` accepted, ``epsilon``; or ``failed``)
        #: as the round closes, for progress display; not on rounds restored from a checkpoint
        self.round_listeners: list[Callable[[Mapping[str, Any]], None]] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self) -> None:
        """Create the topics, join the group, fence a dead predecessor's transaction, restore the state."""
        _ = self.consumer  # joining runs ensure_topics(), then on_join()

    def ensure_topics(self) -> None:
        s = self.settings
        # round states and checkpoints are kept for ever: a job idle longer than a retention must still find
        # its state (and collectors the current round); updates take the transport's default retention
        for topic, parts, retention in (
            (s.rounds_topic, 1, math.inf),
            (s.state_topic, 1, math.inf),
            (s.updates_topic, s.updates_partitions, None),
        ):
            self.transport.create_topic(topic, parts, retention=retention)

    def on_join(self, consumer: Consumer) -> None:
        """Wait for the assignment, rewind what the join delivered (fencing a predecessor), restore."""
        s = self.settings
        deadline = time.monotonic() + s.restore_timeout
        while not consumer.assignment():  # join the group before anything is committed
            consumer.poll(max_records=1, timeout=0.5)
            if time.monotonic() > deadline:
                raise JobStateError(
                    f"group {s.group!r} assigned no partition of {s.updates_topic!r} to member "
                    f"{s.member!r} within {s.restore_timeout:g} s; is another job in the group?"
                )
        try:  # rewinds what the join delivered; on Kafka it also aborts a dead predecessor's open transaction
            with consumer.transaction():
                raise _Rewind()
        except _Rewind:
            pass
        self._restore()

    @property
    def done(self) -> bool:
        return self._st.phase == "done"

    def run(  # type: ignore[override]  # runs until the task is done, not until idle
        self,
        stop: threading.Event | None = None,
        *,
        exit_when_done: bool = True,
    ) -> dict[str, Any]:
        """Process uploads until ``stop`` is set or (``exit_when_done``) the last round is committed."""
        stop = stop or threading.Event()
        if self._consumer is None:
            self.open()
        while not stop.is_set():
            self.step()
            if exit_when_done and self.done and not self._outbox and not self._dirty:
                break
        if self._outbox or self._dirty:
            self._commit()
        self._write_status(force=True)
        return self.status()

    def step(self, timeout: float = 0.2, *, max_records: int | None = None) -> int:
        """Poll once, apply what came, advance phases that are complete or past their deadline, and commit
        when a phase moved or ``checkpoint_interval`` passed with uncommitted uploads. Returns the records polled."""
        self._require()
        recs = self.poll_and_apply(max_records=max_records, timeout=timeout)
        if self._stale:
            log.warning("uncommitted records were rewound (group generation %d); restoring", self._require().generation)
            self._restore()
            return 0
        self._advance()
        if self.checkpoint_due():
            self._commit()
        self._write_status()
        return len(recs)

    def _require(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("call open() first")
        return self._consumer

    # -- the processor's hooks --------------------------------------------------------------------
    def process(self, rec: Record) -> bool | None:
        """One upload of this task (other tasks' records are skipped): checked and folded into the round."""
        if rec.key is not None and rec.key != self.key:
            return None
        self._dirty = True
        take_upload(self._st, self.spec, self.payload_size, self.clock, rec.value)
        return None

    def reset(self, partitions: Collection[TopicPartition] | None) -> None:
        """Drop the state: it is one state over every partition, so any rewound partition voids all of it.

        The reload from the committed checkpoint waits for the next step or commit (:meth:`_restore`): never
        inside a failing transport call, and not at all when the job is closing."""
        self._stale = True

    def checkpoint_due(self) -> bool:
        """A phase moved (a round state waits), or ``checkpoint_interval`` passed with uncommitted uploads."""
        return bool(self._outbox) or (
            self._dirty and time.monotonic() - self._last_commit >= self.settings.checkpoint_interval
        )

    def flush_state(self, tx: Transaction | None) -> Mapping[TopicPartition, int] | None:
        """Publish the newest round state and the checkpoint (with the update offsets it covers) into ``tx``."""
        if self._stale:  # a partition was lost since the last poll: this state is not ours to checkpoint
            self.rewind_all()
            return None
        assert tx is not None
        s = self.settings
        offsets = dict(self._committed)
        for tp, off in self._require().positions().items():
            if tp.topic == s.updates_topic:
                offsets[tp.partition] = off
        if self._outbox:  # collectors keep the newest state only: the superseded ones need not go out
            for chunk in self._round_state_chunks(self._outbox[-1]):
                tx.publish(s.rounds_topic, self.key, chunk)
        for chunk in self._checkpoint(offsets):
            tx.publish(s.state_topic, self.key, chunk)
        return {TopicPartition(s.updates_topic, p): o for p, o in offsets.items()}

    def on_committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._failures = 0
        if self._outbox:
            self._published_stats = dict(self._outbox[-1].stats)
        self._outbox = []
        self._committed = {tp.partition: o for tp, o in offsets.items()}
        self._dirty = False
        self._last_commit = time.monotonic()

    def on_commit_failed(self, exc: CommitFailedError) -> None:
        self._commit_aborted(exc)
        self.rewind_all()

    def _commit_aborted(self, exc: TransportError) -> None:
        self.aborted += 1
        self._failures += 1
        if self._failures > 20:
            raise exc
        log.warning("commit aborted (%s); restoring from the committed checkpoint", exc)

    # -- restore and commit -----------------------------------------------------------------------
    def _restore(self) -> None:
        """Load the newest checkpoint (or start the task) and check that it accounts for exactly the
        group's committed offsets (:meth:`~estimator.fl.checkpoint.CheckpointLog.restore_point`)."""
        consumer = self._require()
        s = self.settings
        self._generation = consumer.generation
        self._stale = False
        self._outbox = []
        self._dirty = False
        n = self.transport.partitions(s.updates_topic)
        committed = {
            p: off for p in range(n) if (off := consumer.committed(TopicPartition(s.updates_topic, p))) is not None
        }
        found = self._checkpoints.restore_point(committed, s.updates_topic)
        if found is None:
            self._start_task()
            return
        offsets = found.offsets
        self._st = found.load()
        self._committed = offsets
        if self.spec.seed is not None and self._st.rng_state is not None:
            self._rng = np.random.default_rng(self.spec.seed)
            self._rng.bit_generator.state = self._st.rng_state
        else:
            self._rng = self._new_rng()
        if self.spec.algorithm == "scaffold":
            self.strategy.control = None if self._st.control is None else self._st.control.copy()  # type: ignore[attr-defined]
        self._accountant = self.spec.build_accountant()
        if self._accountant is not None:
            for z in self._st.noise_history:
                self._accountant.record(z)
        self._build_aggregator()
        if self._adaptive is not None and self._st.clip_norm is not None:
            self._adaptive.clip_norm = self._st.clip_norm
        if self._ftrl is not None:
            self._ftrl.load_state(self._st.ftrl)
        self._last_commit = time.monotonic()
        self.restores += 1
        log.info(
            "task %s restored: round %d phase %s seq %d, offsets %s",
            self.spec.task,
            self._st.round,
            self._st.phase,
            self._st.seq,
            offsets,
        )

    @property
    def incomplete_checkpoints(self) -> int:
        """Checkpoints newer than the one restored that were incomplete or inconsistent (never loaded)."""
        return self._checkpoints.incomplete

    def _new_rng(self) -> np.random.Generator:
        """The job's generator: seeded in simulations, the OS CSPRNG otherwise (see :class:`FLTaskSpec`)."""
        return np.random.default_rng(self.spec.seed) if self.spec.seed is not None else secure_generator()

    def _start_task(self) -> None:
        spec = self.spec
        self._rng = self._new_rng()
        params = self.model.init_params(self._rng)
        self._st = JobState(params=np.asarray(params, np.float32))
        self._committed = {}
        self._accountant = spec.build_accountant()
        self._build_aggregator()
        self._open_round(0)
        self._commit()
        log.info("task %s started: %d rounds, %d clients", spec.task, spec.rounds, len(spec.clients))

    def _build_aggregator(self) -> None:
        self._aggregator = self.spec.build_aggregator(self._accountant)
        inner = getattr(self._aggregator, "inner", None)
        self._adaptive = inner if isinstance(inner, AdaptiveClippingDP) else None
        self._ftrl = inner if isinstance(inner, DPFTRL) else None
        if self._adaptive is not None and self._st.clip_norm is None:
            self._st.clip_norm = float(self._adaptive.clip_norm)

    def _checkpoint(self, offsets: dict[int, int]) -> list[bytes]:
        """The checkpoint as chunk records (:meth:`CheckpointLog.encode`), after copying into the state what
        lives outside it: the seeded generator's state, adaptive clipping's current C and DP-FTRL's tree."""
        st = self._st
        st.rng_state = dict(self._rng.bit_generator.state) if self.spec.seed is not None else None
        if self._adaptive is not None:
            st.clip_norm = float(self._adaptive.clip_norm)
        if self._ftrl is not None:
            st.ftrl = self._ftrl.state()
        return self._checkpoints.encode(st, offsets)

    def _round_state_chunks(self, rs: RoundState) -> list[bytes]:
        return encode_chunks(
            "round_state",
            self.spec.task,
            {"seq": rs.seq},
            pack_document(rs.to_document()),
            self.settings.max_record_bytes,
        )

    def _commit(self) -> None:
        """One checkpoint (:meth:`~pipeline.processor.StreamProcessor.checkpoint`); when it aborts, the state
        is reloaded from the committed checkpoint (after 20 aborts in a row the error propagates)."""
        self._require()
        stats = self._public_stats()
        if not self._outbox and stats != self._published_stats:
            self._outbox.append(self._round_state())  # counters changed: let collectors show them
        try:
            self.checkpoint()
        except FencedError:
            raise
        except TransportError as exc:  # not a rebalance (on_commit_failed): the loop rewound if it could
            self._commit_aborted(exc)
            if not self._stale:
                self.rewind_all()
        if self._stale:
            self._restore()

    # -- rounds: what the job does with each phase's move ------------------------------------------------
    def _public_stats(self) -> dict[str, Any]:
        """The counters every collector serves (:func:`~estimator.fl.status.public_stats`)."""
        return public_stats(self.spec, self._st, self._epsilon_by_adversary(), self._sample_level_privacy())

    def _epsilon_by_adversary(self) -> list[dict[str, Any]] | None:
        return self._privacy.by_adversary(self._accountant, self._st)

    def _sample_level_privacy(self) -> dict[str, Any] | None:
        return self._privacy.sample_level(len(self._st.history))

    def _round_state(self) -> RoundState:
        return round_state(self.spec, self._st, self.strategy, self._public_stats())

    def _set_phase(self, phase: str, timeout: float) -> None:
        st = self._st
        st.phase = phase
        st.seq += 1
        st.opened_at = float(self.clock())
        st.deadline = st.opened_at + timeout
        self._outbox.append(self._round_state())

    def _apply(self, move: Move) -> None:
        """Fail the round, release it, or enter the move's phase (publishing the new round state)."""
        if move.fail is not None:
            self._fail_round(move.fail)
        elif move.close:
            self._close_round()
        else:
            assert move.phase is not None
            self._set_phase(move.phase, move.timeout)

    def _open_round(self, r: int) -> None:
        self._apply(open_round(self._st, self.spec, r, self.sampling, self._rng, self._ftrl, self.payload_size))

    def _fail_round(self, reason: str) -> None:
        log.warning("round %d of task %s failed: %s", self._st.round, self.spec.task, reason)
        self._st.history.append({"round": self._st.round, "failed": reason})  # no release, no privacy spent
        self._round_closed()
        self._open_round(self._st.round + 1)

    def _advance(self) -> None:
        """Move through every phase that is over: all expected uploads in, or the deadline passed."""
        for _ in range(16):
            st = self._st
            if st.phase == "done":
                return
            move = next_move(st, self.spec, late=self.clock() >= st.deadline)
            if move is None:
                return
            self._apply(move)

    def _ctx(self) -> RoundContext:
        return RoundContext(
            self._st.round,
            self.payload_size,
            self._rng,
            self.sampling.expected_clients(len(self.spec.clients)),
            params=self._st.params,  # the model the round's clients started from (FLTrust's root update)
        )

    def _round_closed(self) -> None:
        for listener in self.round_listeners:
            listener(self._st.history[-1])

    def _close_round(self) -> None:
        """Release the round (:mod:`estimator.fl.release`), or fail it, then open the next one."""
        st = self._st
        if self.spec.pate is not None and st.phase != "train":
            assert self.vote_release is not None
            rec = close_pate(st, self.spec, self.vote_release)
            if isinstance(rec, str):
                self._fail_round(rec)
                return
            self._round_closed()
            self._open_round(st.round + 1)
            return
        if st.phase == "train":
            assert self._aggregator is not None
            out = close_plain(st, self._aggregator, self._ctx())
        else:
            out = close_secagg(st, self.spec, self.payload_size, self._ctx(), self._accountant, self._ftrl)
        if isinstance(out, str):
            self._fail_round(out)
            return
        expected = self.sampling.expected_clients(len(self.spec.clients))
        record_release(st, self.spec, self.strategy, out, expected, self._accountant, self._adaptive)
        self._round_closed()
        self._open_round(st.round + 1)

    # -- status ---------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The job's JSON status (:func:`~estimator.fl.status.status_document`)."""
        counters = ProcessorCounters(
            incomplete_checkpoints=self.incomplete_checkpoints,
            uncommitted=self._dirty,
            committed_offsets=self._committed,
            restores=self.restores,
            aborted_commits=self.aborted,
            state=self.run_state,
            ready=self.ready,
        )
        return status_document(
            self.spec,
            self._st,
            done=self.done,
            by_adversary=self._epsilon_by_adversary(),
            sample_level=self._sample_level_privacy(),
            counters=counters,
        )

    def _write_status(self, force: bool = False) -> None:
        path = self.settings.status_path
        if path is None or (not force and time.monotonic() - self._last_status < 0.1):
            return
        self._last_status = time.monotonic()
        write_atomic(path, json.dumps(self.status()).encode())
