"""Transports between pipeline stages, chosen by URL.

==================================  ==================================================
``sqlite:///relative/path.sqlite3``  embedded log (:mod:`pipeline.transport.embedded`)
``sqlite:////absolute/path.sqlite3`` embedded log, absolute path
``kafka://host:port[,host:port]``   Kafka (:mod:`pipeline.transport.kafka`)
==================================  ==================================================

Without a URL, :func:`open_transport` reads ``$LDP_TRANSPORT`` and otherwise
opens the embedded log ``ldp-data/transport.sqlite3`` under the working
directory: no service is needed by default. Options in the URL's query
(``?synchronous=NORMAL``, ``?client_id=x``) and keyword arguments go to the
implementation's constructor; keyword arguments win.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pipeline.transport.base import (
    CommitFailedError,
    Consumer,
    FencedError,
    Health,
    Record,
    RecordPosition,
    TopicError,
    TopicPartition,
    Transaction,
    Transport,
    TransportError,
    partition_for,
)

__all__ = [
    "DEFAULT_URL",
    "open_transport",
    "Transport",
    "Health",
    "Consumer",
    "Transaction",
    "Record",
    "RecordPosition",
    "TopicPartition",
    "TransportError",
    "TopicError",
    "CommitFailedError",
    "FencedError",
    "partition_for",
]

DEFAULT_URL = "sqlite:///ldp-data/transport.sqlite3"

_OPTION_TYPES = {
    "poll_interval": float,
    "replication_factor": int,
    "transaction_timeout": float,
    "request_timeout": float,
    "retention": float,
    "purge_interval": float,
}


def open_transport(url: str | None = None, **options: Any) -> Transport:
    """Open the transport named by ``url`` (default ``$LDP_TRANSPORT``, else :data:`DEFAULT_URL`)."""
    url = url or os.environ.get("LDP_TRANSPORT") or DEFAULT_URL
    parts = urlsplit(url)
    query = {k: _OPTION_TYPES.get(k, str)(v) for k, v in parse_qsl(parts.query)}
    query.update(options)
    if parts.scheme == "sqlite":
        from pipeline.transport.embedded import EmbeddedTransport

        if parts.netloc:
            raise ValueError(f"{url!r}: write sqlite:///relative/path or sqlite:////absolute/path (no host)")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise ValueError(f"{url!r} names no file: write sqlite:///path/to/log.sqlite3")
        return EmbeddedTransport(path, **query)
    if parts.scheme == "kafka":
        from pipeline.transport.kafka import KafkaTransport

        if not parts.netloc:
            raise ValueError(f"{url!r} names no broker: write kafka://127.0.0.1:9092")
        return KafkaTransport(parts.netloc, **query)
    raise ValueError(f"unknown transport URL {url!r}: use sqlite:///path/to/log.sqlite3 or kafka://host:port")
