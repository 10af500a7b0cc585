"""Issue 31: the Parquet sink writes each shuffled batch once even when the group's committed offset goes back.

The sink commits only at chunk ends and a rewrite of a chunk must reuse the chunk's recorded boundaries
(collector.sinks.parquet, "Exactly once"). A member used to drop from its in-memory copy of the chunk log the
chunks below its last commit, and never read them again. When the group's committed offset then went back
below that commit -- an older commit that was reported failed and shows at the group after a newer one, or an
operator resetting the group's offsets -- the same process read those records again, found no recorded chunk
at the restart offset, cut new chunks with other boundaries and wrote the batches a second time under new
file names. Before the fix the dataset below held 2x the reports of the rewound range (the test's numbers:
the check compares every report's multiset, and the overlap check names both files).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collector.sinks.parquet import ParquetSink
from pipeline.catalog import SpecCatalog
from pipeline.dataset import list_parts, read_part
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import TopicPartition, open_transport
from tests.support.shuffled_data import default_specs, make_batches, publish, records_of

DAY = 20400


@pytest.fixture
def transport(tmp_path: Path):  # type: ignore[no-untyped-def]
    t = open_transport(f"sqlite:///{tmp_path}/log.sqlite3", synchronous="NORMAL")
    t.create_topic(SHUFFLED_TOPIC, 1)
    yield t
    t.close()


def _overlaps(root: Path, metric: str) -> list[tuple[str, str]]:
    """Pairs of part files of one topic partition whose offset ranges overlap."""
    parts = sorted(list_parts(root, metric), key=lambda p: (p.topic, p.partition, p.first, p.last))
    return [
        (a.path.name, b.path.name)
        for a, b in zip(parts, parts[1:], strict=False)
        if (a.topic, a.partition) == (b.topic, b.partition) and b.first <= a.last
    ]


def test_a_committed_offset_that_goes_back_rewrites_the_same_files(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = {"m_grr": default_specs()["m_grr"]}
    batches = make_batches(specs, [DAY], 30, np.random.default_rng(31), size=(20, 60))
    publish(transport, SHUFFLED_TOPIC, batches)
    root = tmp_path / "ds"
    tp = TopicPartition(SHUFFLED_TOPIC, 0)
    sink = ParquetSink(transport, root, SpecCatalog(specs=list(specs.items())), flush_seconds=0.0, member="a")
    try:
        commits = []
        for _ in range(3):  # three chunks of 5 batches, each committed
            sink.poll_once(max_records=5, timeout=1.0)
            assert sink.flush() == 5
            commits.append(sink.consumer.committed(tp))
        assert commits == [5, 10, 15]
        # the group's committed offset goes back to the end of the first chunk (an older commit showing late)
        sink.consumer.commit({tp: commits[0]})
        sink.consumer._rewind()  # type: ignore[attr-defined] # the group restarts the partition from there
        stats = sink.run(idle_timeout=0.6, max_records=7)  # other poll sizes: other chunks, were they cut anew
    finally:
        sink.close()
    got = sorted(r.tobytes() for p in list_parts(root, "m_grr") for r in read_part(p).records)
    want = records_of(batches, "m_grr", DAY)
    assert len(got) == len(want), f"the dataset holds {len(got)} reports, {len(want)} were published"
    assert got == want
    assert _overlaps(root, "m_grr") == []
    assert stats.files_existing >= 2  # the rewound chunks were found on disk, not written again
