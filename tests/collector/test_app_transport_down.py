"""A transport that is down is answered 503 + ``Retry-After`` at once, not after the publish timeout.

Before the fix a running collector held every upload through a broker outage until ``publish_timeout``
(30 s) ran out, since a stopped Kafka broker does not fail a publish: the producer retries. Now the
ingestor probes the transport when a publish runs longer than ``probe_after`` (or fails, or at start),
and while a probe fails every upload is answered 503 at once. Whatever was answered 202 is in the log;
uploads answered 503 while their publish was under way are answered ``duplicate`` when retried.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import pytest

from collector.http.app import create_app
from collector.settings import CollectorSettings
from ldp_cli.broker import BrokerConfig, default_home, down, up
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, ReportBatch, decode_frame, encode_frame
from pipeline.transport import Health, RecordPosition, open_transport
from tests.support.collector_support import MemoryTransport, ServerThread, olh_batch, write_metrics

FRAME = {"content-type": FRAME_CONTENT_TYPE}


class OutageTransport(MemoryTransport):
    """In memory; while ``outage`` is set, a publish waits (as a Kafka producer does against a stopped broker)
    and ``health()`` fails; once it is cleared, waiting publishes complete."""

    def __init__(self) -> None:
        super().__init__()
        self.outage = threading.Event()
        self.probes = 0

    def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> list[RecordPosition]:
        items = list(items)
        end = time.monotonic() + 60
        while self.outage.is_set() and time.monotonic() < end:
            time.sleep(0.01)
        return super().publish_many(topic, items)

    def health(self, topic: str | None = None, *, timeout: float = 2.0) -> Health:
        self.probes += 1
        return Health(False, "broker stopped (test)") if self.outage.is_set() else Health(True, "up")


@pytest.fixture
def metrics(tmp_path: Path) -> MetricSet:
    return write_metrics(tmp_path / "metrics.json")


def settings(tmp_path: Path, **kw: object) -> CollectorSettings:
    base: dict[str, object] = dict(
        metrics_path=str(tmp_path / "metrics.json"), dedup_path=str(tmp_path / "ids.sqlite3"), raw_partitions=2
    )
    base.update(kw)
    return CollectorSettings(**base)  # type: ignore[arg-type]


def timed_post(url: str, batch: ReportBatch) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/reports", content=encode_frame(batch), headers=FRAME, timeout=60)
    return r, time.monotonic() - t0


def until_accepted(url: str, batch: ReportBatch, timeout: float = 90.0) -> httpx.Response:
    """Retry ``batch`` as a device would (same batch id) until it is answered 202."""
    end = time.monotonic() + timeout
    while True:
        r = httpx.post(url + "/v1/reports", content=encode_frame(batch), headers=FRAME, timeout=60)
        if r.status_code == 202 or time.monotonic() > end:
            return r
        assert r.status_code == 503 and r.headers["retry-after"], r.text
        time.sleep(0.2)


def test_outage_of_a_running_collector_is_503_within_a_second_and_recovers(tmp_path: Path, metrics: MetricSet) -> None:
    transport = OutageTransport()
    cfg = settings(tmp_path, probe_after=0.3, probe_interval=0.2, retry_after=5)
    a, b, c = (olh_batch(metrics, 10, first_seed=100 * i) for i in range(3))
    with ServerThread(create_app(cfg, transport=transport)) as srv:
        assert timed_post(srv.url, a)[0].status_code == 202
        transport.outage.set()
        r, elapsed = timed_post(srv.url, b)  # its publish hangs: answered once the probe fails
        assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
        assert r.json()["error"] == "transport_unavailable" and "broker stopped" in r.json()["message"]
        assert elapsed < 1.5, elapsed
        r, elapsed = timed_post(srv.url, c)  # known to be down: no wait at all
        assert r.status_code == 503 and r.headers["retry-after"] == "5" and elapsed < 0.5, (r.text, elapsed)
        ready = httpx.get(srv.url + "/readyz", timeout=30).json()
        assert ready["transport_down"] and "broker stopped" in ready["transport_down"]
        transport.outage.clear()  # b's publish goes through now
        rb, rc = until_accepted(srv.url, b, 10), until_accepted(srv.url, c, 10)
        assert (rb.status_code, rb.json()["status"]) == (202, "duplicate")  # published once, by its first upload
        assert (rc.status_code, rc.json()["status"]) == (202, "accepted")  # refused before it was queued
        assert httpx.get(srv.url + "/readyz", timeout=30).json()["transport_down"] is None
        text = httpx.get(srv.url + "/metrics").text
    assert sorted(v for _, _, v in transport.records) == sorted(encode_frame(x) for x in (a, b, c))
    line = 'ldp_collector_batches_total{outcome="unavailable",reason="transport_unavailable"} '
    counted = [float(x[len(line) :]) for x in text.splitlines() if x.startswith(line)]
    assert counted and counted[0] >= 2  # b and c, and any retry made before the probe saw the transport back


def test_collector_started_during_an_outage_answers_503_at_once(tmp_path: Path, metrics: MetricSet) -> None:
    """With the default probe settings: the probe at start marks the transport down."""
    transport = OutageTransport()
    transport.outage.set()
    batch = olh_batch(metrics, 10)
    with ServerThread(create_app(settings(tmp_path), transport=transport)) as srv:
        end = time.monotonic() + 5
        while transport.probes == 0 and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(0.05)  # the probe's answer is taken
        r, elapsed = timed_post(srv.url, batch)
        assert r.status_code == 503 and r.json()["error"] == "transport_unavailable" and elapsed < 0.5
        transport.outage.clear()
        r = until_accepted(srv.url, batch, 10)
        assert r.status_code == 202 and r.json()["status"] == "accepted"
    assert [v for _, _, v in transport.records] == [encode_frame(batch)]


def test_a_failed_publish_with_a_healthy_transport_does_not_refuse_everyone(tmp_path: Path, metrics: MetricSet) -> None:
    """One publish that fails (say, a record the broker refuses) is 503 for its group only: the probe says the
    transport answers, so the next upload is published."""

    class OneFailure(MemoryTransport):
        failed = False

        def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> list[RecordPosition]:
            if not self.failed:
                self.failed = True
                raise OSError("refused once (test)")
            return super().publish_many(topic, items)

    transport = OneFailure()
    with ServerThread(create_app(settings(tmp_path, probe_interval=0.05), transport=transport)) as srv:
        first, second = olh_batch(metrics, 3), olh_batch(metrics, 3, first_seed=3)
        r = timed_post(srv.url, first)[0]
        assert r.status_code == 503 and r.json()["error"] == "transport_unavailable"
        assert until_accepted(srv.url, second, 5).status_code == 202
        assert until_accepted(srv.url, first, 5).json()["status"] == "accepted"
    assert len(transport.records) == 2


def test_a_publish_not_acknowledged_in_time_is_503_timeout(tmp_path: Path, metrics: MetricSet) -> None:
    """A transport that answers its probe but does not acknowledge a publish: the upload is answered 503
    ``timeout`` with ``Retry-After`` after ``publish_timeout``, and its retry once the publish went through is
    ``duplicate`` (published once)."""

    class Slow(OutageTransport):
        def health(self, topic: str | None = None, *, timeout: float = 2.0) -> Health:
            self.probes += 1
            return Health(True, "up")

    transport = Slow()
    cfg = settings(tmp_path, publish_timeout=0.4, probe_after=30.0, retry_after=3)
    batch = olh_batch(metrics, 10)
    with ServerThread(create_app(cfg, transport=transport)) as srv:
        transport.outage.set()
        r, elapsed = timed_post(srv.url, batch)
        assert r.status_code == 503 and r.headers["retry-after"] == "3", r.text
        assert r.json()["error"] == "timeout", r.text
        assert 0.35 < elapsed < 3.0, elapsed
        transport.outage.clear()
        r = until_accepted(srv.url, batch, 10)
        assert (r.status_code, r.json()["status"]) == (202, "duplicate"), r.text
    assert [v for _, _, v in transport.records] == [encode_frame(batch)]


# -- a real broker, stopped and started again ------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def own_broker(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[BrokerConfig]:
    """A broker of this test's own (other home, other ports; jars shared with the project's broker), since the
    test stops it."""
    shared = BrokerConfig.from_home(default_home())
    home = tmp_path_factory.mktemp("kafka-down")
    cfg = BrokerConfig(home=home, port=_free_port(), controller_port=_free_port(), heap="384m", lib_dir=shared.libs)
    up(cfg, timeout=120)
    try:
        yield cfg
    finally:
        down(cfg, grace=10, purge=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.kafka
def test_stopped_kafka_broker_is_503_within_a_second_and_uploads_resume(
    tmp_path: Path, metrics: MetricSet, own_broker: BrokerConfig
) -> None:
    """A running collector and one started while the broker is stopped both answer 503 with ``Retry-After``
    within about a second; once the broker is back, retried uploads are accepted within a few seconds, and
    every batch answered 202 is on the raw topic."""
    url = f"kafka://{own_broker.bootstrap}"
    topic = f"ldp.test.raw-{uuid.uuid4().hex[:8]}"
    cfg = settings(tmp_path, transport_url=url, raw_topic=topic, probe_after=0.5, probe_interval=0.5)
    cfg2 = settings(
        tmp_path, transport_url=url, raw_topic=topic, dedup_path=str(tmp_path / "ids2.sqlite3"), probe_interval=0.5
    )
    batches = [olh_batch(metrics, 100, first_seed=100 * i) for i in range(5)]
    with ServerThread(create_app(cfg)) as srv:
        assert until_accepted(srv.url, batches[0], 60).status_code == 202
        down(own_broker, grace=10)
        r, elapsed = timed_post(srv.url, batches[1])
        assert r.status_code == 503 and r.headers["retry-after"] == "2", r.text
        assert elapsed < 1.5, f"the running collector answered after {elapsed:.2f} s"
        r, elapsed = timed_post(srv.url, batches[2])
        assert r.status_code == 503 and elapsed < 0.5, (r.text, elapsed)
        with ServerThread(create_app(cfg2)) as srv2:  # started during the outage
            r, elapsed = timed_post(srv2.url, batches[3])
            assert r.status_code == 503 and r.json()["error"] == "transport_unavailable", r.text
            assert elapsed < 1.5, f"the collector started during the outage answered after {elapsed:.2f} s"
            time.sleep(8.0)  # an outage of some seconds: the clients' reconnect backoff grows meanwhile
            up(own_broker, timeout=120)
            t0 = time.monotonic()
            answers = [until_accepted(srv.url, batches[1])]
            first = time.monotonic() - t0
            # the producer's reconnect backoff (kafka-python's default grows to 30 s) made this 7-11 s; the
            # transport caps it at 1 s, and the probe runs every 0.5 s here
            assert first < 4.0, f"the first upload after the broker came back took {first:.1f} s to its 202"
            answers += [until_accepted(srv.url, batches[2]), until_accepted(srv2.url, batches[3])]
            answers.append(until_accepted(srv2.url, batches[4]))
    assert [a.status_code for a in answers] == [202] * 4, [a.text for a in answers]
    with open_transport(url) as tr:
        from tests.support.transport_contract import read_exactly

        recs = read_exactly(tr, topic, len(batches))
    got = {decode_frame(r.value, metrics["emoji_used"].spec).batch_id for r in recs}
    # every batch answered 202 is there; a publish cut short by the outage may have been retried and written
    # twice (the shuffler's id window drops the second copy)
    assert got == {b.batch_id for b in batches}
