"""The Kafka transport's publishing producer, on librdkafka (``confluent-kafka``).

Why not kafka-python here: under the collector's load (thousands of uploads a second, each one record)
kafka-python's producer is pure Python: it builds each record batch, computes its CRC, runs its network
thread's selector loop and completes one future per record in Python, all holding the interpreter lock
that the collector's event loop needs. That was about a third of the collector's CPU per report (issue
31). librdkafka does all of it in C threads that never hold the lock; what remains in Python per record
is the ``produce()`` call and its delivery callback.

What it keeps of the kafka-python producer it replaces:

* **durability**: ``acks=all`` and ``enable.idempotence`` (librdkafka refuses idempotence with any other
  ``acks``), so :meth:`RdkafkaProducer.publish` returns only once every in-sync replica has each record,
  and librdkafka's retries cannot duplicate one (KIP-98); ``message.timeout.ms`` bounds the wait;
* **prompt reconnects**: ``reconnect.backoff.max.ms`` 1 s, as for the kafka-python clients;
* **one log line per broker state change**: librdkafka's own log lines and error callbacks about lost
  connections go to the process's :class:`~pipeline.transport.kafka_logs.BrokerStateLog` (shared with the
  kafka-python clients), which says once that a broker is unreachable; librdkafka logs nothing when it
  connects again, so its statistics (once a second, ``statistics.interval.ms``) tell when a broker is
  ``UP`` again. Idle closes by the broker are not logged (``log.connection.close`` off).

A thread of the transport serves librdkafka's callbacks (``poll``); :meth:`RdkafkaProducer.publish` waits
on an event its last delivery report sets.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipeline.transport.base import TransportError
from pipeline.transport.kafka_logs import BrokerStateLog

__all__ = ["RdkafkaProducer", "RdkafkaLog", "rdkafka_settings"]

#: the logger librdkafka's other lines go to (under ``kafka``, so ``--log-level`` treats them as kafka-python's)
RDKAFKA_LOGGER = "kafka.rdkafka"

#: librdkafka's words for a connection to a broker that is gone or refused
_LOST = re.compile(
    r"Connect to .* failed|Connection refused|Disconnected|[Rr]eceive failed|[Ss]end failed|Connection reset"
    r"|Broken pipe|Failed to resolve|brokers are down|timed out|Timed out|No route to host"
)
#: a broker in librdkafka's words: ``127.0.0.1:9092/1:`` (node id) or ``127.0.0.1:9092/bootstrap:``
_BROKER = re.compile(r"(?:^|[\s\]])((?:\[[0-9a-fA-F:]+\]|[\w.\-]+):\d+)/(?:\d+|bootstrap)\b")
#: the thread prefix of a librdkafka log line: ``[thrd:127.0.0.1:9092/bootstrap]: ``
_THREAD = re.compile(r"^\[thrd:[^\]]*\]:\s*")


def rdkafka_settings(
    bootstrap: str,
    client_id: str,
    request_timeout: float,
    max_request_size: int,
    reconnect_backoff_max_ms: int,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The publishing producer's librdkafka configuration (``extra`` last, unchanged)."""
    ms = max(1000, int(request_timeout * 1000))
    cfg: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 2,
        "batch.size": 1 << 20,
        "message.max.bytes": max_request_size,
        "request.timeout.ms": ms,
        "message.timeout.ms": ms,  # a record not acknowledged by then fails (kafka-python's future timed out)
        "allow.auto.create.topics": False,
        "reconnect.backoff.ms": 100,
        "reconnect.backoff.max.ms": reconnect_backoff_max_ms,
        "log.connection.close": False,
        "statistics.interval.ms": 1000,
    }
    cfg.update(extra or {})
    return cfg


def _broker(text: str) -> str | None:
    found = _BROKER.search(text)
    return found.group(1) if found else None


class RdkafkaLog:
    """librdkafka's ``logger``: lines about a lost connection become :class:`BrokerStateLog` state changes,
    the rest go to the ``kafka.rdkafka`` logger at their level."""

    def __init__(self, state: BrokerStateLog) -> None:
        self.state = state
        self.logger = logging.getLogger(RDKAFKA_LOGGER)

    def log(self, level: int, fmt: str, *args: Any) -> None:
        msg = fmt % args if args else fmt
        if level >= logging.WARNING and _LOST.search(msg):
            text = msg.split("] ", 1)[-1] if msg.startswith(("FAIL", "ERROR")) else msg
            self.lost(_THREAD.sub("", text))
            return
        self.logger.log(level, "%s", msg)

    def lost(self, text: str) -> None:
        address = _broker(text)
        if address is not None:
            self.state.lost(address, text[:160])
        # "1/1 brokers are down" names no broker: the per-broker lines say it


