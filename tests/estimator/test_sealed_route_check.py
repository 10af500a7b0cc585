"""A consumer of the shuffled topic checks each sealed record's route (issue 31).

The shuffler splits every released sealed batch by its records' encapsulated keys (:func:`pipeline.topics.sealed_route`)
over the metric-day's N sub-keys, so a replayed ciphertext reaches its original's partition and replay guard. A
hostile SHUFFLER is not bound by that: it can publish a copy of a counted record under another sub-key, or in a
batch "released whole", and the copy reaches another member, whose replay set does not hold it. Each member
(and the sink) therefore derives the partition every sealed record must be read from, with N from its own
settings (``shuffled_spread``, else the shuffled topic's partition count; 1 with ``shuffled_key="metric-day"``),
never from the envelope, and drops (counting ``sealed_misrouted``) any record read elsewhere.

Checked once against the code before the check: the members counted the 40 copies published under the sub-key
next to their originals' again (1,440 in the merge instead of 1,400; the first assertion after the attack fails).
Two sink members with their own datasets (so their own replay sets) read the same topic: with the sinks' check
removed they wrote 1,840 reports for 1,800 (the 40 re-routed copies again).
"""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from collector.sinks.parquet import ParquetSink, SinkSettings
from estimator.service import StreamingEstimator, merge_states
from estimator.service.engine import EstimatorSettings
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.envelope import ShuffleMeta, encode_envelope
from pipeline.topics import SHUFFLED_TOPIC, metric_day_key, sealed_route, shuffled_key, spread_keys
from pipeline.transport import Transport, open_transport
from pipeline.transport.base import partition_for
from tests.support.collector_support import TODAY
from tests.support.spread_members import (
    SealedPair,
    run_shuffler,
    sealed_opener,
    sealed_upload,
    sealed_word_metrics,
    wait_until,
)

PARTS = 4  # partitions of the shuffled topic: N = 4 sub-keys, one per partition
UPLOADS = 28  # sealed uploads of 50, each released as one batch of 50, split over the 4 partitions
PER_UPLOAD = 50
MIN_BATCH = 50
COPIES = 40  # counted ciphertexts the hostile shuffler publishes again, in each of three ways
SIZE = 256


def _forge(  # type: ignore[no-untyped-def]
    transport: Transport,
    key: bytes,
    records: np.ndarray,
    spec,
    part: tuple[int, int] | None,
    topic: str = SHUFFLED_TOPIC,
) -> None:
    """Publish ``records`` on the shuffled topic under ``key`` as a shuffler does: an envelope with a fresh batch id,
    as part ``part = (j, parts)`` of a release, or (``None``) as a batch released whole."""
    sid = uuid.uuid4().bytes
    meta = ShuffleMeta(shuffle_id=sid.hex(), n=len(records), epsilon0=float(spec.epsilon), sources=1)
    if part is not None:
        meta = ShuffleMeta(
            sid.hex(), len(records), float(spec.epsilon), release_id=sid.hex(), release_n=len(records),
            part=part[0], parts=part[1],
        )  # fmt: skip
    transport.publish(topic, key, encode_envelope(meta, ReportBatch("word", spec, TODAY, records, sid)))


