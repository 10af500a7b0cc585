"""The federated aggregation job: rounds over the pipeline, exactly once across crashes.

The job owns one *task* (a model, a client population, a number of rounds,
sampling, DP and optionally secure aggregation; :class:`FLTaskSpec`). It
publishes each round's state (:class:`client_sdk.fl.protocol.RoundState`) to
``ldp.fl.rounds``; collectors serve it to devices and publish their checked
uploads to ``ldp.fl.updates``; the job consumes them, advances the phases,
aggregates with the task's stack (by default ``ValidatingAggregator(
FixedClippingDP(WeightedMean(), C, σ, accountant))``; adaptive clipping or a
robust aggregator as :class:`FLTaskSpec` describes; or the SecAgg+ server
followed by the same Gaussian noise), reports ε after every round and opens
the next round.

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

Finding the newest checkpoint: the job publishes a *marker* record to the
state topic and reads that topic (in a reader group whose committed offset
stays at the last restored checkpoint) until the marker comes back; the last
checkpoint of its task and group before the marker is the newest committed one.

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
import uuid
from collections import Counter
from typing import Any, Mapping

import numpy as np

from client_sdk.files import write_atomic
from client_sdk.fl.client import ClientUpdate, LocalTraining
from client_sdk.fl.errors import FLError, SecAggError, UpdateRejected
from client_sdk.fl.protocol import (
    PROTOCOL_VERSION,
    RoundState,
    Upload,
    check_upload_against,
    decode_vector,
    encode_vector,
    model_from_dict,
    parse_upload,
)
from client_sdk.randomness import secure_generator
from pipeline.fl_records import (
    DEFAULT_MAX_RECORD_BYTES,
    MIN_RECORD_BYTES,
    ChunkAssembler,
    ChunkError,
    decode_chunk,
    encode_chunks,
    is_chunk,
    pack_document,
    unpack_document,
)
from pipeline.topics import FL_ROUNDS_TOPIC, FL_STATE_TOPIC, FL_UPDATES_TOPIC
from pipeline.transport import CommitFailedError, Consumer, FencedError, TopicPartition, Transport, TransportError
from estimator.errors import JobStateError
from estimator.fl.aggregators import AggregateResult, Aggregator, RoundContext, ValidatingAggregator, WeightedMean
from estimator.fl.dp import AdaptiveClippingDP, ClientLevelAccountant, FixedClippingDP, update_noise_multiplier
from estimator.fl.robust import CoordinateMedian, Krum, TrimmedMean
from estimator.fl.sampling import FixedCountSampling, PoissonSampling, Sampling
from estimator.fl.strategies import FedAvg, FedProx, Scaffold, Strategy

__all__ = ["FL_ROUNDS_TOPIC", "FL_UPDATES_TOPIC", "FL_STATE_TOPIC", "FLTaskSpec", "JobSettings", "JobStateError",
           "AggregationJob", "REPLAY_WINDOW"]

log = logging.getLogger("ldp.fl.job")



#: options of each aggregator kind of a task (see :class:`FLTaskSpec`)
_AGGREGATOR_OPTIONS: dict[str, tuple[str, ...]] = {
    "fedavg": (), "adaptive_clipping": ("target_quantile", "clip_learning_rate", "count_stddev"),
    "median": ("f",), "trimmed_mean": ("f",), "krum": ("f", "multi"),
}
#: rounds whose accepted upload ids the job keeps, to count a re-sent old upload as ``replayed``
REPLAY_WINDOW = 16



class _Rewind(Exception):
    """Raised inside a transaction to abort it (which rewinds the consumer to the committed offsets)."""


def _num(name: str, v: object, *, low: float = 0.0, strict: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
            (v <= low if strict else v < low):
        raise FLError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {v!r}")
    return float(v)


@dataclasses.dataclass(frozen=True)
class FLTaskSpec:
    """What the job runs (frozen, validated; JSON via :meth:`from_dict`/:meth:`to_dict`).

    ``sampling`` is ``{"kind": "poisson", "rate": q}`` or ``{"kind": "fixed", "count": m}``;
    ``clip_norm`` C turns on client-level DP (devices clip to C, the server
    clips again and adds N(0, (σC)²) with σ = ``noise_multiplier``); ``secagg``
    needs C (the quantizer's range). ``round_timeout`` bounds the plain
    ``train`` phase, ``phase_timeout`` each SecAgg phase (seconds). ``seed``
    fixes the job's generator (sampling, SecAgg graph, noise) for
    simulations; ``None`` (production) draws every value from the OS CSPRNG
    (:func:`client_sdk.randomness.secure_generator`: an observer of released
    models must not be able to predict the noise or the sample, which a
    seeded PCG64 would allow) and keeps no generator state in checkpoints.

    ``aggregator`` picks the server's stack (:meth:`build_aggregator`):

    * ``{"kind": "fedavg"}`` (default): the weighted mean, under
      ``FixedClippingDP`` when ``clip_norm`` is set (devices clip to C too).
    * ``{"kind": "adaptive_clipping", "target_quantile": γ, "clip_learning_rate": η_C,
      "count_stddev": σ_b}`` (the last three optional: 0.5, 0.2, expected clients / 20):
      ``AdaptiveClippingDP`` starting at C = ``clip_norm`` with overall noise multiplier
      z = ``noise_multiplier`` > 0 (the count's noise is paid for on the updates, as the
      wrapper documents; needs σ_b > z/2). Devices do not clip: the server needs each
      update's norm against C (the bit 1[‖Δ‖ ≤ C]); the current C is in the round's ``stats``.
      Not with ``secagg`` (that bit is not securely summed).
    * ``{"kind": "median", "f": f}``, ``{"kind": "trimmed_mean", "f": f}``,
      ``{"kind": "krum", "f": f, "multi": m}`` (m optional, 1): the robust wrappers over a
      weighted mean, tolerating f malicious clients. They are not linear, so they run without
      DP (``clip_norm`` null, ``noise_multiplier`` 0) and without ``secagg`` (they need every
      individual update; secure aggregation reveals only the sum). A round with fewer updates
      than the wrapper needs (2f + 1; Krum 2f + 3) fails without release."""

    task: str
    model: Mapping[str, Any]
    clients: tuple[str, ...]
    rounds: int
    sampling: Mapping[str, Any]
    algorithm: str = "fedavg"
    training: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    prox_mu: float = 0.01
    server_learning_rate: float = 1.0
    clip_norm: float | None = None
    noise_multiplier: float = 0.0
    delta: float = 1e-5
    secagg: bool = False
    secagg_degree: int | None = None
    round_timeout: float = 60.0
    phase_timeout: float = 30.0
    seed: int | None = None
    aggregator: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"kind": "fedavg"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "clients", tuple(self.clients))
        if not self.clients or len(set(self.clients)) != len(self.clients):
            raise FLError("clients must be a non-empty list of distinct client ids")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise FLError(f"rounds must be a positive integer, got {self.rounds!r}")
        self.build_model()
        self.build_sampling()
        LocalTraining(**self.training)
        if self.algorithm not in ("fedavg", "fedprox", "scaffold"):
            raise FLError(f"algorithm must be fedavg, fedprox or scaffold, got {self.algorithm!r}")
        _num("server_learning_rate", self.server_learning_rate)
        _num("noise_multiplier", self.noise_multiplier, strict=False)
        _num("round_timeout", self.round_timeout)
        _num("phase_timeout", self.phase_timeout)
        if not 0 < self.delta < 1:
            raise FLError(f"delta must be in (0, 1), got {self.delta!r}")
        object.__setattr__(self, "aggregator", dict(self.aggregator))
        self._check_aggregator()
        if self.clip_norm is not None:
            _num("clip_norm", self.clip_norm)
        elif self.noise_multiplier:
            raise FLError("noise_multiplier needs clip_norm (the noise is σ·C)")
        if self.secagg and self.clip_norm is None:
            raise FLError("secagg needs clip_norm: devices clip to C and quantize values in [-C, C]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise FLError(f"seed must be an integer >= 0 or null, got {self.seed!r}")

    def _check_aggregator(self) -> None:
        agg = self.aggregator
        kind = agg.get("kind")
        if kind not in _AGGREGATOR_OPTIONS:
            raise FLError(f"aggregator kind must be one of {sorted(_AGGREGATOR_OPTIONS)}, got {kind!r}")
        unknown = set(agg) - {"kind"} - set(_AGGREGATOR_OPTIONS[kind])
        if unknown:
            raise FLError(f"aggregator {kind!r} has no options {sorted(unknown)}; it takes "
                          f"{sorted(_AGGREGATOR_OPTIONS[kind]) or 'none'}")
        if kind == "adaptive_clipping":
            if self.clip_norm is None or not self.noise_multiplier > 0:
                raise FLError("adaptive_clipping needs clip_norm (the initial C) and noise_multiplier > 0 (the overall "
                              "z the accountant charges, shared by the updates and the clipped-count release)")
            _num("clip_norm", self.clip_norm)
            if self.secagg:
                raise FLError("adaptive_clipping cannot run with secagg: the server needs each client's bit "
                              "1[‖Δ‖ ≤ C], which secure aggregation does not sum; use kind 'fedavg' with secagg")
            self.build_aggregator(None)  # the wrapper checks γ, η_C; update_noise_multiplier checks σ_b > z/2
            sb = agg.get("count_stddev")
            update_noise_multiplier(self.noise_multiplier, self._expected() / 20.0 if sb is None else _num("count_stddev", sb))
        elif kind in ("median", "trimmed_mean", "krum"):
            if self.secagg:
                raise FLError(f"aggregator {kind!r} needs every client's individual update, and secure aggregation "
                              "reveals only their sum: set secagg to false, or use kind 'fedavg' with secagg")
            if self.clip_norm is not None or self.noise_multiplier:
                raise FLError(f"aggregator {kind!r} is not linear, and the DP wrappers need a bounded-sensitivity sum "
                              "to add noise to: a robust task runs without client-level DP; set clip_norm to null and "
                              "noise_multiplier to 0, or use kind 'fedavg' or 'adaptive_clipping' for DP")
            f, multi = agg.get("f"), agg.get("multi", 1)
            for name, v, low in (("f", f, 0), ("multi", multi, 1)):
                if isinstance(v, bool) or not isinstance(v, int) or v < low:
                    raise FLError(f"aggregator {kind!r}: {name} must be an integer >= {low}, got {v!r}")
            need = 2 * f + 3 if kind == "krum" else 2 * f + 1
            if kind == "krum":
                need = max(need, multi + f)
            count = self.sampling.get("count") if self.sampling.get("kind") == "fixed" else None
            if count is not None and count < need:
                raise FLError(f"aggregator {kind!r} with f = {f} needs at least {need} updates per round; the task "
                              f"samples {count}")
        elif agg.get("kind") == "fedavg" and len(agg) > 1:
            raise FLError("aggregator 'fedavg' takes no options")

    def _expected(self) -> float:
        return self.build_sampling().expected_clients(len(self.clients))

    @property
    def device_clip_norm(self) -> float | None:
        """What devices clip to (published in the round state): C for ``fedavg`` with DP, else None."""
        return self.clip_norm if self.aggregator["kind"] == "fedavg" else None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FLTaskSpec":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise FLError(f"unknown task fields {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["clients"] = list(self.clients)
        return out

    def build_model(self) -> Any:
        return model_from_dict(self.model)

    def build_sampling(self) -> Sampling:
        kind = self.sampling.get("kind")
        if kind == "poisson":
            return PoissonSampling(float(self.sampling["rate"]))
        if kind == "fixed":
            s = FixedCountSampling(int(self.sampling["count"]))
            if s.count > len(self.clients):
                raise FLError(f"fixed count {s.count} exceeds the {len(self.clients)} clients")
            return s
        raise FLError(f"sampling kind must be 'poisson' or 'fixed', got {kind!r}")

    def build_strategy(self) -> Strategy:
        tr = LocalTraining(**self.training)
        if self.algorithm == "fedprox":
            return FedProx(tr, self.server_learning_rate, mu=self.prox_mu)
        if self.algorithm == "scaffold":
            return Scaffold(tr, self.server_learning_rate)
        return FedAvg(tr, self.server_learning_rate)

    def build_accountant(self) -> ClientLevelAccountant | None:
        if self.clip_norm is None:
            return None
        return ClientLevelAccountant(self.build_sampling(), len(self.clients), self.delta)

    def build_aggregator(self, accountant: ClientLevelAccountant | None) -> Aggregator:
        """The stack an in-process run with the same spec uses: ``ValidatingAggregator`` around
        ``FixedClippingDP(WeightedMean(), C, σ, accountant)`` (``fedavg``; without the DP wrapper when
        ``clip_norm`` is None), ``AdaptiveClippingDP(WeightedMean(), C, z, γ, η_C, σ_b, accountant)``,
        ``CoordinateMedian``/``TrimmedMean(WeightedMean(), f)`` or ``Krum(WeightedMean(), f, multi)``."""
        agg = self.aggregator
        kind = agg["kind"]
        if kind == "adaptive_clipping":
            return ValidatingAggregator(AdaptiveClippingDP(
                WeightedMean(), float(self.clip_norm), self.noise_multiplier,  # type: ignore[arg-type]
                target_quantile=float(agg.get("target_quantile", 0.5)),
                clip_learning_rate=float(agg.get("clip_learning_rate", 0.2)),
                count_stddev=None if agg.get("count_stddev") is None else float(agg["count_stddev"]),
                accountant=accountant))
        if kind == "median":
            return ValidatingAggregator(CoordinateMedian(WeightedMean(), int(agg["f"])))
        if kind == "trimmed_mean":
            return ValidatingAggregator(TrimmedMean(WeightedMean(), int(agg["f"])))
        if kind == "krum":
            return ValidatingAggregator(Krum(WeightedMean(), int(agg["f"]), int(agg.get("multi", 1))))
        if self.clip_norm is None:
            return ValidatingAggregator(WeightedMean())
        return ValidatingAggregator(FixedClippingDP(WeightedMean(), self.clip_norm, self.noise_multiplier, accountant))


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """Where the job reads and writes. ``group`` names its consumer group (one per task);
    ``member`` should stay the same across restarts (Kafka fences the predecessor's
    transaction by it). Mid-phase checkpoints are committed every ``checkpoint_interval``
    seconds while uploads arrive; ``status_path`` receives the JSON status. Checkpoints and round
    states are split into records of at most ``max_record_bytes`` (keep it under the broker's
    ``message.max.bytes``)."""

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
        if isinstance(self.max_record_bytes, bool) or not isinstance(self.max_record_bytes, int) or \
                self.max_record_bytes < MIN_RECORD_BYTES:
            raise FLError(f"max_record_bytes must be an integer >= {MIN_RECORD_BYTES}, got {self.max_record_bytes!r}; "
                          "keep it below the broker's message.max.bytes")


def _f(x: float | None) -> Any:
    return None if x is None else ("inf" if x == math.inf else x)


def _unf(x: Any) -> float | None:
    return None if x is None else (math.inf if x == "inf" else float(x))


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


@dataclasses.dataclass
class _State:
    """Everything the job knows; :meth:`to_obj`/:meth:`from_obj` are the checkpoint's state.

    ``duplicates`` counts re-sent uploads by kind; ``past_ids`` keeps the accepted upload ids of the
    last :data:`REPLAY_WINDOW` rounds (to tell a replay from a late upload); ``clip_norm`` is adaptive
    clipping's current C."""

    seq: int = 0
    round: int = 0
    phase: str = "train"
    params: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float32))
    control: np.ndarray | None = None
    selected: list[str] = dataclasses.field(default_factory=list)
    indices: dict[str, int] = dataclasses.field(default_factory=dict)
    opened_at: float = 0.0
    deadline: float = 0.0
    rng_state: dict[str, Any] | None = None
    noise_history: list[float] = dataclasses.field(default_factory=list)
    epsilon: float | None = None
    updates: dict[str, tuple[str, np.ndarray, int]] = dataclasses.field(default_factory=dict)
    seen: set[str] = dataclasses.field(default_factory=set)
    secagg: dict[str, Any] | None = None
    adverts: dict[int, tuple[bytes, bytes]] = dataclasses.field(default_factory=dict)
    shares: dict[int, dict[int, bytes]] = dataclasses.field(default_factory=dict)
    inbox: dict[int, dict[int, bytes]] = dataclasses.field(default_factory=dict)
    masked_sum: np.ndarray | None = None
    survivors: list[int] = dataclasses.field(default_factory=list)
    dropped: list[int] = dataclasses.field(default_factory=list)
    reveals: dict[int, dict[int, tuple[str, int, int, int]]] = dataclasses.field(default_factory=dict)
    rejected: Counter = dataclasses.field(default_factory=Counter)
    accepted: Counter = dataclasses.field(default_factory=Counter)
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    duplicates: Counter = dataclasses.field(default_factory=Counter)
    past_ids: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    clip_norm: float | None = None

    def to_obj(self, binary: bool = True) -> dict[str, Any]:
        """The checkpoint's state: vectors as numpy arrays (``binary``, for a chunked document) or base64."""
        def vec(v: np.ndarray, dtype: str = "<f4") -> Any:
            return np.ascontiguousarray(v, np.dtype(dtype)) if binary else encode_vector(v, dtype)
        return {
            "seq": self.seq, "round": self.round, "phase": self.phase, "params": vec(self.params),
            "num_params": int(self.params.shape[0]),
            "control": None if self.control is None else vec(self.control),
            "selected": self.selected, "indices": self.indices, "opened_at": self.opened_at,
            "deadline": self.deadline, "rng_state": self.rng_state, "noise_history": self.noise_history,
            "epsilon": _f(self.epsilon),
            "updates": {c: [uid, vec(v), n] for c, (uid, v, n) in self.updates.items()},
            "update_length": next((int(v.shape[0]) for _, v, _ in self.updates.values()), 0),
            "seen": sorted(self.seen), "secagg": self.secagg,
            "adverts": {str(u): [_b64(a), _b64(b)] for u, (a, b) in self.adverts.items()},
            "shares": {str(u): {str(v): _b64(ct) for v, ct in per.items()} for u, per in self.shares.items()},
            "inbox": {str(v): {str(u): _b64(ct) for u, ct in per.items()} for v, per in self.inbox.items()},
            "masked_sum": None if self.masked_sum is None else vec(self.masked_sum, "<u4"),
            "survivors": self.survivors, "dropped": self.dropped,
            "reveals": {str(u): {str(v): [k, x, str(y), t] for v, (k, x, y, t) in per.items()}
                        for u, per in self.reveals.items()},
            "rejected": dict(self.rejected), "accepted": dict(self.accepted), "history": self.history,
            "duplicates": dict(self.duplicates), "past_ids": {str(r): ids for r, ids in self.past_ids.items()},
            "clip_norm": self.clip_norm,
        }

    @classmethod
    def from_obj(cls, o: Mapping[str, Any]) -> "_State":
        """Inverse of :meth:`to_obj` (either form; a binary vector must have the dtype and length expected)."""
        def dec(v: Any, length: int, dtype: str = "<f4") -> np.ndarray:
            if not isinstance(v, np.ndarray):
                return decode_vector(v, length, dtype)
            if v.shape != (length,) or v.dtype != np.dtype(dtype).newbyteorder("="):
                raise JobStateError(f"checkpoint vector of shape {v.shape} and dtype {v.dtype}; expected "
                                    f"({length},) {dtype}")
            return v
        n = int(o["num_params"])
        ul = int(o["update_length"])
        sa = o["secagg"]
        return cls(
            seq=int(o["seq"]), round=int(o["round"]), phase=str(o["phase"]),
            params=dec(o["params"], n), control=None if o["control"] is None else dec(o["control"], n),
            selected=list(o["selected"]), indices={k: int(v) for k, v in o["indices"].items()},
            opened_at=float(o["opened_at"]), deadline=float(o["deadline"]), rng_state=o["rng_state"],
            noise_history=[float(z) for z in o["noise_history"]], epsilon=_unf(o["epsilon"]),
            updates={c: (uid, dec(v, ul), int(k)) for c, (uid, v, k) in o["updates"].items()},
            seen=set(o["seen"]), secagg=sa,
            adverts={int(u): (base64.b64decode(a), base64.b64decode(b)) for u, (a, b) in o["adverts"].items()},
            shares={int(u): {int(v): base64.b64decode(ct) for v, ct in per.items()} for u, per in o["shares"].items()},
            inbox={int(v): {int(u): base64.b64decode(ct) for u, ct in per.items()} for v, per in o["inbox"].items()},
            masked_sum=None if o["masked_sum"] is None else dec(o["masked_sum"], int(sa["vector_length"]), "<u4"),
            survivors=[int(u) for u in o["survivors"]], dropped=[int(u) for u in o["dropped"]],
            reveals={int(u): {int(v): (k, int(x), int(y), int(t)) for v, (k, x, y, t) in per.items()}
                     for u, per in o["reveals"].items()},
            rejected=Counter(o["rejected"]), accepted=Counter(o["accepted"]), history=list(o["history"]),
            duplicates=Counter(o.get("duplicates", {})),
            past_ids={int(r): list(ids) for r, ids in o.get("past_ids", {}).items()},
            clip_norm=None if o.get("clip_norm") is None else float(o["clip_norm"]))


