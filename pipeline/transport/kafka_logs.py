"""One log line per broker state change instead of kafka-python's burst of errors.

A broker that stops (a restart, a node of a cluster killed) is an expected event, but every kafka-python
client of a process then logs it on its own: the connection (``kafka.net.connection``: "Connection lost:
KafkaConnectionError: socket disconnected", then "... 111 ECONNREFUSED" for every reconnect attempt), the
connection manager ("Connection failed"), the metadata refresh (``kafka.cluster``: "No node available for
metadata refresh", "Metadata refresh: failed"), the group coordinator ("Error sending HeartbeatRequest ...",
"Marking the coordinator dead", and once the broker is back "coordinator ... is either not started or not
valid"), the transactional sender; 14-21 ERROR lines per restart were counted in issue 31's chaos runs
(kafka-python 2.3), and 144 WARNING and ERROR lines (89 ERROR) for a 4 s stop with kafka-python 3.0.12.

:class:`BrokerStateLog`, installed on every ``kafka.*`` logger by :func:`install` (the Kafka transport does it
when it is created), drops those records and logs instead, through the logger ``pipeline.transport.kafka``:

* ``Kafka broker H:P is unreachable (<the first error>); the clients retry at least every second``
  (WARNING), once when a broker goes from reachable to unreachable in this process;
* ``Kafka broker H:P is reachable again after S s`` (WARNING, so that the pair shows at the services' default
  level), once when a connection to it completes again.

The collector's publishing producer is librdkafka's (:mod:`pipeline.transport.kafka_producer`): it reports
to the same filter through :meth:`BrokerStateLog.lost` and :meth:`BrokerStateLog.up`, so a broker is said to
be gone or back once per process whichever client noticed first.

kafka-python 3 names a broker by node id in most of these lines ("node_id=1", "to node coordinator-1"); the
filter learns each node id's address from the connection manager's "Initializing connection for node_id 1 at
H:P". A stable-offset fetch that waits for a transaction's markers (``UnstableOffsetCommitError``, retried by
kafka-python, logged as an ERROR) is no failure either: it is dropped.

Records that say nothing about a lost connection pass unchanged. The state is per broker address and per
process, shared by every client of the process (producer, consumers, admin). ``kafka.net.connection`` and
``kafka.net.manager`` are set to INFO so that the filter sees "Connected" and "Initializing connection"; their
INFO records go on only where the ``kafka`` logger's own level admits them (``--log-level debug``).

A group member that the broker already removed (its session expired: a stalled or paused process) and that then
closes gets "LeaveGroup request ... failed with error: UnknownMemberIdError" from kafka-python 3 as an ERROR,
although there is nothing left to leave. It becomes one INFO line of ``pipeline.transport.kafka`` saying so.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

__all__ = ["BrokerStateLog", "install", "LOGGER"]

#: the logger the state lines go to
LOGGER = "pipeline.transport.kafka"

#: kafka-python's words for a connection to a broker that is gone or refused
_LOST = re.compile(
    r"KafkaConnectionError|socket disconnected|[Cc]onnection refused|[Cc]onnection failed|Cancelled|NodeNotReady"
    r"|Closing connection|[Cc]onnect attempt|ECONNREFUSED|Connection reset|Broken pipe"
    r"|Unable to connect|NoBrokersAvailable|to find a node|No node available|Error receiving network data"
    r"|Connection lost|Metadata refresh: failed|Heartbeat session expired"
    r"|Bootstrap \S+ not ready|[Bb]ootstrap failed|Unable to bootstrap|Bootstrap (?:connection|attempt) to"
)
#: expected and retried, not about a lost connection: dropped without a state change (a group coordinator that
#: moved or is still loading after a broker restart; a stable-offset fetch waiting for a transaction's markers;
#: kafka-python 3's IO thread noting that one of its own tasks ran over 0.1 s, as on a loaded machine)
_QUIET = re.compile(
    r"UnstableOffsetCommit|is either not started or not valid|NotCoordinator|CoordinatorNotAvailable"
    r"|CoordinatorLoadInProgress|metadata response has no brokers|It is blocking the event loop"
)
#: kafka-python's words when the broker closes a connection that had nothing in flight (an idle close)
_IDLE_CLOSE = "without in-flight-requests"
#: the broker's address in a connection's repr: ``host=[127.0.0.1:9092<-51280]`` (the peer, then the local port)
_ADDRESS = re.compile(r"host=\[?([^\s<>\[\]]+)")
#: a node id in kafka-python 3's lines: ``<KafkaConnection node_id=1 ...``, ``to node coordinator-1``, ``(node 1)``
_NODE = re.compile(r"node_id=([^\s>]+)|\bnode ([A-Za-z0-9_-]+)|\b(bootstrap-\d+)\b")
#: the connection manager saying where a node is: ``Initializing connection for node_id 1 at 127.0.0.1:9092``
_NODE_AT = re.compile(r"(?:Initializing connection for node_id|Attempting bootstrap to) (\S+) at (\S+?)(?: \(|$)")
#: a member leaving a group the broker had already removed it from (kafka-python 3 logs it as an ERROR)
_LEFT_ALREADY = re.compile(
    r"LeaveGroup request for (?:group (?P<group>\S+)|member (?P<member>\S+) / group instance (?P<instance>\S+))"
    r" failed.*UnknownMemberId"
)
#: the lines that say a connection is up (kafka-python 3's "Connected", 2.3's "Connection complete")
_UP = re.compile(r": Connected$|Connection complete")


class BrokerStateLog(logging.Filter):
    """Turns kafka-python's records about lost connections into one line per broker state change."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.down: dict[str, float] = {}  # address -> when it was found unreachable
        self.nodes: dict[str, str] = {}  # node id -> address, as the connection manager said
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(LOGGER):  # our own lines (the filter may sit on a handler too)
            return True
        msg = record.getMessage()
        at = _NODE_AT.search(msg)
        if at is not None:
            self.nodes[at.group(1)] = at.group(2)
            return _admitted(record)
        address = self._address(msg)
        if _UP.search(msg):
            if address is not None:
                self.up(address)
            return _admitted(record)
        if _IDLE_CLOSE in msg:
            # the broker closed an idle connection (connections.max.idle.ms) and the client reconnects at once:
            # no state change to announce. A broker that is really gone shows in the reconnect's refusal next.
            return False
        if _QUIET.search(msg):
            return record.levelno < logging.WARNING and _admitted(record)
        left = _LEFT_ALREADY.search(msg)
        if left is not None:
            who = (
                f"group {left['group']}"
                if left["group"]
                else f"its group (member {left['member']}, instance {left['instance']})"
            )
            logging.getLogger(LOGGER).info(
                "left %s: the broker had already removed this member (its session expired)", who
            )
            return False
        if record.levelno >= logging.WARNING and _LOST.search(msg):
            if address is not None:
                self.lost(address, _reason(msg, record))
            return False
        return _admitted(record)

    def _address(self, msg: str) -> str | None:
        """The broker's address in a record: its connection's peer, else its node id's known address."""
        found = _ADDRESS.search(msg)
        if found is not None and found.group(1) != "none":
            return found.group(1)
        node = _NODE.search(msg)
        if node is None:
            return None
        return self.nodes.get(node.group(1) or node.group(2) or node.group(3))

    def lost(self, address: str, reason: str) -> None:
        """Say once that the broker at ``address`` is unreachable (and why); nothing if it is known to be."""
        with self._lock:
            if address in self.down:
                return
            self.down[address] = self.clock()
        logging.getLogger(LOGGER).warning(
            "Kafka broker %s is unreachable (%s); the clients retry at least every second", address, reason
        )

    def up(self, address: str) -> None:
        """Say once that the broker at ``address`` is reachable again; nothing if it was not known to be down."""
        with self._lock:
            since = self.down.pop(address, None)
        if since is not None:
            logging.getLogger(LOGGER).warning(
                "Kafka broker %s is reachable again after %.1f s", address, max(0.0, self.clock() - since)
            )


