"""The collector's federated-learning routes: serve round states, take device uploads.

Enabled with ``fl_enabled`` (``LDP_COLLECTOR_FL_ENABLED=1``). A follower
thread reads ``ldp.fl.rounds`` (in a consumer group of its own, from the
beginning) and keeps the newest :class:`~ldp_core.fl.protocol.RoundState`
of each task. Routes:

``GET /v1/fl/tasks``
    The tasks with their round and phase.
``GET /v1/fl/tasks/{task}/round``
    The public view (:meth:`RoundState.public_view`): model, configuration, phase,
    public counters; nothing that depends on the round's sample.
``GET /v1/fl/tasks/{task}/round?client_id=ID``
    The round as that device sees it (:meth:`RoundState.view_for`), only for a request
    signed by the enrolled device ``ID`` (:mod:`ldp_core.tokens.enrollment` headers, checked
    against the task's enrollment key; 401 ``unauthenticated`` otherwise): whether it is
    selected, its SecAgg index, parameters, neighbours' adverts and its own inbox.
``GET /v1/fl/tasks/{task}/status``
    Round, phase, ε so far and the job's counters (accepted and rejected by reason).
``POST /v1/fl/tasks/{task}/uploads``
    One upload (``application/json``, :mod:`ldp_core.fl.protocol`).

Answers to an upload
--------------------
=====  ======================================================================
202    checked and published durably to ``ldp.fl.updates``; or a duplicate of an
       upload this collector published in the current round (the same answer)
400    not JSON, wrong version or fields, bad base64, ``upload_id`` not matching
       the content, ``task`` differing from the path
401    not signed by the enrolled device of its ``client_id`` (``unauthenticated``;
       checked before anything that depends on the sample)
403    the client is not selected for the round
404    no such task
409    another round (``stale_round``) or another phase (``wrong_phase``), or an
       upload this collector published for an earlier round (``replayed``)
413    body above ``max_body_bytes``
415    another Content-Type
422    wrong vector length, NaN/inf values, bad example count, SecAgg addresses
       outside the client's neighbourhood
503    no round state yet, or the transport did not acknowledge (``Retry-After``)
=====  ======================================================================

What is published: the upload re-encoded from its checked fields (task,
round, kind, client id, upload id, payload), keyed by task. No address,
header or arrival time. The job checks everything again (it trusts no topic).

Re-sent uploads
---------------
The collector remembers the ids it published for the current round and the
previous :data:`REPLAY_WINDOW` rounds of each task. The same upload id again
in the same round is a **duplicate** (a device's retry after a lost answer):
answered 202 like the first, not published again, counted with
``outcome="duplicate"``. An id it published for an earlier round is
**replayed** (409, counted as rejected). Ids another collector published
are not known here; the job tells them apart the same way
(:mod:`estimator.fl.job`). A re-send of another client's signed upload (the
same bytes) is indistinguishable from that client's retry: it is a duplicate
and changes nothing; a changed one no longer verifies.

Round states
------------
Round states arrive as chunk records (:mod:`pipeline.fl_records`), the only
form the job writes; the follower serves a state only once all its chunks
are in and their digest matches. Any other record is ignored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter

from ldp_core.fl.errors import UpdateRejected
from ldp_core.fl.protocol import (
    BINARY_CONTENT_TYPE,
    BINARY_MAGIC,
    RoundState,
    check_upload_against,
    encode_upload_binary,
    parse_upload,
    verify_upload_auth,
)
from ldp_core.tokens.enrollment import EnrollmentError, RequestVerifier
from ldp_core.wire.framing import has_magic
from pipeline.fl_records import ChunkAssembler, ChunkError, decode_chunk, is_chunk, unpack_document
from pipeline.transport import Transport, TransportError

__all__ = ["FLService", "add_fl_routes", "start_fl_service", "STATUS_OF_REASON", "REPLAY_WINDOW"]

log = logging.getLogger("ldp.collector.fl")

#: HTTP status of each rejection reason
STATUS_OF_REASON = {
    "malformed": 400,
    "unsupported_version": 400,
    "upload_id_mismatch": 400,
    "task_mismatch": 400,
    "unauthenticated": 401,
    "not_selected": 403,
    "unknown_task": 404,
    "stale_round": 409,
    "wrong_phase": 409,
    "replayed": 409,
    "too_large": 413,
    "unsupported_media_type": 415,
    "wrong_shape": 422,
    "non_finite": 422,
    "bad_weight": 422,
    "bad_secagg": 422,
}
#: earlier rounds whose published upload ids a collector keeps (to answer a replay with ``replayed``)
REPLAY_WINDOW = 16
#: at most this many remembered ids per task and round (a flood of distinct uploads cannot grow memory further)
_MAX_IDS_PER_ROUND = 1 << 16


class FLService:
    """Follows the rounds topic and publishes uploads; one per collector process."""

    def __init__(
        self,
        transport: Transport,
        rounds_topic: str,
        updates_topic: str,
        *,
        retry_after: int = 2,
        updates_partitions: int = 1,
    ) -> None:
        self.transport = transport
        self.rounds_topic = rounds_topic
        self.updates_topic = updates_topic
        self.retry_after = retry_after
        self.updates_partitions = updates_partitions
        self.states: dict[str, RoundState] = {}
        self.published: dict[str, dict[int, dict[str, bytes]]] = {}  # task -> round -> upload id -> answer
        self._assembler = ChunkAssembler()
        self.caught_up = threading.Event()
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="ldp-fl-rounds", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def state(self, task: str) -> RoundState | None:
        with self._lock:
            return self.states.get(task)

    def _follow(self) -> None:
        group = f"ldp-collector-fl-{uuid.uuid4().hex[:12]}"
        while not self._stop.is_set():
            try:
                # as the job creates them (estimator/fl/job.py), whichever starts first: round states for ever
                self.transport.ensure_topic(self.rounds_topic, 1, retention=math.inf)
                self.transport.ensure_topic(self.updates_topic, self.updates_partitions)
                with self.transport.consume([self.rounds_topic], group) as consumer:
                    while not self._stop.is_set():
                        recs = consumer.poll(max_records=100, timeout=0.3)
                        for r in recs:
                            self._apply(r.value, r.offset)
                        if not recs:
                            self.caught_up.set()
                        self.last_error = None
            except Exception as exc:  # keep following; the routes answer 503 meanwhile
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("following %s failed (%s); retrying", self.rounds_topic, self.last_error)
                self._stop.wait(1.0)

    def _apply(self, value: bytes, offset: int = 0) -> None:
        if not is_chunk(value):
            log.warning("ignoring a record of %s@%d that is not a chunk record", self.rounds_topic, offset)
            return
        try:
            h, payload = decode_chunk(value)
            if h.kind != "round_state":
                return
            done = self._assembler.add(h, payload, offset)
            if done is None:
                return
            self._assembler.drop_before(done.first_offset, h.task)
            st = RoundState.from_document(unpack_document(done.document))
            if st.task != h.task or st.seq != h.meta.get("seq"):
                raise ValueError(f"round state {st.task}/{st.seq} under a header for {h.task}/{h.meta.get('seq')}")
        except (ValueError, KeyError, TypeError, UpdateRejected, ChunkError) as exc:
            log.warning("ignoring an unreadable round state (%s)", exc)
            return
        with self._lock:
            cur = self.states.get(st.task)
            if cur is None or st.seq >= cur.seq:
                self.states[st.task] = st

    def publish(self, task: str, value: bytes) -> None:
        self.transport.publish(self.updates_topic, task.encode(), value)

    def seen(self, task: str, round: int, upload_id: str) -> bytes | None:
        """The answer given when this collector published ``upload_id`` for ``round`` of ``task``, or None."""
        with self._lock:
            return self.published.get(task, {}).get(round, {}).get(upload_id)

    def remember(self, task: str, round: int, upload_id: str, answer: bytes) -> None:
        with self._lock:
            rounds = self.published.setdefault(task, {})
            ids = rounds.setdefault(round, {})
            if len(ids) < _MAX_IDS_PER_ROUND:
                ids[upload_id] = answer
            for r in [r for r in rounds if r < round - REPLAY_WINDOW]:
                del rounds[r]


def _json(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(obj).encode(), status_code=status, media_type="application/json", headers=headers)


def add_fl_routes(
    app: FastAPI, runtime: dict[str, Any], registry: CollectorRegistry, *, max_body_bytes: int, publish_timeout: float
) -> None:
    """Add the routes to ``app``; ``runtime["fl"]`` holds the :class:`FLService` while the app runs."""
    uploads = Counter(
        "ldp_collector_fl_uploads_total",
        "FL uploads by kind, outcome and reason",
        ["kind", "outcome", "reason"],
        registry=registry,
    )

    def service() -> FLService | None:
        return runtime.get("fl")

    def unavailable(svc: FLService | None) -> Response:
        detail = (
            "the collector has not read the rounds topic yet"
            if svc is None or not svc.last_error
            else f"the rounds topic is unreadable ({svc.last_error})"
        )
        retry = str(svc.retry_after if svc else 2)
        return _json(503, {"error": "unavailable", "message": detail + "; retry later"}, {"Retry-After": retry})

    def lookup(task: str) -> tuple[RoundState | None, Response | None]:
        svc = service()
        if svc is None or not svc.caught_up.is_set():
            return None, unavailable(svc)
        st = svc.state(task)
        if st is None:
            return None, _json(
                404,
                {
                    "error": "unknown_task",
                    "message": f"no task {task[:64]!r} has published a round; GET /v1/fl/tasks lists the tasks",
                },
            )
        return st, None

    def reject(kind: str, reason: str, message: str) -> Response:
        uploads.labels(kind=kind, outcome="rejected", reason=reason).inc()
        return _json(STATUS_OF_REASON.get(reason, 400), {"error": reason, "message": message})

    @app.get("/v1/fl/tasks", summary="Federated tasks and their current round")
    async def fl_tasks() -> Response:
        svc = service()
        if svc is None or not svc.caught_up.is_set():
            return unavailable(svc)
        with svc._lock:
            tasks = [
                {"task": t, "round": s.round, "phase": s.phase, "seq": s.seq, "rounds": s.rounds}
                for t, s in sorted(svc.states.items())
            ]
        return _json(200, {"tasks": tasks})

    verifier = RequestVerifier()

    @app.get("/v1/fl/tasks/{task}/round", summary="The current round: public, or as one authenticated device sees it")
    async def fl_round(task: str, request: Request, client_id: str | None = None) -> Response:
        st, err = lookup(task)
        if err is not None:
            return err
        assert st is not None
        if client_id is None:  # the public view: nothing in it depends on the sample
            return _json(200, st.public_view(), {"Cache-Control": "no-store"})
        # a device learns its own selection only, and only by proving it is that enrolled device
        raw = request.scope.get("raw_path") or request.url.path.encode()
        query = request.scope.get("query_string", b"")
        target = raw.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
        try:
            keys = [] if st.enrollment_key is None else [st.enrollment_key]
            cred = verifier.verify("GET", target, b"", dict(request.headers), keys)
        except EnrollmentError as exc:
            return _json(401, {"error": "unauthenticated", "message": f"{exc} ({exc.reason})"})
        if cred.device_id != client_id:
            return _json(401, {"error": "unauthenticated", "message": "the credential is for another client id"})
        return _json(200, st.view_for(client_id), {"Cache-Control": "no-store"})

    @app.get("/v1/fl/tasks/{task}/status", summary="Round, phase, epsilon and the job's counters")
    async def fl_status(task: str) -> Response:
        st, err = lookup(task)
        if err is not None:
            return err
        assert st is not None
        return _json(
            200, {"task": st.task, "round": st.round, "phase": st.phase, "seq": st.seq, "rounds": st.rounds, **st.stats}
        )

    @app.post("/v1/fl/tasks/{task}/uploads", status_code=202, summary="Upload one FL message (update or SecAgg step)")
    async def fl_upload(task: str, request: Request) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", BINARY_CONTENT_TYPE):
            return reject(
                "unknown",
                "unsupported_media_type",
                f"Content-Type {ctype[:60] or '(none)'!r} is not accepted; send the binary form as "
                f"{BINARY_CONTENT_TYPE} or the JSON form as application/json",
            )
        length = request.headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > max_body_bytes:
            return reject("unknown", "too_large", f"the body has {int(length)} bytes; at most {max_body_bytes}")
        buf = bytearray()
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > max_body_bytes:
                return reject("unknown", "too_large", f"the body exceeds {max_body_bytes} bytes")
        st, err = lookup(task)
        if err is not None:
            uploads.labels(
                kind="unknown", outcome="rejected", reason="unknown_task" if err.status_code == 404 else "unavailable"
            ).inc()
            return err
        assert st is not None
        kind = "unknown"
        try:
            if (ctype == BINARY_CONTENT_TYPE) != has_magic(buf, BINARY_MAGIC):
                raise UpdateRejected(
                    "malformed",
                    f"the body does not match its Content-Type {ctype}: the binary "
                    f"form ({BINARY_CONTENT_TYPE}) starts with {BINARY_MAGIC!r}, the JSON form "
                    "(application/json) with '{'",
                )
            u = parse_upload(bytes(buf), payload_size=st.payload_size)
            kind = u.kind
            if u.task != task:
                raise UpdateRejected("task_mismatch", f"the body is for task {u.task!r}, the path for {task!r}")
            # before anything that depends on the sample (not_selected): an outsider learns nothing from the answer
            verify_upload_auth(u, st.enrollment_key)
            if u.round > st.round and st.phase != "done":
                svc = service()  # this collector lags behind the job: the device retries
                uploads.labels(kind=u.kind, outcome="unavailable", reason="round_not_open").inc()
                return _json(
                    503,
                    {
                        "error": "round_not_open",
                        "message": f"round {u.round} is not open here yet "
                        f"(this collector is at round {st.round}); retry later",
                    },
                    {"Retry-After": str(svc.retry_after if svc else 2)},
                )
            svc = service()
            assert svc is not None
            first = svc.seen(task, u.round, u.upload_id)
            if first is not None and u.round == st.round:  # a retry: answered like the first, not published again
                uploads.labels(kind=u.kind, outcome="duplicate", reason="same_upload_id").inc()
                return Response(first, status_code=202, media_type="application/json")
            if first is not None:
                raise UpdateRejected(
                    "replayed",
                    f"upload {u.upload_id} was accepted for round {u.round}; the current round is {st.round}",
                )
            check_upload_against(u, st)
        except UpdateRejected as exc:
            return reject(kind, exc.reason, str(exc))
        try:
            # re-encoded (never the sender's bytes), in the binary form: 4 bytes per value, not base64's 5.4
            await asyncio.wait_for(asyncio.to_thread(svc.publish, task, encode_upload_binary(u)), publish_timeout)
        except (TimeoutError, TransportError, OSError) as exc:
            uploads.labels(kind=u.kind, outcome="unavailable", reason="publish_failed").inc()
            return _json(
                503,
                {
                    "error": "publish_failed",
                    "message": f"the transport did not acknowledge the upload ({type(exc).__name__}); retry later",
                },
                {"Retry-After": str(svc.retry_after)},
            )
        uploads.labels(kind=u.kind, outcome="accepted", reason="ok").inc()
        answer = json.dumps({"status": "accepted", "upload_id": u.upload_id, "round": u.round, "kind": u.kind}).encode()
        svc.remember(task, u.round, u.upload_id, answer)
        return Response(answer, status_code=202, media_type="application/json")


def start_fl_service(transport: Transport, rounds_topic: str, updates_topic: str, retry_after: int) -> FLService:
    svc = FLService(transport, rounds_topic, updates_topic, retry_after=retry_after)
    svc.start()
    return svc
