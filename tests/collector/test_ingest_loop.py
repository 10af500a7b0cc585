"""Group commits on the event loop (Kafka's ``publish_nowait``): grouping, idempotency, nothing twice."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from collector.dedup import BatchIdStore
from collector.errors import RejectedBatch, UnavailableError
from collector.ingest import Ingestor
from pipeline.transport import open_transport


class Counting:
    """The Kafka transport, counting the records handed over by each way of publishing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.many: list[int] = []
        self.nowait: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> Any:
        items = list(items)
        self.many.append(len(items))
        return self.inner.publish_many(topic, items)

    def publish_nowait(
        self, topic: str, items: Iterable[tuple[bytes | None, bytes]], done: Callable[[str | None], None]
    ) -> None:
        items = list(items)
        self.nowait.append(len(items))
        self.inner.publish_nowait(topic, items, done)


async def _submit_all(ing: Ingestor, subs: list[tuple[bytes, bytes]]) -> list[object]:
    """Submit every ``(batch_id, value)`` in one iteration of the loop; each one's outcome or exception."""
    loop = asyncio.get_running_loop()
    waiters = [ing.submit_async(b, b"k", v, 1, "m", loop) for b, v in subs]
    return list(await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 60))


@pytest.mark.kafka
def test_uploads_of_one_loop_iteration_are_one_group_on_the_loop_and_nothing_is_published_twice(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    topic = f"ldp.test.loop-{uuid.uuid4().hex[:8]}"
    rng_bytes = os.urandom  # batch ids are random by protocol; the assertions do not depend on their values
    with open_transport(f"kafka://{kafka_bootstrap}") as inner:
        tr = Counting(inner)
        store = BatchIdStore(tmp_path / "ids.sqlite3")
        ing = Ingestor(tr, topic, store, partitions=2)  # type: ignore[arg-type]
        ing.start()
        try:
            first = (rng_bytes(16), b"warm-up")
            ids = [rng_bytes(16) for _ in range(30)]
            values = [b"value-%d" % i for i in range(30)]
            batch = list(zip(ids, values, strict=True))
            # a repeat with the same content, one with other content, both in the same iteration
            batch += [(ids[0], values[0]), (ids[1], b"other content")]

            async def run() -> tuple[list[object], list[object], list[object]]:
                warm = await _submit_all(ing, [first])  # creates the topic: through a publisher thread
                got = await _submit_all(ing, batch)
                again = await _submit_all(ing, batch[:30])  # retries after the 202: from the store
                return warm, got, again

            warm, got, again = asyncio.run(run())
        finally:
            ing.stop()
            store.close()
        assert warm == ["accepted"]
        assert got[:30] == ["accepted"] * 30
        assert got[30] == "duplicate"
        assert isinstance(got[31], RejectedBatch) and got[31].status == 409
        assert again == ["duplicate"] * 30
        assert tr.many == [1]  # only the first group (topic creation) went through the threads
        assert sum(tr.nowait) == 30 and len(tr.nowait) <= 3  # one iteration's uploads: one group (or a few)
        from tests.support.transport_contract import read_exactly

        recs = read_exactly(inner, topic, 31)
    assert sorted(r.value for r in recs) == sorted([b"warm-up", *values])


class NowaitEmbedded:
    """The embedded log with a ``publish_nowait`` (as Kafka's): group commits after the first run on the loop."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.nowait = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def publish_nowait(
        self, topic: str, items: Iterable[tuple[bytes | None, bytes]], done: Callable[[str | None], None]
    ) -> None:
        self.nowait += 1
        self.inner.publish_many(topic, list(items))
        done(None)


class UnwritableStore(BatchIdStore):
    """A store that fails to record anything, ids or counts: the group commit fails after the publish."""

    def add(self, ids: Any, counts: Any = None) -> None:
        raise RuntimeError("the disk is gone (test)")

    def add_counts(self, counts: Any) -> None:
        raise RuntimeError("the disk is gone (test)")


def test_a_group_commit_that_fails_unexpectedly_answers_503_on_the_thread_and_on_the_loop(tmp_path: Path) -> None:
    """The first group (it creates the topic) goes through a publisher thread, the next one is committed on the
    loop: each fails after its publish, and each upload of it, and a retry that followed it, is answered the
    same 503 ``internal`` with ``Retry-After`` (one helper, ``_fail_group``, for both paths)."""
    with open_transport(f"sqlite:///{tmp_path / 'log.sqlite3'}") as inner:
        tr = NowaitEmbedded(inner)
        store = UnwritableStore(tmp_path / "ids.sqlite3")
        ing = Ingestor(tr, "ldp.raw", store, partitions=2, retry_after=7)  # type: ignore[arg-type]
        ing.start()
        try:
            first, second = os.urandom(16), os.urandom(16)

            async def run() -> tuple[list[object], list[object]]:
                on_thread = await _submit_all(ing, [(first, b"a")])
                on_loop = await _submit_all(ing, [(second, b"b"), (second, b"b"), (os.urandom(16), b"c")])
                return on_thread, on_loop

            on_thread, on_loop = asyncio.run(run())
        finally:
            ing.stop()
            store.close()
        assert tr.nowait == 1
        for out in [*on_thread, *on_loop]:
            assert isinstance(out, UnavailableError), out
            assert out.reason == "internal" and out.retry_after == 7 and "RuntimeError" in out.message
        with inner.consume("ldp.raw", "check") as c:  # published once each (the retry followed), answered 503
            assert sorted(r.value for r in c.records(idle_timeout=0.3)) == [b"a", b"b", b"c"]


def test_a_groups_outcomes_reach_the_loop_in_one_delivery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The publisher thread settles a group's uploads one after the other; the loop gets them all in one
    delivery at the end, not each as it is settled (which, on a loaded machine, cost the loop one wake-up and
    one iteration per upload, and the native front one ``answer_many`` per upload). Each settling is slowed to
    40 ms here, so that an idle loop would drain each one apart: they then arrive >= 80 ms apart, not at once."""
    import collector.ingest as ingest

    settle = ingest._settle

    def slow_settle(fut: Any, result: Any = None, exc: BaseException | None = None) -> None:
        settle(fut, result, exc)
        time.sleep(0.04)

    monkeypatch.setattr(ingest, "_settle", slow_settle)

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        arrived: list[float] = []
        with open_transport(f"sqlite:///{tmp_path}/log.sqlite3") as tr:
            ing = Ingestor(tr, "ldp.raw", BatchIdStore(tmp_path / "ids.sqlite3"), partitions=1, threads=1)
            ing.start()
            try:
                waiters = [ing.submit_async(os.urandom(16), b"k", b"v%d" % i, 1, "m", loop) for i in range(3)]
                for w in waiters:  # a done callback runs in the loop iteration after the delivery
                    w.add_done_callback(lambda _: arrived.append(loop.time()))
                assert await asyncio.wait_for(asyncio.gather(*waiters), 30) == ["accepted"] * 3
            finally:
                ing.stop()
        return arrived

    arrived = asyncio.run(main())
    assert max(arrived) - min(arrived) < 0.02, arrived
