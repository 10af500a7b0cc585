"""Three KRaft nodes on loopback (``ldp_cli.broker_cluster``): with one node killed, records are still
produced with ``acks=all`` (two in-sync replicas remain) and consumed, none lost."""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from pathlib import Path

import pytest

from ldp_cli.broker import BrokerConfig, default_home
from ldp_cli.broker_cluster import cluster_bootstrap, cluster_configs, cluster_down, cluster_up
from pipeline.transport import open_transport
from tests.support.pipeline_procs import free_port
from tests.support.transport_contract import read_exactly


@pytest.mark.kafka
def test_three_brokers_survive_one_killed(tmp_path: Path, kafka_bootstrap: str) -> None:
    shared = BrokerConfig.from_home(default_home())  # jars shared with the project's broker
    base = BrokerConfig(home=tmp_path, port=free_port(), controller_port=free_port(), heap="256m", lib_dir=shared.libs)
    ports = [base.port + i for i in range(3)] + [base.controller_port + i for i in range(3)]
    if len(set(ports)) < 6:
        pytest.fail(f"overlapping ports {ports}; run again")
    cfgs = cluster_configs(tmp_path / "cluster", base, 3)
    try:
        cluster_up(cfgs, timeout=180)
        props = (cfgs[0].properties_path).read_text()
        assert "default.replication.factor=3" in props and "min.insync.replicas=2" in props
        t = open_transport(f"kafka://{cluster_bootstrap(cfgs)}", replication_factor=3)
        topic = f"ldp.reports.raw.{uuid.uuid4().hex[:8]}"
        t.create_topic(topic, 3)
        first = [(f"k{i}".encode(), f"before {i}".encode()) for i in range(50)]
        t.publish_many(topic, first)
        victim = int(cfgs[1].pid_path.read_text())
        os.kill(victim, signal.SIGKILL)  # kill -9 node 2: two replicas of every partition remain
        cfgs[1].pid_path.unlink()
        later = [(f"k{i}".encode(), f"after {i}".encode()) for i in range(50)]
        t.publish_many(topic, later)  # acks=all with min.insync.replicas 2: accepted by the two left
        t.close()
        with open_transport(f"kafka://{cfgs[0].bootstrap},{cfgs[2].bootstrap}") as reader:
            recs = read_exactly(reader, topic, 100)
        assert sorted(r.value for r in recs) == sorted(v for _, v in first + later)
    finally:
        cluster_down(cfgs, grace=10, purge=True)
        shutil.rmtree(tmp_path / "cluster", ignore_errors=True)