class AggregationJob:
    """Runs one task's rounds over ``transport`` (see the module docstring)."""

    def __init__(self, transport: Transport, spec: FLTaskSpec, settings: JobSettings,
                 clock: Any = time.time) -> None:
        self.transport = transport
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
        self.incomplete_checkpoints = 0
        self._adaptive: AdaptiveClippingDP | None = None
        self._consumer: Consumer | None = None
        self._st = _State()
        self._rng = self._new_rng()
        self._accountant: ClientLevelAccountant | None = None
        self._aggregator: Aggregator | None = None
        self._outbox: list[RoundState] = []
        self._committed: dict[int, int] = {}
        self._generation = 0
        self._dirty = False
        self._failures = 0
        self._last_commit = 0.0
        self._last_status = 0.0
        self._published_stats: dict[str, Any] | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self) -> None:
        """Create the topics, join the group, fence a dead predecessor's transaction, restore the state."""
        s = self.settings
        # round states and checkpoints are kept for ever: a job idle longer than a retention must still find
        # its state (and collectors the current round); updates take the transport's default retention
        for topic, parts, retention in ((s.rounds_topic, 1, math.inf), (s.state_topic, 1, math.inf),
                                        (s.updates_topic, s.updates_partitions, None)):
            self.transport.create_topic(topic, parts, retention=retention)
        self._consumer = consumer = self.transport.consume([s.updates_topic], s.group, member=s.member,
                                                           session_timeout=s.session_timeout)
        deadline = time.monotonic() + s.restore_timeout
        while not consumer.assignment():  # join the group before anything is committed
            consumer.poll(max_records=1, timeout=0.5)
            if time.monotonic() > deadline:
                raise JobStateError(f"group {s.group!r} assigned no partition of {s.updates_topic!r} to member "
                                    f"{s.member!r} within {s.restore_timeout:g} s; is another job in the group?")
        try:  # rewinds what the join delivered; on Kafka it also aborts a dead predecessor's open transaction
            with consumer.transaction():
                raise _Rewind()
        except _Rewind:
            pass
        self._restore()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    @property
    def done(self) -> bool:
        return self._st.phase == "done"

    def run(self, stop: threading.Event | None = None, *, exit_when_done: bool = True) -> dict[str, Any]:
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

    def step(self, timeout: float = 0.2) -> int:
        """Poll once, apply what came, advance phases that are complete or past their deadline, and commit
        when a phase moved or ``checkpoint_interval`` passed with uncommitted uploads. Returns the records polled."""
        consumer = self._require()
        recs = consumer.poll(max_records=500, timeout=timeout)
        if consumer.generation != self._generation:
            log.warning("the group rewound uncommitted records (generation %d); restoring", consumer.generation)
            self._restore()
            return 0
        for r in recs:
            if r.key is not None and r.key != self.key:
                continue
            self._dirty = True
            self._on_upload(r.value)
        self._advance()
        due = self._outbox or (self._dirty and time.monotonic() - self._last_commit >= self.settings.checkpoint_interval)
        if due:
            self._commit()
        self._write_status()
        return len(recs)

    def _require(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("call open() first")
        return self._consumer

    # -- restore and commit -----------------------------------------------------------------------
    def _restore(self) -> None:
        """Load the newest checkpoint (or start the task) and check that it accounts for exactly the
        group's committed offsets."""
        consumer = self._require()
        s = self.settings
        self._generation = consumer.generation
        self._outbox = []
        self._dirty = False
        n = self.transport.partitions(s.updates_topic)
        committed = {p: off for p in range(n)
                     if (off := consumer.committed(TopicPartition(s.updates_topic, p))) is not None}
        found = self._read_checkpoint()
        if found is None:
            if committed:
                raise JobStateError(
                    f"group {s.group!r} has committed offsets {committed} on {s.updates_topic!r} but no checkpoint of "
                    f"task {self.spec.task!r} is in {s.state_topic!r}: the state topic was truncated or belongs to "
                    "another deployment; restarting the task would lose or double-count updates, so the job stops")
            self._start_task()
            return
        offsets = {int(p): int(o) for p, o in found["offsets"].items()}
        if offsets != committed:
            torn = (f"; {self.incomplete_checkpoints} newer checkpoint(s) were incomplete or inconsistent and "
                    "cannot be loaded") if self.incomplete_checkpoints else ""
            raise JobStateError(
                f"the newest complete checkpoint of task {self.spec.task!r} accounts for offsets {offsets} of "
                f"{s.updates_topic!r}, but group {s.group!r} committed {committed}{torn}; refusing to guess")
        self._st = _State.from_obj(found["state"])
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
        self._last_commit = time.monotonic()
        self.restores += 1
        log.info("task %s restored: round %d phase %s seq %d, offsets %s", self.spec.task, self._st.round,
                 self._st.phase, self._st.seq, offsets)

    def _read_checkpoint(self) -> dict[str, Any] | None:
        """The newest complete checkpoint of this task and group before a fresh marker: ``{"offsets",
        "state"}``, or None. Chunked checkpoints count only as complete, consistent sets
        (:class:`~pipeline.fl_records.ChunkAssembler`); a single-record JSON checkpoint (the first
        format) is read too. Incomplete sets newer than the result are counted in
        ``incomplete_checkpoints`` and never loaded."""
        s = self.settings
        tp = TopicPartition(s.state_topic, 0)
        marker = uuid.uuid4().hex
        assembler = ChunkAssembler()
        reader = self.transport.consume([s.state_topic], f"{s.group}.restore", member=f"{s.member}.restore",
                                        session_timeout=s.session_timeout)
        try:
            self.transport.publish(s.state_topic, self.key, json.dumps(
                {"version": PROTOCOL_VERSION, "kind": "marker", "id": marker}).encode())
            newest: tuple[int, dict[str, Any]] | None = None
            deadline = time.monotonic() + s.restore_timeout
            got = False
            while not got:
                if time.monotonic() > deadline:
                    raise JobStateError(f"the marker published to {s.state_topic!r} did not come back within "
                                        f"{s.restore_timeout:g} s; is the topic readable?")
                for r in reader.poll(max_records=100, timeout=0.5):
                    if r.key != self.key:
                        continue
                    if is_chunk(r.value):
                        found = self._checkpoint_chunk(assembler, r.value, r.offset)
                        if found is not None:
                            newest = found
                        continue
                    try:
                        obj = json.loads(r.value)
                    except ValueError:
                        continue
                    if not isinstance(obj, dict):
                        continue
                    if obj.get("kind") == "marker" and obj.get("id") == marker:
                        got = True
                        break
                    if obj.get("kind") == "checkpoint" and obj.get("group") == s.group and obj.get("task") == self.spec.task:
                        newest = (r.offset, {"offsets": obj["offsets"], "state": obj["state"]})
                        assembler.drop_before(r.offset)
            self.incomplete_checkpoints = len(assembler.pending()) + assembler.rejected
            if self.incomplete_checkpoints:
                log.warning("task %s: %d checkpoint(s) in %s were incomplete or inconsistent and were ignored",
                            self.spec.task, self.incomplete_checkpoints, s.state_topic)
            if newest is not None:
                try:
                    reader.commit({tp: newest[0]})
                except TransportError as exc:  # only makes the next restore read further back
                    log.warning("could not advance the restore reader (%s)", exc)
            return None if newest is None else newest[1]
        finally:
            reader.close()

    def _checkpoint_chunk(self, assembler: ChunkAssembler, value: bytes,
                          offset: int) -> tuple[int, dict[str, Any]] | None:
        try:
            h, payload = decode_chunk(value)
        except ChunkError as exc:
            log.warning("ignoring a malformed record in %s@%d: %s", self.settings.state_topic, offset, exc)
            return None
        if h.kind != "checkpoint" or h.task != self.spec.task or h.meta.get("group") != self.settings.group:
            return None
        done = assembler.add(h, payload, offset)
        if done is None:
            return None
        try:
            state = unpack_document(done.document)["state"]
            offsets = dict(h.meta["offsets"])
        except (ChunkError, KeyError, TypeError, ValueError) as exc:
            log.warning("ignoring an unreadable checkpoint %s (%s)", h.id, exc)
            return None
        assembler.drop_before(done.first_offset)
        return done.first_offset, {"offsets": offsets, "state": state}

    def _new_rng(self) -> np.random.Generator:
        """The job's generator: seeded in simulations, the OS CSPRNG otherwise (see :class:`FLTaskSpec`)."""
        return np.random.default_rng(self.spec.seed) if self.spec.seed is not None else secure_generator()

    def _start_task(self) -> None:
        spec = self.spec
        self._rng = self._new_rng()
        params = self.model.init_params(self._rng)
        self._st = _State(params=np.asarray(params, np.float32))
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
        if self._adaptive is not None and self._st.clip_norm is None:
            self._st.clip_norm = float(self._adaptive.clip_norm)

    def _checkpoint(self, offsets: dict[int, int]) -> list[bytes]:
        """The checkpoint as chunk records (:mod:`pipeline.fl_records`); every chunk carries the group and
        the update offsets it accounts for."""
        st = self._st
        st.rng_state = self._rng.bit_generator.state if self.spec.seed is not None else None
        if self._adaptive is not None:
            st.clip_norm = float(self._adaptive.clip_norm)
        doc = pack_document({"version": PROTOCOL_VERSION, "state": st.to_obj()})
        meta = {"group": self.settings.group, "offsets": {str(p): o for p, o in offsets.items()}}
        return encode_chunks("checkpoint", self.spec.task, meta, doc, self.settings.max_record_bytes)

    def _round_state_chunks(self, rs: RoundState) -> list[bytes]:
        return encode_chunks("round_state", self.spec.task, {"seq": rs.seq}, pack_document(rs.to_document()),
                             self.settings.max_record_bytes)

    def _commit(self) -> None:
        consumer = self._require()
        s = self.settings
        stats = self._public_stats()
        if not self._outbox and stats != self._published_stats:
            self._outbox.append(self._round_state())  # counters changed: let collectors show them
        offsets = dict(self._committed)
        for tp, off in consumer.positions().items():
            if tp.topic == s.updates_topic:
                offsets[tp.partition] = off
        try:
            with consumer.transaction() as tx:
                if self._outbox:  # collectors keep the newest state only: the superseded ones need not go out
                    for chunk in self._round_state_chunks(self._outbox[-1]):
                        tx.publish(s.rounds_topic, self.key, chunk)
                for chunk in self._checkpoint(offsets):
                    tx.publish(s.state_topic, self.key, chunk)
        except FencedError:
            raise
        except (CommitFailedError, TransportError) as exc:
            self.aborted += 1
            self._failures += 1
            if self._failures > 20:
                raise
            log.warning("commit aborted (%s); restoring from the committed checkpoint", exc)
            self._restore()
            return
        self._failures = 0
        if self._outbox:
            self._published_stats = dict(self._outbox[-1].stats)
        self._outbox = []
        self._committed = offsets
        self._dirty = False
        self._last_commit = time.monotonic()

    # -- rounds and phases ------------------------------------------------------------------------
    def _public_stats(self) -> dict[str, Any]:
        st = self._st
        out = {"epsilon": _f(st.epsilon), "delta": self.spec.delta if self.spec.clip_norm is not None else None,
               "rejected": dict(st.rejected), "accepted": dict(st.accepted), "duplicates": dict(st.duplicates),
               "rounds_done": len(st.history), "last_round": st.history[-1] if st.history else None,
               "aggregator": self.spec.aggregator["kind"]}
        if st.clip_norm is not None:
            out["clip_norm"] = st.clip_norm
        return out

    def _round_state(self) -> RoundState:
        st = self._st
        cfg = self.strategy.configure(st.round, st.params)
        return RoundState(
            task=self.spec.task, seq=st.seq, round=st.round, phase=st.phase, rounds=self.spec.rounds,
            model=dict(self.spec.model), params=st.params, algorithm=cfg.algorithm,
            training=dataclasses.asdict(cfg.training), prox_mu=cfg.prox_mu, control=cfg.control,
            clip_norm=self.spec.device_clip_norm, selected=tuple(st.selected), opened_at=st.opened_at,
            deadline=st.deadline,
            secagg=st.secagg, indices=dict(st.indices),
            adverts=dict(st.adverts) if st.phase in ("share", "masked", "unmask") else {},
            inbox=st.inbox if st.phase == "masked" else {},
            survivors=tuple(st.survivors) if st.phase == "unmask" else (),
            dropped=tuple(st.dropped) if st.phase == "unmask" else (), stats=self._public_stats())

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
        st.survivors, st.dropped, st.masked_sum, st.secagg, st.indices = [], [], None, None, {}
        if r >= spec.rounds:
            st.selected = []
            self._set_phase("done", 0.0)
            return
        st.selected = [str(c) for c in self.sampling.sample(list(spec.clients), self._rng)]
        if not spec.secagg:
            self._set_phase("train", spec.round_timeout)
            return
        if len(st.selected) < 3:
            self._fail_round(f"secure aggregation needs at least 3 clients, {len(st.selected)} were sampled")
            return
        from client_sdk.fl.secagg import Quantizer
        from estimator.fl.secagg_server import make_config

        n = len(st.selected)
        deg = None if spec.secagg_degree is None else min(spec.secagg_degree, n - 1)
        cfg = make_config(r, n, self.payload_size, self._rng, deg)
        q = Quantizer.for_clients(n, float(spec.clip_norm))  # type: ignore[arg-type]
        st.indices = {c: i + 1 for i, c in enumerate(st.selected)}
        st.secagg = {"num_clients": n, "neighbors": {str(u): list(vs) for u, vs in cfg.neighbors.items()},
                     "threshold": cfg.threshold, "vector_length": cfg.vector_length,
                     "clip_range": q.clip_range, "scale": q.scale, "max_clients": q.max_clients}
        st.masked_sum = np.zeros(self.payload_size, np.uint32)
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
                self._set_phase("unmask", self.spec.phase_timeout)
            elif st.phase == "unmask":
                if not (late or set(st.reveals) >= set(st.survivors)):
                    return
                self._close_secagg()

    def _ctx(self) -> RoundContext:
        return RoundContext(self._st.round, self.payload_size, self._rng,
                            self.sampling.expected_clients(len(self.spec.clients)))

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
        if isinstance(info.get("selected"), list):  # Krum's kept client ids would reveal part of the sample
            info["kept"] = len(info.pop("selected"))
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
        from client_sdk.fl.secagg import KeyAdvert, Quantizer, SecAggConfig, Share
        from estimator.fl.secagg_server import SecAggServer

        st = self._st
        sa = st.secagg
        assert sa is not None and st.masked_sum is not None
        cfg = SecAggConfig(st.round, int(sa["num_clients"]), {int(u): tuple(vs) for u, vs in sa["neighbors"].items()},
                           int(sa["threshold"]), int(sa["vector_length"]))
        server = SecAggServer.resume(cfg, {u: KeyAdvert(u, a, b) for u, (a, b) in st.adverts.items()},
                                     set(sa["sharers"]), set(st.survivors), st.masked_sum)
        reveals = {u: {v: (k, Share(x, y, t)) for v, (k, x, y, t) in per.items()} for u, per in st.reveals.items()}
        try:
            total = server.finish(reveals)
        except SecAggError as exc:
            self._fail_round(f"unmasking failed: {exc}")
            return
        q = Quantizer(float(sa["clip_range"]), float(sa["scale"]), int(sa["max_clients"]))
        ctx = self._ctx()
        s = q.decode_sum(total)
        sd = float(self.spec.noise_multiplier) * float(self.spec.clip_norm)  # type: ignore[arg-type]
        noisy = s + (ctx.rng.normal(0.0, sd, size=s.shape) if sd > 0 else 0.0)
        if self._accountant is not None:
            self._accountant.record(self.spec.noise_multiplier)
        m = len(st.survivors)
        res = AggregateResult(noisy / ctx.expected_clients, ctx.expected_clients, m,
                              {"noise_stddev": sd, "clip_norm": self.spec.clip_norm})
        self._finish_round(res, {"secagg_survivors": list(st.survivors), "secagg_dropped": list(st.dropped),
                                 "sum_sha256": hashlib.sha256(total.astype("<u4").tobytes()).hexdigest()})

    # -- uploads --------------------------------------------------------------------------------
    def _on_upload(self, value: bytes) -> None:
        st = self._st
        try:
            u = parse_upload(value, payload_size=self.payload_size)
            if u.task != self.spec.task:
                return
            if u.upload_id in st.seen:  # a retry (or a second collector's copy) of an accepted upload: idempotent
                st.duplicates[u.kind] += 1
                log.info("duplicate of upload %s (round %d): already counted", u.upload_id, u.round)
                return
            if u.round < st.round and u.upload_id in st.past_ids.get(u.round, ()):
                raise UpdateRejected("replayed", f"upload {u.upload_id} was accepted in round {u.round}; the current "
                                     f"round is {st.round}")
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
        return RoundState(task=self.spec.task, seq=st.seq, round=st.round, phase=st.phase, rounds=self.spec.rounds,
                          model=self.spec.model, params=st.params, selected=tuple(st.selected), secagg=st.secagg,
                          indices=st.indices, adverts=st.adverts, survivors=tuple(st.survivors))

    def _accept(self, u: Upload) -> None:
        st = self._st
        if u.kind == "update":
            if u.client_id in st.updates:
                raise UpdateRejected("duplicate_client", f"{u.client_id} already uploaded in round {st.round}")
            st.updates[u.client_id] = (u.upload_id, np.asarray(u.payload["vector"], np.float32),
                                       int(u.payload["num_examples"]))
            return
        me = st.indices[u.client_id]
        if u.kind == "advert":
            if me in st.adverts:
                raise UpdateRejected("duplicate_client", f"client {me} already advertised keys")
            st.adverts[me] = (u.payload["share_key"], u.payload["mask_key"])
        elif u.kind == "shares":
            if me in st.shares:
                raise UpdateRejected("duplicate_client", f"client {me} already shared keys")
            st.shares[me] = dict(u.payload["ciphertexts"])
        elif u.kind == "masked":
            if me in st.survivors:
                raise UpdateRejected("duplicate_client", f"client {me} already sent its masked input")
            if me not in set(st.secagg["sharers"]):  # type: ignore[index]
                raise UpdateRejected("bad_secagg", f"client {me} did not share keys: its input could not be unmasked")
            assert st.masked_sum is not None
            st.masked_sum += u.payload["vector"]
            st.survivors.append(me)
        else:
            if me in st.reveals:
                raise UpdateRejected("duplicate_client", f"client {me} already revealed its shares")
            st.reveals[me] = dict(u.payload["shares"])

    # -- status ---------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The job's JSON status: round, phase, ε, counters (committed and pending), history."""
        st = self._st
        return {"task": self.spec.task, "round": st.round, "phase": st.phase, "seq": st.seq,
                "rounds": self.spec.rounds, "done": self.done, "epsilon": _f(st.epsilon),
                "delta": self.spec.delta if self.spec.clip_norm is not None else None,
                "rejected": dict(st.rejected), "accepted": dict(st.accepted), "duplicates": dict(st.duplicates),
                "clip_norm": st.clip_norm if st.clip_norm is not None else self.spec.device_clip_norm,
                "incomplete_checkpoints": self.incomplete_checkpoints,
                "received_this_round": len(st.seen), "uncommitted": self._dirty,
                "committed_offsets": {str(p): o for p, o in self._committed.items()},
                "restores": self.restores, "aborted_commits": self.aborted, "history": st.history,
                "params": encode_vector(st.params)}

    def _write_status(self, force: bool = False) -> None:
        path = self.settings.status_path
        if path is None or (not force and time.monotonic() - self._last_status < 0.1):
            return
        self._last_status = time.monotonic()
        write_atomic(path, json.dumps(self.status()).encode())
