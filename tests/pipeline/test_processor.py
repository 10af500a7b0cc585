"""The checkpointed consume loop (pipeline.processor) against the embedded log: rewinds, failed flushes, rejoins."""

from __future__ import annotations

import collections
import uuid
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

import pytest

from ldp_core.errors import FrameError
from pipeline.errors import ProcessorError
from pipeline.processor import FATAL_ERRORS, StreamProcessor
from pipeline.transport import FencedError, Record, TopicPartition, Transaction
from pipeline.transport.embedded import EmbeddedTransport


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EmbeddedTransport]:
    t = EmbeddedTransport(tmp_path / "log.sqlite3")
    yield t
    t.close()


class _Stats:
    def __init__(self) -> None:
        self.records = 0
        self.undecodable = 0
        self.rejoins = 0
        self.commit_failures = 0


class Summer(StreamProcessor):
    """Sums the integers of a topic per partition; a value that is not an integer is undecodable.

    ``durable`` plays the snapshot: the flush writes the open sums there
    (``fail_flush`` makes it raise first); a commit folds them into ``committed``.
    """

    def __init__(self, transport: EmbeddedTransport, topic: str, group: str, member: str, **kw: object) -> None:
        super().__init__(transport, topic, group, member, partitions=2, **kw)  # type: ignore[arg-type]
        self.stats = _Stats()
        self.open: dict[TopicPartition, list[int]] = {}  # tp -> [sum, end]
        self.committed: collections.Counter[TopicPartition] = collections.Counter()
        self.durable: dict[TopicPartition, tuple[int, int]] = {}
        self.resets: list[frozenset[TopicPartition] | None] = []
        self.fail_flush: Exception | None = None
        self.undecoded: list[int] = []

    def decode(self, rec: Record) -> int:
        if not rec.value.isdigit():
            raise FrameError(f"{rec.value!r} is not a number")
        return int(rec.value)

    def apply(self, rec: Record, value: int | None) -> None:
        tp = TopicPartition(rec.topic, rec.partition)
        acc = self.open.setdefault(tp, [0, 0])
        if value is None:
            self.undecoded.append(rec.offset)
        else:
            acc[0] += value
        acc[1] = rec.offset + 1

    def reset(self, partitions: Collection[TopicPartition] | None) -> None:
        self.resets.append(None if partitions is None else frozenset(partitions))
        if partitions is None:
            self.open.clear()
        for tp in partitions or ():
            self.open.pop(tp, None)

    def flush_state(self, tx: Transaction | None) -> Mapping[TopicPartition, int] | None:
        assert tx is None
        if not self.open:
            return None
        if self.fail_flush is not None:
            raise self.fail_flush
        self.durable = {tp: (s, end) for tp, (s, end) in self.open.items()}
        return {tp: end for tp, (_, end) in self.open.items()}

    def on_committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        for tp in offsets:
            self.committed[tp] += self.open.pop(tp)[0]

    def total(self) -> int:
        return sum(self.committed.values())


def _topic(log: EmbeddedTransport, partitions: int = 2) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    log.create_topic(name, partitions)
    return name


def _publish(log: EmbeddedTransport, topic: str, values: list[int | bytes]) -> None:
    log.publish_many(
        topic, [(f"k{i % 7}".encode(), v if isinstance(v, bytes) else str(v).encode()) for i, v in enumerate(values)]
    )


def _committed(p: StreamProcessor, topic: str) -> dict[int, int | None]:
    return {i: p.consumer.committed(TopicPartition(topic, i)) for i in range(2)}


def test_run_checkpoints_every_record_once_and_counts_the_undecodable(log: EmbeddedTransport) -> None:
    topic = _topic(log)
    _publish(log, topic, [*range(1, 21), b"junk", b"\x00"])
    with Summer(log, topic, "g", "a", checkpoint_seconds=0.05) as p:
        p.run(idle_timeout=0.5)
        assert p.total() == sum(range(1, 21))
        assert (p.stats.records, p.stats.undecodable) == (22, 2)
        assert len(p.undecoded) == 2
        assert sum(v or 0 for v in _committed(p, topic).values()) == 22  # the undecodable ones are committed too


def test_a_failed_flush_aborts_the_checkpoint_and_commits_nothing(log: EmbeddedTransport) -> None:
    topic = _topic(log)
    _publish(log, topic, list(range(10)))
    p = Summer(log, topic, "g", "a")
    while p.poll_once(timeout=0.3):
        pass
    p.fail_flush = OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        p.checkpoint()
    assert _committed(p, topic) == {0: None, 1: None}
    assert p.durable == {} and p.total() == 0
    assert sum(s for s, _ in p.open.values()) == sum(range(10))  # kept: the next checkpoint retries
    p.fail_flush = None
    assert p.checkpoint()
    assert p.total() == sum(range(10)) and sum(v or 0 for v in _committed(p, topic).values()) == 10
    p.close()


