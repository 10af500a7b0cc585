"""A device's retry through another collector, and a shuffler member lost in between: each report released once.

Issue 31's chaos test once found one frame's 100 reports twice in the shuffled topic. These tests play the
upstream paths that could make it, on the embedded log, and show they do not: two collectors that share
nothing (each its own dedup store) both publish a frame whose first answer the device never got, and the
shuffler member that released the first copy is lost (kill -9: it never leaves the group) before the
second copy arrives, with its release committed or still in its open transaction. Both copies carry the
device's batch id and land in one raw partition (keyed by metric and day), so the member that takes over
restores the batch-id window from the checkpoint (or reads the first copy again) and drops the second.
(The double count's cause was a Kafka-only one: tests/pipeline/test_kafka_zombie_commit.py.)
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import httpx
import numpy as np
import pytest

from collector.http.app import create_app
from collector.settings import CollectorSettings
from collector.shuffler import Shuffler
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, encode_frame
from pipeline.transport import RecordPosition, Transport, TransportError, open_transport
from tests.collector.test_shuffler import Topics, read_shuffled
from tests.support.collector_support import FailingTransport, ServerThread, olh_batch, write_metrics

FRAME = 100


class DiesAfterPublishing(FailingTransport):
    """Publishes, then fails: the collector's process died after the broker took the frame, before its 202."""

    def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> list[RecordPosition]:
        self.inner.publish_many(topic, items)
        raise TransportError("the collector died before answering (test)")


def _collector(tmp_path: Path, name: str, raw: str, transport: Transport) -> ServerThread:
    cfg = CollectorSettings(
        metrics_path=str(tmp_path / "metrics.json"),
        dedup_path=str(tmp_path / f"dedup-{name}.sqlite3"),  # a store of its own: the collectors share nothing
        raw_topic=raw,
        raw_partitions=4,
        min_body_rate=0.0,
    )
    return ServerThread(create_app(cfg, transport=transport))


def _raw_copies(url: str, raw: str) -> list[tuple[int, int]]:
    with open_transport(url) as tr, tr.consume(raw, "raw-reader", session_timeout=2.0) as c:
        out: list[tuple[int, int]] = []
        end = time.monotonic() + 10
        while time.monotonic() < end:
            recs = c.poll(max_records=100, timeout=0.1)
            out.extend((r.partition, r.offset) for r in recs)
            if len(out) >= 2:
                break
        return out


@pytest.mark.parametrize("committed", [True, False], ids=["release-committed", "release-in-open-transaction"])
def test_a_retry_through_another_collector_after_a_lost_shuffler_member(tmp_path: Path, committed: bool) -> None:
    metrics: MetricSet = write_metrics(tmp_path / "metrics.json")
    tp = Topics()
    url = f"sqlite:///{tmp_path}/log.sqlite3"
    batch = olh_batch(metrics, FRAME, first_seed=0)
    body = encode_frame(batch)
    settings = {  # s1 commits what it released, or never (its release stays in its open transaction)
        "s1": tp.settings(
            min_batch=FRAME, member="s1", session_timeout=1.0, checkpoint_interval=0.05 if committed else 1e6
        ),
        "s2": tp.settings(min_batch=FRAME, member="s2", session_timeout=1.0),
    }
    with open_transport(url) as tr:
        tr.create_topic(tp.raw, 4)
    # the first copy reaches collector a, which publishes it and dies; shuffler member s1 releases it
    with open_transport(url) as tr_a, _collector(tmp_path, "a", tp.raw, DiesAfterPublishing(tr_a)) as a:
        r = httpx.post(
            f"{a.url}/v1/reports",
            content=body,
            headers={"Content-Type": FRAME_CONTENT_TYPE, "Idempotency-Key": batch.batch_id.hex()},
            timeout=30,
        )
        assert r.status_code >= 500, r.text
    tr1 = open_transport(url)
    s1 = Shuffler(tr1, metrics, settings["s1"])
    s1.open()
    end = time.monotonic() + 30
    # released and committed (stats count at commit), or released into the open transaction only
    while (s1.stats.released_reports if committed else sum(p.pending_reports for p in s1._parts.values())) < FRAME:
        assert time.monotonic() < end, "s1 released nothing"
        s1.step()
    assert s1.stats.released_reports == (FRAME if committed else 0)
    # s1 is killed (-9: it never leaves the group); the device retries through collector b, which shares nothing
    with open_transport(url) as tr_b, _collector(tmp_path, "b", tp.raw, tr_b) as b:
        r = httpx.post(
            f"{b.url}/v1/reports",
            content=body,
            headers={"Content-Type": FRAME_CONTENT_TYPE, "Idempotency-Key": batch.batch_id.hex()},
            timeout=30,
        )
        assert r.status_code == 202, r.text
    copies = _raw_copies(url, tp.raw)
    assert len(copies) == 2 and copies[0][0] == copies[1][0], copies  # two copies, one raw partition
    # s2 takes over once s1's session timed out: it restores s1's checkpoint (or reads the first copy again)
    with open_transport(url) as tr2:
        s2 = Shuffler(tr2, metrics, settings["s2"])
        s2.run(idle_exit=2.0)
        s2.close()
        out = read_shuffled(tr2, tp.shuffled, metrics, expect=FRAME, quiet=1.0)
    tr1.close()
    seeds = np.sort(np.concatenate([sb.batch.records["seed"] for _, sb in out]).astype(np.int64))
    assert np.array_equal(seeds, np.arange(FRAME)), f"{seeds.size} reports released of {FRAME}"
    assert s2.stats.duplicate_batches == 1
