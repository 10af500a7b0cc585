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
settings, its per-upload step, what each checkpoint publishes, and its phases.

Records: checkpoints and round states are chunked documents
(:mod:`pipeline.fl_records`) of at most ``JobSettings.max_record_bytes``
each, all chunks in the commit's transaction; a restore loads only a
complete, consistent set (and still checks its offsets against the group's).

Idempotence of uploads: ids are content-derived and bind the round. The same
id again in the current round is a **duplicate** (a retry, or a second
collector's copy): counted in ``duplicates``, changing nothing. An id accepted
in one of the last :data:`REPLAY_WINDOW` rounds, re-sent later, is refused as
``replayed``; any other upload for another round as ``stale_round``.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from estimator.errors import JobStateError
from estimator.fl.aggregator_specs import FLAccountant
from estimator.fl.aggregators import AggregateResult, Aggregator, RoundContext
from estimator.fl.checkpoint import CheckpointLog, JobState
from estimator.fl.checkpoint import json_float as _f
from estimator.fl.dp import FLTRUST_OPERATOR_SEES, AdaptiveClippingDP, epsilon_by_adversary
from estimator.fl.ftrl import DPFTRL
from estimator.fl.task import FLTaskSpec
from ldp_core.files import write_atomic
from ldp_core.fl.errors import FLError, SecAggError, UpdateRejected
from ldp_core.fl.personalization import personalization_to_dict
from ldp_core.fl.protocol import (
    RoundState,
    Upload,
    check_upload_against,
    encode_vector,
    parse_upload,
    verify_upload_auth,
)
from ldp_core.fl.training import ClientUpdate
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
    "FLTaskSpec",
    "JobSettings",
    "JobStateError",
    "AggregationJob",
    "REPLAY_WINDOW",
    "ENV_PREFIX",
]

log = logging.getLogger("ldp.fl.job")

#: rounds whose accepted upload ids the job keeps, to count a re-sent old upload as ``replayed``
REPLAY_WINDOW = 16
#: environment variables of :meth:`JobSettings.from_env`: ``LDP_FL_JOB_<FIELD>``
ENV_PREFIX = "LDP_FL_JOB_"
#: the keys of a round's record that the public counters show (none depends on the sample)
_PUBLIC_ROUND_KEYS = ("round", "epsilon", "noise_stddev", "clip_norm")


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

    def __init__(self, transport: Transport, spec: FLTaskSpec, settings: JobSettings, clock: Any = time.time) -> None:
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
        self.payload_size = self.strategy.payload_size(self.model.num_params)
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
        self._by_adversary: tuple[int, list[dict[str, Any]]] | None = None  # (rounds accounted, figures)
        self._sample_level: tuple[int, dict[str, Any]] | None = None  # (rounds released, figures)
        self._sample_figures: dict[int, dict[str, Any]] = {}

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
        self._on_upload(rec.value)
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

    # -- rounds and phases ------------------------------------------------------------------------
    def _public_stats(self) -> dict[str, Any]:
        """The counters every collector serves to anyone (``/status``, every round view). Nothing that
        depends on the round's sample: no accepted, rejected or duplicate counts, no realized client count,
        no survivor lists, no failure reason (those stay in the operator's :meth:`status`); the sampling
        amplification the accountant credits assumes an observer who does not know the sample; the figures
        for the other adversaries (``epsilon_by_adversary``) depend only on public task parameters."""
        st = self._st
        last = st.history[-1] if st.history else None
        out = {
            "epsilon": _f(st.epsilon),
            "delta": self.spec.delta if self.spec.clip_norm is not None else None,
            "rounds_done": len(st.history),
            "last_round": None if last is None else {k: last[k] for k in _PUBLIC_ROUND_KEYS if k in last},
            "aggregator": self.spec.aggregator.kind,
            "epsilon_by_adversary": self._epsilon_by_adversary(),
        }
        if self.spec.local_dp_sgd is not None:
            out["sample_level"] = self._sample_level_privacy()
        if last is not None and "failed" in last:
            out["last_round"]["failed"] = True
        if st.clip_norm is not None:
            out["clip_norm"] = st.clip_norm
        return out

    def _epsilon_by_adversary(self) -> list[dict[str, Any]] | None:
        """ε against each adversary (:func:`estimator.fl.dp.epsilon_by_adversary`; None without DP): a
        function of the task's public parameters (sampling, population, δ, σ) and of how many rounds
        were released, never of the realized sample, so the public stats may carry it. Cached per
        number of accounted rounds (the status is written every 0.1 s; PLD is not free)."""
        acc = self._accountant
        if acc is None:
            return None
        if self._by_adversary is None or self._by_adversary[0] != acc.rounds:
            st = self._st  # its ε is the accountant's epsilon() when it covers the same rounds
            fresh = acc.rounds and st.epsilon is not None and len(st.noise_history) == acc.rounds
            observer = st.epsilon if fresh else None
            if self.spec.noise is not None:  # distributed noise: the server operator gets a figure too
                from estimator.fl.ddg_accounting import ddg_epsilon_by_adversary

                figures = ddg_epsilon_by_adversary(self._ddg_accountant(acc.rounds), self.spec.secagg_threshold)
            else:
                sees = FLTRUST_OPERATOR_SEES if self.spec.aggregator.kind == "fltrust" else None  # DP-FLTrust
                figures = epsilon_by_adversary(
                    acc, secagg=bool(self.spec.secagg), observer=observer, operator_sees=sees
                )
            for a in figures:
                a["epsilon"] = _f(a["epsilon"])
            self._by_adversary = (acc.rounds, figures)
        return [dict(a) for a in self._by_adversary[1]]

    def _sample_level_privacy(self) -> dict[str, Any]:
        """The devices' sample-level ε (task option ``local_dp_sgd``) beside the client-level figures: per round,
        so far (a device may have joined every released round) and for the whole task (every round), all worst
        cases over devices from public task parameters only (no device's participation). Cached per round count."""
        done = len(self._st.history)
        if self._sample_level is None or self._sample_level[0] != done:
            spec = self.spec
            task = self._sample_figure(spec.rounds, add_remove=True)
            per_round, so_far = self._sample_figure(1), self._sample_figure(done)
            self._sample_level = (
                done,
                {
                    "epsilon": _f(so_far["epsilon"]),
                    "neighbors": "replace one example (a device's example count is public)",
                    "rounds": done,
                    "epsilon_per_round": _f(per_round["epsilon"]),
                    "epsilon_task": _f(task["epsilon"]),
                    "epsilon_task_add_remove": _f(task["epsilon_add_remove"]),
                    "epsilon_task_add_remove_rdp": _f(task["epsilon_add_remove_rdp"]),
                    "task_rounds": spec.rounds,
                    "delta": spec.delta,
                    "local_dp_sgd": dict(spec.local_dp_sgd or {}),
                    "worst_case": "a device that took part in every round",
                    "protects": "one training example of one device, against anyone who sees that device's "
                    "update, the server included; the client-level epsilon protects a whole device's data "
                    "against those who see the models",
                },
            )
        return dict(self._sample_level[1])

    def _sample_figure(self, rounds: int, add_remove: bool = False) -> dict[str, Any]:
        """:meth:`FLTaskSpec.sample_level_privacy` for ``rounds``, computed once per count (PLD takes ~1 s);
        the add/remove figures only when asked (the task's total)."""
        have = self._sample_figures.get(rounds)
        if have is None or (add_remove and "epsilon_add_remove" not in have):
            fig = self.spec.sample_level_privacy(rounds, add_remove=add_remove)
            assert fig is not None
            self._sample_figures[rounds] = fig
        return self._sample_figures[rounds]

    def _round_state(self) -> RoundState:
        st = self._st
        cfg = self.strategy.configure(st.round, st.params)
        return RoundState(
            task=self.spec.task,
            seq=st.seq,
            round=st.round,
            phase=st.phase,
            rounds=self.spec.rounds,
            model=dict(self.spec.model),
            params=st.params,
            algorithm=cfg.algorithm,
            training=dataclasses.asdict(cfg.training),
            prox_mu=cfg.prox_mu,
            control=cfg.control,
            clip_norm=self.spec.device_clip_norm,
            selected=tuple(st.selected),
            opened_at=st.opened_at,
            deadline=st.deadline,
            secagg=st.secagg,
            indices=dict(st.indices),
            adverts=dict(st.adverts) if st.phase in ("share", "masked", "unmask") else {},
            inbox=st.inbox if st.phase == "masked" else {},
            survivors=tuple(st.survivors) if st.phase in ("consistency", "unmask") else (),
            dropped=tuple(st.dropped) if st.phase in ("consistency", "unmask") else (),
            stats=self._public_stats(),
            enrollment_key=self.spec.authority_key,
            task_config=self._task_config(),
            advert_auth=dict(st.advert_auth) if st.phase in ("share", "masked", "consistency", "unmask") else {},
            consistency=dict(st.consistency) if st.phase == "unmask" else {},
            personalization=personalization_to_dict(cfg.personalization),
        )

    def _task_config(self) -> dict[str, Any] | None:
        sig = self.spec.task_signature
        return None if sig is None else {"config": self.spec.signed_config(), "signature": sig}

    def _set_phase(self, phase: str, timeout: float) -> None:
        st = self._st
        st.phase = phase
        st.seq += 1
        st.opened_at = float(self.clock())
        st.deadline = st.opened_at + timeout
        self._outbox.append(self._round_state())

    def _open_round(self, r: int) -> None:
        st = self._st
        spec = self.spec
        if st.seen:  # the closing round's accepted ids, to recognise a replay of one of them later
            st.past_ids[st.round] = sorted(st.seen)
        st.past_ids = {k: v for k, v in st.past_ids.items() if r - REPLAY_WINDOW <= k < r}
        st.round = r
        st.updates, st.seen, st.adverts, st.shares, st.inbox, st.reveals = {}, set(), {}, {}, {}, {}
        st.advert_auth, st.consistency, st.commitments = {}, {}, {}
        st.survivors, st.dropped, st.masked_sum, st.secagg, st.indices = [], [], None, None, {}
        if r >= spec.rounds:
            st.selected = []
            self._set_phase("done", 0.0)
            return
        st.selected = [str(c) for c in self.sampling.sample(list(spec.clients), self._rng)]
        if spec.secagg and self._ftrl is not None:  # a masked sum cannot drop a repeat: leave it out of the round
            st.selected = self._ftrl.eligible(st.selected)
        if not spec.secagg:
            self._set_phase("train", spec.round_timeout)
            return
        if len(st.selected) < 3:
            self._fail_round(f"secure aggregation needs at least 3 clients, {len(st.selected)} were sampled")
            return
        from estimator.fl.secagg_server import default_degree, make_config
        from ldp_core.fl.secagg import Quantizer

        n = len(st.selected)
        deg = default_degree(n) if spec.secagg_degree is None else min(spec.secagg_degree, n - 1)
        t = spec.secagg_threshold
        if t is not None:  # the signed t: devices refuse any other, and any degree k >= 2t
            ok = [k for k in range(t, min(2 * t - 1, n - 1) + 1) if k == n - 1 or k % 2 == 0]
            if not ok:
                self._fail_round(f"no neighbour graph on {n} clients has a degree k with t = {t} <= k < 2t")
                return
            deg = max([k for k in ok if k <= deg] or [min(ok)])
        ddg = None if spec.noise is None else spec.noise.build(spec, self.payload_size)
        comp = spec.build_compression()
        length = self.payload_size if ddg is None else ddg.padded_dim  # DDG rotates a power-of-two padding
        if comp is not None:  # b-bit codes summed in Z_{2^ring_bits} (issue 18), padded when rotated
            length = comp.length(self.payload_size)
        cfg = make_config(r, n, length, self._rng, deg, t)
        q = Quantizer.for_clients(n, float(spec.clip_norm))  # type: ignore[arg-type]
        st.indices = {c: i + 1 for i, c in enumerate(st.selected)}
        st.secagg = {
            "num_clients": n,
            "neighbors": {str(u): list(vs) for u, vs in cfg.neighbors.items()},
            "threshold": cfg.threshold,
            "vector_length": cfg.vector_length,
            "clip_range": q.clip_range,
            "scale": q.scale,
            "max_clients": q.max_clients,
        }
        if ddg is not None:  # the rotation is public (the server inverts it); the devices' noise is not
            st.secagg["ddg"] = {"rotation_seed": int(self._rng.integers(0, 2**62)), "bits": ddg.bits}
        if comp is not None:  # the rotation seed is public; the devices pack their words ring_bits each
            st.secagg["compression"] = {"rotation_seed": int(self._rng.integers(0, 2**62)), **comp.to_dict()}
        st.masked_sum = np.zeros(length, np.uint32)
        self._set_phase("advertise", spec.phase_timeout)

    def _fail_round(self, reason: str) -> None:
        log.warning("round %d of task %s failed: %s", self._st.round, self.spec.task, reason)
        self._st.history.append({"round": self._st.round, "failed": reason})  # no release, no privacy spent
        self._open_round(self._st.round + 1)

    def _advance(self) -> None:
        """Move through every phase whose condition holds: all expected uploads in, or the deadline passed."""
        for _ in range(16):
            st = self._st
            if st.phase == "done":
                return
            late = self.clock() >= st.deadline
            if st.phase == "train":
                if not (late or set(st.updates) >= set(st.selected)):
                    return
                self._close_plain()
            elif st.phase == "advertise":
                if not (late or len(st.adverts) == len(st.selected)):
                    return
                if len(st.adverts) < int(st.secagg["threshold"]) + 1:  # type: ignore[index]
                    self._fail_round(f"only {len(st.adverts)} clients advertised keys")
                else:
                    self._set_phase("share", self.spec.phase_timeout)
            elif st.phase == "share":
                if not (late or set(st.shares) >= set(st.adverts)):
                    return
                inbox: dict[int, dict[int, bytes]] = {}
                for u, per in st.shares.items():
                    for v, ct in per.items():
                        inbox.setdefault(v, {})[u] = ct
                st.inbox, st.shares = inbox, {}
                st.survivors = []
                st.secagg["sharers"] = sorted(set().union(*[set(per) for per in inbox.values()]) if inbox else set())  # type: ignore[index]
                self._set_phase("masked", self.spec.phase_timeout)
            elif st.phase == "masked":
                sharers = set(st.secagg["sharers"])  # type: ignore[index]
                if not (late or set(st.survivors) >= sharers):
                    return
                if len(st.survivors) < int(st.secagg["threshold"]):  # type: ignore[index]
                    self._fail_round(f"only {len(st.survivors)} masked inputs arrived")
                    continue
                st.dropped = sorted(sharers - set(st.survivors))
                st.survivors = sorted(st.survivors)
                st.inbox = {}
                st.consistency = {}
                self._set_phase("consistency", self.spec.phase_timeout)
            elif st.phase == "consistency":
                if not (late or set(st.consistency) >= set(st.survivors)):
                    return
                if len(st.consistency) < int(st.secagg["threshold"]) + 1:  # type: ignore[index]
                    # each survivor reveals only with t signatures from *other* survivors
                    self._fail_round(f"only {len(st.consistency)} survivors signed the survivor set")
                    continue
                self._set_phase("unmask", self.spec.phase_timeout)
            elif st.phase == "unmask":
                if not (late or set(st.reveals) >= set(st.survivors)):
                    return
                self._close_secagg()

    def _ctx(self) -> RoundContext:
        return RoundContext(
            self._st.round,
            self.payload_size,
            self._rng,
            self.sampling.expected_clients(len(self.spec.clients)),
            params=self._st.params,  # the model the round's clients started from (FLTrust's root update)
        )

    def _finish_round(self, res: AggregateResult, extra: dict[str, Any]) -> None:
        st = self._st
        ctx_expected = self.sampling.expected_clients(len(self.spec.clients))
        if self.spec.algorithm == "scaffold":
            self.strategy.control = None if st.control is None else st.control.copy()  # type: ignore[attr-defined]
        st.params = np.asarray(self.strategy.apply(st.params, res, ctx_expected / len(self.spec.clients)), np.float32)
        if self.spec.algorithm == "scaffold":
            st.control = np.asarray(self.strategy.control, np.float32)  # type: ignore[attr-defined]
        if self.spec.clip_norm is not None:
            st.noise_history.append(float(self.spec.noise_multiplier))
            if "epsilon" in res.info:
                st.epsilon = float(res.info["epsilon"])
            elif self._accountant is not None:
                st.epsilon = self._accountant.epsilon()
        info = {k: v for k, v in res.info.items() if isinstance(v, (int, float, str, dict, list)) or v is None}
        info.pop("epsilon", None)
        selected = info.get("selected")
        if isinstance(selected, list):  # Krum's kept client ids would reveal part of the sample
            info.pop("selected")
            info["kept"] = len(selected)
        trust = info.get("trust_scores")
        if isinstance(trust, dict):  # FLTrust's scores by client id: kept as a sorted list, without the ids
            info["trust_scores"] = sorted((float(t) for t in trust.values()), reverse=True)
        if self._adaptive is not None:
            st.clip_norm = float(self._adaptive.clip_norm)
        rec = {"round": st.round, "clients": res.num_clients, "epsilon": _f(st.epsilon), **extra, **info}
        st.history.append(rec)
        self._open_round(st.round + 1)

    def _close_plain(self) -> None:
        st = self._st
        ups = [ClientUpdate(c, st.round, st.updates[c][1], st.updates[c][2]) for c in st.selected if c in st.updates]
        assert self._aggregator is not None
        try:
            res = self._aggregator.aggregate(ups, self._ctx())
        except FLError as exc:  # a robust wrapper with too few updates for its f: nothing is released
            self._fail_round(f"aggregation refused the round: {exc}")
            return
        self._finish_round(res, {})

    def _close_secagg(self) -> None:
        from estimator.fl.secagg_server import SecAggServer
        from ldp_core.fl.secagg import KeyAdvert, Quantizer, SecAggConfig, Share

        st = self._st
        sa = st.secagg
        assert sa is not None and st.masked_sum is not None
        cfg = SecAggConfig(
            st.round,
            int(sa["num_clients"]),
            {int(u): tuple(vs) for u, vs in sa["neighbors"].items()},
            int(sa["threshold"]),
            int(sa["vector_length"]),
        )
        server = SecAggServer.resume(
            cfg,
            {u: KeyAdvert(u, a, b) for u, (a, b) in st.adverts.items()},
            set(sa["sharers"]),
            set(st.survivors),
            st.masked_sum,
        )
        reveals = {u: {v: (k, Share(x, y, t)) for v, (k, x, y, t) in per.items()} for u, per in st.reveals.items()}
        noise = self.spec.noise
        if "ddg" in sa and noise is not None and len(st.survivors) < noise.shares(self.spec):
            # fewer noise shares than the accountant assumes: the operator does not even unmask this sum
            self._fail_round(f"only {len(st.survivors)} survivors: fewer than {noise.shares(self.spec)} noise shares")
            return
        try:
            total = server.finish(reveals, st.commitments)
        except SecAggError as exc:
            self._fail_round(f"unmasking failed: {exc}")
            return
        if server.bad_shares:
            st.rejected["bad_share"] += server.bad_shares
            log.warning("round %d: %d revealed shares did not match their commitments", st.round, server.bad_shares)
        ctx = self._ctx()
        if "ddg" in sa and noise is not None:
            self._close_ddg(total, int(sa["ddg"]["rotation_seed"]), ctx)
            return
        comp = self.spec.build_compression()
        if comp is not None and "compression" in sa:  # fedavg only: the task refuses other aggregators with it
            # σ relative to the codes' sensitivity (the bound B every honest device enforces, C + Δ·√D with
            # unbiased rounding, or the clipped sketch's), added where that bound holds: on the decoded codes, or
            # on the summed sketch before unsketching (RingQuantization / RingCountSketch.release)
            sensitivity = comp.sensitivity(float(self.spec.clip_norm), self.payload_size)  # type: ignore[arg-type]
            sd = float(self.spec.noise_multiplier) * sensitivity
            seed = int(sa["compression"]["rotation_seed"])
            noisy = comp.release(total, len(st.survivors), seed, self.payload_size, sd, ctx.rng)
            res = self._gaussian_result(noisy, sd, ctx, len(st.survivors))
        else:
            q = Quantizer(float(sa["clip_range"]), float(sa["scale"]), int(sa["max_clients"]))
            s = q.decode_sum(total)
            if self._ftrl is not None:  # DP-FTRL: the tree's increment on the unmasked sum (central noise)
                by_index = {i: c for c, i in st.indices.items()}
                res = self._ftrl.release_sum(s, [by_index[u] for u in st.survivors], ctx)
            else:  # σ relative to C, so the accountant's ε holds
                sd = float(self.spec.noise_multiplier) * float(self.spec.clip_norm)  # type: ignore[arg-type]
                noisy = s + (ctx.rng.normal(0.0, sd, size=s.shape) if sd > 0 else 0.0)
                res = self._gaussian_result(noisy, sd, ctx, len(st.survivors))
        # the digest of the un-noised sum is an integrity record for the operator's audit, kept in the checkpoint
        # only: published, it would let anyone who knows the other inputs test a hypothesis about one client's
        # update with certainty (issue 13), voiding the DP guarantee of the noised release
        st.audit[st.round] = hashlib.sha256(total.astype("<u4").tobytes()).hexdigest()
        st.audit = {r: h for r, h in st.audit.items() if r > st.round - REPLAY_WINDOW}
        self._finish_round(res, {"secagg_survivors": list(st.survivors), "secagg_dropped": list(st.dropped)})

    def _gaussian_result(self, noisy: np.ndarray, sd: float, ctx: RoundContext, survivors: int) -> AggregateResult:
        """A SecAgg round's central-noise release (the noised sum over the expected count), told to the accountant."""
        if self._accountant is not None:
            self._accountant.record(self.spec.noise_multiplier)
        return AggregateResult(
            noisy / ctx.expected_clients,
            ctx.expected_clients,
            survivors,
            {"noise_stddev": sd, "clip_norm": self.spec.clip_norm},
        )

    def _ddg_accountant(self, rounds: int) -> Any:
        """The distributed-DG accountant after ``rounds`` released rounds (every round has the same public spec)."""
        from estimator.fl.ddg_accounting import DDGAccountant

        noise = self.spec.noise
        assert noise is not None
        acc = DDGAccountant(self.spec.delta)
        spec = noise.build(self.spec, self.payload_size)
        for _ in range(rounds):
            acc.record(spec, noise.shares(self.spec))
        return acc

    def _close_ddg(self, total: np.ndarray, rotation_seed: int, ctx: RoundContext) -> None:
        """Release a distributed-DG round: the unmasked sum mod 2^bits already carries the devices' noise;
        the server only decodes it (nothing is added, nothing un-noised was ever in its hands)."""
        st = self._st
        noise = self.spec.noise
        assert noise is not None
        spec = noise.build(self.spec, self.payload_size)
        s = spec.decode_sum(total.astype(np.int64), rotation_seed)
        if self._accountant is not None:
            self._accountant.record(self.spec.noise_multiplier)
        acc = self._ddg_accountant(len(st.noise_history) + 1)
        info = {
            "noise_stddev": math.sqrt(spec.noise_variance()),
            "clip_norm": self.spec.clip_norm,
            "noise": noise.kind,
            "bits": spec.bits,
            "modular_clipping_bound": acc.modular_clipping_bound(),
            "epsilon": acc.epsilon(),
        }
        res = AggregateResult(s / ctx.expected_clients, ctx.expected_clients, len(st.survivors), info)
        self._finish_round(res, {"secagg_survivors": list(st.survivors), "secagg_dropped": list(st.dropped)})

    # -- uploads --------------------------------------------------------------------------------
    def _on_upload(self, value: bytes) -> None:
        st = self._st
        try:
            u = parse_upload(value, payload_size=self.payload_size)
            if u.task != self.spec.task:
                return
            verify_upload_auth(u, self.spec.authority_key, self.clock())  # the topic is not trusted either
            if u.upload_id in st.seen:  # a retry (or a second collector's copy) of an accepted upload: idempotent
                st.duplicates[u.kind] += 1
                log.info("duplicate of upload %s (round %d): already counted", u.upload_id, u.round)
                return
            if u.round < st.round and u.upload_id in st.past_ids.get(u.round, ()):
                raise UpdateRejected(
                    "replayed", f"upload {u.upload_id} was accepted in round {u.round}; the current round is {st.round}"
                )
            check_upload_against(u, self._round_state_light())
            self._accept(u)
        except UpdateRejected as exc:
            st.rejected[exc.reason] += 1
            log.info("rejected an upload (%s): %s", exc.reason, exc)
            return
        st.seen.add(u.upload_id)
        st.accepted[u.kind] += 1

    def _round_state_light(self) -> RoundState:
        st = self._st
        return RoundState(
            task=self.spec.task,
            seq=st.seq,
            round=st.round,
            phase=st.phase,
            rounds=self.spec.rounds,
            model=self.spec.model,
            params=st.params,
            selected=tuple(st.selected),
            secagg=st.secagg,
            indices=st.indices,
            adverts=st.adverts,
            survivors=tuple(st.survivors),
        )

    def _accept(self, u: Upload) -> None:
        st = self._st
        if u.kind == "update":
            if u.client_id in st.updates:
                raise UpdateRejected("duplicate_client", f"{u.client_id} already uploaded in round {st.round}")
            st.updates[u.client_id] = (
                u.upload_id,
                np.asarray(u.payload["vector"], np.float32),
                int(u.payload["num_examples"]),
            )
            return
        me = st.indices[u.client_id]
        if u.kind == "advert":
            if me in st.adverts:
                raise UpdateRejected("duplicate_client", f"client {me} already advertised keys")
            st.adverts[me] = (u.payload["share_key"], u.payload["mask_key"])
            assert u.auth is not None  # verified in _on_upload
            # peers check this signature themselves: the server cannot swap in keys of its own
            st.advert_auth[me] = {"client_id": u.client_id, **u.auth}
        elif u.kind == "shares":
            if me in st.shares:
                raise UpdateRejected("duplicate_client", f"client {me} already shared keys")
            st.shares[me] = dict(u.payload["ciphertexts"])
            if "commitments" in u.payload:
                st.commitments[me] = dict(u.payload["commitments"])
        elif u.kind == "masked":
            if me in st.survivors:
                raise UpdateRejected("duplicate_client", f"client {me} already sent its masked input")
            if me not in set(st.secagg["sharers"]):  # type: ignore[index]
                raise UpdateRejected("bad_secagg", f"client {me} did not share keys: its input could not be unmasked")
            assert st.masked_sum is not None
            st.masked_sum += u.payload["vector"]
            st.survivors.append(me)
        elif u.kind == "consistency":
            from ldp_core.fl.secagg import SURVIVORS_TAG, survivors_message
            from ldp_core.tokens.enrollment import Credential, verify_signature

            if me in st.consistency:
                raise UpdateRejected("duplicate_client", f"client {me} already signed the survivor set")
            assert u.auth is not None  # verified in _on_upload
            cred = Credential.from_dict(u.auth["credential"])
            message = survivors_message(self.spec.task, st.round, st.survivors)
            if not verify_signature(cred.public_key, u.payload["signature"], SURVIVORS_TAG, message):
                raise UpdateRejected("bad_secagg", f"client {me}'s signature is not of this round's survivor set")
            st.consistency[me] = {
                "client_id": u.client_id,
                "credential": u.auth["credential"],
                "signature": base64.b64encode(u.payload["signature"]).decode(),
            }
        else:
            if me in st.reveals:
                raise UpdateRejected("duplicate_client", f"client {me} already revealed its shares")
            st.reveals[me] = dict(u.payload["shares"])

    # -- status ---------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The job's JSON status: round, phase, ε, counters (committed and pending), history."""
        st = self._st
        return {
            "task": self.spec.task,
            "round": st.round,
            "phase": st.phase,
            "seq": st.seq,
            "rounds": self.spec.rounds,
            "done": self.done,
            "epsilon": _f(st.epsilon),
            "delta": self.spec.delta if self.spec.clip_norm is not None else None,
            "epsilon_by_adversary": self._epsilon_by_adversary(),
            "sample_level": None if self.spec.local_dp_sgd is None else self._sample_level_privacy(),
            "rejected": dict(st.rejected),
            "accepted": dict(st.accepted),
            "duplicates": dict(st.duplicates),
            "clip_norm": st.clip_norm if st.clip_norm is not None else self.spec.device_clip_norm,
            "incomplete_checkpoints": self.incomplete_checkpoints,
            "received_this_round": len(st.seen),
            "uncommitted": self._dirty,
            "committed_offsets": {str(p): o for p, o in self._committed.items()},
            "restores": self.restores,
            "aborted_commits": self.aborted,
            "history": st.history,
            "params": encode_vector(st.params),
            "state": self.run_state,  # readiness (pipeline.processor); `python -m pipeline.status FILE` checks it
            "ready": self.ready,
            "updated": round(time.time(), 3),
        }

    def _write_status(self, force: bool = False) -> None:
        path = self.settings.status_path
        if path is None or (not force and time.monotonic() - self._last_status < 0.1):
            return
        self._last_status = time.monotonic()
        write_atomic(path, json.dumps(self.status()).encode())