def test_a_copy_a_hostile_shuffler_routes_elsewhere_is_dropped_by_the_member_it_reaches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rng = np.random.default_rng(23)
    pair = SealedPair(tmp_path, rng, uploads=UPLOADS, per_upload=PER_UPLOAD, size=SIZE, partitions=PARTS)
    metrics, folder, cat, uploads, total, transport = (
        pair.metrics, pair.folder, pair.cat, pair.uploads, pair.total, pair.transport
    )  # fmt: skip
    a, b = pair.a, pair.b  # the embedded log gives partitions 0, 2 to a and 1, 3 to b
    # two sink members of one group, each writing its own dataset (so each with its own replay set), joined
    # before anything is published: they split the partitions as a and b do
    sinks = {
        name: ParquetSink(
            transport,
            tmp_path / f"dataset-{name}",
            cat,
            group="sinks",
            member=name,
            flush_seconds=0.0,
            opener=sealed_opener(folder),
        )  # fmt: skip
        for name in ("s1", "s2")
    }
    for sk in sinks.values():
        sk.poll_once(timeout=0.5)
    sink_stop = threading.Event()
    sink_threads = [threading.Thread(target=sk.run, kwargs={"stop": sink_stop}) for sk in sinks.values()]
    for t in sink_threads:
        t.start()
    try:
        run_shuffler(tmp_path, transport, metrics, uploads, min_batch=MIN_BATCH)
        wait_until(lambda: a.state().certain.n + b.state().certain.n >= total)
        n_a, n_b = merge_states([a.state()]).n, merge_states([b.state()]).n
        assert n_a > 0 and n_b > 0 and n_a + n_b == total

        # the hostile shuffler holds every ciphertext it shuffled; it publishes 40 counted ones again, three ways
        spec = uploads[0].spec
        read = a.stats.records + b.stats.records
        forged = 0
        copies = np.concatenate([u.records[:10] for u in uploads[: COPIES // 10]])
        keys = spread_keys("word", TODAY, PARTS, PARTS)
        route = sealed_route(copies, spec.record_size, PARTS)
        home = partition_for(metric_day_key("word", TODAY), PARTS)
        # 1. each under the sub-key after its own (the next partition: the other member's), a well-formed part
        for j in range(PARTS):
            sel = (route + 1) % PARTS == j
            if sel.any():
                _forge(transport, keys[j], copies[sel], spec, (j, PARTS))
                forged += 1
        # 2. all 40 as a batch released whole, keyed per batch like a plain metric's (off the metric-day's home)
        key = next(k for k in (shuffled_key("word", TODAY, rng.bytes(16)) for _ in range(64)) if
                   partition_for(k, PARTS) != home)  # fmt: skip
        _forge(transport, key, copies, spec, None)
        # 3. all 40 as the one part of a release split over 1 sub-key, under the metric-day key: what a shuffler
        # run with --shuffled-spread 1 publishes; indistinguishable from it, so it is also reported loudly
        _forge(transport, metric_day_key("word", TODAY), copies, spec, (0, 1))
        forged += 2
        wait_until(lambda: a.stats.records + b.stats.records >= read + forged, timeout=30)
        assert merge_states([a.state(), b.state()]).n == total  # nothing counted twice

        def dropped() -> int:
            return sum(m.stats.sealed_misrouted + m.stats.sealed_replays_dropped for m in (a, b))

        assert dropped() == 3 * COPIES  # every copy dropped: 40 misrouted by the first way, the rest either
        misrouted = a.stats.sealed_misrouted + b.stats.sealed_misrouted
        assert misrouted >= COPIES
        # the copies of the third way sit on the metric-day's home partition, consistent with N = 1: its owner
        # reports the disagreement (not ready, an ERROR line naming both N) besides dropping them
        owner = a if home in (a.state().assigned or {}) else b
        status = owner.run_status()
        assert status["ready"] is False and "N = 1" in status["route_mismatch"] and "N = 4" in status["route_mismatch"]
        # (those of the 40 whose own partition is the home one pass the check and meet the replay guard there)
        off_home = int(np.count_nonzero(np.array([partition_for(keys[j], PARTS) for j in route]) != home))
        assert 0 < off_home < COPIES and owner.stats.sealed_route_mismatch == off_home
        assert any(r.levelno == logging.ERROR and "N = 1" in r.getMessage() for r in caplog.records)

        # honest traffic after a rebalance: a leaves, b takes its partitions; nothing is dropped or lost
        pair.stop("a")
        final_a = a.state()
        pair.close("a")
        more = [sealed_upload(metrics, PER_UPLOAD, SIZE, rng) for _ in range(8)]
        before = b.stats.sealed_misrouted, b.stats.sealed_replays_dropped
        run_shuffler(tmp_path, transport, metrics, more, min_batch=MIN_BATCH)
        wait_until(lambda: merge_states([final_a, b.state()]).n >= total + 8 * PER_UPLOAD)
        assert set(b.state().assigned or {}) == set(range(PARTS))
        assert merge_states([final_a, b.state()]).n == total + 8 * PER_UPLOAD
        assert (b.stats.sealed_misrouted, b.stats.sealed_replays_dropped) == before

        # the two sink members, each with its own replay set: every copy dropped by one of them, nothing lost
        def sunk() -> int:
            return sum(sk.stats.reports for sk in sinks.values())

        wait_until(lambda: sunk() >= total + 8 * PER_UPLOAD)
        sink_stop.set()
        for t in sink_threads:
            t.join(30)
        s1, s2 = sinks["s1"].stats, sinks["s2"].stats
        assert s1.reports > 0 and s2.reports > 0 and sunk() == total + 8 * PER_UPLOAD
        assert sum(st.sealed_misrouted + st.sealed_replays_dropped for st in (s1, s2)) == 3 * COPIES
        assert s1.sealed_misrouted + s2.sealed_misrouted >= COPIES
    finally:
        sink_stop.set()
        for t in sink_threads:
            t.join(30)
        for sk in sinks.values():
            sk.close()
        pair.close()
    try:
        # the sink, one member over every partition with one replay set: the same 120 copies dropped
        sink = ParquetSink(transport, tmp_path / "dataset", cat, group="sink", flush_seconds=0.0,
                           opener=sealed_opener(folder))  # fmt: skip
        sink.run(idle_timeout=0.5)
        sink.close()
        assert sink.stats.sealed_misrouted + sink.stats.sealed_replays_dropped == 3 * COPIES
        assert sink.stats.sealed_misrouted >= COPIES and sink.stats.sealed_route_mismatch == off_home
        assert sink.stats.reports == total + 8 * PER_UPLOAD
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("shuffler", "member", "agree"),
    [
        ({"shuffled_spread": 2}, {"shuffled_spread": 2}, True),
        ({"shuffled_key": "metric-day"}, {"shuffled_key": "metric-day"}, True),
        ({"shuffled_spread": 2}, {}, False),  # the shuffler routes over 2 sub-keys, the member over 4 partitions
        ({"shuffled_key": "metric-day"}, {"shuffled_spread": 2}, False),
    ],
)
def test_a_member_routing_under_another_n_than_the_shuffler_says_so(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    shuffler: dict,
    member: dict,
    agree: bool,  # type: ignore[type-arg]
) -> None:
    metrics, folder = sealed_word_metrics(tmp_path, SIZE)
    rng = np.random.default_rng(31)
    uploads = [sealed_upload(metrics, PER_UPLOAD, SIZE, rng) for _ in range(6)]
    transport = open_transport(f"sqlite:///{tmp_path}/log.sqlite3", synchronous="NORMAL")
    transport.create_topic(SHUFFLED_TOPIC, PARTS)
    est = StreamingEstimator(
        transport, tmp_path / "m", SpecCatalog([metrics]), group="g", member="m", checkpoint_seconds=0.05,
        opener=sealed_opener(folder), **member,
    )  # fmt: skip
    try:
        run_shuffler(tmp_path, transport, metrics, uploads, min_batch=MIN_BATCH, **shuffler)
        est.run(idle_timeout=0.5)
        counted, dropped = merge_states([est.state()]).n, est.stats.sealed_misrouted
        assert counted + dropped == 6 * PER_UPLOAD
        if agree:
            assert dropped == 0 and est.run_status().get("route_mismatch") is None
        else:  # most records dropped, and said so: both N in the status and an ERROR line
            assert dropped > 0 and est.stats.sealed_route_mismatch == dropped
            msg = est.run_status()["route_mismatch"]
            assert "shuffled-spread" in msg
            assert any(r.levelno == logging.ERROR and "--shuffled-spread" in r.getMessage() for r in caplog.records)
    finally:
        est.close()
        transport.close()


def test_the_consumers_take_the_shufflers_keying_from_its_flags_or_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from collector.shuffler.settings import ShufflerSettings
    from ldp_cli.options import shuffler_keying
    from pipeline.errors import ConfigError

    for var in ("LDP_SHUFFLER_SHUFFLED_KEY", "LDP_SHUFFLER_SHUFFLED_SPREAD", "LDP_SHUFFLED_KEY", "LDP_SHUFFLED_SPREAD"):
        monkeypatch.delenv(var, raising=False)
    assert shuffler_keying(None, None) == {"shuffled_key": "batch", "shuffled_spread": 0}
    monkeypatch.setenv("LDP_SHUFFLER_SHUFFLED_SPREAD", "2")
    monkeypatch.setenv("LDP_SHUFFLER_SHUFFLED_KEY", "metric-day")
    assert shuffler_keying(None, None) == {"shuffled_key": "metric-day", "shuffled_spread": 2}
    assert shuffler_keying("batch", 0) == {"shuffled_key": "batch", "shuffled_spread": 0}  # the flags win
    monkeypatch.setenv("LDP_SHUFFLER_SHUFFLED_SPREAD", "two")
    with pytest.raises(ConfigError, match="LDP_SHUFFLER_SHUFFLED_SPREAD"):
        shuffler_keying(None, None)
    # the deployment-wide names: every stage reads them, the shuffler's own spellings first (as the shuffler does)
    monkeypatch.delenv("LDP_SHUFFLER_SHUFFLED_KEY")
    monkeypatch.delenv("LDP_SHUFFLER_SHUFFLED_SPREAD")
    monkeypatch.setenv("LDP_SHUFFLED_KEY", "metric-day")
    monkeypatch.setenv("LDP_SHUFFLED_SPREAD", "3")
    assert shuffler_keying(None, None) == {"shuffled_key": "metric-day", "shuffled_spread": 3}
    shuffler = ShufflerSettings.from_env()
    assert (shuffler.shuffled_key, shuffler.shuffled_spread) == ("metric-day", 3)
    monkeypatch.setenv("LDP_SHUFFLER_SHUFFLED_SPREAD", "2")
    assert shuffler_keying(None, None)["shuffled_spread"] == ShufflerSettings.from_env().shuffled_spread == 2
    monkeypatch.setenv("LDP_SHUFFLED_KEY", "per-record")
    with pytest.raises(ConfigError, match="LDP_SHUFFLED_KEY"):
        shuffler_keying(None, None)
    with pytest.raises(ConfigError, match="shuffled_key"):
        EstimatorSettings(shuffled_key="per-record")
    with pytest.raises(ConfigError, match="shuffled_spread"):
        SinkSettings(shuffled_spread=-1)


@pytest.mark.kafka
def test_on_kafka_a_member_derives_the_partitions_from_the_broker_and_drops_a_copy_under_another_sub_key(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """The check on Kafka: the member reads P from the broker, and Kafka's producer places the shuffler's sub-keys
    where the member expects them (every honest record counted, none dropped), while a copy under another
    sub-key is dropped as misrouted before the replay guard sees it."""
    metrics, folder = sealed_word_metrics(tmp_path, SIZE)
    rng = np.random.default_rng(37)
    uploads = [sealed_upload(metrics, PER_UPLOAD, SIZE, rng) for _ in range(6)]
    run = uuid.uuid4().hex[:8]
    topics = {"raw_topic": f"ldp.t.raw.{run}", "shuffled_topic": f"ldp.t.shuffled.{run}"}
    transport = open_transport(f"kafka://{kafka_bootstrap}")
    transport.create_topic(topics["shuffled_topic"], PARTS)
    est = StreamingEstimator(
        transport, tmp_path / "m", SpecCatalog([metrics]), topic=topics["shuffled_topic"], group=f"g-{run}",
        member="m", checkpoint_seconds=0.05, session_timeout=6.0, opener=sealed_opener(folder),
    )  # fmt: skip
    try:
        run_shuffler(
            tmp_path, transport, metrics, uploads, min_batch=MIN_BATCH, state_topic=f"ldp.t.state.{run}",
            group=f"sh-{run}", session_timeout=6.0, idle_exit=3.0, **topics,
        )  # fmt: skip
        spec = uploads[0].spec
        copies = uploads[0].records[:10]
        keys = spread_keys("word", TODAY, PARTS, PARTS)
        route = sealed_route(copies, spec.record_size, PARTS)
        for j in range(PARTS):
            sel = (route + 1) % PARTS == j
            if sel.any():
                _forge(transport, keys[j], copies[sel], spec, (j, PARTS), topics["shuffled_topic"])
        est.run(idle_timeout=3.0)
        assert merge_states([est.state()]).n == 6 * PER_UPLOAD  # every honest record where the member expects it
        assert est.stats.sealed_misrouted == 10 and est.stats.sealed_replays_dropped == 0
        assert est.routes.partitions == PARTS
    finally:
        est.close()
        transport.close()


def test_ldp_sink_takes_the_shufflers_keying_and_prints_what_it_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from ldp_cli.main import main

    for var in ("LDP_SHUFFLER_SHUFFLED_KEY", "LDP_SHUFFLER_SHUFFLED_SPREAD", "LDP_SHUFFLED_KEY", "LDP_SHUFFLED_SPREAD"):
        monkeypatch.delenv(var, raising=False)
    metrics, folder = sealed_word_metrics(tmp_path, SIZE)
    rng = np.random.default_rng(41)
    uploads = [sealed_upload(metrics, PER_UPLOAD, SIZE, rng) for _ in range(4)]
    url = f"sqlite:///{tmp_path}/log.sqlite3"
    transport = open_transport(url)
    transport.create_topic(SHUFFLED_TOPIC, PARTS)
    run_shuffler(tmp_path, transport, metrics, uploads, min_batch=MIN_BATCH, shuffled_spread=2)
    transport.close()
    path = tmp_path / "metrics.json"  # written by sealed_word_metrics
    out = {}
    for name, flags in (("agree", ["--shuffled-spread", "2"]), ("default", [])):
        argv = ["sink", "--transport", url, "--metrics", str(path), "--analyzer-keys", str(folder)]
        argv += ["--dataset", str(tmp_path / name), "--group", f"sink-{name}", "--idle-exit", "0.5", *flags]
        capsys.readouterr()
        assert main(argv) == 0
        out[name] = json.loads(capsys.readouterr().out.splitlines()[-1])["sink"]
    assert out["agree"]["reports"] == 4 * PER_UPLOAD and out["agree"]["sealed_misrouted"] == 0
    default = out["default"]
    assert default["sealed_misrouted"] > 0 and default["sealed_route_mismatch"] == default["sealed_misrouted"]
    assert default["reports"] + default["sealed_misrouted"] == 4 * PER_UPLOAD
