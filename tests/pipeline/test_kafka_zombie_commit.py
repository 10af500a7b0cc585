"""A member the group expelled must not commit a transaction (issue 31, the chaos test's upstream double count).

kafka-python 2 sends transactional offsets without the member's generation (TxnOffsetCommit v0-2, no
KIP-447), so the group coordinator accepts them from any producer. A member whose heartbeats stop reaching
the coordinator for a session timeout (a loaded machine, a coordinator that moved when a broker died) is
expelled and its partitions go to another member, which restarts them from the committed offsets; the
expelled member does not know it yet (its client still thinks the generation stable), and when it commits
its open transaction, both its outputs and the new owner's outputs for the same input records show. For the
shuffler that is one raw frame released twice (the chaos test's 3,100 reports of 3,000 with no overlapping
part files: the second copy never reached the first copy's batch-id window).

Played on the project's broker: member ``a`` reads the input record and publishes its output in an open
transaction, then its heartbeats stop; after the session timeout member ``b`` owns the partition, reads the
record again, publishes and commits; then ``a`` commits. On the old code ``a``'s commit went through and the
output topic held the record's output twice; now the offsets carry ``a``'s generation and member id
(TxnOffsetCommit v3), the coordinator refuses them, and ``a``'s transaction is aborted.
"""

from __future__ import annotations

import time
import uuid

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
        a._consumer._coordinator._disable_heartbeat_thread()
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
