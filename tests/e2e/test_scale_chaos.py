"""Issue 31: kill one broker of three and one member of every group under load; nothing lost or counted twice.

The pipeline runs on its own three-node KRaft cluster (``ldp_cli.broker_cluster``: replication factor 3,
``min.insync.replicas`` 2, the topics created with ``replication_factor=3`` as docker-compose.yml creates
them) with two collectors behind a round-robin uploader (one shared dedup file) and two members in each of
the shuffler's, the sink's and the estimator's consumer groups (static members; the estimators name each
other with ``--peer``). A paced stream of frames is uploaded in five portions:

1. portion 1 flows through the whole cluster;
2. during portion 2 one broker is killed with SIGKILL (its partitions' leadership moves to the two left);
3. during portion 3 one collector and one member of each group are killed with SIGKILL: the uploader moves
   to the other collector, and once the session timeout passes each group rebalances onto its survivor;
4. the broker and the killed processes start again (each member rejoins under its own name: another
   rebalance), and portions 4 and 5 flow.

Then the Parquet dataset the two sinks wrote must hold every accepted report exactly once, and the batch job
on it (``ldp estimate --json``) must equal the offline estimator over the uploaded reports, value for value;
and the whole streaming estimator group, read at either member, must count exactly what was uploaded and give
the same estimates. (That last check once failed in 5 of 11 runs: an estimator member whose offset commit was
reported failed after the broker died dropped its tail, although the commit reached the group a moment later,
so the tail was never read again; see tests/estimator/test_commit_outcome.py.) On a failure the message holds
each group's committed offsets against the end of its topic.

The cluster takes six free ports, or ``LDP_TEST_CLUSTER_PORT`` and the five after it; the time of each phase
is printed (``pytest -rP`` shows it).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from estimator.jobs.batch import estimate_dataset
from ldp_cli.broker import BrokerConfig, default_home, up
from ldp_cli.broker_cluster import cluster_bootstrap, cluster_configs, cluster_down, cluster_up
from ldp_cli.main import main as ldp
from ldp_core.days import utc_day
from ldp_core.metrics import parse_metrics
from simulator.stack import fleet_batches
from tests.support.group_procs import GroupProcs, RoundRobinUpload
from tests.support.metrics_docs import dictionary, hashed, metric, metrics_doc
from tests.support.pipeline_procs import free_port
from tests.support.shuffled_data import offline

METRICS = metrics_doc(
    tab=metric("grr", 1.0, dictionary("a", "b", "c", "d")),
    color=metric("oue", 2.0, hashed(48, 3)),
    theme=metric("grr", 1.5, dictionary("light", "dark", "auto")),
    lang=metric("olh", 2.0, hashed(64, 5)),
)
FRAME = 100
VICTIMS = ("collector-1", "shuffler-1", "sink-1", "estimator-1")


def _cluster(tmp_path: Path) -> list[BrokerConfig]:
    shared = BrokerConfig.from_home(default_home())  # the jars of the project's broker (`ldp kafka up`)
    assert shared.libs.is_dir() and any(shared.libs.glob("kafka_*.jar")), (
        f"no Kafka jars in {shared.libs}: run `.venv/bin/ldp kafka up` once (scripts/test does)"
    )
    fixed = os.environ.get("LDP_TEST_CLUSTER_PORT")  # the first of six ports set aside for the cluster
    for _ in range(1 if fixed else 5):
        port, cport = (int(fixed), int(fixed) + 3) if fixed else (free_port(), free_port())
        base = BrokerConfig(home=tmp_path, port=port, controller_port=cport, heap="256m", lib_dir=shared.libs)
        cfgs = cluster_configs(tmp_path / "cluster", base, 3)
        ports = [p for c in cfgs for p in (c.port, c.controller_port)]
        if len(set(ports)) == 6 and all(_free(p) for p in ports):
            return cfgs
    raise AssertionError("found no six free ports for the cluster")


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Kafka binds: a port in TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _check_batch_job(
    procs: GroupProcs, metrics_path: Path, accs: dict[Any, Any], day: int
) -> tuple[list[str], list[str]]:
    """Once the dataset the two sinks write holds every report, ``ldp estimate --json`` over it answers each
    value's estimate exactly as the offline estimator does. Returns the double counts made upstream of the sink
    (no overlapping part files: the same reports at two offsets of the shuffled topic) and the losses, which the
    caller reports after reading the estimator group (whether the loss is the sink's or upstream); a double count
    the sink made fails here."""
    upstream: list[str] = []
    lost: list[str] = []
    for (name, _, _), acc in accs.items():
        deadline = time.monotonic() + 60
        while True:  # the sinks commit on their own flush schedule
            try:
                n = estimate_dataset(procs.dataset, name, [day], progress=False).n
            except ValueError:  # no part file of the metric yet
                n = 0
            if n >= acc.n or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        overlapping = _overlapping_parts(procs.dataset, name)
        held = f"{name}: the dataset holds {n} reports, {acc.n} were uploaded"
        if n < acc.n:
            lost.append(held)
            continue
        assert n == acc.n or not overlapping, f"{held}; part files with overlapping offsets: {overlapping}"
        if n > acc.n:  # the same reports at two offsets of the shuffled topic: made upstream of the sink
            upstream.append(held)
    for (name, _, _), acc in accs.items():  # the command's own code, run in this process: a Python start-up
        if any(u.startswith(f"{name}:") for u in upstream + lost):
            continue
        out = io.StringIO()  # per metric was a third of the test's time on a loaded machine
        with contextlib.redirect_stdout(out):
            code = ldp(
                ["estimate", "--dataset", str(procs.dataset), "--metric", name, "--days", str(day)]
                + ["--metrics", str(metrics_path), "--json"]
            )
        assert code == 0, (name, out.getvalue()[-3000:])
        body = json.loads(out.getvalue())
        assert body["n"] == acc.n, (name, body["n"], acc.n)
        np.testing.assert_array_equal([row["estimate"] for row in body["rows"]], acc.estimate().counts)
    return upstream, lost


def _overlapping_parts(dataset: Path, metric: str) -> list[tuple[str, str]]:
    """Pairs of part files of one topic partition whose offset ranges overlap: a double count with none came
    from upstream (the same reports published at two offsets), one with some from the sink."""
    from pipeline.dataset import list_parts

    parts = sorted(list_parts(dataset, metric), key=lambda p: (p.topic, p.partition, p.first, p.last))
    return [
        (a.path.name, b.path.name)
        for a, b in zip(parts, parts[1:], strict=False)
        if (a.topic, a.partition) == (b.topic, b.partition) and b.first <= a.last
    ]


def _lag(cfgs: list[BrokerConfig], procs: GroupProcs) -> str:
    """Per group and partition: the committed offset against the end of the topic (what a failure left where)."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    bootstrap = ",".join(c.bootstrap for c in cfgs)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    reader = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    lines: list[str] = []
    try:
        for group, topic in [(g, procs.raw if g.startswith("shuffler") else procs.shuffled) for g in procs.groups]:
            tps = [TopicPartition(topic, p) for p in sorted(reader.partitions_for_topic(topic) or ())]
            ends = reader.end_offsets(tps)
            done = admin.list_group_offsets(group)[group]
            lines.append(
                f"{group}: "
                + ", ".join(f"p{tp.partition} {done[tp].offset if tp in done else None}/{ends[tp]}" for tp in tps)
            )
    except Exception as exc:  # a diagnostic: it must not hide the failure it explains
        lines.append(f"(reading the committed offsets failed: {exc!r})")
    finally:
        admin.close()
        reader.close()
    return "\n".join(lines)


@pytest.mark.kafka
def test_kill_a_broker_and_a_member_of_every_group_under_load(tmp_path: Path) -> None:
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(METRICS))
    metrics = parse_metrics(METRICS)
    day = utc_day(time.time())
    fleet = fleet_batches(metrics, sorted(metrics), 3000, day, np.random.default_rng(31), frame_reports=FRAME)
    order = np.random.default_rng(32).permutation(len(fleet.batches))
    batches = [fleet.batches[i] for i in order]
    portion = len(batches) // 5

    cfgs = _cluster(tmp_path)
    t0 = last = time.monotonic()
    phases: list[str] = []

    def phase(name: str) -> None:  # the time each phase took, printed at the end (pytest -s or -rP shows it)
        nonlocal last
        now = time.monotonic()
        phases.append(f"{name} {now - last:.1f} s")
        last = now

    procs: GroupProcs | None = None
    try:
        cluster_up(cfgs, timeout=180)
        phase("cluster up")
        url = f"kafka://{cluster_bootstrap(cfgs)}?replication_factor=3"
        procs = GroupProcs(tmp_path, url, metrics_path, min_batch=FRAME, members=2, collectors=2, partitions=4)
        procs.start()
        phase("services up")
        stream = RoundRobinUpload(procs.collector_urls, batches, interval=0.05, allowed=portion).start()
        stream.wait_until(portion)
        phase("portion 1")

        # portion 2: one broker dies
        stream.allow(portion)
        stream.wait_until(portion + portion // 3)
        broker = cfgs[2]
        os.kill(int(broker.pid_path.read_text()), signal.SIGKILL)
        broker.pid_path.unlink()
        stream.wait_until(2 * portion, timeout=120)
        phase("portion 2 (broker killed)")
        procs.check_alive()

        # portion 3: one collector and one member of each group die; the groups rebalance onto the others
        stream.allow(portion)
        stream.wait_until(2 * portion + portion // 3)
        for name in VICTIMS:
            procs[name].kill9()
        stream.wait_until(3 * portion, timeout=120)
        time.sleep(3.5)  # past the session timeout: the survivors own every partition now
        phase("portion 3 (members killed)")
        moved = stream.moved

        # portions 4 and 5: the broker and the killed members come back under their names
        procs.start(VICTIMS, meanwhile=lambda: up(broker, timeout=120))
        phase("restarted")
        stream.allow(len(batches))
        stream.join(timeout=180)
        phase("portions 4-5")
        procs.check_alive()

        # the sinks' dataset: every accepted report once, and `ldp estimate` on it equals the offline estimator
        accs = offline(fleet.batches)
        upstream, lost = _check_batch_job(procs, metrics_path, accs, day)
        phase("dataset and batch job")
        assert all(procs[n].kills == 1 and procs[n].starts == 2 for n in VICTIMS)
        assert moved > 0, "no upload moved to the other collector while one was down"
        # the streaming estimator group, read at either member, counts the same
        if upstream or lost:  # the same reports at two offsets of the shuffled topic (docs/PIPELINE.md), or
            # reports missing: what the estimator group counted (the sink's fault or upstream), each group's
            # committed offsets and what every service warned of, in the failure
            seen = [procs.group_read(f"/v1/estimates/{name}", 0, day=day) for (name, _, _) in accs]
            counted = {name: (b or {}).get("n") for (name, _, _), b in zip(accs, seen, strict=True)}
            what = f"lost: {lost}" if lost else f"a double count upstream of the sink: {upstream}"
            raise AssertionError(f"{what}; estimator group: {counted}\n{_lag(cfgs, procs)}\n{procs.warnings()}")
        try:
            for at in (0, 1):
                procs.wait_counted(fleet.reports(), timeout=60 if at == 0 else 10, at=at)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_lag(cfgs, procs)}") from None
        for (name, _, _), acc in accs.items():
            est = acc.estimate()
            for at in (0, 1):  # either member answers for the whole group
                body = procs.group_read(f"/v1/estimates/{name}", at, day=day)
                assert body is not None and not body["partial"] and body["merged_instances"] == 2, (name, at)
                assert body["n"] == acc.n, (name, at, body["n"], acc.n)
                assert body["counts"] == est.counts.tolist(), (name, at)
        phase("estimator group")
    finally:
        if procs is not None:
            procs.stop()
        cluster_down(cfgs, grace=3, purge=True)  # its data is deleted: no need to wait for a clean shutdown
        if os.environ.get("LDP_TEST_KEEP_BROKER_LOGS"):  # the brokers' own logs, to read what a failure did
            for i, c in enumerate(cfgs):
                with contextlib.suppress(OSError):
                    shutil.copy(c.log_path, tmp_path / f"broker-{i + 1}.log")
        shutil.rmtree(tmp_path / "cluster", ignore_errors=True)
        phase("teardown")
        print(f"phases ({time.monotonic() - t0:.1f} s): " + ", ".join(phases))
