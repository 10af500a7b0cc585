"""Transactional offsets fenced by the consumer's generation (KIP-447) for kafka-python 2.

kafka-python 2 sends a transaction's offsets with TxnOffsetCommit v0-2, which carry no generation and no
member id: the group coordinator accepts them from a member it has already expelled. Such a member (its
heartbeats did not reach the coordinator for a session timeout: a loaded machine, a coordinator that moved
when its broker died) still believes its generation stable, so it commits its open transaction after its
partitions went to another member, which restarted them from the committed offsets: both members' outputs
for the same input records show (issue 31: the chaos test's shuffler released one raw frame twice;
``tests/pipeline/test_kafka_zombie_commit.py``).

:func:`send_offsets_fenced` sends them with TxnOffsetCommit v3 (Kafka >= 2.5), which carries the
generation id, the member id and the static instance id. The coordinator then refuses the offsets of a
member that is not in the group's current generation (``ILLEGAL_GENERATION``, ``UNKNOWN_MEMBER_ID``,
``FENCED_INSTANCE_ID``); the error leaves the transaction abortable, the commit that follows raises it, and
the transport aborts the transaction and reports a rebalance (its records come again). Only the request is
new; AddOffsetsToTxn and the retries of the transaction manager are kafka-python's own.
"""

from __future__ import annotations

from typing import Any

from kafka.producer.transaction_manager import (
    AddOffsetsToTxnHandler,
    TransactionState,
    TxnOffsetCommitHandler,
)
from kafka.protocol.api import Request, Response
from kafka.protocol.types import CompactArray, CompactString, Int16, Int32, Int64, Schema, TaggedFields

__all__ = ["send_offsets_fenced", "FENCED_VERSION"]

#: the broker version from which TxnOffsetCommit v3 (KIP-447) is understood
FENCED_VERSION = (2, 5)


class TxnOffsetCommitResponse_v3(Response):  # type: ignore[misc]  # noqa: N801 - kafka-python's version naming
    API_KEY = 28
    API_VERSION = 3
    FLEXIBLE_VERSION = True
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("topic", CompactString("utf-8")),
                ("partitions", CompactArray(("partition", Int32), ("error_code", Int16), ("tags", TaggedFields))),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest_v3(Request):  # type: ignore[misc]  # noqa: N801
    API_KEY = 28
    API_VERSION = 3
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("topic", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition", Int32),
                        ("offset", Int64),
                        ("leader_epoch", Int32),
                        ("metadata", CompactString("utf-8")),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _FencedCommit(TxnOffsetCommitHandler):  # type: ignore[misc]
    """kafka-python's TxnOffsetCommit handler, sending v3 with the member's generation; a refusal because the
    member left the generation is an abortable error (the transaction is aborted, the producer stays usable)."""

    def __init__(self, manager: Any, group: str, offsets: Any, result: Any, member: tuple[int, str, str | None]):
        self._member = member
        super().__init__(manager, group, offsets, result)

    def _build_request(self) -> Any:
        generation, member_id, instance = self._member
        by_topic: dict[str, list[tuple[int, int, int, str | None, dict[int, bytes]]]] = {}
        for tp, om in self.offsets.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, om.offset, om.leader_epoch, om.metadata, {}))
        return TxnOffsetCommitRequest_v3(
            transactional_id=self.transactional_id,
            group_id=self.consumer_group_id,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=instance,
            topics=[(topic, parts, {}) for topic, parts in by_topic.items()],
            tags={},
        )

    def handle_response(self, response: Any) -> None:
        from kafka import errors as Errors  # noqa: N812 - kafka-python's own spelling

        stale = (
            Errors.IllegalGenerationError,
            Errors.UnknownMemberIdError,
            Errors.FencedInstanceIdError,
            Errors.RebalanceInProgressError,
        )
        for _, parts, *_ in response.topics:
            for _, code, *_ in parts:
                error = Errors.for_code(code)
                if error in stale:
                    self.abortable_error(error(f"the group {self.consumer_group_id!r} refused the offsets"))
                    return
        # v0-2's tuples lack the tags: hand kafka-python's handler the same shape
        response.topics = [(t, [(p, c) for p, c, *_ in parts]) for t, parts, *_ in response.topics]
        super().handle_response(response)


class _FencedAddOffsets(AddOffsetsToTxnHandler):  # type: ignore[misc]
    """AddOffsetsToTxn whose success chains into :class:`_FencedCommit` instead of kafka-python's v0-2 one."""

    def __init__(self, manager: Any, group: str, offsets: Any, member: tuple[int, str, str | None]):
        super().__init__(manager, group, offsets)
        self._member = member

    def handle_response(self, response: Any) -> None:
        from kafka import errors as Errors  # noqa: N812

        if Errors.for_code(response.error_code) is not Errors.NoError:
            super().handle_response(response)
            return
        tm = self.transaction_manager
        for tp, offset in self.offsets.items():
            tm._pending_txn_offset_commits[tp] = offset
        tm._enqueue_request(
            _FencedCommit(tm, self.consumer_group_id, tm._pending_txn_offset_commits, self._result, self._member)
        )
        tm._transaction_started = True


def send_offsets_fenced(manager: Any, offsets: Any, group: str, member: tuple[int, str, str | None]) -> Any:
    """``manager.send_offsets_to_transaction(offsets, group)`` with the member's ``(generation id, member id,
    group instance id)`` in the offsets (TxnOffsetCommit v3); returns the request's result to wait on."""
    from kafka import errors as Errors  # noqa: N812

    with manager._lock:
        manager._ensure_transactional()
        manager._maybe_fail_with_error()
        if manager._current_state != TransactionState.IN_TRANSACTION:
            raise Errors.KafkaError("cannot send offsets: the producer is not in an active transaction")
        handler = _FencedAddOffsets(manager, group, offsets, member)
        manager._enqueue_request(handler)
        return handler.result
