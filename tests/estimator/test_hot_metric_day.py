"""One hot metric-day spread over the estimator group (issue 31, "Parallelism is capped by the number of
metric-days").

The real shuffler releases one metric-day's crowds keyed per batch, so its batches land in every partition of the
shuffled topic; two streaming-estimator members of one group each count part of that metric-day; a read at either
member (over HTTP, merged with its ``--peer``) equals the batch job (``ldp estimate --dataset``) over the Parquet
sink's dataset of the same topic, and, with one member gone, the other answers for its part, marked partial with
the partitions that are missing. Under the old keying (``shuffled_key="metric-day"``) one member held the whole
metric-day and the other none: the first assertion on the members' shares fails there.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from collector.sinks.parquet import ParquetSink
from estimator.oracles import accumulator_for
from estimator.service import StreamingEstimator, create_app
from ldp_cli.main import main
from ldp_core.metrics import MetricSet
from pipeline.catalog import SpecCatalog
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import open_transport
from simulator.stack import serve_in_thread
from tests.support.collector_support import TODAY, olh_batch, write_metrics
from tests.support.spread_members import run_shuffler

UPLOADS = 40  # uploads of 60 reports; released as 48 batches of 50 (48 keys over 4 partitions)
PER_UPLOAD = 60
MIN_BATCH = 50


def _shuffle(tmp_path: Path, transport, metrics: MetricSet) -> list:  # type: ignore[no-untyped-def]
    uploads = [olh_batch(metrics, PER_UPLOAD, first_seed=PER_UPLOAD * i) for i in range(UPLOADS)]
    run_shuffler(tmp_path, transport, metrics, uploads, min_batch=MIN_BATCH)
    return uploads


def _sink(tmp_path: Path, transport, cat: SpecCatalog) -> Path:  # type: ignore[no-untyped-def]
    root = tmp_path / "dataset"
    sink = ParquetSink(transport, root, cat, group="sink", flush_seconds=0.0)
    sink.run(idle_timeout=0.5)
    sink.close()
    return root


def _two_members(tmp_path: Path, transport, cat: SpecCatalog, total: int):  # type: ignore[no-untyped-def]
    a = StreamingEstimator(transport, tmp_path / "a", cat, group="g", member="a", checkpoint_seconds=0.05)
    b = StreamingEstimator(transport, tmp_path / "b", cat, group="g", member="b", checkpoint_seconds=0.05)
    a.poll_once(timeout=0.5)
    b.poll_once(timeout=0.5)  # b joins: the group splits the partitions
    stop = threading.Event()
    threads = [threading.Thread(target=e.run, kwargs={"stop": stop}) for e in (a, b)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    while a.state().certain.n + b.state().certain.n < total and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(30)
    return a, b


def _batch_job(dataset: Path, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    capsys.readouterr()
    argv = ["estimate", "--dataset", str(dataset), "--metric", "emoji_used", "--days", str(TODAY), "--json"]
    assert main(argv) == 0
    out: dict = json.loads(capsys.readouterr().out.splitlines()[0])  # type: ignore[type-arg]
    counts = np.full(len(out["rows"]), np.nan)
    for row in out["rows"]:  # one row per domain item
        counts[int(row["item"])] = row["estimate"]
    out["counts"] = counts
    return out


def test_a_hot_metric_day_spreads_over_two_members_and_merges_to_the_batch_estimate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = write_metrics(tmp_path / "metrics.json")
    cat = SpecCatalog([metrics])
    transport = open_transport(f"sqlite:///{tmp_path}/log.sqlite3", synchronous="NORMAL")
    uploads = _shuffle(tmp_path, transport, metrics)
    total = UPLOADS * PER_UPLOAD
    assert transport.partitions(SHUFFLED_TOPIC) == 4
    dataset = _sink(tmp_path, transport, cat)
    a, b = _two_members(tmp_path, transport, cat, total)
    spec = metrics["emoji_used"].spec
    key = ("emoji_used", spec.spec_id, TODAY)
    try:
        share_a, share_b = a.counted().keys.get(key), b.counted().keys.get(key)
        # each member holds part of the one metric-day (the old keying gave one member all of it)
        assert share_a is not None and share_b is not None, "one member holds the whole metric-day"
        assert share_a.acc.n > 0 and share_b.acc.n > 0 and share_a.acc.n + share_b.acc.n == total
        assert set(a.state().assigned or {}) and set(b.state().assigned or {})
        assert not set(a.state().assigned or {}) & set(b.state().assigned or {})

        offline = accumulator_for(spec)  # every uploaded report once
        for u in uploads:
            offline.update(u.records)
        batch = _batch_job(dataset, capsys)
        assert batch["n"] == total
        peers_a: list[str] = []
        peers_b: list[str] = []
        server_b, url_b, thread_b = serve_in_thread(create_app(b, peers=peers_b, peer_timeout=2.0), lifespan="off")
        server_a, url_a, thread_a = serve_in_thread(create_app(a, peers=peers_a, peer_timeout=2.0), lifespan="off")
        peers_a.append(url_b)
        peers_b.append(url_a)
        try:
            for url in (url_a, url_b):  # a merged read at either member: the batch job's estimate
                body = httpx.get(f"{url}/v1/estimates/emoji_used", params={"day": TODAY}).json()
                assert body["partial"] is False and body["merged_instances"] == 2
                assert body["missing_partitions"] == [] and body["missing_parts"] == []
                assert body["n"] == total and body["batches"] == share_a.batches + share_b.batches
                # the same integer sums, the same estimator: equal up to float summation order
                np.testing.assert_allclose(body["counts"], batch["counts"], rtol=1e-9, atol=1e-9)
                np.testing.assert_allclose(body["counts"], offline.estimate().counts, rtol=1e-9, atol=1e-9)
            local = httpx.get(f"{url_a}/v1/estimates/emoji_used", params={"day": TODAY, "merged": "false"}).json()
            assert local["n"] == share_a.acc.n < total

            server_b.should_exit = True  # member b goes away: a answers for its part, and says what is missing
            thread_b.join(30)
            body = httpx.get(f"{url_a}/v1/estimates/emoji_used", params={"day": TODAY}).json()
            assert body["partial"] is True and body["missing_peers"] == [url_b]
            assert body["n"] == share_a.acc.n < total
            b_parts = sorted(b.state().assigned or {})
            assert body["missing_partitions"] == b_parts
            ends = {p["partition"]: p["read"] for p in b.freshness()["partitions"]}
            for part in body["missing_parts"]:  # b's partitions: from where a's counts end (nothing), unbounded
                assert part["topic"] == SHUFFLED_TOPIC and part["to"] is None
                assert part["from"] <= ends.get(part["partition"], 0)
            listing = httpx.get(url_a + "/v1/estimates").json()
            assert listing["partial"] is True and listing["missing_partitions"] == b_parts
        finally:
            server_a.should_exit = True
            server_b.should_exit = True
            thread_a.join(30)
    finally:
        a.close()
        b.close()
        transport.close()


def test_missing_parts_name_the_offsets_no_answering_member_holds() -> None:
    """A member that took partition 1 over at the committed offset 5 lacks [0, 5) (the missing member counted
    it); partition 2 is nobody's that answered, so all of it is missing; partition 0 is whole."""
    from estimator.service.state import EstimatorState, Tally, missing_parts
    from pipeline.transport.base import TopicPartition

    t = SHUFFLED_TOPIC
    a = EstimatorState(
        Tally(),
        {TopicPartition(t, 0): [[0, 10, 1.0]], TopicPartition(t, 1): [[5, 9, 2.0]]},
        [],
        assigned={0: 0, 1: 5},
        partition_count=3,
    )
    assert missing_parts([a]) == [
        {"topic": t, "partition": 1, "from": 0, "to": 5},
        {"topic": t, "partition": 2, "from": 0, "to": None},
    ]
    # just assigned, nothing read yet: below the offset it got the partition at is someone else's
    fresh = EstimatorState(Tally(), {}, [], assigned={0: 0, 1: 7, 2: 0}, partition_count=3)
    assert missing_parts([fresh]) == [{"topic": t, "partition": 1, "from": 0, "to": 7}]
    # a state over the wire keeps both fields
    again = EstimatorState.from_json_obj(json.loads(json.dumps(a.to_json_obj())))
    assert (again.assigned, again.partition_count) == ({0: 0, 1: 5}, 3)
