"""The FL job's checkpoint/restore protocol: its state as a document, written to and found in the state topic.

:class:`JobState` is everything the job knows (model, round, phase, sample,
the round's accepted uploads or SecAgg running sum, seen upload ids,
counters, the seeded generator's state, the noise of every past round);
:meth:`JobState.to_obj`/:meth:`JobState.from_obj` are its checkpoint form.

:class:`CheckpointLog` is the job's side of ``ldp.fl.state``:

* :meth:`~CheckpointLog.encode` turns a state and the update offsets it
  accounts for into chunk records (:mod:`pipeline.fl_records`) of at most
  ``max_record_bytes``; the job publishes them in the same transaction as its
  round states and its consumer offsets.
* :meth:`~CheckpointLog.restore_point` finds the newest complete checkpoint
  of the task and group and checks that it accounts for exactly the group's
  committed offsets (else :class:`~estimator.errors.JobStateError`: loading
  it would lose or double-count updates). Finding "newest": publish a
  *marker* record and read the topic (in a reader group whose committed
  offset stays at the last restored checkpoint) until the marker comes back;
  the last checkpoint of the task and group before it is the newest
  committed one. Incomplete or inconsistent chunk sets are never loaded and
  are counted in :attr:`~CheckpointLog.incomplete`. A single-record JSON
  checkpoint (the first format) is still read.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from estimator.errors import JobStateError
from ldp_core.fl.protocol import PROTOCOL_VERSION, decode_vector, encode_vector
from pipeline.fl_records import (
    ChunkAssembler,
    ChunkError,
    decode_chunk,
    encode_chunks,
    is_chunk,
    pack_document,
    unpack_document,
)
from pipeline.transport import TopicPartition, Transport, TransportError

__all__ = ["JobState", "Checkpoint", "CheckpointLog", "json_float", "float_from_json"]

log = logging.getLogger("ldp.fl.job")


def json_float(x: float | None) -> Any:
    """``x`` for JSON: None stays None, ∞ becomes ``"inf"`` (ε before any accounting can be infinite)."""
    return None if x is None else ("inf" if x == math.inf else x)


def float_from_json(x: Any) -> float | None:
    """Inverse of :func:`json_float`."""
    return None if x is None else (math.inf if x == "inf" else float(x))


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


@dataclasses.dataclass
class JobState:
    """Everything the job knows; :meth:`to_obj`/:meth:`from_obj` are the checkpoint's state.

    ``duplicates`` counts re-sent uploads by kind; ``past_ids`` keeps the accepted upload ids of the
    last ``REPLAY_WINDOW`` rounds (to tell a replay from a late upload); ``clip_norm`` is adaptive
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
    #: SHA-256 of each recent round's un-noised SecAgg sum (the operator's integrity record; never published)
    audit: dict[int, str] = dataclasses.field(default_factory=dict)
    #: per advertiser index: its client id, credential and signature (peers verify the advert themselves)
    advert_auth: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: per survivor index: its client id, credential and signature of the survivor set (the consistency round)
    consistency: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: per sharer index: recipient → 64 bytes (SHA-256 commitments to the b and s shares it sent)
    commitments: dict[int, dict[int, bytes]] = dataclasses.field(default_factory=dict)
    #: DP-FTRL's tree noise and the current tree's contributors (:meth:`estimator.fl.ftrl.DPFTRL.state`)
    ftrl: dict[str, Any] | None = None

    def to_obj(self, binary: bool = True) -> dict[str, Any]:
        """The checkpoint's state: vectors as numpy arrays (``binary``, for a chunked document) or base64."""

        def vec(v: np.ndarray, dtype: str = "<f4") -> Any:
            return np.ascontiguousarray(v, np.dtype(dtype)) if binary else encode_vector(v, dtype)

        return {
            "seq": self.seq,
            "round": self.round,
            "phase": self.phase,
            "params": vec(self.params),
            "num_params": int(self.params.shape[0]),
            "control": None if self.control is None else vec(self.control),
            "selected": self.selected,
            "indices": self.indices,
            "opened_at": self.opened_at,
            "deadline": self.deadline,
            "rng_state": self.rng_state,
            "noise_history": self.noise_history,
            "epsilon": json_float(self.epsilon),
            "updates": {c: [uid, vec(v), n] for c, (uid, v, n) in self.updates.items()},
            "update_length": next((int(v.shape[0]) for _, v, _ in self.updates.values()), 0),
            "seen": sorted(self.seen),
            "secagg": self.secagg,
            "adverts": {str(u): [_b64(a), _b64(b)] for u, (a, b) in self.adverts.items()},
            "shares": {str(u): {str(v): _b64(ct) for v, ct in per.items()} for u, per in self.shares.items()},
            "inbox": {str(v): {str(u): _b64(ct) for u, ct in per.items()} for v, per in self.inbox.items()},
            "masked_sum": None if self.masked_sum is None else vec(self.masked_sum, "<u4"),
            "survivors": self.survivors,
            "dropped": self.dropped,
            "reveals": {
                str(u): {str(v): [k, x, str(y), t] for v, (k, x, y, t) in per.items()}
                for u, per in self.reveals.items()
            },
            "rejected": dict(self.rejected),
            "accepted": dict(self.accepted),
            "history": self.history,
            "duplicates": dict(self.duplicates),
            "past_ids": {str(r): ids for r, ids in self.past_ids.items()},
            "clip_norm": self.clip_norm,
            "audit": {str(r): h for r, h in self.audit.items()},
            "advert_auth": {str(u): a for u, a in self.advert_auth.items()},
            "consistency": {str(u): c for u, c in self.consistency.items()},
            "commitments": {str(u): {str(v): _b64(c) for v, c in per.items()} for u, per in self.commitments.items()},
            "ftrl": self.ftrl,
        }

    @classmethod
    def from_obj(cls, o: Mapping[str, Any]) -> JobState:
        """Inverse of :meth:`to_obj` (either form; a binary vector must have the dtype and length expected)."""

        def dec(v: Any, length: int, dtype: str = "<f4") -> np.ndarray:
            if not isinstance(v, np.ndarray):
                return decode_vector(v, length, dtype)
            if v.shape != (length,) or v.dtype != np.dtype(dtype).newbyteorder("="):
                raise JobStateError(
                    f"checkpoint vector of shape {v.shape} and dtype {v.dtype}; expected ({length},) {dtype}"
                )
            return v

        n = int(o["num_params"])
        ul = int(o["update_length"])
        sa = o["secagg"]
        return cls(
            seq=int(o["seq"]),
            round=int(o["round"]),
            phase=str(o["phase"]),
            params=dec(o["params"], n),
            control=None if o["control"] is None else dec(o["control"], n),
            selected=list(o["selected"]),
            indices={k: int(v) for k, v in o["indices"].items()},
            opened_at=float(o["opened_at"]),
            deadline=float(o["deadline"]),
            rng_state=o["rng_state"],
            noise_history=[float(z) for z in o["noise_history"]],
            epsilon=float_from_json(o["epsilon"]),
            updates={c: (uid, dec(v, ul), int(k)) for c, (uid, v, k) in o["updates"].items()},
            seen=set(o["seen"]),
            secagg=sa,
            adverts={int(u): (base64.b64decode(a), base64.b64decode(b)) for u, (a, b) in o["adverts"].items()},
            shares={int(u): {int(v): base64.b64decode(ct) for v, ct in per.items()} for u, per in o["shares"].items()},
            inbox={int(v): {int(u): base64.b64decode(ct) for u, ct in per.items()} for v, per in o["inbox"].items()},
            masked_sum=None if o["masked_sum"] is None else dec(o["masked_sum"], int(sa["vector_length"]), "<u4"),
            survivors=[int(u) for u in o["survivors"]],
            dropped=[int(u) for u in o["dropped"]],
            reveals={
                int(u): {int(v): (k, int(x), int(y), int(t)) for v, (k, x, y, t) in per.items()}
                for u, per in o["reveals"].items()
            },
            rejected=Counter(o["rejected"]),
            accepted=Counter(o["accepted"]),
            history=list(o["history"]),
            duplicates=Counter(o.get("duplicates", {})),
            past_ids={int(r): list(ids) for r, ids in o.get("past_ids", {}).items()},
            clip_norm=None if o.get("clip_norm") is None else float(o["clip_norm"]),
            audit={int(r): str(h) for r, h in o.get("audit", {}).items()},
            advert_auth={int(u): dict(a) for u, a in o.get("advert_auth", {}).items()},
            consistency={int(u): dict(c) for u, c in o.get("consistency", {}).items()},
            commitments={
                int(u): {int(v): base64.b64decode(c) for v, c in per.items()}
                for u, per in o.get("commitments", {}).items()
            },
            ftrl=None if o.get("ftrl") is None else dict(o["ftrl"]),
        )


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A committed checkpoint: the update offsets it accounts for (partition → next offset) and its state."""

    offsets: dict[int, int]
    state: Mapping[str, Any]

    def load(self) -> JobState:
        return JobState.from_obj(self.state)


class CheckpointLog:
    """One task's checkpoints in one group, on the state topic (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        *,
        task: str,
        group: str,
        member: str,
        state_topic: str,
        session_timeout: float,
        restore_timeout: float,
        max_record_bytes: int,
    ) -> None:
        self.transport = transport
        self.task = task
        self.key = task.encode()
        self.group = group
        self.member = member
        self.state_topic = state_topic
        self.session_timeout = session_timeout
        self.restore_timeout = restore_timeout
        self.max_record_bytes = max_record_bytes
        #: checkpoints newer than the last one found that were incomplete or inconsistent (never loaded)
        self.incomplete = 0

    def encode(self, state: JobState, offsets: Mapping[int, int]) -> list[bytes]:
        """The checkpoint as chunk records; every chunk carries the group and the update offsets it accounts for."""
        doc = pack_document({"version": PROTOCOL_VERSION, "state": state.to_obj()})
        meta = {"group": self.group, "offsets": {str(p): o for p, o in offsets.items()}}
        return encode_chunks("checkpoint", self.task, meta, doc, self.max_record_bytes)

    def restore_point(self, committed: Mapping[int, int], updates_topic: str) -> Checkpoint | None:
        """The newest checkpoint, checked against the group's ``committed`` offsets on ``updates_topic``;
        None when the task has not started (no checkpoint and nothing committed).

        Raises :class:`JobStateError` when offsets were committed but no checkpoint exists (the state topic was
        truncated or is another deployment's) or when the newest complete checkpoint accounts for other offsets."""
        found = self.read_newest()
        if found is None:
            if committed:
                raise JobStateError(
                    f"group {self.group!r} has committed offsets {dict(committed)} on {updates_topic!r} but no "
                    f"checkpoint of task {self.task!r} is in {self.state_topic!r}: the state topic was truncated or "
                    "belongs to another deployment; restarting the task would lose or double-count updates, so the "
                    "job stops"
                )
            return None
        if found.offsets != dict(committed):
            torn = (
                (f"; {self.incomplete} newer checkpoint(s) were incomplete or inconsistent and cannot be loaded")
                if self.incomplete
                else ""
            )
            raise JobStateError(
                f"the newest complete checkpoint of task {self.task!r} accounts for offsets {found.offsets} of "
                f"{updates_topic!r}, but group {self.group!r} committed {dict(committed)}{torn}; refusing to guess"
            )
        return found

    def read_newest(self) -> Checkpoint | None:
        """The newest complete checkpoint of this task and group before a fresh marker, or None.

        Chunked checkpoints count only as complete, consistent sets
        (:class:`~pipeline.fl_records.ChunkAssembler`); a single-record JSON checkpoint (the first
        format) is read too. Incomplete sets newer than the result are counted in :attr:`incomplete`."""
        tp = TopicPartition(self.state_topic, 0)
        marker = uuid.uuid4().hex
        assembler = ChunkAssembler()
        reader = self.transport.consume(
            [self.state_topic],
            f"{self.group}.restore",
            member=f"{self.member}.restore",
            session_timeout=self.session_timeout,
        )
        try:
            self.transport.publish(
                self.state_topic,
                self.key,
                json.dumps({"version": PROTOCOL_VERSION, "kind": "marker", "id": marker}).encode(),
            )
            newest: tuple[int, Checkpoint] | None = None
            deadline = time.monotonic() + self.restore_timeout
            got = False
            while not got:
                if time.monotonic() > deadline:
                    raise JobStateError(
                        f"the marker published to {self.state_topic!r} did not come back within "
                        f"{self.restore_timeout:g} s; is the topic readable?"
                    )
                for r in reader.poll(max_records=100, timeout=0.5):
                    if r.key != self.key:
                        continue
                    if is_chunk(r.value):
                        found = self._chunk(assembler, r.value, r.offset)
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
                    if (
                        obj.get("kind") == "checkpoint"
                        and obj.get("group") == self.group
                        and obj.get("task") == self.task
                    ):
                        newest = (r.offset, Checkpoint(_offsets(obj["offsets"]), obj["state"]))
                        assembler.drop_before(r.offset)
            self.incomplete = len(assembler.pending()) + assembler.rejected
            if self.incomplete:
                log.warning(
                    "task %s: %d checkpoint(s) in %s were incomplete or inconsistent and were ignored",
                    self.task,
                    self.incomplete,
                    self.state_topic,
                )
            if newest is not None:
                try:
                    reader.commit({tp: newest[0]})
                except TransportError as exc:  # only makes the next restore read further back
                    log.warning("could not advance the restore reader (%s)", exc)
            return None if newest is None else newest[1]
        finally:
            reader.close()

    def _chunk(self, assembler: ChunkAssembler, value: bytes, offset: int) -> tuple[int, Checkpoint] | None:
        try:
            h, payload = decode_chunk(value)
        except ChunkError as exc:
            log.warning("ignoring a malformed record in %s@%d: %s", self.state_topic, offset, exc)
            return None
        if h.kind != "checkpoint" or h.task != self.task or h.meta.get("group") != self.group:
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
        return done.first_offset, Checkpoint(_offsets(offsets), state)


def _offsets(o: Mapping[str, Any]) -> dict[int, int]:
    return {int(p): int(off) for p, off in dict(o).items()}