def test_a_new_generation_resets_every_partition_and_the_group_counts_each_record_once(log: EmbeddedTransport) -> None:
    topic = _topic(log)
    _publish(log, topic, list(range(30)))
    a = Summer(log, topic, "g", "a")
    while a.poll_once(timeout=0.3):
        pass
    assert a.open and a.total() == 0
    a.resets.clear()  # (joining reset once: a new member starts from the committed offsets)
    b = Summer(log, topic, "g", "b")
    b.poll_once(timeout=0.3)  # b joins: a rebalance that rewinds what a read and did not commit
    a.poll_once(timeout=0.3)
    assert None in a.resets  # everything a held was dropped at once
    for _ in range(40):  # a's first commit after the rebalance fails once (the transport reports the rewind)
        for p in (a, b):
            p.poll_once(timeout=0.05)
            p.checkpoint()
        if a.total() + b.total() == sum(range(30)):
            break
    assert a.stats.commit_failures == 1
    assert a.committed and b.committed and not set(a.committed) & set(b.committed)
    assert a.total() + b.total() == sum(range(30))
    a.close()
    b.close()


def test_a_failed_commit_resets_the_state_and_its_records_come_again(log: EmbeddedTransport) -> None:
    topic = _topic(log)
    _publish(log, topic, list(range(12)))
    a = Summer(log, topic, "g", "a")
    while a.poll_once(timeout=0.3):
        pass
    b = Summer(log, topic, "g", "b")
    b.poll_once(timeout=0.3)
    assert not a.checkpoint()  # stale: the group rebalanced since a's records were delivered
    assert a.stats.commit_failures == 1 and not a.open and a.total() == 0
    b.close()  # a owns everything again and reads it from the committed offsets
    a.run(idle_timeout=0.5)
    assert a.total() == sum(range(12))
    a.close()


def test_an_offset_that_goes_back_resets_only_its_partition(log: EmbeddedTransport) -> None:
    topic = _topic(log, 1)
    _publish(log, topic, list(range(5)))
    p = Summer(log, topic, "g", "a")
    while p.poll_once(timeout=0.3):
        pass
    assert p.open[TopicPartition(topic, 0)] == [10, 5]
    p.resets.clear()
    with pytest.raises(RuntimeError):  # an aborted transaction rewinds the consumer to the committed offsets
        with p.consumer.transaction():
            raise RuntimeError("abort")
    _publish(log, topic, [100])
    while p.poll_once(timeout=0.3):
        pass
    assert p.resets == [frozenset({TopicPartition(topic, 0)})]  # that partition only, not everything
    assert p.open[TopicPartition(topic, 0)] == [110, 6]  # counted once, not 10 + 110
    assert p.checkpoint() and p.total() == 110
    p.close()


def test_rejoin_drops_uncommitted_state_leaves_the_group_and_resumes_from_the_committed_offsets(
    log: EmbeddedTransport,
) -> None:
    topic = _topic(log)
    _publish(log, topic, list(range(8)))
    p = Summer(log, topic, "g", "a")
    p.run(idle_timeout=0.4)
    done = p.total()
    assert done == sum(range(8))
    _publish(log, topic, [1000, 2000])
    while p.poll_once(timeout=0.3):
        pass
    assert p.open
    p.rejoin("a transport failure")
    assert p._consumer is None and not p.open and p.stats.rejoins == 1
    p.run(idle_timeout=0.4)  # joins again
    assert p.total() == done + 3000
    p.close()


def test_processor_errors_and_fencing_are_the_fatal_ones() -> None:
    assert issubclass(ProcessorError, FATAL_ERRORS) and issubclass(FencedError, FATAL_ERRORS)
    from collector.errors import ShufflerStateError, SinkError
    from estimator.errors import StateError

    for cls in (SinkError, ShufflerStateError, StateError):
        assert issubclass(cls, ProcessorError)


class Doubler(StreamProcessor):
    """A transactional processor: publishes each value doubled into the open transaction."""

    transactional = True

    def __init__(self, transport: EmbeddedTransport, src: str, dst: str, member: str = "w") -> None:
        super().__init__(transport, src, "g", member, partitions=1, checkpoint_seconds=0.05)
        self.dst = dst
        self.fail_flush = False
        self.resets = 0

    def decode(self, rec: Record) -> bytes:
        return rec.value

    def apply(self, rec: Record, value: bytes | None) -> None:
        self.transaction().publish(self.dst, None, b"%d" % (2 * int(value or b"0")))

    def reset(self, partitions: Collection[TopicPartition] | None) -> None:
        self.resets += 1

    def flush_state(self, tx: Transaction | None) -> Mapping[TopicPartition, int] | None:
        assert tx is not None
        if self.fail_flush:
            raise OSError("checkpoint store unavailable")
        return {}


def _values(log: EmbeddedTransport, topic: str) -> list[int]:
    with log.consume(topic, f"r-{uuid.uuid4().hex[:6]}") as c:
        return [int(r.value) for r in c.records(idle_timeout=0.5)]


def test_a_failed_flush_aborts_the_transaction_outputs_and_offsets_alike(log: EmbeddedTransport) -> None:
    src, dst = _topic(log, 1), _topic(log, 1)
    _publish(log, src, list(range(6)))
    p = Doubler(log, src, dst)
    while p.poll_once(timeout=0.3):
        pass
    p.fail_flush = True
    resets = p.resets
    with pytest.raises(OSError):
        p.checkpoint()
    assert p.resets == resets + 1 and p._tx is None
    assert p.consumer.committed(TopicPartition(src, 0)) is None
    assert _values(log, dst) == []  # the aborted transaction published nothing
    p.fail_flush = False
    p.run(idle_timeout=0.5)  # the records come again: each output once
    assert sorted(_values(log, dst)) == [2 * i for i in range(6)]
    assert p.consumer.committed(TopicPartition(src, 0)) == 6
    p.close()
