"""A transaction whose commit got no answer, on the project's broker (issue 31).

kafka-python (2.3 and 3.0.12) waits for ever on a transactional request that is never answered, so
:meth:`KafkaConsumer._tx_call` gives up after ``request_timeout`` and the transport replaces the producer. In
the three-broker chaos test that happened once or more per run (a request to a coordinator that had just
died). The transport used to take such a transaction as aborted and rewind to the committed offsets at once.
But if EndTxn had reached the coordinator, the coordinator completes the commit on its own: its outputs show
and its offsets are committed, a moment after the rewind had read the old ones. The shuffler then processed
the same raw records again and published their reports a second time (each consumer group downstream, the
sink's dataset and the estimators, counted them twice).

Three outcomes on the project's broker: the answer of a real EndTxn is dropped (``lost``: the coordinator
committed), the EndTxn reaches the coordinator only after the client gave up (``late``: its producer is kept
open and sends it then), or it is never sent (``never``). Whatever the outcome, the transport must keep it
exactly once: the output shows and no input record comes again, or the output never shows and every input
record comes again. On the old code ``lost`` was reported failed although it had committed, and ``late``
committed its output *and* delivered its 12 input records again (the shuffler's double publication); now
settling the transaction fences the old producer first, so its late EndTxn is refused.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kafka.errors import KafkaError

from pipeline.transport.base import TransportError
from pipeline.transport.kafka import KafkaConsumer, KafkaTransport, _TransactionStuck

pytestmark = pytest.mark.kafka

N = 12


def _read_committed(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed record of ``topic`` (one partition), as a read_committed reader sees it."""
    from kafka import KafkaConsumer as _KC
    from kafka import TopicPartition as KTP

    reader = _KC(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    try:
        ktp = KTP(topic, 0)
        reader.assign([ktp])
        reader.seek_to_beginning(ktp)
        end = reader.end_offsets([ktp])[ktp]
        out: list[bytes] = []
        deadline = time.monotonic() + 20
        while reader.position(ktp) < end and time.monotonic() < deadline:
            for recs in reader.poll(timeout_ms=200).values():
                out.extend(r.value for r in recs)
        return out
    finally:
        reader.close()


def _poll_all(consumer: KafkaConsumer, want: int, timeout: float = 20.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got.extend(consumer.poll(max_records=100, timeout=0.5))
    return got


@pytest.mark.parametrize("outcome", ["lost", "late", "never"])
def test_a_commit_without_answer_is_settled_before_the_rewind(kafka_bootstrap: str, outcome: str) -> None:
    run = uuid.uuid4().hex[:8]
    src, dst, group = f"tx-outcome-in-{run}", f"tx-outcome-out-{run}", f"tx-outcome-{run}"
    transport = KafkaTransport(kafka_bootstrap, request_timeout=15.0)
    stash: dict[str, Any] = {}
    try:
        transport.create_topic(src, 1)
        transport.create_topic(dst, 1)
        transport.publish_many(src, [(None, b"in-%d" % i) for i in range(N)])
        consumer = transport.consume(src, group, member="m0", session_timeout=6.0)
        try:
            assert len(_poll_all(consumer, N)) == N
            real, real_drop = consumer._tx_call, consumer._drop_producer

            def no_answer(what: str, start: Any) -> None:
                if what == "commit_transaction":
                    if outcome == "lost":
                        real(what, start)  # the coordinator commits; its answer never reaches the client
                    else:
                        consumer._producer.flush(timeout=10)  # the output is in the open transaction; no EndTxn yet
                    raise _TransactionStuck(f"{what} got no answer (injected)")
                real(what, start)

            def keep_in_flight() -> None:  # "late": the old producer's EndTxn is still on its way
                consumer._drop_producer = real_drop  # type: ignore[method-assign]
                stash["producer"], consumer._producer = consumer._producer, None

            consumer._tx_call = no_answer  # type: ignore[method-assign]
            if outcome == "late":
                consumer._drop_producer = keep_in_flight  # type: ignore[method-assign]
            try:
                with consumer.transaction() as tx:
                    tx.publish(dst, None, b"out")
                reported = "committed"
            except TransportError as exc:
                assert "did not complete" in str(exc)
                reported = "failed"
            consumer._tx_call = real  # type: ignore[method-assign]
            if outcome == "late":  # the EndTxn reaches the coordinator only now, after the client gave up
                old = stash["producer"]
                try:
                    done = old._transaction_manager.begin_commit()
                    old._sender.wakeup()
                    assert done.wait(timeout_ms=15000)
                except KafkaError:  # refused: a newer producer of this transactional id fenced the old one
                    pass
            again = _poll_all(consumer, N, timeout=3.0)
            (tp,) = consumer.assignment()
            committed = consumer.committed(tp)
        finally:
            consumer.close()
        out = _read_committed(kafka_bootstrap, dst)
        # exactly once: the output shows and nothing comes again, or it never shows and everything comes again
        if out:
            assert again == [], f"the output committed and {len(again)} of its input records were delivered again"
            assert (out, committed, reported) == ([b"out"], N, "committed")
        else:
            assert [r.offset for r in again] == list(range(N))
            assert (committed, reported) == (None, "failed")
        assert bool(out) == (outcome == "lost")  # "late": settling fenced the old producer, its EndTxn came too late
    finally:
        if "producer" in stash:
            stash["producer"].close(timeout=2)
        transport.close()
