"""One hot SEALED metric-day spread over the estimator group, and a replay still meeting its original's guard
(issue 31, "a sealed metric-day is not spread").

The real shuffler splits each released sealed batch by its records' encapsulated keys
(:func:`pipeline.topics.sealed_route`) over the metric-day's sub-keys, so the metric-day lands in every partition
of the shuffled topic. Two streaming-estimator members, each with its own replay set (the default), each count
part of it; a merged read at either (over HTTP, with ``--peer``) equals the batch job (``ldp estimate
--dataset``) over the Parquet sink's dataset.

Then a hostile collector (it reads ``ldp.reports.raw``) re-publishes already counted ciphertexts mixed with
fresh ones of its own in a new upload under a new batch id; the shuffler takes it (a new id) and releases it in
a new batch. Each replayed record travels to the partition its encapsulated key routes to, the partition of
its original, so the member that counted the original drops it. Spread per batch id instead (the plain
metrics' keying, each member with its own set), the new batch lands on one partition, and the replayed records
whose originals another member counted are counted twice: checked once against that routing (the report
on branch ``seal-spread``: 12 and 16 of the 30 replayed records counted again in two runs, the assertions
below fail).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from collector.sinks.parquet import ParquetSink
from estimator.service import StreamingEstimator, create_app, merge_states
from ldp_cli.main import main
from ldp_core.wire.frames import ReportBatch
from simulator.stack import serve_in_thread
from tests.support.collector_support import TODAY
from tests.support.spread_members import SealedPair, run_shuffler, sealed_opener, sealed_upload, wait_until

UPLOADS = 24  # sealed uploads of 50 reports, each released as one batch of 50 and split over 4 partitions
PER_UPLOAD = 50
MIN_BATCH = 50
REPLAYED = 30  # already counted ciphertexts the hostile collector re-publishes, with 20 fresh ones of its own
FRESH = MIN_BATCH - REPLAYED
SIZE = 256


def _guarantee(n: int, e0: float) -> tuple[float, float, str]:  # a central figure on every part
    return e0 / n**0.5, 1e-6, "test"


def _batch_job(dataset: Path, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    capsys.readouterr()
    argv = ["estimate", "--dataset", str(dataset), "--metric", "word", "--days", str(TODAY), "--json"]
    assert main(argv) == 0
    out: dict = json.loads(capsys.readouterr().out.splitlines()[0])  # type: ignore[type-arg]
    counts = np.full(len(out["rows"]), np.nan)
    for row in out["rows"]:
        counts[int(row["item"])] = row["estimate"]
    out["counts"] = counts
    return out


def _merged_read(members: list[StreamingEstimator]) -> list[dict]:  # type: ignore[type-arg]
    """The answer of ``GET /v1/estimates/word`` at each member, every member naming the others as peers."""
    peers: list[list[str]] = [[] for _ in members]
    servers = [
        serve_in_thread(create_app(m, peers=p, peer_timeout=2.0), lifespan="off") for m, p in zip(members, peers)
    ]
    try:
        for i, p in enumerate(peers):
            p.extend(url for j, (_, url, _) in enumerate(servers) if j != i)
        return [httpx.get(f"{url}/v1/estimates/word", params={"day": TODAY}).json() for _, url, _ in servers]
    finally:
        for server, _, thread in servers:
            server.should_exit = True
            thread.join(30)


def test_a_hot_sealed_metric_day_spreads_over_two_members_and_a_replay_in_another_batch_is_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(11)
    pair = SealedPair(tmp_path, rng, uploads=UPLOADS, per_upload=PER_UPLOAD, size=SIZE)
    metrics, folder, cat, uploads, total, transport = (
        pair.metrics, pair.folder, pair.cat, pair.uploads, pair.total, pair.transport
    )  # fmt: skip
    a, b = pair.a, pair.b  # two partitions each, kept for the whole test
    try:
        run_shuffler(tmp_path, transport, metrics, uploads, min_batch=MIN_BATCH, guarantee=_guarantee)
        wait_until(lambda: a.state().certain.n + b.state().certain.n >= total)
        key = ("word", metrics["word"].spec.spec_id, TODAY)
        share_a, share_b = a.counted().keys.get(key), b.counted().keys.get(key)
        # each member holds part of the one sealed metric-day (keyed by metric-day, one member held all of it)
        assert share_a is not None and share_b is not None, "one member holds the whole sealed metric-day"
        assert share_a.acc.n > 0 and share_b.acc.n > 0 and share_a.acc.n + share_b.acc.n == total
        assert not set(a.state().assigned or {}) & set(b.state().assigned or {})
        # every part carries its release's central figure (50 reports shuffled together), not its own size's
        assert share_a.central_epsilon == share_b.central_epsilon == pytest.approx(1.5 / MIN_BATCH**0.5)

        # the hostile collector: 30 ciphertexts it read off the raw topic, two from each of 15 uploads (their
        # originals were counted by both members), in one new upload with 20 fresh ones of its own
        replayed = np.concatenate([u.records[:2] for u in uploads[: REPLAYED // 2]])
        fresh = sealed_upload(metrics, FRESH, SIZE, rng)
        mixed = np.concatenate([replayed, fresh.records])[rng.permutation(MIN_BATCH)]
        attack = ReportBatch("word", fresh.spec, TODAY, mixed, uuid.uuid4().bytes)
        run_shuffler(tmp_path, transport, metrics, [attack], min_batch=MIN_BATCH, guarantee=_guarantee)
        dropped = lambda: a.stats.sealed_replays_dropped + b.stats.sealed_replays_dropped  # noqa: E731
        wait_until(lambda: merge_states([a.state(), b.state()]).n >= total + FRESH and dropped() >= REPLAYED)
        assert dropped() == REPLAYED
        assert a.stats.sealed_replays_dropped > 0 and b.stats.sealed_replays_dropped > 0  # each guarded its part
    finally:
        pair.stop()
    try:
        assert merge_states([a.state(), b.state()]).n == total + FRESH  # nothing counted twice

        sink = ParquetSink(
            transport, tmp_path / "dataset", cat, group="sink", flush_seconds=0.0, opener=sealed_opener(folder)
        )
        sink.run(idle_timeout=0.5)
        sink.close()
        assert sink.stats.sealed_replays_dropped == REPLAYED
        batch = _batch_job(tmp_path / "dataset", capsys)
        assert batch["n"] == total + FRESH
        for body in _merged_read([a, b]):  # a merged read at either member: the batch job's estimate
            assert body["partial"] is False and body["merged_instances"] == 2
            assert body["n"] == total + FRESH
            # the same integer sums, the same estimator: equal up to float summation order
            np.testing.assert_allclose(body["counts"], batch["counts"], rtol=1e-9, atol=1e-9)
    finally:
        pair.close(transport=True)
