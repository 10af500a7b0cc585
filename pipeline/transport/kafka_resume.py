"""Take a transactional id back after a failure, without fencing a newer incarnation (KIP-360, KIP-588).

A consumer's transactional producer (``ldp.<group>.<member>``) is replaced whenever it fails: a request with
no answer, an abort that cannot go through, or a transaction its coordinator aborted. The replacement used to
start with ``init_transactions()``, an ``InitProducerId`` *without* a producer id: the coordinator always
grants that one (it is how a restarted worker fences its dead predecessor), so a paused zombie replacing its
producer would fence the live member that had taken its name.

And one event was read as the zombie case when it was not. The transaction coordinator aborts a transaction
open longer than ``transaction.timeout.ms`` and bumps the producer's epoch; the producer's next request is
refused with ``PRODUCER_FENCED``. A broker that dies while it coordinates a member's transaction makes that
happen: the coordinator's partition moves to another broker some seconds later, which finds the transaction
past its timeout (the chaos test, ``tests/e2e/test_scale_chaos.py``, lost a shuffler member so once in CI:
30 s of outage, a 10 s timeout).

So a member takes its id *fresh* once, when it starts. Every later producer of the same consumer
**resumes**: its first ``InitProducerId`` carries the producer id and epoch its predecessor held (v3+,
KIP-360). The coordinator grants it if that epoch is the id's current one, or the one just before a bump by
the coordinator itself (an epoch fence on timeout; or a resume whose answer was lost), and aborts whatever
the predecessor left open. It refuses it with ``PRODUCER_FENCED`` if another incarnation initialised the id
since: then this member really is the zombie, and :class:`~pipeline.transport.base.FencedError` stops it.
Played on Kafka 4.1 by ``tests/pipeline/test_kafka_tx_timeout.py``: a transaction left open past its timeout,
then resumed (granted); a second incarnation, then the first resuming (refused).

kafka-python (3.0.12) has the request (its own KIP-360 epoch bump after a sequence error) but no public call
to start a producer with it, so :func:`resume_transactions` starts its handler on the new producer's
transaction manager, as ``init_transactions`` does, with two differences: the producer id and epoch are the
predecessor's, and ``INVALID_PRODUCER_EPOCH`` is taken for the fence it is (kafka-python would fall back to a
fresh ``InitProducerId``, which always succeeds).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from pipeline.transport.base import FencedError

__all__ = ["Identity", "identity_of", "resume_after_fence", "resume_transactions"]

log = logging.getLogger(__name__)


class Identity(NamedTuple):
    """The producer id and epoch a transactional producer held."""

    producer_id: int
    epoch: int


def identity_of(producer: Any) -> Identity | None:
    """The producer id and epoch ``producer`` holds, or ``None`` before it got one."""
    tm = getattr(producer, "_transaction_manager", None)
    pe = getattr(tm, "producer_id_and_epoch", None)
    if pe is None or pe.producer_id < 0 or pe.epoch < 0:
        return None
    return Identity(int(pe.producer_id), int(pe.epoch))


def resume_transactions(producer: Any, held: Identity, timeout: float) -> None:
    """Start ``producer`` (a new transactional ``KafkaProducer``, ``init_transactions`` not called) as the
    successor of the producer that held ``held``; returns once the coordinator granted it (raising
    ``kafka.errors.ProducerFencedError`` if another incarnation took the id since, ``KafkaTimeoutError`` if
    no answer came within ``timeout`` s)."""
    from kafka import errors
    from kafka.producer.transaction_manager import (
        InitProducerIdHandler,
        ProducerIdAndEpoch,
        TransactionState,
    )

    class _Resume(InitProducerIdHandler):  # type: ignore[misc]
        def handle_response(self, response: Any) -> None:
            if errors.for_code(response.error_code) is errors.InvalidProducerEpochError:
                self.fatal_error(errors.ProducerFencedError())  # not kafka-python's fresh-id fallback
            else:
                super().handle_response(response)

    tm = producer._transaction_manager
    with tm._lock:
        tm._transition_to(TransactionState.INITIALIZING)
        tm.set_producer_id_and_epoch(ProducerIdAndEpoch(held.producer_id, held.epoch))
        handler = _Resume(tm, tm.transaction_timeout_ms, is_epoch_bump=True)
        tm._enqueue_request(handler)
    producer._init_transactions_result = handler.result  # a later init_transactions() waits on this one
    producer._sender.wakeup()
    if not handler.result.wait(timeout_ms=int(timeout * 1000)):  # raises the refusal
        raise errors.KafkaTimeoutError(f"no answer to resuming transactional producer {held} in {timeout:g} s")


def resume_after_fence(consumer: Any, fence: BaseException) -> bool:
    """After a ``PRODUCER_FENCED`` (``consumer``'s producer dropped): a successor resuming the member's producer id
    and epoch (``consumer._tx_producer()``). Raises :class:`FencedError` if the coordinator refuses it (another
    incarnation took the transactional id); ``False`` if it could not be asked (the next transaction asks
    again); ``True`` once granted."""
    from kafka import errors

    tid = consumer.transactional_id
    try:
        consumer._tx_producer()
    except (errors.ProducerFencedError, errors.InvalidProducerEpochError) as exc:
        raise FencedError(f"another worker took transactional id {tid!r}: {exc!r}") from fence
    except Exception as exc:  # noqa: BLE001 - the coordinator is away: the next transaction resumes
        log.warning("could not resume transactional id %r after %r: %r", tid, fence, exc)
        consumer._drop_producer()
        return False
    log.warning(
        "the transaction coordinator fenced %r (%r) and granted its resumption: the transaction had outlived "
        "its timeout, no other worker holds the id",
        tid,
        fence,
    )
    return True
