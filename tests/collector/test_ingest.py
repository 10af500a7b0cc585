"""The collector's group-commit ingestor: a waiter that gives up changes nothing for the publish."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from collector.dedup import BatchIdStore
from collector.errors import UnavailableError
from collector.ingest import Ingestor
from pipeline.transport.base import RecordPosition
from pipeline.transport.embedded import EmbeddedTransport

TOPIC = "ldp.raw"


class SlowTransport(EmbeddedTransport):
    """The embedded log, with publishes held until ``release`` is set (a broker that stalls)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, synchronous="NORMAL")
        self.release = threading.Event()
        self.entered = threading.Event()
        self.fail_next = False

    def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> list[RecordPosition]:
        items = list(items)
        self.entered.set()
        assert self.release.wait(30), "the test never released the publish"
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("broker went away")
        return super().publish_many(topic, items)


def _records(transport: EmbeddedTransport) -> list[bytes]:
    with transport.consume(TOPIC, "check") as c:
        return [r.value for r in c.records(idle_timeout=0.3)]


@pytest.fixture()
def slow(tmp_path: Path) -> SlowTransport:
    t = SlowTransport(tmp_path / "log.db")
    t.create_topic(TOPIC, 1)
    return t


def _ingestor(transport: SlowTransport, errors: list[BaseException]) -> Ingestor:
    ing = Ingestor(transport, TOPIC, BatchIdStore(":memory:"), partitions=1, threads=1)
    original = ing._commit

    def commit(group):  # record anything the worker thread would otherwise only log
        try:
            original(group)
        except BaseException as exc:
            errors.append(exc)
            raise

    ing._commit = commit  # type: ignore[method-assign]
    ing.start()
    return ing


def test_cancelled_waiter_does_not_break_the_publish_or_its_retry(slow: SlowTransport) -> None:
    """A request that timed out cancels its future while the publish is in flight; a retry of the same batch id
    arrives meanwhile and follows it. The publish still lands once, the worker raises nothing, the retry is told
    'duplicate', and a later upload is still accepted (the worker is alive)."""
    errors: list[BaseException] = []
    ing = _ingestor(slow, errors)
    try:
        first = ing.submit(b"A" * 16, b"k", b"frame-A", 10)
        assert slow.entered.wait(10)
        assert first.cancel(), "a pending future can be cancelled by its waiter"
        retry = ing.submit(b"A" * 16, b"k", b"frame-A", 10)
        slow.release.set()
        assert retry.result(timeout=10) == "duplicate"
        later = ing.submit(b"B" * 16, b"k", b"frame-B", 10)
        assert later.result(timeout=10) == "accepted"
        assert ing.alive
    finally:
        ing.stop()
    assert errors == []
    assert _records(slow) == [b"frame-A", b"frame-B"]


def test_failed_publish_reaches_a_follower_even_if_the_first_waiter_left(slow: SlowTransport) -> None:
    """When the publish fails, a retry that followed the first upload gets the 503, not a hang or a crash."""
    errors: list[BaseException] = []
    ing = _ingestor(slow, errors)
    slow.fail_next = True
    try:
        first = ing.submit(b"C" * 16, b"k", b"frame-C", 10)
        assert slow.entered.wait(10)
        first.cancel()
        retry = ing.submit(b"C" * 16, b"k", b"frame-C", 10)
        slow.release.set()
        with pytest.raises(UnavailableError) as info:
            retry.result(timeout=10)
        assert info.value.reason == "transport_unavailable"
        again = ing.submit(b"C" * 16, b"k", b"frame-C", 10)
        assert again.result(timeout=10) == "accepted"
    finally:
        ing.stop()
    assert errors == []
    assert _records(slow) == [b"frame-C"]


def test_uncancelled_future_still_reports_its_outcome(slow: SlowTransport) -> None:
    errors: list[BaseException] = []
    ing = _ingestor(slow, errors)
    slow.release.set()
    try:
        futs = [ing.submit(bytes([i]) * 16, b"k", b"v%d" % i, 1) for i in range(20)]
        done, _ = concurrent.futures.wait(futs, timeout=10)
        assert len(done) == 20 and all(f.result() == "accepted" for f in futs)
    finally:
        ing.stop()
    assert errors == [] and len(_records(slow)) == 20
