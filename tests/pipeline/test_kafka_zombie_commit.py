"""A member the group expelled must not commit a transaction (issue 31, the chaos test's upstream double count).

A transaction's offsets sent without the member's generation (TxnOffsetCommit v0-2, or v3 with no group
metadata: kafka-python 2, or ``send_offsets_to_transaction(offsets, group_id)``) are accepted by the group
coordinator from any producer. A member whose heartbeats stop reaching the coordinator for a session timeout
(a loaded machine, a coordinator that moved when a broker died) is expelled and its partitions go to another
member, which restarts them from the committed offsets; the expelled member does not know it yet (its client
still thinks the generation stable), and when it commits its open transaction, both its outputs and the new
owner's outputs for the same input records show. For the shuffler that is one raw frame released twice (the
chaos test's 3,100 reports of 3,000 with no overlapping part files: the second copy never reached the first
copy's batch-id window).

Played on the project's broker: member ``a`` reads the input record and publishes its output in an open
transaction, then its heartbeats stop; after the session timeout member ``b`` owns the partition, reads the
record again, publishes and commits; then ``a`` commits. Without the generation ``a``'s commit went through
and the output topic held the record's output twice (kafka-python 2.3; and kafka-python 3.0.12 given only the
group id); the transport passes the consumer's ``group_metadata()``, the offsets carry ``a``'s generation and
member id (TxnOffsetCommit v3, KIP-447), the coordinator refuses them, and ``a``'s transaction is aborted.
A second test checks on the wire that the request is v3 and carries the member's generation.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from pipeline.transport.base import CommitFailedError, TransportError
from pipeline.transport.kafka import KafkaConsumer, KafkaTransport
from tests.pipeline.test_kafka_tx_outcome import _read_committed

pytestmark = pytest.mark.kafka

SESSION = 3.0


def _poll_until(consumer: KafkaConsumer, want: int, timeout: float = 30.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got.extend(r.value for r in consumer.poll(max_records=100, timeout=0.3))
    return got


@pytest.mark.parametrize("static", [True, False])
def test_an_expelled_member_cannot_commit_its_transaction(kafka_bootstrap: str, static: bool) -> None:
    run = uuid.uuid4().hex[:8]
    src, dst, group = f"zombie-in-{run}", f"zombie-out-{run}", f"zombie-{run}"
    transport = KafkaTransport(kafka_bootstrap, request_timeout=15.0)
    a = b = None
    try:
        transport.create_topic(src, 1)
        transport.create_topic(dst, 1)
        transport.publish_many(src, [(b"k", b"frame-1")])
        a = transport.consume(src, group, member="a", session_timeout=SESSION, static=static)
        assert _poll_until(a, 1) == [b"frame-1"]
        scope_a = a.transaction()
        tx_a = scope_a.__enter__()
        tx_a.publish(dst, b"k", b"released by a")
        # a's heartbeats stop (its process stalls, or they cannot reach the coordinator): it is expelled
        a._consumer._coordinator._disable_heartbeat()
        time.sleep(SESSION + 0.5)
        b = transport.consume(src, group, member="b", session_timeout=SESSION, static=static)
        assert _poll_until(b, 1) == [b"frame-1"]  # b restarts the partition from the committed offset
        with b.transaction() as tx_b:
            tx_b.publish(dst, b"k", b"released by b")
        assert a._generation_stable()  # a's client has not noticed: the old guard lets it commit
        refused: BaseException | None = None
        try:
            scope_a.__exit__(None, None, None)
        except (CommitFailedError, TransportError) as exc:
            refused = exc
        out = _read_committed(kafka_bootstrap, dst)
        assert out == [b"released by b"], f"the input record's output shows {len(out)} times: {out}"
        assert isinstance(refused, CommitFailedError), refused  # reported as a rebalance: the records come again
    finally:
        for c in (a, b):
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001 - the expelled member's close may fail; b's must not hide it
                    pass
        transport.close()


@pytest.mark.parametrize("static", [True, False])
def test_the_offsets_go_as_txn_offset_commit_v3_with_the_members_generation(
    kafka_bootstrap: str, static: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What kafka-python puts on the wire: the TxnOffsetCommit request the broker answered, its negotiated
    version and its KIP-447 fields, against the consumer's own view of its membership."""
    from kafka.producer import transaction_manager

    sent: list[Any] = []
    real = transaction_manager.TxnOffsetCommitHandler.handle_response

    def spy(handler: Any, response: Any) -> None:
        sent.append(handler.request)
        real(handler, response)

    monkeypatch.setattr(transaction_manager.TxnOffsetCommitHandler, "handle_response", spy)
    run = uuid.uuid4().hex[:8]
    src, dst, group = f"wire-in-{run}", f"wire-out-{run}", f"wire-{run}"
    transport = KafkaTransport(kafka_bootstrap, request_timeout=15.0)
    try:
        transport.create_topic(src, 1)
        transport.create_topic(dst, 1)
        transport.publish_many(src, [(b"k", b"frame-1")])
        with transport.consume(src, group, member="w", session_timeout=SESSION, static=static) as c:
            assert _poll_until(c, 1) == [b"frame-1"]
            meta = c._consumer.group_metadata()
            with c.transaction() as tx:
                tx.publish(dst, b"k", b"out")
        (req,) = sent
        assert req.API_VERSION == 3  # the broker (Kafka 4.1) knows v0-5; kafka-python drives up to v3
        assert meta.generation_id >= 1 and meta.member_id
        assert (req.group_id, req.generation_id, req.member_id) == (group, meta.generation_id, meta.member_id)
        assert req.group_instance_id == ("w" if static else None)
        assert [(t.name, [p.committed_offset for p in t.partitions]) for t in req.topics] == [(src, [1])]
    finally:
        transport.close()
