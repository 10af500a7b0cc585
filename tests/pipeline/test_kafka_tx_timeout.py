"""A transaction its coordinator aborted on timeout is retried; a member whose id another incarnation took stops.

The chaos test (``tests/e2e/test_scale_chaos.py``) lost a shuffler member once in CI: the broker it killed
coordinated the member's open transaction and stayed away 30 s; the coordinator's partition moved to another
broker, which found the transaction older than the 10 s transaction timeout, aborted it and bumped the
producer's epoch. The member's commit was refused with ``PRODUCER_FENCED``, which the transport took for
"another worker took my transactional id" (:class:`FencedError`, fatal), and the member exited.

Played here on the project's broker with a 1 s transaction timeout and the broker's 1 s abort sweep
(``ldp_cli/broker.py``): a transaction left open for 4 s is aborted by its coordinator. The member's commit now
fails as a retryable :class:`TransportError`, its producer resumes the id (KIP-360: the coordinator grants the
producer id and epoch it fenced itself), its input comes again and the next transaction commits it once. On the
old code the commit raised :class:`FencedError`.

A resumption is refused when another incarnation of the member (the same group and member name) initialised
the id since, with or without a timeout first: that member is the zombie, and :class:`FencedError` stops it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from pipeline.transport.base import FencedError, TransportError
from pipeline.transport.kafka import KafkaTransport
from tests.pipeline.test_kafka_tx_outcome import _read_committed
from tests.pipeline.test_kafka_zombie_commit import _poll_until

pytestmark = pytest.mark.kafka

#: the transaction timeout of these tests, and how long a transaction stays open to outlive it (the timeout,
#: the broker's 1 s sweep for timed-out transactions, and a margin)
TIMEOUT = 1.0
OUTLIVE = TIMEOUT + 1.0 + 2.0


def _setup(bootstrap: str, name: str) -> tuple[KafkaTransport, str, str, str]:
    run = uuid.uuid4().hex[:8]
    src, dst, group = f"{name}-in-{run}", f"{name}-out-{run}", f"{name}-{run}"
    transport = KafkaTransport(bootstrap, request_timeout=15.0, transaction_timeout=TIMEOUT)
    transport.create_topic(src, 1)
    transport.create_topic(dst, 1)
    transport.publish_many(src, [(b"k", b"frame-1")])
    return transport, src, dst, group


def _open_transaction(transport: KafkaTransport, src: str, group: str, dst: str, value: bytes) -> tuple[Any, Any]:
    """Member ``a`` of ``group`` reads the input record and publishes ``value`` in a transaction left open."""
    a = transport.consume(src, group, member="a", session_timeout=10.0)
    assert _poll_until(a, 1) == [b"frame-1"]
    scope = a.transaction()
    scope.__enter__().publish(dst, b"k", value)
    return a, scope


def test_a_transaction_its_coordinator_aborted_on_timeout_is_retried_not_fatal(kafka_bootstrap: str) -> None:
    transport, src, dst, group = _setup(kafka_bootstrap, "tx-timeout")
    a: Any = None
    try:
        a, scope = _open_transaction(transport, src, group, dst, b"out-1")
        time.sleep(OUTLIVE)  # the coordinator aborts the transaction and bumps the producer's epoch
        with pytest.raises(TransportError) as failed:
            scope.__exit__(None, None, None)
        assert not isinstance(failed.value, FencedError), failed.value
        assert _poll_until(a, 1) == [b"frame-1"]  # rewound: the input comes again
        with a.transaction() as tx:
            tx.publish(dst, b"k", b"out-1")
        assert _read_committed(kafka_bootstrap, dst) == [b"out-1"]
        assert a.poll(max_records=10, timeout=1.0) == []  # and its offset is committed
    finally:
        if a is not None:
            a.close()
        transport.close()


@pytest.mark.parametrize("timed_out", [True, False])
def test_a_member_whose_id_another_incarnation_took_stays_fenced(kafka_bootstrap: str, timed_out: bool) -> None:
    transport, src, dst, group = _setup(kafka_bootstrap, "tx-zombie")
    a: Any = None
    b: Any = None
    try:
        a, scope = _open_transaction(transport, src, group, dst, b"zombie")
        if timed_out:
            time.sleep(OUTLIVE)
        b = transport.consume(src, group, member="a", session_timeout=10.0)  # a restart under the same name
        with b.transaction():  # its first producer takes the id (and aborts what a left open)
            pass
        with pytest.raises(FencedError):
            scope.__exit__(None, None, None)
        with pytest.raises(FencedError):  # and every later transaction of the zombie
            a.transaction().__enter__()
        assert _read_committed(kafka_bootstrap, dst) == []
    finally:
        for c in (a, b):
            if c is not None:
                c.close()
        transport.close()
