"""The transport contract against the Kafka broker started by ``ldp kafka up``."""

from __future__ import annotations

import pytest

from pipeline.transport.base import TopicError
from tests.support.transport_contract import TransportContract

pytestmark = pytest.mark.kafka


class TestKafkaTransport(TransportContract):
    @pytest.fixture
    def transport_url(self, kafka_bootstrap: str) -> str:
        return f"kafka://{kafka_bootstrap}"


# -- what only the Kafka transport does ------------------------------------------------------


def test_records_carry_the_start_of_their_utc_day_not_the_send_time(kafka_bootstrap: str) -> None:
    """Kafka would store each record's send time (CreateTime); the transport sends the start of the UTC day,
    on the plain and the transactional path, and the broker keeps it (``log.message.timestamp.type=CreateTime``)."""
    import math
    import uuid

    from kafka import KafkaConsumer as RawConsumer

    from pipeline.transport.kafka import KafkaTransport

    day = 20_000 * 86400.0
    t = KafkaTransport(kafka_bootstrap, clock=lambda: day + 45_678.9)
    topic = f"ts-{uuid.uuid4().hex[:8]}"
    # kept for ever: the records' day lies years back, and a time retention would let the broker's retention
    # check delete them (whenever it happens to run) before they are read back
    t.create_topic(topic, 1, retention=math.inf)
    t.publish(topic, b"k", b"plain")
    with t.consume(topic, f"g-{topic}") as c:
        assert [r.value for r in c.records(idle_timeout=2.0)] == [b"plain"]
        with c.transaction() as tx:
            tx.publish(topic, b"k", b"transactional")
    t.close()
    raw = RawConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        consumer_timeout_ms=5000,
        enable_auto_commit=False,
    )
    got = [(m.value, m.timestamp, m.timestamp_type) for m in raw]
    raw.close()
    assert got == [(b"plain", int(day) * 1000, 0), (b"transactional", int(day) * 1000, 0)]


def test_topic_retention_reaches_the_broker(kafka_bootstrap: str) -> None:
    import math
    import uuid

    from kafka.admin import ConfigResource, ConfigResourceType

    from pipeline.transport.kafka import KafkaTransport

    t = KafkaTransport(kafka_bootstrap, retention=3 * 86400.0)
    names = {f"ret-{k}-{uuid.uuid4().hex[:8]}": k for k in ("default", "forever", "hour")}
    for name, kind in names.items():
        t.create_topic(name, 1, retention={"default": None, "forever": math.inf, "hour": 3600.0}[kind])
    segmented = f"seg-{uuid.uuid4().hex[:8]}"
    t.create_topic(segmented, 1, retention=math.inf, segment=600.0)
    with pytest.raises(TopicError, match="segment"):
        t.create_topic(f"seg-bad-{uuid.uuid4().hex[:8]}", 1, segment=0.5)
    admin = t._admin_client()
    res = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, n) for n in [*names, segmented]], config_filter="all"
    )
    seen = {names.get(n, n): cfg["retention.ms"]["value"] for n, cfg in res["topic"].items()}
    segments = {n: cfg["segment.ms"]["value"] for n, cfg in res["topic"].items()}
    t.close()
    assert seen == {"default": str(3 * 86400 * 1000), "forever": "-1", "hour": "3600000", segmented: "-1"}
    # superseded checkpoints leave the broker's disk once their segment rolls: 10 minutes, not the 7-day default
    assert segments[segmented] == "600000" and {segments[n] for n in names} == {str(7 * 86400 * 1000)}


