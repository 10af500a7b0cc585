"""One log line per broker state change (issue 31: 14-21 ERROR lines from kafka-python per broker restart).

The unit test feeds :class:`BrokerStateLog` the records kafka-python 3.0.12 logged while a broker was stopped
(kafka-python names the broker by node id there; the filter learns the node ids' addresses first). The Kafka test restarts a broker of its own under a producer, a group consumer
and an admin client of one process, and counts what reaches the log.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ldp_cli.broker import BrokerConfig, default_home, down, up
from pipeline.transport.kafka_logs import LOGGER, BrokerStateLog, install
from tests.support.pipeline_procs import free_port

A = "127.0.0.1:56419"
B = "127.0.0.1:56417"
UP = "<KafkaConnection node_id=%s host=[%s<-51280] broker_version=(4, 1) (connected)>"
DOWN = "<KafkaConnection node_id=%s broker_version=(4, 1) (disconnected)>"
REFUSED = "KafkaConnectionError: 111 ECONNREFUSED"
# where the clients' nodes are (the connection manager says so before each connection attempt)
WHERE = [
    ("kafka.net.manager", logging.INFO, "Initializing connection for node_id %s at %s:%s (rack=%s)", (n, *a, None))
    for n, a in (("1", ("127.0.0.1", 56419)), ("coordinator-3", ("127.0.0.1", 56417)))
]
WHERE.append(
    (
        "kafka.net.manager",
        logging.INFO,
        "Attempting bootstrap to %s at %s:%s (rack %s)",
        ("bootstrap-0", "127.0.0.1", 56419, None),
    )
)
# what kafka-python 3.0.12 logged while the broker of tests/pipeline/test_kafka_logs.py was stopped, per client
SEEN = [
    (
        "kafka.net.connection",
        logging.ERROR,
        "%s: Connection lost: %s",
        (DOWN % 1, "KafkaConnectionError: socket disconnected"),
    ),
    ("kafka.net.transport", logging.ERROR, "%s: socket disconnected", ("<KafkaTCPTransport [none] (closed)>",)),
    ("kafka.cluster", logging.WARNING, "No node available for metadata refresh - backoff/retry", ()),
    ("kafka.net.manager", logging.ERROR, "Connection failed: %s", (REFUSED,)),
    ("kafka.net.connection", logging.ERROR, "%s: Connection lost: %s", (DOWN % 1, REFUSED)),
    ("kafka.cluster", logging.ERROR, "Metadata refresh: failed %s", (REFUSED,)),
    (
        "kafka.coordinator",
        logging.ERROR,
        "Error sending %s to node %s [%s]",
        ("HeartbeatRequest", "coordinator-3", REFUSED),
    ),
    (
        "kafka.coordinator",
        logging.WARNING,
        "Marking the coordinator dead (node %s) for group %s: %s.",
        ("coordinator-3", "g", REFUSED),
    ),
    (
        "kafka.producer.sender",
        logging.WARNING,
        "%s: Got an exception when trying to find a node to send a "
        "transactional request to. Going to back off and retry: %s",
        ("<Sender>", "KafkaConnectionError: Connection to coordinator-3 failed."),
    ),
    # once the broker is back, before its group coordinator has loaded: expected, retried
    (
        "kafka.coordinator.heartbeat",
        logging.WARNING,
        "Heartbeat failed for group %s: coordinator (node %s) is either not started or not valid",
        ("g", "coordinator-3"),
    ),
    (
        "kafka.coordinator",
        logging.ERROR,
        "Unknown error fetching offsets for %s: %s",
        ("t-0", "UnstableOffsetCommitError"),
    ),
    # kafka-python 3's IO thread on a loaded machine (failed tests/e2e/test_broker_startup.py once in CI)
    (
        "kafka.net.selector",
        logging.WARNING,
        "Task %s ran for %.3fs (>%.3fs threshold). It is blocking the event loop -- likely a tight sync loop "
        "inside a coroutine. Other pollers will time out.",
        ("<kafka.net.selector.Task object at 0x7f>", 0.106, 0.1),
    ),
    # a client made while the broker is down (tests/e2e/test_broker_startup.py)
    ("kafka.net.manager", logging.WARNING, "Bootstrap %s not ready; waiting %.2f secs", ("bootstrap-0", 0.09)),
    ("kafka.net.manager", logging.ERROR, "Bootstrap failed: %s", ("KafkaTimeoutError: Unable to bootstrap from " + A,)),
]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _record(name: str, level: int, msg: str, args: tuple[object, ...]) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_an_idle_close_announces_nothing() -> None:
    """Brokers close idle connections (connections.max.idle.ms) and the client reconnects at once: that is no
    state change. A CI run saw 'unreachable' and 'reachable again after 0.0 s' for one before a real restart."""
    f = BrokerStateLog(clock=lambda: 0.0)
    handler = _Lines()
    ours = logging.getLogger(LOGGER)
    ours.addHandler(handler)
    try:
        for where in WHERE:
            f.filter(_record(*where))
        # the broker closes an idle connection and the client reconnects: kafka-python says so at INFO
        f.filter(_record("kafka.net.manager", logging.INFO, "Closing idle connection to node %s", ("1",)))
        f.filter(_record("kafka.net.connection", logging.INFO, "%s: Connection closed", (DOWN % 1,)))
        f.filter(_record("kafka.net.connection", logging.INFO, "%s: Connected", (UP % (1, A),)))
        assert handler.records == [] and f.down == {}
    finally:
        ours.removeHandler(handler)


def test_a_burst_of_lost_connections_is_one_line_per_broker_and_one_when_it_is_back() -> None:
    now = [100.0]
    f = BrokerStateLog(clock=lambda: now[0])
    handler = _Lines()
    ours = logging.getLogger(LOGGER)
    ours.addHandler(handler)
    # the filter admits other records at the `kafka` logger's own level, which another test in this process
    # may have raised (ldp demo sets it to ERROR): hold it at WARNING here
    kafka_logger = logging.getLogger("kafka")
    level = kafka_logger.level
    kafka_logger.setLevel(logging.WARNING)
    try:
        for where in WHERE:
            f.filter(_record(*where))
        passed = [r for r in (_record(*s) for s in SEEN * 3) if f.filter(r)]  # three clients, same burst
        assert passed == []  # none of kafka-python's records goes on
        lines = [r.getMessage() for r in handler.records]
        assert lines == [
            f"Kafka broker {A} is unreachable (KafkaConnectionError: socket disconnected); "
            "the clients retry at least every second",
            f"Kafka broker {B} is unreachable (Error sending HeartbeatRequest to node coordinator-3 [{REFUSED}]); "
            "the clients retry at least every second",
        ]  # one per broker address that went away
        now[0] = 104.5
        back = _record("kafka.net.connection", logging.INFO, "%s: Connected", (UP % (1, A),))
        f.filter(back)
        f.filter(back)  # every client reconnects: still one line
        assert [r.getMessage() for r in handler.records[2:]] == [f"Kafka broker {A} is reachable again after 4.5 s"]
        assert all(r.levelno == logging.WARNING for r in handler.records)
        # what says nothing about a lost connection passes, at its level
        other = _record(
            "kafka.coordinator", logging.WARNING, "Heartbeat failed for group %s because it is rebalancing", ("g",)
        )
        assert f.filter(other)
        # and a broker lost again is said again
        f.filter(_record(*SEEN[4]))
        assert handler.records[-1].getMessage().startswith(f"Kafka broker {A} is unreachable ({REFUSED})")
    finally:
        ours.removeHandler(handler)
        kafka_logger.setLevel(level)


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerConfig]:
    shared = BrokerConfig.from_home(default_home())  # the jars of the project's broker (`ldp kafka up`)
    assert any(shared.libs.glob("kafka_*.jar")), f"no Kafka jars in {shared.libs}: run `.venv/bin/ldp kafka up`"
    cfg = BrokerConfig(
        home=tmp_path / "kafka", port=free_port(), controller_port=free_port(), heap="256m", lib_dir=shared.libs
    )
    up(cfg, timeout=120)
    yield cfg
    down(cfg, grace=10, purge=True)
    shutil.rmtree(tmp_path / "kafka", ignore_errors=True)


@pytest.mark.kafka
def test_a_broker_restart_logs_one_line_when_it_goes_and_one_when_it_is_back(own_broker: BrokerConfig) -> None:
    from pipeline.transport import open_transport

    install()
    handler = _Lines()
    root, kafka_logger = logging.getLogger(), logging.getLogger("kafka")
    old = kafka_logger.level
    kafka_logger.setLevel(logging.WARNING)  # as `ldp ... --log-level info` holds it (ldp_cli.options.setup_logging)
    root.addHandler(handler)
    topic = f"ldp.logs.{uuid.uuid4().hex[:8]}"
    t = open_transport(f"kafka://{own_broker.bootstrap}", request_timeout=5.0)
    try:
        t.create_topic(topic, 2)
        consumer = t.consume([topic], f"g-{topic}", member="m-0", session_timeout=3.0)
        t.publish_many(topic, [(b"k", b"before")])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(timeout=0.5)]
        assert got == [b"before"]
        start = len(handler.records)
        down(own_broker, grace=30)  # a clean stop: every client's connections drop
        end = time.monotonic() + 4
        while time.monotonic() < end:  # the clients keep working meanwhile: polls and a publish that fails
            consumer.poll(timeout=0.5)
        up(own_broker, timeout=120)
        t.publish_many(topic, [(b"k", b"after")])
        deadline = time.monotonic() + 60
        while b"after" not in got and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(timeout=0.5)]
        assert got[-1] == b"after"
        consumer.close()
    finally:
        t.close()
        root.removeHandler(handler)
        kafka_logger.setLevel(old)
    lines = handler.records[start:]
    shown = [f"{r.name} {r.levelname} {r.getMessage()}" for r in lines if r.levelno >= logging.WARNING]
    assert not [s for s in shown if s.startswith("kafka")], "\n".join(shown)  # kafka-python's own: none
    gone = [s for s in shown if f"Kafka broker {own_broker.bootstrap} is unreachable" in s]
    back = [s for s in shown if f"Kafka broker {own_broker.bootstrap} is reachable again" in s]
    assert (len(gone), len(back)) == (1, 1), "\n".join(shown)


def test_leaving_a_group_the_broker_already_left_is_one_info_line() -> None:
    """A member expelled while stalled (session expired) then closes: kafka-python 3 logs the LeaveGroup's
    UnknownMemberIdError as an ERROR, though there is nothing left to leave. One INFO line of ours instead."""
    import kafka.errors

    f = BrokerStateLog(clock=lambda: 0.0)
    handler = _Lines()
    ours = logging.getLogger(LOGGER)
    ours.addHandler(handler)
    level = ours.level
    ours.setLevel(logging.INFO)
    try:
        error = kafka.errors.UnknownMemberIdError()
        passed = [
            f.filter(
                _record(
                    "kafka.coordinator.base",
                    logging.ERROR,
                    "LeaveGroup request for group %s failed with error: %s",
                    ("ldp-estimator", error),
                )
            ),
            f.filter(
                _record(
                    "kafka.coordinator.base",
                    logging.ERROR,
                    "LeaveGroup request for member %s / group instance %s failed with error: %s",
                    ("m-1", "est-0", error),
                )
            ),
        ]
        # another LeaveGroup failure is no expected event: it passes unchanged
        other = _record(
            "kafka.coordinator.base",
            logging.ERROR,
            "LeaveGroup request for group %s failed with error: %s",
            ("g", kafka.errors.GroupAuthorizationFailedError()),
        )
        assert passed == [False, False] and f.filter(other)
        assert [(r.levelno, r.getMessage()) for r in handler.records] == [
            (
                logging.INFO,
                "left group ldp-estimator: the broker had already removed this member (its session expired)",
            ),
            (
                logging.INFO,
                "left its group (member m-1, instance est-0): the broker had already removed this member "
                "(its session expired)",
            ),
        ]
    finally:
        ours.setLevel(level)
        ours.removeHandler(handler)
