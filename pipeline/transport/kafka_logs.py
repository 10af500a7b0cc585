"""One log line per broker state change instead of kafka-python's burst of errors.

A broker that stops (a restart, a node of a cluster killed) is an expected event, but every kafka-python
client of a process then logs it on its own: the connection (``kafka.conn``: "socket disconnected",
"Closing connection", "Connect attempt ... returned error 111"), the client ("Node 3 connection failed --
refreshing metadata"), the fetcher ("Fetch to node 3 failed"), the group coordinator ("Error sending
HeartbeatRequest ... Cancelled", "Marking the coordinator dead"), the transactional sender; 14-21 ERROR
lines per restart were counted in issue 31's chaos runs, and more for every reconnect attempt.

:class:`BrokerStateLog`, installed on every ``kafka.*`` logger by :func:`install` (the Kafka transport does it
when it is created), drops those records and logs instead, through the logger ``pipeline.transport.kafka``:

* ``Kafka broker H:P is unreachable (<the first error>); the clients retry at least every second``
  (WARNING), once when a broker goes from reachable to unreachable in this process;
* ``Kafka broker H:P is reachable again after S s`` (WARNING, so that the pair shows at the services' default
  level), once when a connection to it completes again.

The collector's publishing producer is librdkafka's (:mod:`pipeline.transport.kafka_producer`): it reports
to the same filter through :meth:`BrokerStateLog.lost` and :meth:`BrokerStateLog.up`, so a broker is said to
be gone or back once per process whichever client noticed first.

Records that say nothing about a lost connection pass unchanged. The state is per broker address and per
process, shared by every client of the process (producer, consumers, admin). ``kafka.conn`` is set to INFO so
that the filter sees "Connection complete"; its INFO records go on only where the ``kafka`` logger's own level
admits them (``--log-level debug``).
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
    r"KafkaConnectionError|socket disconnected|[Cc]onnection refused|connection failed|Cancelled|NodeNotReady"
    r"|Marking the coordinator|Closing connection|[Cc]onnect attempt|Errno 111|Connection reset|Broken pipe"
    r"|Unable to connect|NoBrokersAvailable|to find a node|No node available|Error receiving network data"
)
#: kafka-python's words when the broker closes a connection that had nothing in flight (an idle close)
_IDLE_CLOSE = "without in-flight-requests"
#: the broker's address in a ``BrokerConnection`` repr: ``... host=127.0.0.1:9092 <connected> ...``
_ADDRESS = re.compile(r"host=([^\s<>\]]+)")


class BrokerStateLog(logging.Filter):
    """Turns kafka-python's records about lost connections into one line per broker state change."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.down: dict[str, float] = {}  # address -> when it was found unreachable
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(LOGGER):  # our own lines (the filter may sit on a handler too)
            return True
        msg = record.getMessage()
        found = _ADDRESS.search(msg)
        address = found.group(1) if found else None
        if "Connection complete" in msg:
            if address is not None:
                self.up(address)
            return _admitted(record)
        if _IDLE_CLOSE in msg:
            # the broker closed an idle connection (connections.max.idle.ms) and the client reconnects at once:
            # no state change to announce. A broker that is really gone shows in the reconnect's refusal next.
            return False
        if record.levelno >= logging.WARNING and _LOST.search(msg):
            if address is not None:
                self.lost(address, _reason(msg, record))
            return False
        return _admitted(record)

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
    if record.exc_info and record.exc_info[1] is not None:
        text = f"{text}: {record.exc_info[1]!r}"
    return text.strip()[:160]


def _admitted(record: logging.LogRecord) -> bool:
    """Whether the ``kafka`` logger's own level lets the record through (``kafka.conn`` is held lower)."""
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
        conn = logging.getLogger("kafka.conn")
        if conn.level == logging.NOTSET or conn.level > logging.INFO:
            conn.setLevel(logging.INFO)  # "Connection complete" is INFO: the filter must see it
        return _installed
