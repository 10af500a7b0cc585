"""A transaction whose commit got no answer, on the project's broker (issue 31).

kafka-python 2 waits for ever on a transactional request that is never answered, so
:meth:`KafkaConsumer._tx_call` gives up after ``request_timeout`` and the transport replaces the producer. In
the three-broker chaos test that happened once or more per run (a request to a coordinator that had just
died). The transport used to take such a transaction as aborted and rewind to the committed offsets at once.
But if EndTxn had reached the coordinator, the coordinator completes the commit on its own: its outputs show
and its offsets are committed, a moment after the rewind had read the old ones. The shuffler then processed
the same raw records again and published their reports a second time (each consumer group downstream, the
sink's dataset and the estimators, counted them twice).

Here the answer of a real EndTxn is dropped (``lost``: the coordinator committed) or the request is never sent
(``never``): the transport must report the first as committed -- nothing delivered again, the output once --
and the second as failed -- the records delivered again, the output never visible. On the old code the
``lost`` case raised ``TransportError: the transaction did not complete`` and delivered the records again.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

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


@pytest.mark.parametrize("outcome", ["lost", "never"])
def test_a_commit_without_answer_is_settled_before_the_rewind(kafka_bootstrap: str, outcome: str) -> None:
    run = uuid.uuid4().hex[:8]
    src, dst, group = f"tx-outcome-in-{run}", f"tx-outcome-out-{run}", f"tx-outcome-{run}"
    transport = KafkaTransport(kafka_bootstrap, request_timeout=15.0)
    try:
        transport.create_topic(src, 1)
        transport.create_topic(dst, 1)
        transport.publish_many(src, [(None, b"in-%d" % i) for i in range(N)])
        consumer = transport.consume(src, group, member="m0", session_timeout=6.0)
        try:
            assert len(_poll_all(consumer, N)) == N
            real = consumer._tx_call

            def no_answer(what: str, start: Any) -> None:
                if what == "commit_transaction":
                    if outcome == "lost":
                        real(what, start)  # the coordinator commits; its answer never reaches the client
                    else:
                        consumer._producer.flush(timeout=10)  # the output is in the open transaction; no EndTxn
                    raise _TransactionStuck(f"{what} got no answer (injected)")
                real(what, start)

            consumer._tx_call = no_answer  # type: ignore[method-assign]
            if outcome == "lost":
                with consumer.transaction() as tx:
                    tx.publish(dst, None, b"out")
            else:
                with pytest.raises(TransportError, match="did not complete"):
                    with consumer.transaction() as tx:
                        tx.publish(dst, None, b"out")
            consumer._tx_call = real  # type: ignore[method-assign]
            again = _poll_all(consumer, N, timeout=3.0)
            (tp,) = consumer.assignment()
            committed = consumer.committed(tp)
        finally:
            consumer.close()
        if outcome == "lost":
            assert again == [], f"{len(again)} records committed in the transaction were delivered again"
            assert committed == N
            assert _read_committed(kafka_bootstrap, dst) == [b"out"]
        else:
            assert [r.offset for r in again] == list(range(N))  # nothing committed: all of them again
            assert committed is None
            assert _read_committed(kafka_bootstrap, dst) == []
    finally:
        transport.close()
