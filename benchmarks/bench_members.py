"""Throughput against the number of members per stage, on a three-node Kafka cluster (issue 31).

The benchmark starts its own three-node KRaft cluster (``ldp_cli.broker_cluster``, replication factor 3,
``min.insync.replicas`` 2; the jars of the project's broker) and, for each member count M in ``--members``,
``ldp shuffler``, ``ldp sink`` and ``ldp estimator`` processes, M of each, in their consumer groups
(``tests/support/group_procs.py``; the estimators name each other with ``--peer``). Once every member is
ready, ``--frames`` frames of ``--frame`` reports (the shuffler's crowd threshold), spread over ``--metrics``
metric-days of one GRR metric each, are published to the raw topic as the collector publishes them (key
``metric/day``, the collector's frame), and the clock runs until the estimator group counts every report
(merged read, polled every 50 ms). Reported per M, as medians over ``--repeat`` runs (fresh topics, groups
and processes each run):

* ``reports_per_s``: reports / (last counted − first published), wall clock, the three stages together
  (shuffle, write Parquet, estimate) draining a backlog;
* ``cpu_s_per_m``: CPU seconds (user + system, from /proc) of all the stages' processes per million reports
  (what a fleet pays per report, independent of how many cores were free), and the share of each stage;
  ``broker_cpu_s_per_m`` the same for the three Kafka nodes' JVMs together.

**One hot metric-day** (``--scenario hot-day``, issue 31): every frame is of one metric on one day, and the runs
interleave the shuffler's keyings of released batches (``--shuffled-keys batch,batch:2,metric-day``: per batch,
the default since issue 31, which spreads the metric-day over every shuffled partition; two sub-keys on two
partitions, ``--shuffled-spread 2``; per metric-day, the keying before). Each run also records ``holding``: how many estimator members count part of the metric-day (their
``merged=false`` answers), 1 under the old keying.

**One stage, isolated** (``--scenario drain-sealed`` / ``drain-plain``, issue 31): only the estimator group runs.
A backlog of one hot metric-day (``--drain-reports`` reports, sealed or plain) is shuffled once by the real
shuffler (in this process, keyed per ``--shuffled-keys``: a sealed release is split by its records'
encapsulated keys over the shuffled partitions) into a source topic of the broker at ``--bootstrap`` (one
broker, ``ldp kafka up``); each run copies it into a fresh topic for M ``ldp estimator`` members started with
``--serial-open`` (``--open-processes``), so that one member opens on one core. (Without it one member splits
each sealed batch of 512 reports or more among one thread per CPU with the compiled opener.) The members
first count a warm-up release (so that the group has settled and each member holds its partitions; a member
that joined after another counted it finds it committed, so up to five are sent), then the clock runs from publishing the rest (``publish_s``, the broker's part) until the merged read counts all of it.
``ratio`` is the median reports/s of the largest M over that of the smallest.

The collector is left out (its throughput and CPU per report are ``benchmarks/bench_ingest.py``'s), and so is
the start-up of the processes. The machine's load average is recorded with each run: on a shared machine the
wall-clock figure depends on it, the CPU figure much less.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_members.py --members 1,2 --repeat 3
    .venv/bin/python benchmarks/bench_members.py --scenario hot-day --members 1,2 --repeat 3 \
        --out benchmarks/results/members_hot_day.json

    .venv/bin/ldp kafka up --port 19100 --controller-port 19101
    .venv/bin/python benchmarks/bench_members.py --scenario drain-sealed --bootstrap 127.0.0.1:19100 \
        --members 1,2 --repeat 5 --out benchmarks/results/members_drain_sealed.json

Results print as Markdown (``--json``: the whole result as one JSON object) and go to
``benchmarks/results/members.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ldp_cli.broker import BrokerConfig, default_home  # noqa: E402
from ldp_cli.broker_cluster import cluster_bootstrap, cluster_configs, cluster_down, cluster_up  # noqa: E402
from ldp_core.days import utc_day  # noqa: E402
from ldp_core.metrics import parse_metrics  # noqa: E402
from ldp_core.wire.frames import ReportBatch, encode_frame  # noqa: E402
from pipeline.topics import metric_day_key  # noqa: E402
from pipeline.transport import open_transport  # noqa: E402
from tests.support.group_procs import GroupProcs  # noqa: E402
from tests.support.pipeline_procs import free_port  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
#: the stage-isolated scenarios (benchmarks/members_drain.py)
DRAINS = ("drain-sealed", "drain-plain")


def metrics_doc(count: int) -> dict[str, Any]:
    one = {
        "owner": "bench@example.org",
        "expires": "2099-12-31",
        "max_reports_per_day": 1,
        "mechanism": {"mechanism": "grr", "epsilon": 1.0},
        "domain": {"kind": "dictionary", "values": [f"v{i}" for i in range(16)]},
    }
    return {"format": "ldp-metrics/1", "metrics": {f"m{i}": {"description": f"m{i}", **one} for i in range(count)}}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def one_run(
    workdir: Path,
    cfgs: list[BrokerConfig],
    metrics_path: Path,
    members: int,
    frames: list[tuple[bytes, bytes]],
    reports: int,
    shuffled_key: str = "batch",
) -> dict[str, Any]:
    url = f"kafka://{cluster_bootstrap(cfgs)}?replication_factor=3"
    brokers = {f"broker-{c.node_id}": int(c.pid_path.read_text()) for c in cfgs}
    frame = reports // len(frames)
    procs = GroupProcs(
        workdir,
        url,
        metrics_path,
        min_batch=frame,
        members=members,
        collectors=0,
        partitions=8,
        shuffler_args=_keying_args(shuffled_key),
    )
    try:
        procs.start()
        t = open_transport(url)
        t.create_topic(procs.raw, 8)
        pids = {n: s.proc.pid for n, s in procs.services.items() if s.proc is not None}
        pids.update(brokers)  # the three Kafka nodes' JVMs
        cpu0 = {n: cpu_seconds(pid) for n, pid in pids.items()}
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        for i in range(0, len(frames), 50):
            t.publish_many(procs.raw, frames[i : i + 50])
        published = time.perf_counter() - t0
        while True:
            got, partial = procs.counted()
            if sum(got.values()) >= reports and not partial:
                break
            procs.check_alive()
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"not drained in 600 s: {got}")
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        cpu = {n: cpu_seconds(pid) - cpu0[n] for n, pid in pids.items()}
        t.close()
        # estimator members whose own partitions hold part of a metric-day (the most over the metric-days)
        held: dict[tuple[str, int], int] = {}
        for i in range(members):
            own = procs.group_read("/v1/estimates", i, merged="false") or {"estimates": []}
            for e in own["estimates"]:
                held[(e["metric"], e["day"])] = held.get((e["metric"], e["day"]), 0) + (e["n"] > 0)
        holding = max(held.values(), default=0)
    finally:
        procs.stop()
    by_stage: dict[str, float] = {}
    for name, c in cpu.items():
        stage = name.rsplit("-", 1)[0]
        by_stage[stage] = by_stage.get(stage, 0.0) + c
    total = sum(v for k, v in by_stage.items() if k != "broker")
    return {
        "members": members,
        "shuffled_key": shuffled_key,
        "holding": holding,
        "reports": reports,
        "wall_s": round(wall, 3),
        "publish_s": round(published, 3),
        "reports_per_s": round(reports / wall),
        "cpu_s": round(total, 2),
        "cpu_s_per_m": round(total / reports * 1e6, 2),
        "broker_cpu_s_per_m": round(by_stage.get("broker", 0.0) / reports * 1e6, 2),
        "cpu_s_per_m_by_stage": {k: round(v / reports * 1e6, 2) for k, v in sorted(by_stage.items())},
        "load_1min": round(load, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", default="1,2", help="members per stage, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--frames", type=int, default=240, help="frames published per run")
    ap.add_argument("--frame", type=int, default=1000, help="reports per frame (= the crowd threshold)")
    ap.add_argument("--metrics", type=int, default=16, help="metric-days the frames are spread over")
    ap.add_argument(
        "--scenario",
        choices=("metric-days", "hot-day", *DRAINS),
        default="metric-days",
        help="metric-days: frames spread over --metrics metric-days; hot-day: all of them one metric-day; "
        "drain-sealed, drain-plain: only the estimator group drains a backlog of one (sealed or plain) metric-day",
    )
    ap.add_argument(
        "--bootstrap",
        default=os.environ.get("LDP_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        help="the broker of the drain scenarios (`ldp kafka up`; default $LDP_KAFKA_BOOTSTRAP, else 127.0.0.1:9092)",
    )
    ap.add_argument("--drain-reports", type=int, default=100_000, help="reports in a drain scenario's backlog")
    ap.add_argument(
        "--open-processes",
        type=int,
        default=1,
        help="the drain members' --open-processes (default 1: --serial-open, one member = one core)",
    )
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object instead of Markdown")
    ap.add_argument(
        "--shuffled-keys",
        default=None,
        help="the shuffler's keyings to compare, comma-separated (batch, batch:N for --shuffled-spread N, "
        "metric-day; default: batch, and batch,batch:2,metric-day for --scenario hot-day)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "members.json"))
    args = ap.parse_args()
    member_counts = [int(x) for x in args.members.split(",")]
    if args.scenario in DRAINS:
        from benchmarks.members_drain import drain_main

        return drain_main(args, member_counts)
    if args.scenario == "hot-day":
        args.metrics = 1
    keyings = (args.shuffled_keys or ("batch,batch:2,metric-day" if args.scenario == "hot-day" else "batch")).split(",")
    for k in keyings:
        try:
            _keying_args(k)
        except ValueError:
            raise SystemExit(f"--shuffled-keys takes batch, batch:N and metric-day, got {k!r}") from None
    shared = BrokerConfig.from_home(default_home())
    if not any(shared.libs.glob("kafka_*.jar")):
        raise SystemExit(f"no Kafka jars in {shared.libs}: run `.venv/bin/ldp kafka up` once")
    doc = metrics_doc(args.metrics)
    metrics = parse_metrics(doc)
    day = utc_day(time.time())
    rng = np.random.default_rng(args.seed)
    names = sorted(metrics)
    frames = []
    for i in range(args.frames):
        name = names[i % len(names)]
        spec = metrics[name].spec
        batch = ReportBatch(name, spec, day, spec.encode(rng.integers(0, 16, args.frame), rng))
        frames.append((metric_day_key(name, day), encode_frame(batch)))
    reports = args.frames * args.frame
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ldp-bench-members-") as tmp:
        base = BrokerConfig(
            home=Path(tmp), port=free_port(), controller_port=free_port(), heap="384m", lib_dir=shared.libs
        )
        cfgs = cluster_configs(Path(tmp) / "cluster", base, 3)
        try:
            cluster_up(cfgs, timeout=240)
            for rep in range(args.repeat):
                for keying in keyings:
                    for m in member_counts:  # interleaved, so that a change of the machine's load hits both
                        work = Path(tmp) / f"run-{rep}-{keying}-{m}"
                        work.mkdir()
                        mpath = work / "metrics.json"
                        mpath.write_text(json.dumps(doc))
                        r = one_run(work, cfgs, mpath, m, frames, reports, keying)
                        print(json.dumps(r), flush=True)
                        runs.append(r)
        finally:
            cluster_down(cfgs, grace=10, purge=True)
    summary = []
    for keying in keyings:
        for m in member_counts:
            mine = [r for r in runs if r["members"] == m and r["shuffled_key"] == keying]
            summary.append(_summary(keying, m, mine))
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "runs": runs,
        "summary": summary,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(
        "\n| shuffled key | members per stage | members holding a metric-day | reports/s (median) | "
        "CPU s per 10⁶ reports (stages) | (3 brokers) | load (1 min) |"
    )
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        print(
            f"| {s['shuffled_key']} | {s['members']} | {s['holding']} | {s['reports_per_s']:,} | {s['cpu_s_per_m']} | "
            f"{s['broker_cpu_s_per_m']} | {s['load_1min']} |"
        )
    return 0


def _keying_args(keying: str) -> list[str]:
    """``ldp shuffler`` arguments of a keying: ``batch``, ``batch:N`` (``--shuffled-spread N``), ``metric-day``."""
    name, _, spread = keying.partition(":")
    if name not in ("batch", "metric-day") or (spread and (name != "batch" or not spread.isdigit())):
        raise ValueError(keying)
    return ["--shuffled-key", name] + (["--shuffled-spread", spread] if spread else [])


def _summary(keying: str, members: int, mine: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "shuffled_key": keying,
        "members": members,
        "runs": len(mine),
        "holding": statistics.median(r["holding"] for r in mine),
        "reports_per_s": statistics.median(r["reports_per_s"] for r in mine),
        "reports_per_s_runs": [r["reports_per_s"] for r in mine],
        "cpu_s_per_m": statistics.median(r["cpu_s_per_m"] for r in mine),
        "broker_cpu_s_per_m": statistics.median(r["broker_cpu_s_per_m"] for r in mine),
        "load_1min": statistics.median(r["load_1min"] for r in mine),
    }


if __name__ == "__main__":
    raise SystemExit(main())
