"""The producer configuration that makes the collector's 202 durable.

The collector answers 202 only after ``publish_many`` returned, so a report
accepted is only as safe as the producer's acknowledgement: ``acks="all"``
(every in-sync replica has it) and idempotence (a retried send is not written
twice). These tests record the configuration actually passed to librdkafka's
``confluent_kafka.Producer`` by the publishing producer and to
``kafka.KafkaProducer`` by the transactional one, so changing either setting
(or letting a default drift) fails here; the Kafka test asks the running
librdkafka producer itself (its statistics) whether it holds an idempotent
producer id.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import confluent_kafka
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


class _RecordingRdkafka:
    """Stands in for ``confluent_kafka.Producer``: remembers its configuration, sends nothing."""

    made: list[dict[str, Any]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        type(self).made.append(config)

    def poll(self, timeout: float) -> int:
        time.sleep(min(timeout, 0.05))
        return 0


def test_publishing_producer_waits_for_all_replicas_and_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    _RecordingRdkafka.made = []
    monkeypatch.setattr(confluent_kafka, "Producer", _RecordingRdkafka)
    t = KafkaTransport("127.0.0.1:1")  # nothing is contacted: the producer is a recorder
    try:
        t._producer_client()
        assert len(_RecordingRdkafka.made) == 1
        cfg = _RecordingRdkafka.made[0]
        assert cfg["acks"] == "all" and cfg["enable.idempotence"] is True
        assert cfg["allow.auto.create.topics"] is False
        assert cfg["reconnect.backoff.max.ms"] <= 1000  # prompt reconnects after a broker restart
        assert cfg["message.timeout.ms"] == int(t.request_timeout * 1000)  # a publish fails, never hangs
    finally:
        t._producer._closed.set()
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
    """librdkafka itself, not only our arguments: after a publish its statistics show the idempotent
    producer id the broker assigned (librdkafka refuses idempotence unless acks=all)."""
    t = KafkaTransport(kafka_bootstrap)
    topic = f"test-producer-real-{uuid.uuid4().hex[:8]}"
    try:
        t.create_topic(topic)
        [pos] = t.publish_many(topic, [(b"k", b"v")])
        assert pos.offset >= 0
        producer = t._producer_client()
        deadline = time.monotonic() + 10
        # statistics come once a second; a snapshot taken before the producer id came (the first one, on a
        # loaded machine) says "WaitTransport" although the publish above needed the id: wait for a later one
        while time.monotonic() < deadline and (
            producer.last_stats is None or producer.last_stats["eos"]["idemp_state"] != "Assigned"
        ):
            time.sleep(0.1)
        assert producer.last_stats is not None, "librdkafka reported no statistics"
        eos = producer.last_stats["eos"]
        assert eos["idemp_state"] == "Assigned" and eos["producer_id"] >= 0, eos
    finally:
        t.close()
