"""The contract every :class:`pipeline.transport.Transport` must pass.

A test module subclasses :class:`TransportContract` and overrides the
``transport_url`` fixture; everything else is shared. Crashes are real: a
child process (``python -m tests.support.transport_contract ...``) consumes, and is
killed with SIGKILL at a chosen point.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from pipeline.transport import (
    CommitFailedError,
    Consumer,
    Record,
    TopicError,
    TopicPartition,
    Transport,
    open_transport,
    partition_for,
)

__all__ = ["TransportContract", "drain", "read_exactly"]

ROOT = Path(__file__).resolve().parents[2]
SESSION = 5.0  # seconds: a killed member leaves its group this fast; shorter risks false expiry on a loaded machine
DEADLINE = 45.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def drain(consumers: Sequence[Consumer], n: int, timeout: float = DEADLINE) -> list[list[Record]]:
    """Poll the consumers in turn until they received ``n`` records in all; fail after ``timeout`` s."""
    got: list[list[Record]] = [[] for _ in consumers]
    end = time.monotonic() + timeout
    while sum(map(len, got)) < n:
        if time.monotonic() > end:
            pytest.fail(f"received {sum(map(len, got))} of {n} records in {timeout} s")
        for i, c in enumerate(consumers):
            got[i].extend(c.poll(max_records=1000, timeout=0.1))
    return got


def group_state(*consumers: Consumer) -> str:
    """Each consumer's member name, :attr:`~Consumer.generation` and partitions, for a failing assert's message."""
    return "; ".join(
        f"{c.member}: generation {c.generation}, partitions {sorted(tp.partition for tp in c.assignment())}"
        for c in consumers
    )


def read_exactly(transport: Transport, topic: str, n: int, quiet: float = 1.0) -> list[Record]:
    """All records of ``topic`` through a fresh group: wait for ``n``, then check for ``quiet`` s that no more come."""
    with transport.consume(topic, unique("reader"), session_timeout=SESSION) as c:
        recs = drain([c], n)[0]
        end = time.monotonic() + quiet
        while time.monotonic() < end:
            recs.extend(c.poll(timeout=0.1))
    return recs


class _Member(threading.Thread):
    """Polls one consumer in its own thread, as a deployed worker does, recording records and assignment."""

    def __init__(self, consumer: Consumer) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer
        self.records: list[Record] = []
        self.assigned: frozenset[TopicPartition] = frozenset()
        self.error: BaseException | None = None
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                recs = self.consumer.poll(max_records=1000, timeout=0.2)
                with self.lock:
                    self.records.extend(recs)
                    self.assigned = self.consumer.assignment()
        except BaseException as exc:  # reported by run_group
            self.error = exc


def run_group(
    consumers: Sequence[Consumer],
    done: Callable[[list[_Member]], bool],
    timeout: float = DEADLINE,
    *,
    between: Callable[[], object] | None = None,
) -> list[_Member]:
    """Poll every consumer in its own thread until ``done(members)``; fail after ``timeout`` s.

    ``between()``, if given, runs once the group settled (every member owns partitions).
    """
    members = [_Member(c) for c in consumers]
    for m in members:
        m.start()
    try:
        end = time.monotonic() + timeout
        settled = between is None
        while True:
            errors = [m.error for m in members if m.error is not None]
            if errors:
                raise errors[0]
            with contextlib.ExitStack() as stack:
                for m in members:
                    stack.enter_context(m.lock)
                if not settled and all(m.assigned for m in members):
                    settled = True
                    assert between is not None
                    between()
                elif settled and done(members):
                    return members
            if time.monotonic() > end:
                pytest.fail(
                    f"the group did not finish in {timeout} s: assignments {[sorted(m.assigned) for m in members]}, "
                    f"records {[len(m.records) for m in members]}"
                )
            time.sleep(0.05)
    finally:
        for m in members:
            m.halt.set()
        for m in members:
            m.join(timeout=120)


def transform(
    consumer: Consumer,
    fn: Callable[[Record], list[tuple[str, bytes | None, bytes]]],
    *,
    max_records: int,
    idle_timeout: float,
) -> int:
    """Run ``fn`` over the records until idle for ``idle_timeout`` s, each polled chunk one transaction (its
    ``(topic, key, value)`` outputs and its input offsets commit together); return the records done."""
    done = 0
    idle_since = time.monotonic()
    while True:
        batch = consumer.poll(max_records=max_records, timeout=0.2)
        if not batch:
            if time.monotonic() - idle_since >= idle_timeout:
                return done
            continue
        with consumer.transaction() as tx:
            for rec in batch:
                for topic, key, value in fn(rec):
                    tx.publish(topic, key, value)
        done += len(batch)
        idle_since = time.monotonic()


class _Child:
    """A worker process that signals readiness through a file and can be SIGKILLed."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.ready = tmp / f"ready-{uuid.uuid4().hex}"
        self.err = tmp / f"stderr-{uuid.uuid4().hex}"
        self._errf = open(self.err, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.transport_contract", str(self.ready), *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self._errf,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                self.kill()
                pytest.fail(
                    f"worker exited ({self.proc.returncode}) or timed out before it was ready:\n"
                    f"{self.err.read_text()[-3000:]}"
                )
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._errf.close()


class TransportContract:
    """Shared tests. Subclasses override the ``transport_url`` fixture."""

    @pytest.fixture
    def transport_url(self) -> str:
        raise NotImplementedError

    @pytest.fixture
    def transport(self, transport_url: str) -> Iterator[Transport]:
        t = open_transport(transport_url)
        yield t
        t.close()

    def topic(self, transport: Transport, partitions: int = 1) -> str:
        name = unique("t")
        transport.create_topic(name, partitions)
        return name

    # -- topics and publishing -------------------------------------------------

    def test_create_topic_is_idempotent_and_checks_partitions(self, transport: Transport) -> None:
        name = self.topic(transport, 3)
        transport.create_topic(name, 3)
        assert transport.partitions(name) == 3
        with pytest.raises(TopicError, match="3 partitions"):
            transport.create_topic(name, 4)
        with pytest.raises(TopicError, match="does not exist"):
            transport.publish(unique("missing"), b"k", b"v")
        with pytest.raises(TopicError, match="invalid"):
            transport.create_topic("no spaces allowed", 1)

    def test_offsets_are_consecutive_and_order_is_kept_in_a_partition(self, transport: Transport) -> None:
        name = self.topic(transport, 1)
        values = [f"v{i}".encode() for i in range(40)]
        positions = [transport.publish(name, None, v) for v in values[:10]]
        positions += transport.publish_many(name, [(b"k", v) for v in values[10:]])
        assert [p.offset for p in positions] == list(range(40))
        assert {(p.topic, p.partition) for p in positions} == {(name, 0)}
        with transport.consume(name, unique("g"), session_timeout=SESSION) as c:
            recs = drain([c], 40)[0]
        assert [r.value for r in recs] == values
        assert [r.offset for r in recs] == list(range(40))
        assert [r.key for r in recs] == [None] * 10 + [b"k"] * 30

    def test_delete_before_removes_older_records_and_keeps_offsets(self, transport: Transport) -> None:
        name = self.topic(transport, 2)
        keys = {partition_for(f"k{i}".encode(), 2): f"k{i}".encode() for i in range(20)}
        for p in (0, 1):
            transport.publish_many(name, [(keys[p], f"{p}:{i}".encode()) for i in range(10)])
        group = unique("g")
        with transport.consume(name, group, session_timeout=SESSION) as c:
            drain([c], 20)
            c.commit({TopicPartition(name, 0): 2})  # behind what will be deleted
        transport.delete_before(name, {0: 6})
        transport.delete_before(name, {0: 3})  # below what is already gone: nothing more
        recs = read_exactly(transport, name, 14)
        assert sorted(r.offset for r in recs if r.partition == 0) == [6, 7, 8, 9]
        assert sorted(r.offset for r in recs if r.partition == 1) == list(range(10))
        assert transport.publish(name, keys[0], b"new").offset == 10  # numbering goes on
        with transport.consume(name, group, session_timeout=SESSION) as c:  # resumes at the oldest record left
            first = [r for r in drain([c], 15)[0] if r.partition == 0]
        assert [r.offset for r in first] == [6, 7, 8, 9, 10]

    def test_keys_keep_their_partition_and_their_order(self, transport: Transport) -> None:
        name = self.topic(transport, 4)
        keys = [f"device-{i}".encode() for i in range(12)]
        sent = [(keys[(i * 7) % 12], f"{(i * 7) % 12}:{i}".encode()) for i in range(240)]
        positions = []
        for start in range(0, 240, 60):
            positions += transport.publish_many(name, sent[start : start + 60])
        for (key, _), pos in zip(sent, positions):
            assert pos.partition == partition_for(key, 4)
        with transport.consume(name, unique("g"), session_timeout=SESSION) as c:
            recs = drain([c], 240)[0]
        by_key = collections.defaultdict(list)
        last_offset: dict[int, int] = {}
        for r in recs:
            assert r.partition == partition_for(r.key, 4)
            assert r.offset > last_offset.get(r.partition, -1)
            last_offset[r.partition] = r.offset
            by_key[r.key].append(int(r.value.split(b":")[1]))
        for key in keys:
            expected = [int(v.split(b":")[1]) for k, v in sent if k == key]
            assert by_key[key] == expected

    def test_a_record_carries_a_whole_report_batch(self, transport: Transport) -> None:
        from ldp_core.mechanisms import make_spec
        from ldp_core.wire.frames import ReportBatch, decode_frame, encode_frame

        spec = make_spec("grr", epsilon=1.0, domain_size=1000)
        rng = np.random.default_rng(20240601)
        batch = ReportBatch("emoji_used", spec, 19_900, spec.encode(rng.integers(0, 1000, 4096), rng))
        name = self.topic(transport, 2)
        pos = transport.publish(name, batch.metric.encode(), encode_frame(batch))
        with transport.consume(name, unique("g"), session_timeout=SESSION) as c:
            (rec,) = drain([c], 1)[0]
        assert (rec.partition, rec.offset) == (pos.partition, pos.offset)
        back = decode_frame(rec.value, spec)
        assert back.batch_id == batch.batch_id and len(back) == 4096
        np.testing.assert_array_equal(back.records, batch.records)

    # -- consumer groups -------------------------------------------------------

    def test_members_of_a_group_split_the_partitions(self, transport: Transport) -> None:
        name = self.topic(transport, 4)
        group = unique("g")
        a = transport.consume(name, group, member="a", session_timeout=SESSION)
        b = transport.consume(name, group, member="b", session_timeout=SESSION)
        try:
            members = run_group(
                [a, b],
                lambda ms: sum(len(m.records) for m in ms) >= 80,
                between=lambda: transport.publish_many(name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(80)]),
            )
        finally:
            a.close()
            b.close()
        ma, mb = members
        assert ma.assigned.isdisjoint(mb.assigned)
        assert ma.assigned | mb.assigned == {TopicPartition(name, p) for p in range(4)}
        for m in members:
            assert {TopicPartition(r.topic, r.partition) for r in m.records} <= m.assigned
        assert sorted(r.value for r in ma.records + mb.records) == sorted(f"v{i}".encode() for i in range(80))

    def test_each_group_reads_everything(self, transport: Transport) -> None:
        name = self.topic(transport, 3)
        transport.publish_many(name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(30)])
        for _ in range(2):
            with transport.consume(name, unique("g"), session_timeout=SESSION) as c:
                assert sorted(r.value for r in drain([c], 30)[0]) == sorted(f"v{i}".encode() for i in range(30))

    def test_a_new_member_resumes_from_the_committed_offset(self, transport: Transport) -> None:
        name = self.topic(transport, 1)
        group = unique("g")
        transport.publish_many(name, [(None, f"v{i}".encode()) for i in range(30)])
        tp = TopicPartition(name, 0)
        with transport.consume(name, group, session_timeout=SESSION) as c:
            drain([c], 30)
            assert c.positions() == {tp: 30}
            c.commit({tp: 12})
            assert c.committed(tp) == 12
        with transport.consume(name, group, session_timeout=SESSION) as c:
            recs = drain([c], 18)[0]
            assert [r.offset for r in recs] == list(range(12, 30))
            c.commit()
            assert c.committed(tp) == 30 and c.positions() == {}

    def test_records_not_committed_are_delivered_again_after_close(self, transport: Transport) -> None:
        name = self.topic(transport, 2)
        group = unique("g")
        transport.publish_many(name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)])
        with transport.consume(name, group, session_timeout=SESSION) as c:
            first = drain([c], 20)[0]
        with transport.consume(name, group, session_timeout=SESSION) as c:
            again = drain([c], 20)[0]
        assert sorted((r.partition, r.offset, r.value) for r in again) == sorted(
            (r.partition, r.offset, r.value) for r in first
        )

    def test_redelivery_after_a_killed_consumer(self, transport: Transport, transport_url: str, tmp_path: Path) -> None:
        """A member SIGKILLed after committing 8 of 20 records: the group redelivers exactly offsets 8..19."""
        name = self.topic(transport, 1)
        group = unique("g")
        transport.publish_many(name, [(None, f"v{i}".encode()) for i in range(20)])
        child = _Child(tmp_path, "consume-commit-some", transport_url, name, group, "20", "8")
        try:
            child.wait_ready()
        finally:
            child.kill()
        assert child.proc.returncode == -signal.SIGKILL
        with transport.consume(name, group, session_timeout=SESSION) as c:
            recs = drain([c], 12)[0]
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                recs.extend(c.poll(timeout=0.1))
        assert [r.offset for r in recs] == list(range(8, 20))

    def test_a_rebalance_delivers_uncommitted_records_again(self, transport: Transport) -> None:
        """a reads all 20 records without committing; b joins: after the rebalance the group reads all 20 again."""
        name = self.topic(transport, 2)
        group = unique("g")
        positions = transport.publish_many(name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)])
        a = transport.consume(name, group, member="a", session_timeout=SESSION)
        b = None
        try:
            drain([a], 20)
            b = transport.consume(name, group, member="b", session_timeout=SESSION)
            members = run_group([a, b], lambda ms: len({(r.partition, r.offset) for m in ms for r in m.records}) >= 20)
            assert members[0].assigned.isdisjoint(members[1].assigned)
            with pytest.raises(CommitFailedError):  # a had 20 records it never committed when b joined
                a.commit()
            drain([a], sum(1 for p in positions if TopicPartition(name, p.partition) in a.assignment()))
            a.commit()
            b.commit()
        finally:
            a.close()
            if b is not None:
                b.close()
        with transport.consume(name, group, session_timeout=SESSION) as c:
            assert c.poll(timeout=1.5) == []

    @pytest.mark.parametrize("via", ["commit", "transaction"])
    def test_the_first_commit_after_a_rebalance_that_rewound_uncommitted_records_fails_once(
        self, transport: Transport, via: str
    ) -> None:
        """a commits 10 records, receives 10 more without committing; b joins and takes half the partitions.

        a's next commit (plain or transactional) raises CommitFailedError and commits nothing; a then receives
        exactly the uncommitted records of the partitions it still owns, once, and commits them normally.
        """
        name = self.topic(transport, 4)
        group = unique("g")
        first = transport.publish_many(name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(10)])
        a = transport.consume(name, group, member="a", session_timeout=SESSION)
        b = None
        try:
            drain([a], 10)
            a.commit()
            second = transport.publish_many(name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(10, 20)])
            assert {(r.partition, r.offset) for r in drain([a], 10)[0]} == {(p.partition, p.offset) for p in second}
            tps = [TopicPartition(name, p) for p in range(4)]
            committed = {tp: a.committed(tp) for tp in tps}
            assert a.generation == 0, group_state(a)
            b = transport.consume(name, group, member="b", session_timeout=SESSION)
            run_group(
                [a, b],
                lambda ms: (
                    all(m.assigned for m in ms)
                    and ms[0].assigned.isdisjoint(ms[1].assigned)
                    and len(ms[0].assigned | ms[1].assigned) == 4
                ),
            )
            # one rebalance, which rewound a's 10 uncommitted records; b had received none. A CI run once saw
            # (1, 1): the leader repeated a join that had completed, a second rebalance (transport/kafka_join.py)
            assert (a.generation, b.generation) == (1, 0), group_state(a, b)
            with pytest.raises(CommitFailedError):
                if via == "commit":
                    a.commit()
                else:
                    with a.transaction():
                        pass
            assert {tp: a.committed(tp) for tp in tps} == committed
            mine = {(p.partition, p.offset) for p in second if TopicPartition(name, p.partition) in a.assignment()}
            assert mine and len(mine) < 10 and not {(p.partition, p.offset) for p in first} & mine
            again = drain([a], len(mine))[0]
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                again.extend(a.poll(timeout=0.1))
            assert sorted((r.partition, r.offset) for r in again) == sorted(mine)
            if via == "commit":
                a.commit()
            else:
                with a.transaction():
                    pass
            assert a.generation == 1, group_state(a, b)
            for p, off in dict(sorted((p, o + 1) for p, o in mine)).items():
                assert a.committed(TopicPartition(name, p)) == off
        finally:
            a.close()
            if b is not None:
                b.close()

    @pytest.mark.parametrize("via", ["commit", "transaction"])
    def test_a_rebalance_with_nothing_uncommitted_does_not_fail_a_commit(self, transport: Transport, via: str) -> None:
        """a reads and commits all 20 records; b joins: a's next commits succeed and its generation stays 0."""
        name = self.topic(transport, 4)
        group = unique("g")
        transport.publish_many(name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)])
        a = transport.consume(name, group, member="a", session_timeout=SESSION)
        b = None
        try:
            drain([a], 20)
            a.commit()
            b = transport.consume(name, group, member="b", session_timeout=SESSION)
            run_group(
                [a, b],
                lambda ms: (
                    all(m.assigned for m in ms)
                    and ms[0].assigned.isdisjoint(ms[1].assigned)
                    and len(ms[0].assigned | ms[1].assigned) == 4
                ),
            )
            assert (a.generation, b.generation) == (0, 0), group_state(a, b)
            later = transport.publish_many(name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20, 40)])
            got = drain([a, b], 20)
            if via == "commit":
                a.commit()
                b.commit()
            else:
                for c in (a, b):
                    with c.transaction():
                        pass
            assert (a.generation, b.generation) == (0, 0), group_state(a, b)
            ends = dict(sorted((p.partition, p.offset + 1) for p in later))
            for p, off in ends.items():
                assert a.committed(TopicPartition(name, p)) == off
            assert sorted((r.partition, r.offset) for g in got for r in g) == sorted(
                (p.partition, p.offset) for p in later
            )
        finally:
            a.close()
            if b is not None:
                b.close()

    # -- transactions ------------------------------------------------------------

    def test_consume_transform_produce_commits_outputs_and_offsets_together(self, transport: Transport) -> None:
        src, dst = self.topic(transport, 3), self.topic(transport, 2)
        group = unique("g")
        transport.publish_many(src, [(f"k{i % 5}".encode(), f"v{i}".encode()) for i in range(30)])
        with transport.consume(src, group, member="worker", session_timeout=SESSION) as c:
            drain_done = 0
            end = time.monotonic() + DEADLINE
            while drain_done < 30 and time.monotonic() < end:
                drain_done += transform(c, lambda r: [(dst, r.key, r.value.upper())], max_records=7, idle_timeout=0.5)
            assert drain_done == 30
            ends = collections.Counter(TopicPartition(src, partition_for(f"k{i % 5}".encode(), 3)) for i in range(30))
            assert {tp: c.committed(tp) for tp in ends} == dict(ends)
        out = read_exactly(transport, dst, 30)
        assert sorted(r.value for r in out) == sorted(f"V{i}".encode() for i in range(30))
        with transport.consume(src, group, session_timeout=SESSION) as c:
            assert c.poll(timeout=1.5) == []

    def test_an_aborted_transaction_is_invisible_and_its_input_comes_back(self, transport: Transport) -> None:
        src, dst = self.topic(transport, 1), self.topic(transport, 1)
        group = unique("g")
        transport.publish_many(src, [(None, f"v{i}".encode()) for i in range(10)])
        with transport.consume(src, group, member="worker", session_timeout=SESSION) as c:
            first = drain([c], 10)[0]
            with pytest.raises(RuntimeError, match="transform failed"):
                with c.transaction() as tx:
                    for r in first:
                        tx.publish(dst, None, b"aborted-" + r.value)
                    raise RuntimeError("transform failed")
            assert c.positions() == {}
            again = drain([c], 10)[0]
            assert [r.offset for r in again] == [r.offset for r in first]
            with c.transaction() as tx:
                for r in again:
                    tx.publish(dst, None, b"done-" + r.value)
            assert c.committed(TopicPartition(src, 0)) == 10
        out = read_exactly(transport, dst, 10)
        assert [r.value for r in out] == [b"done-v%d" % i for i in range(10)]

    def test_no_duplicates_when_a_worker_dies_inside_a_transaction(
        self, transport: Transport, transport_url: str, tmp_path: Path
    ) -> None:
        """The worker commits 5 records' outputs, then is SIGKILLed with 5 more outputs sent but not committed.

        A restarted worker (same member name) finishes; the output holds each of the 20 inputs exactly once.
        """
        src, dst = self.topic(transport, 1), self.topic(transport, 1)
        group = unique("g")
        transport.publish_many(src, [(None, f"v{i}".encode()) for i in range(20)])
        child = _Child(tmp_path, "die-in-transaction", transport_url, src, group, dst)
        try:
            child.wait_ready()
        finally:
            child.kill()
        with transport.consume(src, group, member="worker", session_timeout=SESSION) as c:
            assert c.committed(TopicPartition(src, 0)) == 5
            done = 0
            end = time.monotonic() + DEADLINE
            while done < 15 and time.monotonic() < end:
                done += transform(c, lambda r: [(dst, None, r.value.upper())], max_records=4, idle_timeout=0.5)
            assert done == 15
        out = read_exactly(transport, dst, 20)
        assert [r.value for r in out] == [f"V{i}".encode() for i in range(20)]

    # -- durability ----------------------------------------------------------------

    def test_records_and_offsets_survive_reopening(self, transport: Transport, transport_url: str) -> None:
        name = self.topic(transport, 2)
        group = unique("g")
        transport.publish_many(name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)])
        with transport.consume(name, group, session_timeout=SESSION) as c:
            recs = drain([c], 20)[0]
            c.commit({TopicPartition(r.topic, r.partition): r.offset + 1 for r in recs[:1]})
        transport.close()
        with open_transport(transport_url) as again:
            assert again.partitions(name) == 2
            with again.consume(name, group, session_timeout=SESSION) as c:
                rest = drain([c], 19)[0]
        assert sorted(r.value for r in rest) == sorted(r.value for r in recs[1:])


