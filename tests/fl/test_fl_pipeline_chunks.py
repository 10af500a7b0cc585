"""Chunked checkpoints and round states of the FL job (pipeline/fl_records.py) on the embedded log.

* The chunk codec: vectors as raw little-endian bytes, records never above the limit, and an assembler
  that returns a document only for a complete, consistent set (missing, altered or mixed chunks: nothing).
* A collector serves a round state only once every chunk of it is in.
* A restore never loads a partial checkpoint: torn chunks without committed offsets are skipped (the
  previous complete checkpoint is loaded); torn chunks whose transaction committed offsets make the job
  refuse to start (JobStateError), since no complete checkpoint matches the committed offsets.
* A 300,100-parameter softmax regression over the pipeline with 64 kB records (so every checkpoint and
  round state is chunked), the job SIGKILLed mid-round and restarted: the final model is bit-identical to
  the in-process run.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collector.fl.routes import FLService
from estimator.fl.job import AggregationJob, JobSettings, JobStateError
from ldp_core.fl.protocol import RoundState
from pipeline.fl_records import (
    ChunkAssembler,
    ChunkError,
    decode_chunk,
    encode_chunks,
    is_chunk,
    pack_document,
    unpack_document,
)
from pipeline.transport import open_transport
from tests.support.fl_pipeline_support import (
    JobProcess,
    Topics,
    collector,
    devices_for,
    drive_rounds,
    final_params,
    reference_run,
    task_spec,
)


def _doc_obj(n: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "a": rng.normal(size=n).astype(np.float32),
        "nested": {
            "u": np.arange(7, dtype=np.uint32),
            "raw": b"\x00\xff" * 5,
            "list": [1, "x", None, np.array([0.5], np.float64)],
        },
        "inf": "inf",
    }


def test_documents_keep_vectors_as_raw_little_endian_bytes() -> None:
    obj = _doc_obj(1000)
    doc = pack_document(obj)
    back = unpack_document(doc)
    assert back["a"].dtype == np.float32 and back["a"].tobytes() == obj["a"].astype("<f4").tobytes()
    assert back["nested"]["u"].tolist() == list(range(7)) and back["nested"]["raw"] == b"\x00\xff" * 5
    assert back["nested"]["list"][:3] == [1, "x", None] and back["nested"]["list"][3].tolist() == [0.5]
    # 4 bytes per float32 value plus a small JSON head (not base64's 5.4)
    assert 4000 + 4 * 7 + 10 + 8 < len(doc) < 4000 + 400
    assert obj["a"].astype("<f4").tobytes() in doc
    with pytest.raises(ChunkError):
        unpack_document(doc[:-3])  # a blob runs past the end


def test_chunks_stay_under_the_limit_and_only_complete_consistent_sets_assemble() -> None:
    doc = pack_document(_doc_obj(20_000))
    chunks = encode_chunks("checkpoint", "t", {"group": "g", "offsets": {"0": 5}}, doc, 8192)
    assert len(chunks) == -(-len(doc) // (8192 - 2048)) > 1
    assert all(is_chunk(c) and len(c) <= 8192 for c in chunks)
    order = list(range(len(chunks)))
    random.Random(3).shuffle(order)

    asm = ChunkAssembler()
    out = [asm.add(*decode_chunk(chunks[i]), offset=i) for i in order]
    assert all(o is None for o in out[:-1])
    done = out[-1]
    assert done is not None and done.document == doc and (done.first_offset, done.last_offset) == (0, len(chunks) - 1)
    assert done.header.meta == {"group": "g", "offsets": {"0": 5}}

    asm = ChunkAssembler()
    assert all(asm.add(*decode_chunk(c), offset=i) is None for i, c in enumerate(chunks[:-1]))  # one missing
    assert len(asm.pending()) == 1

    # a payload altered under an intact header: the digest refuses the whole set
    bad = bytearray(chunks[1])
    bad[-1] ^= 1
    asm = ChunkAssembler()
    got = [asm.add(*decode_chunk(bytes(c)), offset=i) for i, c in enumerate([chunks[0], bytes(bad), *chunks[2:]])]
    assert got == [None] * len(chunks) and asm.rejected == 1

    # chunks of another write of the same document (another id) never complete this one's set
    other = encode_chunks("checkpoint", "t", {"group": "g", "offsets": {"0": 5}}, doc, 8192)
    asm = ChunkAssembler()
    mixed = [other[0], *chunks[1:]]
    assert all(asm.add(*decode_chunk(c), offset=i) is None for i, c in enumerate(mixed))
    # a chunk claiming the same id with other offsets spoils the id
    forged = encode_chunks(
        "checkpoint", "t", {"group": "g", "offsets": {"0": 9}}, doc, 8192, doc_id=decode_chunk(chunks[0])[0].id
    )
    asm = ChunkAssembler()
    assert asm.add(*decode_chunk(forged[0]), offset=0) is None
    assert all(asm.add(*decode_chunk(c), offset=i + 1) is None for i, c in enumerate(chunks[1:]))
    assert asm.rejected == 1
    with pytest.raises(ChunkError):
        decode_chunk(b"LDPF\x02\x00\x00\x00")
    with pytest.raises(ChunkError, match="not a FL chunk record") as info:
        decode_chunk(b"LDPX" + chunks[0][4:])  # the framing's refusal comes as a ChunkError, raised once
    assert info.value.__context__ is None
    with pytest.raises(ChunkError):
        encode_chunks("checkpoint", "t", {}, doc, 1000)


def test_collector_serves_a_round_state_only_when_all_its_chunks_are_in() -> None:
    def state(seq: int, fill: float) -> RoundState:
        return RoundState(
            task="big",
            seq=seq,
            round=seq,
            phase="train",
            rounds=9,
            model={"kind": "logistic", "n_features": 5999},
            params=np.full(6000, fill, np.float32),
            selected=("a",),
        )

    def chunks(st: RoundState) -> list[bytes]:
        return encode_chunks("round_state", st.task, {"seq": st.seq}, pack_document(st.to_document()), 4096)

    svc = FLService(None, "r", "u")  # type: ignore[arg-type]  # not started: records are applied by hand
    first, second = chunks(state(1, 0.25)), chunks(state(2, -1.5))
    assert len(first) > 1
    for i, c in enumerate(first):
        svc._apply(c, i)
    assert svc.state("big").seq == 1  # type: ignore[union-attr]
    for i, c in enumerate(second[:-1]):
        svc._apply(c, 100 + i)
    got = svc.state("big")
    assert got is not None and got.seq == 1 and np.all(got.params == np.float32(0.25))
    svc._apply(second[-1], 200)
    got = svc.state("big")
    assert got is not None and got.seq == 2 and np.all(got.params == np.float32(-1.5))
    svc._apply(state(3, 9.0).to_json(), 300)  # the single-record JSON form (never written by the job) is not read
    got = svc.state("big")
    assert got is not None and got.seq == 2 and np.all(got.params == np.float32(-1.5))


def _job(tr: Any, spec: Any, topics: Topics) -> AggregationJob:
    return AggregationJob(
        tr,
        spec,
        JobSettings(
            group=topics.group,
            rounds_topic=topics.rounds,
            updates_topic=topics.updates,
            state_topic=topics.state,
            session_timeout=4.0,
            max_record_bytes=4096,
        ),
    )


def test_a_restore_never_loads_a_partial_checkpoint(tmp_path: Path) -> None:
    """Softmax regression with 2,010 parameters and 4 kB records: each checkpoint is 3+ chunks. (1) Some
    chunks of a newer checkpoint written without a transaction (offsets unchanged): the restart loads the
    previous complete checkpoint, bit for bit, and counts the torn one. (2) Some chunks written in a
    transaction that also committed an update's offset: no complete checkpoint matches the committed
    offsets, so the job refuses to start rather than load a partial state or guess."""
    spec = task_spec(
        "torn",
        4,
        model={"kind": "softmax", "n_features": 200, "n_classes": 10, "l2": 0.0},
        sampling={"kind": "fixed", "count": 2},
    )
    topics = Topics.fresh()
    with open_transport(f"sqlite:///{tmp_path}/t.sqlite3") as tr:
        job = _job(tr, spec, topics)
        job.open()
        before = job.status()
        good = job._checkpoint({})
        assert len(good) >= 3 and all(len(c) <= 4096 for c in good)
        job._st.params = job._st.params + np.float32(1.0)  # a newer state, of which only some chunks land
        job._st.seq += 1
        torn = job._checkpoint({})
        job.close()
        for c in torn[:-1]:
            tr.publish(topics.state, spec.task.encode(), c)

        again = _job(tr, spec, topics)
        again.open()
        after = again.status()
        assert after["params"] == before["params"] and after["seq"] == before["seq"]
        assert again.incomplete_checkpoints == 1
        again.close()

        tr.publish(topics.updates, spec.task.encode(), b"{}")
        with tr.consume([topics.updates], topics.group, member="fl-job-0") as c:
            while not c.poll(timeout=0.5):
                pass
            with c.transaction() as tx:  # offsets {0: 1} committed with only part of a checkpoint
                for chunk in torn[:2]:
                    tx.publish(topics.state, spec.task.encode(), chunk)
        third = _job(tr, spec, topics)
        with pytest.raises(JobStateError, match="incomplete or inconsistent"):
            third.open()
        third.close()


def _big_data(
    n_clients: int, d: int, k: int, per_client: int = 12, seed: int = 5
) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, d)).astype(np.float32)
    out = []
    for _ in range(n_clients):
        y = rng.integers(0, k, size=per_client)
        X = (centers[y] + rng.normal(size=(per_client, d))).astype(np.float32)
        out.append((X, y.astype(np.int64)))
    return out


def test_large_model_with_chunked_records_survives_sigkill(tmp_path: Path) -> None:
    """3,000 features × 100 classes (300,100 parameters, 1.2 MB as float32): with 64 kB records a round
    state is 19+ chunks and a checkpoint holding one update 38+. The job is SIGKILLed in round 1 after a
    mid-phase checkpoint of one upload, as soon as it has received a second, and restarted; the final model equals run_rounds bit for
    bit, every update is accepted once, and no record in the rounds or state topic exceeds 64 kB."""
    limit = 65536
    spec = task_spec(
        "big",
        6,
        model={"kind": "softmax", "n_features": 3000, "n_classes": 100, "l2": 0.0},
        sampling={"kind": "fixed", "count": 3},
        rounds=3,
        training={"epochs": 1, "batch_size": 6, "learning_rate": 0.1},
    )
    assert spec.build_model().num_params == 300_100
    data = _big_data(6, 3000, 100)
    ref, history = reference_run(spec, data)
    topics = Topics.fresh()
    url = f"sqlite:///{tmp_path}/transport.sqlite3"
    job = JobProcess(
        tmp_path, url, spec, topics, checkpoint_interval=0.3, extra_args=["--max-record-bytes", str(limit)]
    )

    def before(r: int, i: int) -> None:
        if (r, i) == (1, 1):  # the first upload is in a mid-phase checkpoint
            job.wait_status(lambda st: st["received_this_round"] >= 1 and not st["uncommitted"])

    def after(r: int, i: int) -> None:
        if (r, i) == (1, 1):  # the job has the second one (committed or not): kill, restart
            job.wait_status(lambda st: st["received_this_round"] >= 2)
            job.kill9()
            job.start()

    with collector(tmp_path, url, topics) as srv:
        job.start()
        try:
            drive_rounds(job, devices_for(srv.url, spec, data), spec.rounds, before=before, after=after)
            status = job.wait(timeout=90)
        finally:
            job.stop()
    assert job.kills == 1
    assert np.array_equal(final_params(status), ref)
    assert status["accepted"] == {"update": 9} and status["rejected"] == {} and status["duplicates"] == {}
    assert [h["epsilon"] for h in status["history"]] == [h.info["epsilon"] for h in history]

    sizes: dict[str, list[int]] = {"round_state": [], "checkpoint": []}
    with open_transport(url) as tr:
        for topic in (topics.rounds, topics.state):
            with tr.consume([topic], f"inspect-{topic}") as c:
                for rec in c.records(idle_timeout=1.0):
                    assert len(rec.value) <= limit, (topic, len(rec.value))
                    if is_chunk(rec.value):
                        h, _ = decode_chunk(rec.value)
                        if h.index == 0:
                            sizes[h.kind].append(h.count)
                    else:
                        assert json.loads(rec.value)["kind"] == "marker"
    assert sizes["round_state"] and min(sizes["round_state"]) >= 19
    # params + one update: 2 · 4 · 300,100 bytes over 63,488-byte payloads (the mid-phase checkpoint waited for)
    assert sizes["checkpoint"] and max(sizes["checkpoint"]) >= 38