def test_a_join_that_completes_between_two_polls_is_taken_up_not_sent_again(kafka_bootstrap: str) -> None:
    """The leader's join round completes while its thread is between two polls (descheduled, or processing
    records): its next poll takes that assignment. kafka-python 3.0.12 alone sends a new JoinGroup instead,
    and the coordinator rebalances a stable group whenever its leader rejoins: b, which had read records of its
    new partition meanwhile, lost them (its generation went to 1) and read them a second time."""
    import threading
    import time
    import uuid

    from pipeline.transport import Consumer
    from pipeline.transport.kafka import KafkaConsumer, KafkaTransport
    from tests.support.transport_contract import SESSION, drain, group_state

    t = KafkaTransport(kafka_bootstrap)
    topic, group = f"join-{uuid.uuid4().hex[:8]}", f"g-join-{uuid.uuid4().hex[:8]}"
    t.create_topic(topic, 2)
    t.publish_many(topic, [(f"k{i}".encode(), b"first") for i in range(10)])
    a = t.consume(topic, group, member="a", session_timeout=SESSION)
    b = t.consume(topic, group, member="b", session_timeout=SESSION)
    assert isinstance(a, KafkaConsumer)
    got: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
    owns: dict[str, set[int]] = {"a": set(), "b": set()}
    halt = threading.Event()
    errors: list[BaseException] = []

    def run(c: Consumer, name: str) -> None:
        try:
            while not halt.is_set():
                got[name].extend((r.partition, r.offset) for r in c.poll(timeout=0.1))
                owns[name] = {tp.partition for tp in c.assignment()}
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        drain([a], 10)
        a.commit()  # a alone leads the group with nothing uncommitted
        threads = {"b": threading.Thread(target=run, args=(b, "b"), daemon=True)}
        threads["b"].start()  # b joins; a hears of the rebalance at its next heartbeat
        end = time.monotonic() + 30
        while not a._joining():  # the round is in flight once a poll started it and returned at once
            assert time.monotonic() < end, "a never started to rejoin after b joined"
            a._consumer.poll(timeout_ms=0)
            time.sleep(0.02)
        # a's thread stays away; its round completes on kafka-python's IO thread and b reads its new partition
        second = t.publish_many(topic, [(f"k{i}".encode(), b"second") for i in range(10, 30)])
        while len(owns["b"]) != 1 or len(got["b"]) < sum(1 for p in second if p.partition in owns["b"]):
            assert time.monotonic() < end, f"b got {got['b']} of its partition(s) {owns['b']}"
            time.sleep(0.05)
        threads["a"] = threading.Thread(target=run, args=(a, "a"), daemon=True)
        threads["a"].start()
        while len(got["a"]) + len(got["b"]) < len(second):
            assert time.monotonic() < end, f"records so far: {got}"
            time.sleep(0.05)
        time.sleep(2 * SESSION / 3)  # a second rebalance, if a rejoined, has come by now (b heartbeats this often)
        halt.set()
        for th in threads.values():
            th.join(timeout=30)
        assert not errors, errors
        assert (a.generation, b.generation) == (0, 0), group_state(a, b)
        assert sorted(got["a"] + got["b"]) == sorted((p.partition, p.offset) for p in second), got
    finally:
        halt.set()
        a.close()
        b.close()
        t.close()


def test_a_publish_right_after_creating_a_topic_asks_no_broker_again(kafka_bootstrap: str) -> None:
    """In a cluster, the broker a metadata request reaches may not have heard of a topic created a moment ago
    (tests/cli/test_kafka_cluster.py once failed so). ``create_topic`` saw every partition's leader: a
    publish that follows takes the partition count from there, even if a broker would now call it missing."""
    import uuid

    from pipeline.transport.kafka import KafkaTransport

    t = KafkaTransport(kafka_bootstrap)
    try:
        topic = f"fresh-{uuid.uuid4().hex[:8]}"
        t.create_topic(topic, 3)
        t._describe = lambda name: None  # type: ignore[method-assign]  # a broker behind on metadata
        positions = t.publish_many(topic, [(f"k{i}".encode(), b"v") for i in range(9)])
        assert len(positions) == 9 and {p.partition for p in positions} <= {0, 1, 2}
    finally:
        t.close()
