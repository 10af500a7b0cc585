"""Ask a Kafka cluster to describe itself (``ldp kafka up``'s readiness check and the transport's health
probe): a plain socket check first, then a short-lived admin client."""

from __future__ import annotations

import socket
from typing import Any

from pipeline.transport.base import TransportError

__all__ = ["describe_cluster"]


def describe_cluster(bootstrap: str, timeout: float = 5.0) -> dict[str, Any]:
    """Ask the cluster at ``bootstrap`` (``host:port``) to describe itself; :class:`TransportError` if it cannot.

    Returns ``{"cluster_id", "brokers": [...]}`` once at least one broker is
    registered and unfenced. A fresh admin client with ``timeout`` for each
    call, so that a broker that is down costs at most about ``timeout``.
    """
    host, _, port = bootstrap.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit():
        raise ValueError(f"bootstrap must be host:port, got {bootstrap!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=min(timeout, 1.0)):
            pass
    except OSError as exc:
        raise TransportError(f"nothing accepts connections on {bootstrap}") from exc
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from pipeline.transport import kafka_logs

    kafka_logs.install()
    ms = max(1000, int(timeout * 1000))
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap, client_id="ldp-kafka-probe", request_timeout_ms=ms, bootstrap_timeout_ms=ms
        )
    except (KafkaError, OSError) as exc:
        raise TransportError(f"the broker at {bootstrap} does not answer: {exc!r}") from exc
    try:
        desc = admin.describe_cluster()
    except (KafkaError, OSError) as exc:
        raise TransportError(f"the broker at {bootstrap} does not describe its cluster: {exc!r}") from exc
    finally:
        admin.close()
    brokers = [b for b in desc.get("brokers", []) if not b.get("is_fenced", False)]
    if not brokers:
        raise TransportError(f"the broker at {bootstrap} answers but no broker is registered and unfenced yet")
    return {"cluster_id": desc.get("cluster_id"), "brokers": brokers}