def _reason(msg: str, record: logging.LogRecord) -> str:
    """The error of the first record, without the connection's repr."""
    text = msg.rsplit(">: ", 1)[-1] if ">: " in msg else msg
    text = text.removeprefix("Connection lost: ")
    if record.exc_info and record.exc_info[1] is not None:
        text = f"{text}: {record.exc_info[1]!r}"
    return text.strip()[:160]


def _admitted(record: logging.LogRecord) -> bool:
    """Whether the ``kafka`` logger's own level lets the record through (``kafka.net.*`` is held lower)."""
    return record.levelno >= logging.getLogger("kafka").getEffectiveLevel()


_installed: BrokerStateLog | None = None
_install_lock = threading.Lock()


def install() -> BrokerStateLog:
    """Put one :class:`BrokerStateLog` on every ``kafka.*`` logger (kafka-python is imported first, so that its
    loggers exist); idempotent. Returns the filter."""
    global _installed
    import kafka  # noqa: F401 - creates kafka-python's module loggers

    with _install_lock:
        if _installed is None:
            _installed = BrokerStateLog()
        names = [n for n in logging.Logger.manager.loggerDict if n == "kafka" or n.startswith("kafka.")]
        for name in names:
            logger = logging.getLogger(name)
            if _installed not in logger.filters:
                logger.addFilter(_installed)
        for name in ("kafka.net.connection", "kafka.net.manager"):
            logger = logging.getLogger(name)
            if logger.level == logging.NOTSET or logger.level > logging.INFO:
                logger.setLevel(
                    logging.INFO
                )  # "Connected", "Initializing connection" are INFO: the filter must see them
        return _installed
