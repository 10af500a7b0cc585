"""The producer configuration that makes the collector's 202 durable.

The collector answers 202 only after ``publish_many`` returned, so a report
accepted is only as safe as the producer's acknowledgement: ``acks="all"``
(every in-sync replica has it) and idempotence (a retried send is not written
twice). These tests record the keyword arguments actually passed to
``kafka.KafkaProducer`` by the plain and the transactional producer, so
changing either setting (or letting a default drift) fails here.
"""

from __future__ import annotations

import uuid
from typing import Any

import kafka
import pytest

from pipeline.transport.kafka import KafkaTransport


class _RecordingProducer:
    """Stands in for ``kafka.KafkaProducer``: remembers its configuration, sends nothing."""

    made: list[dict[str, Any]] = []

    def __init__(self, **config: Any) -> None:
        type(self).made.append(config)

    def init_transactions(self) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    _RecordingProducer.made = []
    monkeypatch.setattr(kafka, "KafkaProducer", _RecordingProducer)
    return _RecordingProducer.made


def _durable(cfg: dict[str, Any]) -> None:
    assert cfg["acks"] == "all"
    assert cfg["enable_idempotence"] is True


def test_publishing_producer_waits_for_all_replicas_and_is_idempotent(recorded: list[dict[str, Any]]) -> None:
    t = KafkaTransport("127.0.0.1:1")  # nothing is contacted: the producer is a recorder
    try:
        t._producer_client()
        assert len(recorded) == 1
        _durable(recorded[0])
    finally:
        t._producer = None
        t.close()


@pytest.mark.kafka
def test_transactional_producer_waits_for_all_replicas_and_is_idempotent(
    kafka_bootstrap: str, recorded: list[dict[str, Any]]
) -> None:
    t = KafkaTransport(kafka_bootstrap)
    topic = f"test-producer-config-{uuid.uuid4().hex[:8]}"
    t.create_topic(topic)
    consumer = t.consume(topic, f"g-{topic}")
    try:
        consumer._tx_producer()
        assert len(recorded) == 1
        _durable(recorded[0])
        assert recorded[0]["transactional_id"]
    finally:
        consumer._producer = None
        consumer.close()
        t.close()


@pytest.mark.kafka
def test_real_producer_runs_with_acks_all_and_idempotence(kafka_bootstrap: str) -> None:
    """kafka-python itself, not only our arguments: its resolved config (acks "all" becomes -1)."""
    t = KafkaTransport(kafka_bootstrap)
    try:
        cfg = t._producer_client().config
        assert cfg["acks"] in (-1, "all") and cfg["enable_idempotence"] is True
    finally:
        t.close()
