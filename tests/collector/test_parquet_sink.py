"""The Parquet sink on the embedded transport: layout, durability protocol, exactly-once rewrites."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collector.errors import SinkError
from collector.sinks.parquet import ChunkLog, ParquetSink
from ldp_core.mechanisms import MECHANISMS, make_spec
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.dataset import (
    list_parts,
    parse_part_name,
    part_name,
    read_part,
    records_to_table,
    table_to_records,
)
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import TopicPartition, open_transport
from simulator.numeric import NUMERIC_MECHANISMS
from tests.support.shuffled_data import default_specs, envelope_of, make_batches, publish, records_of

DAYS = [20400, 20401]


@pytest.fixture
def transport(tmp_path: Path):  # type: ignore[no-untyped-def]
    t = open_transport(f"sqlite:///{tmp_path}/log.sqlite3", synchronous="NORMAL")
    t.create_topic(SHUFFLED_TOPIC, 4)
    yield t
    t.close()


def catalog(specs: dict) -> SpecCatalog:  # type: ignore[type-arg]
    return SpecCatalog(specs=list(specs.items()))


def dataset_records(root: Path, metric: str, day: int) -> list[bytes]:
    out = []
    for part in list_parts(root, metric, [day]):
        out.extend(r.tobytes() for r in read_part(part).records)
    return sorted(out)


def check_once(root: Path, batches: list[ReportBatch]) -> None:
    for metric in {b.metric for b in batches}:
        for day in DAYS:
            assert dataset_records(root, metric, day) == records_of(batches, metric, day), (metric, day)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_columns_mirror_the_record_layout(name: str) -> None:
    rng = np.random.default_rng(5)
    if name in NUMERIC_MECHANISMS:  # numbers, not indices; several attributes give subarray fields
        multi = name in ("duchi", "pm", "hm")  # the mean mechanisms take several attributes
        spec = make_spec(name, epsilon=6.0, low=0, high=9, **({"dims": 5, "sample": 2} if multi else {}))
        recs = spec.encode(rng.random((257, 5)) * 9 if multi else rng.random(257) * 9, rng)
    elif name in ("pem", "sfp"):  # heavy hitters: strings (docs/HEAVY_HITTERS.md)
        spec = make_spec(name, epsilon=1.0, length=6, **({"num_hashes": 4, "width": 64} if name == "sfp" else {}))
        recs = spec.encode([f"w{i}" for i in range(257)], rng)
    else:
        spec = make_spec(name, epsilon=1.0, domain_size=2 if name == "rr" else 70)
        recs = spec.encode(rng.integers(0, spec.domain_size, 257), rng)
    table = records_to_table(recs, spec)
    dt = spec.record_dtype
    for field in dt.names:
        ftype = dt.fields[field][0]
        if ftype.subdtype is not None:
            assert table.schema.field(field).type == pa.binary(ftype.itemsize)
        else:
            assert table.schema.field(field).type == pa.from_numpy_dtype(ftype.newbyteorder("="))
    assert table.column("spec_id").to_pylist() == [spec.spec_id] * recs.size
    back = table_to_records(table, spec)
    assert back.tobytes() == recs.tobytes()
    sliced = table_to_records(table.slice(100, 57), spec)  # non-zero Arrow offsets
    assert sliced.tobytes() == recs[100:157].tobytes()


def test_every_report_lands_once_with_metadata(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    batches = make_batches(specs, DAYS, 30, np.random.default_rng(1))
    positions = publish(transport, SHUFFLED_TOPIC, batches)
    root = tmp_path / "ds"
    sink = ParquetSink(transport, root, catalog(specs), flush_seconds=0.0)
    stats = sink.run(idle_timeout=0.6)
    sink.close()
    assert stats.reports == sum(len(b) for b in batches)
    check_once(root, batches)
    assert not [p for p in root.rglob("*") if p.name.startswith(".") and p.is_file()], "temporary files left"
    by_pos = {(p.partition, p.offset): b for p, b in zip(positions, batches)}
    for metric, spec in specs.items():
        for part in list_parts(root, metric):
            data = read_part(part)
            assert data.spec == spec and part.metric == metric
            md = pq.read_schema(part.path).metadata
            assert json.loads(md[b"ldp.spec"]) == spec.to_dict()
            src = json.loads(md[b"ldp.source"])
            assert (src["first"], src["last"], src["partition"]) == (part.first, part.last, part.partition)
            ids = [s["shuffle_id"] for s in data.shuffles]
            expect = [by_pos[(part.partition, s["offset"])].batch_id.hex() for s in data.shuffles]
            assert ids == expect
            assert all(part.first <= s["offset"] <= part.last for s in data.shuffles)
            assert sum(s["n"] for s in data.shuffles) == data.records.size
    c = transport.consume(SHUFFLED_TOPIC, "ldp-parquet-sink")
    ends: dict[int, int] = {}
    for p in positions:
        ends[p.partition] = max(ends.get(p.partition, 0), p.offset + 1)
    assert {p: c.committed(TopicPartition(SHUFFLED_TOPIC, p)) for p in ends} == ends
    c.close()


class _Crash(Exception):
    pass


def test_crash_between_files_and_commit_rewrites_the_same_files(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    """The first sink writes its chunks, then dies before committing; a second sink that would cut
    the stream into smaller chunks must follow the chunk log and produce the very same files."""
    specs = default_specs()
    batches = make_batches(specs, DAYS, 36, np.random.default_rng(2))
    publish(transport, SHUFFLED_TOPIC, batches)
    root = tmp_path / "ds"
    first = ParquetSink(transport, root, catalog(specs), flush_seconds=0.0, member="a")
    first.poll_once(max_records=1000, timeout=1.0)
    while first.poll_once(max_records=1000, timeout=0.3):
        pass

    def crash(offsets=None):  # type: ignore[no-untyped-def]
        raise _Crash

    first.consumer.commit = crash  # type: ignore[method-assign]
    with pytest.raises(_Crash):
        first.flush()
    names_before = sorted(p.name for p in root.rglob("part-*.parquet"))
    assert names_before
    first._consumer.close()  # type: ignore[union-attr]
    first._consumer = None

    second = ParquetSink(transport, root, catalog(specs), flush_seconds=0.0, member="b")
    stats = second.run(idle_timeout=0.6, max_records=2)
    second.close()
    assert stats.files_existing == len(names_before)
    assert stats.files_written == 0
    assert sorted(p.name for p in root.rglob("part-*.parquet")) == names_before
    check_once(root, batches)


def test_a_lost_file_of_a_recorded_chunk_is_written_on_the_rerun(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    batches = make_batches(specs, DAYS, 24, np.random.default_rng(3))
    publish(transport, SHUFFLED_TOPIC, batches)
    root = tmp_path / "ds"
    first = ParquetSink(transport, root, catalog(specs), flush_seconds=0.0, member="a")
    while first.poll_once(max_records=1000, timeout=0.5):
        pass
    first.consumer.commit = lambda offsets=None: (_ for _ in ()).throw(_Crash())  # type: ignore[method-assign]
    with pytest.raises(_Crash):
        first.flush()
    first._consumer.close()  # type: ignore[union-attr]
    first._consumer = None
    victim = sorted(root.rglob("part-*.parquet"))[0]
    victim.unlink()  # as if the crash came before this file's rename
    second = ParquetSink(transport, root, catalog(specs), flush_seconds=0.0, member="b")
    stats = second.run(idle_timeout=0.6)
    second.close()
    assert stats.files_written == 1 and victim.exists()
    check_once(root, batches)


def test_two_members_split_the_partitions_and_write_each_report_once(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    rng = np.random.default_rng(4)
    batches = make_batches(specs, DAYS, 40, rng)
    publish(transport, SHUFFLED_TOPIC, batches[:20])
    root = tmp_path / "ds"
    cat = catalog(specs)
    sinks = [
        ParquetSink(transport, root, cat, flush_seconds=0.05, member=f"s{i}", session_timeout=2.0) for i in range(2)
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=s.run, kwargs={"stop": stop, "max_records": 3}) for s in sinks]
    threads[0].start()
    publish(transport, SHUFFLED_TOPIC, batches[20:30])
    threads[1].start()
    publish(transport, SHUFFLED_TOPIC, batches[30:])
    deadline = 30.0
    import time

    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline:
        if sum(len(dataset_records(root, m, d)) for m in specs for d in DAYS) >= sum(len(b) for b in batches):
            break
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(30)
    for s in sinks:
        s.close()
    check_once(root, batches)


def test_an_unknown_spec_is_kept_verbatim_not_dropped(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    stranger = make_spec("grr", epsilon=0.7, domain_size=5)
    rng = np.random.default_rng(6)
    batch = ReportBatch("m_grr", stranger, DAYS[0], stranger.encode(rng.integers(0, 5, 60), rng))
    pos = transport.publish(SHUFFLED_TOPIC, b"m_grr/20400", envelope_of(batch))
    root = tmp_path / "ds"
    sink = ParquetSink(transport, root, catalog(specs), flush_seconds=0.0)
    stats = sink.run(idle_timeout=0.5)
    sink.close()
    assert stats.undecodable == 1
    kept = root / "_undecodable" / f"{SHUFFLED_TOPIC}-{pos.partition}-{pos.offset:020d}.ldps"
    assert kept.read_bytes() == envelope_of(batch)
    assert list_parts(root, "m_grr") == []


def test_chunk_log_refuses_a_start_inside_a_recorded_chunk(tmp_path: Path) -> None:
    cl = ChunkLog(tmp_path, "t", 0)
    with cl.locked():
        cl.append(0, 9)
        cl.append(10, 19)
    with open(cl.path, "ab") as f:
        f.write(b"20 2")  # a line torn by a crash
    fresh = ChunkLog(tmp_path, "t", 0)
    with fresh.locked():
        assert fresh.lookup(10) == 19 and fresh.lookup(20) is None
        assert fresh.containing(15) == (10, 19) and fresh.containing(10) is None
        fresh.append(20, 29)
    again = ChunkLog(tmp_path, "t", 0)
    with again.locked():
        assert again.lookup(20) == 29
    with pytest.raises(SinkError):
        again.append(30, 31)


def test_part_names_round_trip() -> None:

    name = part_name("ldp.reports-shuffled_x", 7, 12, 345, "0123456789abcdef")
    assert parse_part_name(name) == {
        "topic": "ldp.reports-shuffled_x",
        "partition": 7,
        "first": 12,
        "last": 345,
        "spec_id": "0123456789abcdef",
    }
    assert parse_part_name(".part-x-1-" + "0" * 20 + "-" + "0" * 20 + "-0123456789abcdef.parquet") is None


def test_settings_come_from_keywords_over_the_environment_over_defaults(  # type: ignore[no-untyped-def]
    tmp_path: Path, transport
) -> None:
    from collector.sinks.parquet import SinkSettings
    from pipeline.errors import ConfigError

    env = {"LDP_SINK_FLUSH_SECONDS": "2.5", "LDP_SINK_GROUP": "g-env"}
    settings = SinkSettings.from_env(env, flush_reports=10, group=None)
    assert (settings.flush_seconds, settings.group, settings.flush_reports) == (2.5, "g-env", 10)
    sink = ParquetSink(transport, tmp_path / "ds", catalog(default_specs()), settings, member="m", flush_seconds=0.0)
    assert (sink.group, sink.member, sink.flush_seconds, sink.flush_reports) == ("g-env", "m", 0.0, 10)
    with pytest.raises(ConfigError, match="flush_reports"):
        ParquetSink(transport, tmp_path / "ds", catalog(default_specs()), flush_reports=0)
    with pytest.raises(ConfigError, match="flush_seconds"):
        SinkSettings.from_env({"LDP_SINK_FLUSH_SECONDS": "-1"})
