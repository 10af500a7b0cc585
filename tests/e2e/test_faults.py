"""Faults on real processes: kill -9 each component mid-stream, restart a Kafka broker mid-stream.

The pipeline runs as ``ldp collector``, ``ldp shuffler``, ``ldp estimator``
and ``ldp sink`` subprocesses (:mod:`tests.support.pipeline_procs`) while a paced
uploader streams frames over HTTP, retrying while the collector is down.
Each component is killed with SIGKILL at a different moment of the stream
and started again. Every frame holds the shuffler's crowd threshold, so all
reports are released; at the end the estimator's counts (over HTTP) and the
Parquet dataset must equal, exactly, the offline estimator over the uploaded
reports: nothing lost, nothing counted twice.

The broker test runs its own second broker (other home, other ports) through
:mod:`ldp_cli.broker`, so the shared broker of the other tests is
never touched.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from estimator.jobs.batch import estimate_dataset
from ldp_cli.broker import BrokerConfig, default_home, down, up
from ldp_core.days import utc_day
from ldp_core.metrics import parse_metrics
from simulator.stack import fleet_batches
from tests.support.metrics_docs import dictionary, hashed, metric, metrics_doc
from tests.support.pipeline_procs import PacedUpload, PipelineProcs, free_port
from tests.support.shuffled_data import offline

METRICS = metrics_doc(
    tab=metric("grr", 1.0, dictionary("a", "b", "c", "d")),
    color=metric("oue", 2.0, hashed(48, 3)),
)
FRAME = 100


def _setup(tmp_path: Path, devices: int, seed: int):  # type: ignore[no-untyped-def]
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(METRICS))
    metrics = parse_metrics(METRICS)
    day = utc_day(time.time())
    fleet = fleet_batches(metrics, sorted(metrics), devices, day, np.random.default_rng(seed), frame_reports=FRAME)
    order = np.random.default_rng(seed + 1).permutation(len(fleet.batches))
    return metrics_path, day, fleet, [fleet.batches[i] for i in order]


def _check_exact(procs: PipelineProcs, fleet, day: int) -> None:  # type: ignore[no-untyped-def]
    expected = fleet.reports()
    procs.wait_counted(expected, timeout=120)
    for (name, _, _), acc in offline(fleet.batches).items():
        est = acc.estimate()
        deadline = time.monotonic() + 60
        while True:  # the live view serves uncommitted reads too: after a rebalance it re-reads them
            body = procs.estimates(name, day)
            if body is not None and body["n"] == acc.n:
                break
            assert body is None or body["n"] < acc.n, f"{name}: {body['n']} counted, {acc.n} uploaded"
            assert time.monotonic() < deadline, f"{name}: the estimate stays at {body and body['n']} of {acc.n}"
            time.sleep(0.2)
        assert body["counts"] == est.counts.tolist(), name
        assert body["ci_high"] == est.ci_high.tolist(), name
        deadline = time.monotonic() + 60
        while True:  # the sink commits on its own flush schedule
            try:
                batch = estimate_dataset(procs.dataset, name, [day], progress=False)
                if batch.n >= acc.n:
                    break
            except ValueError:
                pass
            assert time.monotonic() < deadline, f"the dataset did not reach {acc.n} reports of {name}"
            time.sleep(0.3)
        assert batch.n == acc.n, f"{name}: the dataset holds {batch.n} reports, {acc.n} were uploaded"
        np.testing.assert_array_equal(batch.table["estimate"].to_numpy(), est.counts)


def _dataset_files(procs: PipelineProcs) -> int:
    return sum(1 for _ in procs.dataset.rglob("part-*.parquet"))


def _kill_each_mid_stream(procs: PipelineProcs, stream: PacedUpload) -> None:
    """Five portions of the stream; during portions 1-4 one component is killed while the portion is still
    being uploaded and after it took part of it in hand: the collector and the shuffler once input of the
    portion flows, the estimator once it counted some of it, the sink once it wrote some of it."""
    portion = len(stream.batches) // 5
    half = portion // 2
    assert stream.allowed == portion
    stream.start()
    stream.wait_until(portion)
    for k, victim in enumerate(("collector", "shuffler", "estimator", "sink"), start=1):
        counted0, files0 = sum(procs.counted().values()), _dataset_files(procs)
        stream.allow(half)
        stream.wait_until(k * portion + half // 2)
        deadline = time.monotonic() + 60
        while victim == "estimator" and sum(procs.counted().values()) <= counted0:
            assert time.monotonic() < deadline, "the estimator counted nothing of the portion"
            time.sleep(0.02)
        while victim == "sink" and _dataset_files(procs) <= files0:
            assert time.monotonic() < deadline, "the sink wrote nothing of the portion"
            time.sleep(0.02)
        stream.allow(portion - half)
        procs.check_alive()
        assert stream.accepted < (k + 1) * portion, f"the portion was uploaded before {victim} was killed"
        procs[victim].kill9()
        procs.restart(victim)
    stream.allow(len(stream.batches))
    stream.join()
    procs.check_alive()


@pytest.fixture
def transport_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "embedded":
        return f"sqlite:///{tmp_path}/log.sqlite3"
    return f"kafka://{request.getfixturevalue('kafka_bootstrap')}"


@pytest.mark.parametrize(
    ("transport_url", "front"),
    [("embedded", "python"), ("embedded", "native"), pytest.param("kafka", "python", marks=pytest.mark.kafka)],
    indirect=["transport_url"],
)
def test_kill_9_each_component_mid_stream(tmp_path: Path, transport_url: str, front: str) -> None:
    """Each component killed with SIGKILL mid-stream and restarted; ``front="native"``: the collector serves its
    port with the native upload front (the uploads it held die with it, and the devices' retries land once)."""
    metrics_path, day, fleet, batches = _setup(tmp_path, 5000, seed=31)
    procs = PipelineProcs(tmp_path, transport_url, metrics_path, min_batch=FRAME, front=front)
    procs.start()
    try:
        stream = PacedUpload(procs.collector_url, batches, interval=0.1, allowed=len(batches) // 5)
        _kill_each_mid_stream(procs, stream)
        _check_exact(procs, fleet, day)
        assert all(procs[n].kills == 1 and procs[n].starts == 2 for n in ("collector", "shuffler", "estimator", "sink"))
    finally:
        procs.stop()


@pytest.fixture(scope="module")
def second_broker(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str):  # type: ignore[no-untyped-def]
    """A broker of this module's own (other home, other ports; jars shared with the project's broker)."""
    shared = BrokerConfig.from_home(default_home())
    home = tmp_path_factory.mktemp("kafka2")
    cfg = BrokerConfig(home=home, port=free_port(), controller_port=free_port(), heap="384m", lib_dir=shared.libs)
    up(cfg, timeout=120)
    yield cfg
    down(cfg, grace=10, purge=True)
    shutil.rmtree(home, ignore_errors=True)


def _restart_broker(cfg: BrokerConfig) -> None:
    down(cfg, grace=30)
    time.sleep(1.0)
    up(cfg, timeout=120)


@pytest.mark.kafka
@pytest.mark.parametrize("front", ["python", "native"])
def test_broker_restart_mid_stream_producers_lose_nothing(
    tmp_path: Path, second_broker: BrokerConfig, front: str
) -> None:
    """The broker is stopped and started again while devices upload: the collector holds the uploads
    (or answers 503 and the devices retry), and afterwards every accepted batch is in the raw topic; with either
    front on the collector's port."""
    from ldp_core.wire.frames import decode_frame
    from pipeline.transport import open_transport

    metrics_path, day, fleet, batches = _setup(tmp_path, 1600, seed=43)
    url = f"kafka://{second_broker.bootstrap}"
    procs = PipelineProcs(tmp_path, url, metrics_path, min_batch=FRAME, front=front)
    collector = procs["collector"]
    collector.start()
    try:
        stream = PacedUpload(procs.collector_url, batches, interval=0.1).start()
        stream.wait_for(0.3)
        assert stream.accepted < len(batches)
        _restart_broker(second_broker)
        assert stream.accepted < len(batches), "the stream ended before the broker was back"
        stream.join(timeout=180)
        assert collector.alive()
    finally:
        collector.stop()
    specs = {b.spec.spec_id: b.spec for b in batches}
    seen: dict[bytes, int] = {}
    with open_transport(url) as t, t.consume(procs.raw, f"check-{procs.raw}") as c:
        deadline = time.monotonic() + 60
        while len(seen) < len(batches) and time.monotonic() < deadline:
            for rec in c.poll(max_records=500, timeout=0.5):
                b = decode_frame(rec.value, specs)
                seen[b.batch_id] = seen.get(b.batch_id, 0) + 1
    assert set(seen) == {b.batch_id for b in batches}, f"{len(set(seen))} of {len(batches)} batches reached Kafka"


@pytest.mark.kafka
def test_broker_restart_mid_stream_pipeline_stays_exact(tmp_path: Path, second_broker: BrokerConfig) -> None:
    """The whole pipeline across a broker restart: every component keeps running and the final
    estimates and dataset are exact."""
    metrics_path, day, fleet, batches = _setup(tmp_path, 1600, seed=47)
    procs = PipelineProcs(tmp_path, f"kafka://{second_broker.bootstrap}", metrics_path, min_batch=FRAME)
    procs.start()
    try:
        stream = PacedUpload(procs.collector_url, batches, interval=0.1).start()
        stream.wait_for(0.3)
        _restart_broker(second_broker)
        assert stream.accepted < len(batches), "the stream ended before the broker was back"
        stream.join(timeout=180)
        procs.check_alive()
        _check_exact(procs, fleet, day)
    finally:
        procs.stop()


@pytest.mark.kafka
def test_broker_restart_mid_stream_consumers_stay_exact(tmp_path: Path, second_broker: BrokerConfig) -> None:
    """The estimator and the sink alone (shuffled batches published directly, as the shuffler would):
    they ride through a broker restart, rejoin their groups, and end with exact counts and files."""
    from kafka.errors import KafkaError

    from pipeline.transport import TransportError, open_transport
    from tests.support.shuffled_data import envelope_of

    metrics_path, day, fleet, batches = _setup(tmp_path, 2000, seed=53)
    url = f"kafka://{second_broker.bootstrap}"
    procs = PipelineProcs(tmp_path, url, metrics_path, min_batch=FRAME)
    with open_transport(url) as t:
        t.create_topic(procs.shuffled, 3)
    for name in ("estimator", "sink"):
        procs[name].start()

    def publish(part: list) -> None:  # type: ignore[type-arg]
        from pipeline.topics import metric_day_key

        for b in part:
            for _ in range(120):
                try:
                    with open_transport(url, request_timeout=5.0) as t:
                        t.publish(procs.shuffled, metric_day_key(b.metric, b.day), envelope_of(b))
                    break
                except (TransportError, KafkaError):  # the broker is restarting
                    time.sleep(0.5)
            else:
                raise AssertionError("the broker did not come back for the publisher")

    try:
        half = len(batches) // 2
        publish(batches[:half])
        deadline = time.monotonic() + 60
        while sum(procs.counted().values()) == 0:
            assert time.monotonic() < deadline, "the estimator counted nothing before the restart"
            time.sleep(0.1)
        _restart_broker(second_broker)
        publish(batches[half:])
        assert procs["estimator"].alive() and procs["sink"].alive()
        _check_exact(procs, fleet, day)
    finally:
        procs.stop()
