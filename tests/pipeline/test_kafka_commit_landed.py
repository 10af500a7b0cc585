"""An offset commit reported failed that landed anyway (issue 31).

When the group coordinator's node is killed, kafka-python's first OffsetCommit may be written by the old
coordinator before it dies; the retry at the new coordinator is refused (UnknownMemberIdError: the member
must rejoin), and kafka-python raises CommitFailedError. The group's offsets are the new ones all the same.
Before, :meth:`KafkaConsumer.commit` reported the failure, and the streaming estimator would drop the tail it
had just committed, which the group never delivers again. Now the commit carries a token in the offsets'
metadata and a reported failure whose token is the group's committed state is a success. (It was suspected
of the estimator group's shortfall in tests/e2e/test_scale_chaos.py; that shortfall also happens with a commit
that was refused, so its cause is still open.)

kafka-python's consumer is replaced here by a fake that plays the coordinator: this is the client-side
decision only (the chaos test runs it against a real cluster).
"""

from __future__ import annotations

from typing import Any

import pytest
from kafka import OffsetAndMetadata
from kafka import TopicPartition as KTP
from kafka.errors import CommitFailedError as KafkaCommitFailed

from pipeline.transport.base import CommitFailedError, TopicPartition
from pipeline.transport.kafka import KafkaConsumer

TP = TopicPartition("ldp.reports.shuffled", 3)


class _Coordinator:
    """The group's committed offsets; ``lands``: a commit is written before the error reaches the client."""

    def __init__(self, lands: bool) -> None:
        self.lands = lands
        self.offsets: dict[KTP, OffsetAndMetadata] = {KTP(TP.topic, TP.partition): OffsetAndMetadata(40, "", -1)}
        self.seeks: list[tuple[KTP, int]] = []

    def commit(self, offsets: dict[KTP, OffsetAndMetadata]) -> None:
        if self.lands:
            self.offsets.update(offsets)
        raise KafkaCommitFailed("UnknownMemberIdError: the member must rejoin")

    def committed(self, ktp: KTP, metadata: bool = False) -> Any:
        got = self.offsets.get(ktp)
        return got if metadata or got is None else got.offset

    def assignment(self) -> set[KTP]:
        return set(self.offsets)

    def seek(self, ktp: KTP, offset: int) -> None:
        self.seeks.append((ktp, offset))


def _consumer(coordinator: _Coordinator) -> KafkaConsumer:
    c = object.__new__(KafkaConsumer)
    c._set_identity([TP.topic], "estimator-g", "estimator-0", 3.0)
    c._rewinds, c._rewind_unreported = 0, False
    c._closed = False
    c._consumer = coordinator
    c._delivered = {TP: 57}
    return c


def test_a_commit_reported_failed_that_landed_is_a_success() -> None:
    coordinator = _Coordinator(lands=True)
    c = _consumer(coordinator)
    c.commit({TP: 57})  # no CommitFailedError: the caller keeps what it derived from offsets 40..56
    assert coordinator.committed(KTP(TP.topic, TP.partition)) == 57
    assert c._delivered == {} and coordinator.seeks == [] and c.generation == 0


def test_a_commit_that_did_not_land_still_fails_and_rewinds() -> None:
    coordinator = _Coordinator(lands=False)
    c = _consumer(coordinator)
    with pytest.raises(CommitFailedError):
        c.commit({TP: 57})
    assert coordinator.seeks == [(KTP(TP.topic, TP.partition), 40)]  # the records come again from 40
    assert c.generation == 1


def test_another_commit_of_the_same_offset_is_not_taken_for_this_one() -> None:
    """Another member (or an earlier attempt of this one) left the same offset: only this commit's token
    counts, so a refused commit is not mistaken for a landed one."""
    coordinator = _Coordinator(lands=False)
    coordinator.offsets[KTP(TP.topic, TP.partition)] = OffsetAndMetadata(57, "estimator-1:3:123", -1)
    c = _consumer(coordinator)
    with pytest.raises(CommitFailedError):
        c.commit({TP: 57})
