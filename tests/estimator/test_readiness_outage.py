"""A running estimator's readiness follows its input stream: 503 while the broker is down, 200 once it is back.

Before, ``/readyz`` answered 200 through a whole broker outage (kafka-python keeps polling and reconnecting
without raising, so the consumer's run state stayed ``ready``); only an estimator started during the outage
answered 503. The first publish after the outage is timed too (kafka-python's reconnect backoff made it wait
7-11 s). The test stops and restarts a broker of its own (other home, other ports), never the shared one.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from estimator.service import StreamingEstimator, create_app
from ldp_cli.broker import BrokerConfig, default_home, down, port_open, up
from pipeline.catalog import SpecCatalog
from pipeline.transport import open_transport
from simulator.stack import serve_in_thread
from tests.support.pipeline_procs import free_port
from tests.support.shuffled_data import default_specs, make_batches, publish


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str):  # type: ignore[no-untyped-def]
    """A broker of this module's own (jars shared with the project's broker, which ``kafka_bootstrap`` checks)."""
    shared = BrokerConfig.from_home(default_home())
    home = tmp_path_factory.mktemp("kafka-readiness")
    cfg = BrokerConfig(home=home, port=free_port(), controller_port=free_port(), heap="384m", lib_dir=shared.libs)
    up(cfg, timeout=120)
    yield cfg
    down(cfg, grace=10, purge=True)
    shutil.rmtree(home, ignore_errors=True)


def _until(url: str, status: int, timeout: float) -> float:
    """Seconds until ``GET url`` answers ``status``."""
    t0 = time.monotonic()
    while True:
        try:
            if httpx.get(url, timeout=2.0).status_code == status:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        assert time.monotonic() - t0 < timeout, f"{url} did not answer {status} within {timeout} s"
        time.sleep(0.1)


@pytest.mark.kafka
def test_readyz_follows_a_broker_outage(tmp_path: Path, own_broker: BrokerConfig) -> None:
    specs = default_specs()
    days = [20400]
    transport = open_transport(f"kafka://{own_broker.bootstrap}")
    topic = f"ldp.reports.shuffled.{uuid.uuid4().hex[:8]}"
    transport.create_topic(topic, 2)
    publish(transport, topic, make_batches(specs, days, 6, np.random.default_rng(1)))
    est = StreamingEstimator(
        transport,
        tmp_path / "st",
        SpecCatalog(specs=list(specs.items())),
        topic=topic,
        group=f"g-ready-{uuid.uuid4().hex[:8]}",
        checkpoint_seconds=0.2,
        session_timeout=6.0,
    )
    stop = threading.Event()
    worker = threading.Thread(target=lambda: est.supervise(lambda: est.run(stop), stop), daemon=True)
    worker.start()
    server, url, thread = serve_in_thread(create_app(est), lifespan="off")
    try:
        _until(url + "/readyz", 200, 90)
        down(own_broker, grace=30)
        went = _until(url + "/readyz", 503, 30)
        body = httpx.get(url + "/readyz").json()
        assert body["ready"] is False and body["state"] in ("waiting", "lost"), body
        assert httpx.get(url + "/healthz").status_code == 200  # alive: it serves what it counted
        up(own_broker, timeout=120)
        later = make_batches(specs, days, 4, np.random.default_rng(2))
        t0 = time.monotonic()
        publish(transport, topic, later)  # the producer of before the outage publishes again promptly
        republish = time.monotonic() - t0
        back = _until(url + "/readyz", 200, 120)
        # kafka-python's default reconnect backoff (up to 30 s) made this 7-11 s; at most 1 s now, plus the
        # metadata refresh and the leader's first answer
        assert republish < 3.0, f"the first publish after the outage took {republish:.1f} s"
        t0 = time.monotonic()
        while est.counted().n < sum(len(b) for b in make_batches(specs, days, 6, np.random.default_rng(1)) + later):
            assert time.monotonic() - t0 < 60, "the estimator did not consume after the broker came back"
            time.sleep(0.2)
        print(f"readyz: 503 {went:.1f} s after the broker stopped, 200 {back:.1f} s after it answered again;")
        print(f"first publish after the outage: {republish:.2f} s")
    finally:
        if not port_open("127.0.0.1", own_broker.port):
            up(own_broker, timeout=120)  # a consumer closing against a stopped broker would wait for it
        stop.set()
        worker.join(60)
        server.should_exit = True
        thread.join(30)
        est.close()
        transport.close()
