"""Sealed metrics end to end, on both transports: devices seal, the collector and shuffler carry
ciphertexts, the estimator and the sink open after the shuffle, and the estimates are exactly the
offline estimator's over the plain reports.

The attacks play the operator of the collector and the shuffler, who reads ``ldp.reports.raw`` and
opens the shuffler's checkpoints with the shuffler's own key: for a sealed metric neither holds a
single plaintext record (an OLH record is 5 bytes with a random 32-bit seed, so by chance one of the
1,240 appears in the ~300 kB they read with probability about 1240 * 3e5 / 2^40 < 1e-3), and the
collector process has no analyzer key to open them with.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collector.shuffler.checkpoint import decode_checkpoint_chunk, open_checkpoint_chunk
from estimator.jobs.batch import estimate_dataset
from ldp_core.days import utc_day
from ldp_core.metrics import parse_metrics
from ldp_core.wire.frames import ReportBatch, decode_frame, encode_frame, read_header
from ldp_core.wire.sealing import KeyRing, SealedSpec, new_key_file, open_batch, seal_batch
from pipeline.transport import open_transport
from simulator.stack import LocalPipeline, fleet_batches, upload
from tests.support.shuffled_data import offline

FRAME = 150


def _metrics(public: dict[str, str]) -> dict[str, Any]:
    common = {"owner": "o@example.org", "expires": "2099-12-31", "max_reports_per_day": 1}
    return {
        "format": "ldp-metrics/1",
        "analyzer_keys": [public],
        "metrics": {
            "tab": {
                **common,
                "description": "tab, sealed",
                "mechanism": {"mechanism": "grr", "epsilon": 1.0},
                "domain": {"kind": "dictionary", "values": ["a", "b", "c", "d", "e"], "other": True},
                "sealed": True,
            },
            "word": {
                **common,
                "description": "word, sealed",
                "mechanism": {"mechanism": "olh", "epsilon": 1.5},
                "domain": {"kind": "hashed", "size": 256, "seed": 4},
                "sealed": True,
            },
            "color": {
                **common,
                "description": "color, plain",
                "mechanism": {"mechanism": "oue", "epsilon": 2.0},
                "domain": {"kind": "hashed", "size": 48, "seed": 3},
            },
        },
    }


def _read_all(transport_url: str, topic: str, at_least: int, timeout: float = 60.0) -> list[bytes]:
    t = open_transport(transport_url)
    try:
        consumer = t.consume(topic, "attacker-" + uuid.uuid4().hex[:8])
        values: list[bytes] = []
        deadline = time.monotonic() + timeout
        with consumer:
            while time.monotonic() < deadline:
                values += [r.value for r in consumer.poll(max_records=10_000, timeout=0.5)]
                if len(values) >= at_least:
                    # one more short poll: whatever else is there
                    values += [r.value for r in consumer.poll(max_records=10_000, timeout=0.5)]
                    break
        return values
    finally:
        t.close()


def _rows(batches: list[ReportBatch], metric: str) -> list[bytes]:
    out = []
    for b in batches:
        if b.metric == metric:
            w = b.records.dtype.itemsize
            out += [r.tobytes() for r in np.ascontiguousarray(b.records).view(np.uint8).reshape(len(b), w)]
    return out


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def transport_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "kafka":
        return f"kafka://{request.getfixturevalue('kafka_bootstrap')}"
    return f"sqlite:///{tmp_path / 'transport.sqlite3'}"


def test_sealed_metrics_end_to_end_and_the_operator_sees_ciphertexts_only(tmp_path: Path, transport_url: str) -> None:
    _, key = new_key_file(tmp_path / "analyzer-keys")
    doc = _metrics(key.public.to_dict())
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(doc))
    metrics = parse_metrics(doc)
    assert metrics["tab"].sealed and metrics["word"].sealed and not metrics["color"].sealed
    day = utc_day(time.time())
    fleet = fleet_batches(metrics, sorted(metrics), 1200, day, np.random.default_rng(7), frame_reports=FRAME)
    sent = [seal_batch(b, key.public) if metrics[b.metric].sealed else b for b in fleet.batches]
    # a group of its own (another day) below the crowd threshold: it stays in the shuffler's buffer,
    # so the shuffler's checkpoints hold sealed records
    spec = metrics["word"].spec
    held = ReportBatch("word", spec, day - 1, spec.encode(np.arange(40), np.random.default_rng(8)))
    sent.append(seal_batch(held, key.public))
    with LocalPipeline(
        tmp_path / "run",
        metrics_path,
        transport_url=transport_url,
        min_batch=FRAME,
        partitions=2,
        checkpoint_interval=0.3,
        analyzer_keys=tmp_path / "analyzer-keys",
    ) as pipe:
        stats = upload(pipe.collector_url, sent, clients=3)
        assert stats.batches == len(sent) and stats.rejected == 0
        expected = fleet.reports()
        _, below = pipe.wait_settled(sum(expected.values()) + len(held), timeout=120)
        assert below == len(held)
        pipe.wait_sink(sum(expected.values()), timeout=120)
        assert pipe.counted() == expected
        assert pipe.estimator.stats.sealed_unopened == 0 and pipe.sink.stats.sealed_unopened == 0
        counted = pipe.estimator.counted()
        raw = _read_all(transport_url, pipe.topics.raw, len(sent))
        state = _read_all(transport_url, pipe.topics.state, 1, timeout=20)
        shuffled = _read_all(transport_url, pipe.topics.shuffled, 1)
        shuffler = pipe.shuffler
        dataset = pipe.dataset
        # the collector process holds public keys only: nothing in it can open a sealed record
        app_keys = {k.key_id for k in pipe.metrics.analyzer_keys}
        assert app_keys == {key.key_id}
        # the operator's view of the shuffler's state: its checkpoints opened with the shuffler's own key
        opened_state = []
        for value in state:
            header, payload = decode_checkpoint_chunk(value)
            opened = open_checkpoint_chunk(header, payload, shuffler._keys, key_file=shuffler.settings.key_file)
            opened_state.append(bytes(opened[3]))

    # exact estimates: the opened records are the plain ones, each counted once
    want = offline(fleet.batches)
    assert set(counted.keys) == set(want)
    for k, acc in want.items():
        got = counted.keys[k].acc
        for name, arr in acc.sums.items():
            np.testing.assert_array_equal(got.sums[name], arr, err_msg=f"{k} {name}")
        batch = estimate_dataset(dataset, k[0], [day], progress=False)
        assert batch.n == acc.n
        np.testing.assert_array_equal(batch.table["estimate"].to_numpy(), acc.estimate().counts)

    # attack 1: the raw topic reader. Every frame of a sealed metric is sealed; its plain records appear
    # nowhere in the topic; decoding it as plain records fails; the plain metric is unchanged.
    frames = {read_header(v).batch_id: v for v in raw}
    assert len(frames) == len(sent)
    everything = b"".join(raw)
    for b in fleet.batches:
        h = read_header(frames[b.batch_id])
        assert h.sealed == metrics[b.metric].sealed
        if h.sealed:
            assert h.record_size == b.spec.record_size + 52
            assert isinstance(decode_frame(frames[b.batch_id], b.spec).spec, SealedSpec)
        else:
            assert frames[b.batch_id] == encode_frame(b)
    word_rows = _rows([*fleet.batches, held], "word")
    assert len(word_rows) == 1240 and len(word_rows[0]) == 5  # a 32-bit seed and the hashed value
    assert not [r for r in word_rows if r in everything]
    assert [r for r in _rows(fleet.batches, "color") if r in everything]  # the control: plain records are there

    # attack 2: the shuffler's operator, who opens its checkpoints, finds no plaintext record of "word" either
    assert opened_state, "the shuffler wrote no checkpoint"
    state_bytes = b"".join(opened_state)
    assert not [r for r in word_rows if r in state_bytes]
    held_sealed = _rows([sent[-1]], "word")
    assert all(r in state_bytes for r in held_sealed)  # the control: the state does hold those reports, sealed
    # ... and the shuffled topic carries sealed records too (opened only by the analyzer's processes)
    assert not [r for r in word_rows if r in b"".join(shuffled)]

    # without the analyzer's key (a fresh key ring) nothing opens
    _, other = new_key_file(tmp_path / "other-keys")
    sealed_word = next(decode_frame(frames[b.batch_id], b.spec) for b in fleet.batches if b.metric == "word")
    res = open_batch(sealed_word, KeyRing([other]))
    assert res.failed == len(sealed_word) and len(res.batch) == 0


def test_a_replayed_sealed_frame_is_counted_once_by_the_estimator_and_the_sink(tmp_path: Path) -> None:
    """Issue #28 over the running pipeline: the collector operator reads a sealed frame off the raw topic and
    posts it again over HTTP under a fresh batch id. The collector and the shuffler take it (a new id); the
    estimator and the sink open the copies and drop them as replays, so nothing is counted twice."""
    _, key = new_key_file(tmp_path / "analyzer-keys")
    doc = _metrics(key.public.to_dict())
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(doc))
    spec = parse_metrics(doc)["word"].spec
    day = utc_day(time.time())
    sealed = seal_batch(
        ReportBatch("word", spec, day, spec.encode(np.arange(FRAME), np.random.default_rng(9))), key.public
    )
    with LocalPipeline(
        tmp_path / "run",
        metrics_path,
        transport_url=f"sqlite:///{tmp_path / 'transport.sqlite3'}",
        min_batch=FRAME,
        partitions=1,
        checkpoint_interval=0.3,
        analyzer_keys=tmp_path / "analyzer-keys",
    ) as pipe:
        assert upload(pipe.collector_url, [sealed], clients=1).batches == 1
        pipe.wait_settled(FRAME, timeout=120)
        pipe.wait_sink(FRAME, timeout=120)
        raw = decode_frame(_read_all(pipe.transport_url, pipe.topics.raw, 1)[0], spec)
        replay = ReportBatch(raw.metric, raw.spec, raw.day, raw.records, uuid.uuid4().bytes)
        assert upload(pipe.collector_url, [replay], clients=1).batches == 1
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (
            pipe.estimator.stats.sealed_replays_dropped < FRAME or pipe.sink.stats.sealed_replays_dropped < FRAME
        ):
            pipe.check()
            time.sleep(0.1)
        assert pipe.estimator.stats.sealed_replays_dropped == FRAME
        assert pipe.sink.stats.sealed_replays_dropped == FRAME
        assert pipe.counted() == {"word": FRAME}
