"""A Kafka cluster of several KRaft nodes on loopback, from the single-node broker of :mod:`ldp_cli.broker`.

``cluster_up(home, brokers=3, port=P, controller_port=Q)`` gives node ``i`` (1..n) the home ``<home>/node<i>``,
the broker port ``P + i - 1`` and the controller port ``Q + i - 1``; every node is a combined broker and
controller, the quorum is all of them, and they share one cluster id. Every topic, the offsets and the
transaction-state topics are replicated ``min(3, n)`` times with ``min.insync.replicas`` ``replication - 1``
(2 for three nodes): with ``acks=all`` a record is acknowledged once two replicas hold it, and the cluster
keeps accepting and serving records while one node is down. The nodes start at once (each waits for the
quorum, which needs a majority of them) and are stopped one by one by :func:`cluster_down`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from pathlib import Path
from typing import Any

from ldp_cli.broker import BrokerConfig, BrokerStatus, down, new_cluster_id, up

__all__ = ["cluster_configs", "cluster_up", "cluster_down", "cluster_bootstrap"]


def cluster_configs(
    home: Path, base: BrokerConfig, brokers: int, *, cluster_id: str | None = None
) -> list[BrokerConfig]:
    """The nodes' configs; ``base`` gives the ports of node 1, the heap, the versions and the jars."""
    if brokers < 1:
        raise ValueError(f"brokers must be >= 1, got {brokers}")
    h = f"[{base.host}]" if ":" in base.host else base.host
    ports = [base.port + i for i in range(brokers)]
    cports = [base.controller_port + i for i in range(brokers)]
    if set(ports) & set(cports):
        raise ValueError(
            f"broker ports {ports} and controller ports {cports} overlap; pick a controller port further away"
        )
    voters = ",".join(f"{i + 1}@{h}:{cports[i]}" for i in range(brokers))
    replication = min(3, brokers)
    cid = cluster_id or new_cluster_id()
    libs = base.lib_dir or base.libs
    return [
        dataclasses.replace(
            base,
            home=home / f"node{i + 1}",
            port=ports[i],
            controller_port=cports[i],
            node_id=i + 1,
            voters=voters,
            replication=replication,
            min_isr=max(1, replication - 1),
            cluster_id=cid,
            lib_dir=libs,
        )
        for i in range(brokers)
    ]


def cluster_bootstrap(cfgs: list[BrokerConfig]) -> str:
    """The clients' ``bootstrap_servers``: every node, comma-separated."""
    return ",".join(c.bootstrap for c in cfgs)


def cluster_up(cfgs: list[BrokerConfig], *, timeout: float = 180.0, log: Any = None) -> list[BrokerStatus]:
    """Start every node at once (a node answers only once a majority of the quorum runs) and wait for each."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cfgs)) as pool:
        futures = [pool.submit(up, c, timeout=timeout, log=log) for c in cfgs]
        return [f.result() for f in futures]


def cluster_down(cfgs: list[BrokerConfig], *, grace: float = 30.0, purge: bool = False) -> list[str]:
    """Stop every node (all at once: a controlled shutdown waits for the others' quorum)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cfgs)) as pool:
        return list(pool.map(lambda c: down(c, grace=grace, purge=purge), cfgs))