# -- the worker run in a child process ------------------------------------------------


def _worker(argv: list[str]) -> None:
    ready, mode, url = Path(argv[0]), argv[1], argv[2]
    transport = open_transport(url)
    if mode == "consume-commit-some":
        topic, group, n, upto = argv[3], argv[4], int(argv[5]), int(argv[6])
        c = transport.consume(topic, group, session_timeout=SESSION)
        recs = drain([c], n)[0]
        c.commit({TopicPartition(topic, recs[0].partition): upto})
    elif mode == "die-in-transaction":
        src, group, dst = argv[3], argv[4], argv[5]
        c = transport.consume(src, group, member="worker", session_timeout=SESSION)

        def take(k: int) -> list[Record]:
            got: list[Record] = []
            end = time.monotonic() + DEADLINE
            while len(got) < k and time.monotonic() < end:
                got += c.poll(max_records=k - len(got), timeout=0.2)
            return got

        first = take(5)
        with c.transaction() as tx:
            for r in first:
                tx.publish(dst, None, r.value.upper())
        second = take(5)
        with c.transaction() as tx:
            for r in second:
                tx.publish(dst, None, r.value.upper())
            time.sleep(1.0)  # the outputs reach the log, uncommitted
            ready.touch()
            time.sleep(600)
    else:
        raise SystemExit(f"unknown mode {mode}")
    ready.touch()
    time.sleep(600)


if __name__ == "__main__":
    _worker(sys.argv[1:])
