"""The Prio3 path on Kafka: the collector publishes to a Kafka raw topic and the leader reads it there."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from client_sdk.prio3 import Prio3Client
from ldp_core.days import utc_day
from simulator.prio3.stack import Prio3Stack, new_deployment


@pytest.mark.kafka
def test_prio3_over_kafka(tmp_path: Path, kafka_bootstrap: str) -> None:
    dep = new_deployment(tmp_path / "ops", {"k.hist": {"type": "histogram", "length": 3}})
    with Prio3Stack(dep, tmp_path / "run", transport_url=f"kafka://{kafka_bootstrap}") as st:
        for i, v in enumerate((0, 2, 2, 1)):
            dev = Prio3Client(st.metrics, tmp_path / f"d{i}", st.collector_url)
            assert dev.record("k.hist", v) and dev.flush() == "idle"
            dev.close()
        st.wait_settled(4, timeout=120)
        result = st.collect("k.hist", utc_day(time.time()))
    assert (result.reports, result.value) == (4, [1, 1, 2])