class RdkafkaProducer:
    """An idempotent librdkafka producer with ``acks=all`` and a thread serving its callbacks."""

    def __init__(self, config: Mapping[str, Any], state: BrokerStateLog, *, timeout: float) -> None:
        from confluent_kafka import Producer

        self.timeout = float(timeout)
        self._log = RdkafkaLog(state)
        self._state = state
        self._fatal: str | None = None
        #: the last statistics librdkafka reported (a dict of its JSON), for tests and diagnostics
        self.last_stats: dict[str, Any] | None = None
        self.config = dict(config)
        self._producer = Producer(
            {**self.config, "logger": self._log, "error_cb": self._on_error, "stats_cb": self._on_stats}
        )
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._serve, name="ldp-kafka-producer-poll", daemon=True)
        self._poller.start()

    # -- callbacks (on the poll thread) ---------------------------------------------

    def _serve(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.5)

    def _on_error(self, err: Any) -> None:
        if err.fatal():
            self._fatal = f"{err.name()}: {err.str()}"
            logging.getLogger("pipeline.transport.kafka").error(
                "the Kafka producer hit a fatal error (%s); it is replaced at the next publish", self._fatal
            )
            return
        text = str(err.str())
        if _LOST.search(text) or err.name() in ("_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE"):
            self._log.lost(_THREAD.sub("", text))
            return
        logging.getLogger(RDKAFKA_LOGGER).warning("%s: %s", err.name(), text)

    def _on_stats(self, raw: str) -> None:
        try:
            stats = json.loads(raw)
        except ValueError:
            return
        self.last_stats = stats
        up = {b.get("nodename") for b in stats.get("brokers", {}).values() if b.get("state") == "UP"}
        for address in up:
            if address:
                self._state.up(address)

    # -- publishing -------------------------------------------------------------------

    @property
    def fatal(self) -> str | None:
        """The fatal error that made this producer unusable (a new one must replace it), or ``None``."""
        return self._fatal

    def publish(
        self, topic: str, records: Sequence[tuple[bytes | None, bytes, int]], timestamp_ms: int
    ) -> list[tuple[int, int]]:
        """Publish ``(key, value, partition)`` records; return each one's ``(partition, offset)`` once every
        in-sync replica has it. :class:`TransportError` if any is refused or not acknowledged in time."""
        if self._fatal is not None:
            raise TransportError(f"the Kafka producer is unusable: {self._fatal}")
        out: list[tuple[int, int]] = [(-1, -1)] * len(records)
        if not records:
            return out
        done = threading.Event()
        left = [len(records)]
        errors: list[str] = []
        lock = threading.Lock()

        def delivered(i: int, err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(f"{err.name()}: {err.str()}")
            else:
                out[i] = (msg.partition(), msg.offset())
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        end = time.monotonic() + self.timeout
        produce = self._producer.produce
        for i, (key, value, partition) in enumerate(records):
            while True:
                try:
                    produce(
                        topic,
                        value,
                        key,
                        partition=partition,
                        timestamp=timestamp_ms,
                        on_delivery=functools.partial(delivered, i),
                    )
                    break
                except BufferError:  # librdkafka's queue is full: the poll thread drains it
                    if time.monotonic() > end:
                        raise TransportError(f"Kafka's producer queue stayed full for {self.timeout:g} s") from None
                    time.sleep(0.005)
                except Exception as exc:  # KafkaException: unknown partition, message too large, ...
                    raise TransportError(f"Kafka refused a record for {topic!r}: {exc!r}") from exc
        # librdkafka fails each record after message.timeout.ms; the margin covers the poll thread's delay
        if not done.wait(max(0.0, end - time.monotonic()) + 5.0):
            raise TransportError(f"Kafka did not acknowledge {left[0]} record(s) on {topic!r} in {self.timeout:g} s")
        if errors:
            raise TransportError(f"Kafka did not acknowledge a record on {topic!r}: {errors[0]}")
        return out

    def publish_nowait(
        self,
        topic: str,
        records: Sequence[tuple[bytes | None, bytes, int]],
        timestamp_ms: int,
        done: Callable[[str | None], None],
    ) -> None:
        """Hand ``(key, value, partition)`` records to librdkafka without waiting (for a caller on an event
        loop): ``done(None)`` runs on the poll thread once every in-sync replica has every record,
        ``done(error)`` once the last of them is settled if any failed. :class:`TransportError` at once (and
        ``done`` never called) if librdkafka takes not all of them: its queue is full, or it refuses one;
        records taken before that may still be published. One delivery callback serves the whole group."""
        if self._fatal is not None:
            raise TransportError(f"the Kafka producer is unusable: {self._fatal}")
        if not records:
            done(None)
            return
        lock = threading.Lock()
        state: list[Any] = [len(records) + 1, None]  # records left (+1 held until all are produced), first error

        def delivered(err: Any, msg: Any) -> None:
            if err is not None and state[1] is None:
                state[1] = f"{err.name()}: {err.str()}"
            with lock:
                state[0] -= 1
                last = state[0] == 0
            if last:
                done(None if state[1] is None else f"Kafka did not acknowledge a record on {topic!r}: {state[1]}")

        produce = self._producer.produce
        try:
            for key, value, partition in records:
                produce(topic, value, key, partition=partition, timestamp=timestamp_ms, on_delivery=delivered)
        except BufferError:
            raise TransportError("Kafka's producer queue is full") from None
        except Exception as exc:  # KafkaException: unknown partition, message too large, ...
            raise TransportError(f"Kafka refused a record for {topic!r}: {exc!r}") from exc
        delivered(None, None)  # release the hold: the last delivery report (maybe this one) calls done

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (at most ``timeout`` s), then stop the poll thread and the client."""
        try:
            self._producer.flush(timeout)
        finally:
            self._closed.set()
            self._poller.join(2.0)
            try:
                self._producer.close()
            except Exception:  # noqa: BLE001 - closing what may be half gone must not hide the caller's error
                logging.getLogger("pipeline.transport.kafka").debug("closing the producer failed", exc_info=True)
