"""The stage-isolated scenarios of ``benchmarks/bench_members.py`` (``--scenario drain-sealed`` / ``drain-plain``):
1 against 2 (or more) ``ldp estimator`` members draining a backlog of one hot metric-day. Its docstring says
what is measured; this module builds the backlog and times the runs."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from collector.shuffler import Shuffler, ShufflerSettings
from ldp_core.days import utc_day
from ldp_core.metrics import MetricSet, parse_metrics
from ldp_core.wire.frames import ReportBatch, encode_frame
from ldp_core.wire.sealing import new_key_file, seal_batch
from pipeline.envelope import decode_envelope
from pipeline.topics import key_metric_day, metric_day_key, spread_keys
from pipeline.transport import Transport, open_transport
from tests.support.pipeline_procs import Service

__all__ = ["drain_main"]

PARTITIONS = 8
METRIC = "word"
TICK = os.sysconf("SC_CLK_TCK")
#: the members' HTTP ports: the session's range (docs/benchmarks/PIPELINE.md names the run's)
PORT_BASE = int(os.environ.get("LDP_BENCH_PORT_BASE", "19120"))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def metrics_doc(sealed: bool, public_key: dict[str, str] | None) -> dict[str, Any]:
    metric: dict[str, Any] = {
        "owner": "bench@example.org",
        "expires": "2099-12-31",
        "max_reports_per_day": 1,
        "description": "one hot metric-day",
        "mechanism": {"mechanism": "olh", "epsilon": 1.5},
        "domain": {"kind": "hashed", "size": 256, "seed": 4},
    }
    doc: dict[str, Any] = {"format": "ldp-metrics/1", "metrics": {METRIC: metric}}
    if sealed:
        metric["sealed"] = True
        doc["analyzer_keys"] = [public_key]
    return doc


def build_backlog(
    tmp: Path, url: str, metrics: MetricSet, reports: int, frame: int, keying: list[str], seed: int
) -> list[list[tuple[bytes, bytes]]]:
    """Uploads of ``frame`` reports of one metric-day, shuffled by the real shuffler (crowd = ``frame``) into a
    source topic; the released records grouped by release (a sealed release: its parts), in release order."""
    rng = np.random.default_rng(seed)
    spec = metrics[METRIC].spec
    day = utc_day(time.time())
    run = uuid.uuid4().hex[:8]
    raw, src, state = f"ldp.bench.raw.{run}", f"ldp.bench.src.{run}", f"ldp.bench.state.{run}"
    t = open_transport(url)
    try:
        t.create_topic(raw, PARTITIONS)
        t.create_topic(src, PARTITIONS)
        items = []
        for _ in range(reports // frame):
            batch = ReportBatch(METRIC, spec, day, spec.encode(rng.integers(0, 256, frame), rng), rng.bytes(16))
            if metrics.analyzer_key is not None:
                batch = seal_batch(batch, metrics.analyzer_key)  # the device's sealing
            items.append((metric_day_key(METRIC, day), encode_frame(batch)))
        for i in range(0, len(items), 50):
            t.publish_many(raw, items[i : i + 50])
        settings = ShufflerSettings(
            min_batch=frame,
            max_batch=frame,
            raw_topic=raw,
            shuffled_topic=src,
            state_topic=state,
            partitions=PARTITIONS,
            group=f"bench-shuffler-{run}",
            key_file=str(tmp / "shuffler.key"),
            checkpoint_interval=0.3,
            **_keying(keying),
        )
        sh = Shuffler(t, metrics, settings)
        sh.run(idle_exit=3.0)
        sh.close()
        return _read_releases(t, src, metrics, reports)
    finally:
        t.close()


def _keying(keying: list[str]) -> dict[str, Any]:
    name, _, spread = keying[0].partition(":")
    return {"shuffled_key": name, "shuffled_spread": int(spread or 0)}


def _read_releases(t: Transport, topic: str, metrics: MetricSet, reports: int) -> list[list[tuple[bytes, bytes]]]:
    specs = {m.spec.spec_id: m.spec for m in metrics.values()}
    releases: dict[str, list[tuple[bytes, bytes]]] = {}
    got = 0
    with t.consume(topic, f"bench-reader-{uuid.uuid4().hex[:8]}", session_timeout=3.0) as c:
        end = time.monotonic() + 300
        while got < reports:
            if time.monotonic() > end:
                raise RuntimeError(f"the shuffler released {got} of {reports} reports")
            for r in c.poll(max_records=1000, timeout=0.5):
                sb = decode_envelope(r.value, specs)
                assert r.key is not None
                releases.setdefault(sb.meta.release_id or sb.meta.shuffle_id, []).append((r.key, bytes(r.value)))
                got += sb.meta.n
    return list(releases.values())


def _count(url: str, **params: Any) -> tuple[int, bool]:
    try:
        body = httpx.get(url + "/v1/estimates", params=params, timeout=30).json()
    except (httpx.HTTPError, ValueError):
        return -1, True
    return sum(e["n"] for e in body.get("estimates", [])), bool(body.get("partial"))


def _warm_up(release: list[tuple[bytes, bytes]], n: int, sealed: bool) -> tuple[list[tuple[bytes, bytes]], int]:
    """The records that show the group settled (every partition receives some) and how many reports they hold:
    a sealed release's parts already reach every partition; a plain release (one record) is published once under
    each partition's sub-key (:func:`~pipeline.topics.spread_keys`), so counted once per partition."""
    if sealed:
        return release, n
    (key, value), *_ = release
    metric, day = key_metric_day(key)
    return [(k, value) for k in spread_keys(metric, day, PARTITIONS, PARTITIONS)], n * PARTITIONS


def drain_run(
    work: Path,
    url: str,
    metrics_path: Path,
    keys: Path | None,
    releases: list[list[tuple[bytes, bytes]]],
    reports: int,
    members: int,
    open_processes: int,
    keying: list[str] | None = None,
) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    k = _keying(keying or ["batch"])  # the members route-check sealed records under the shuffler's keying
    key_args = ["--shuffled-key", k["shuffled_key"], "--shuffled-spread", str(k["shuffled_spread"])]
    topic, group = f"ldp.bench.drain.{run}", f"bench-estimator-{run}"
    t = open_transport(url)
    t.create_topic(topic, PARTITIONS)
    urls = [f"http://127.0.0.1:{PORT_BASE + i}" for i in range(members)]
    services = []
    for i, u in enumerate(urls):
        argv = ["estimator", "--transport", url, "--metrics", str(metrics_path), "--state", str(work / f"est-{i}")]
        argv += ["--port", u.rsplit(":", 1)[1], "--topic", topic, "--group", group, "--member", f"estimator-{i}"]
        argv += ["--partitions", str(PARTITIONS), "--checkpoint-seconds", "0.3", "--session-timeout", "3", *key_args]
        argv += ["--open-processes", str(open_processes)] + (["--analyzer-keys", str(keys)] if keys else [])
        argv += [a for p in urls if p != u for a in ("--peer", p)]
        services.append(Service(f"estimator-{i}", argv, work / f"estimator-{i}.log", "listening on", u))
    try:
        for s in services:
            s.launch()
        for s in services:
            s.wait_ready(120)
        # the group settled when a warm-up release is counted with every member holding part of it; a member
        # that joins after the first one counted a warm-up finds it committed, so another release is sent
        per = reports // len(releases)
        warm_n, used, retry_at, own = 0, 0, 0.0, [0] * members
        deadline = time.monotonic() + 120
        while True:
            if time.monotonic() > retry_at:
                if used >= min(5, len(releases) - 1):
                    raise RuntimeError(f"the group did not settle after {used} warm-up releases: members {own}")
                warm, n_warm = _warm_up(releases[used], per, keys is not None)
                t.publish_many(topic, warm)
                warm_n, used, retry_at = warm_n + n_warm, used + 1, time.monotonic() + 8
            n, partial = _count(urls[0])
            own = [_count(u, merged="false")[0] for u in urls]
            if n == warm_n and not partial and all(x > 0 for x in own):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the group did not settle: merged {n} (partial {partial}), members {own}")
            time.sleep(0.1)
        rest = [rec for r in releases[used:] for rec in r]
        drained = reports - per * used
        pids = [s.proc.pid for s in services if s.proc is not None]
        cpu0 = [_cpu_seconds(p) for p in pids]
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        for i in range(0, len(rest), 200):
            t.publish_many(topic, rest[i : i + 200])
        published = time.perf_counter() - t0
        while True:
            n, partial = _count(urls[0])
            if n >= warm_n + drained and not partial:
                break
            for s in services:
                if not s.alive():
                    raise RuntimeError(f"{s.name} exited:\n{s.tail()}")
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"not drained in 600 s: {n} of {warm_n + drained}")
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        cpu = sum(_cpu_seconds(p) - c for p, c in zip(pids, cpu0))
        shares = [_count(u, merged="false")[0] for u in urls]
    finally:
        for s in services:
            s.stop()
        t.close()
    return {
        "members": members,
        "reports": drained,
        "wall_s": round(wall, 3),
        "publish_s": round(published, 3),
        "reports_per_s": round(drained / wall),
        "cpu_s_per_m": round(cpu / drained * 1e6, 2),
        # CPU seconds the members used per second of the drain: how many cores they had between them
        "cores_used": round(cpu / wall, 2),
        "member_shares": shares,
        "load_1min": round(load, 2),
    }


def drain_main(args: argparse.Namespace, member_counts: list[int]) -> int:
    sealed = args.scenario == "drain-sealed"
    keying = (args.shuffled_keys or "batch").split(",")
    if len(keying) != 1:
        raise SystemExit("the drain scenarios take one --shuffled-keys keying")
    url = f"kafka://{args.bootstrap}"
    reports = args.drain_reports // args.frame * args.frame
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ldp-bench-drain-") as tmp_name:
        tmp = Path(tmp_name)
        keys = tmp / "analyzer-keys" if sealed else None
        public = new_key_file(keys)[1].public.to_dict() if keys is not None else None
        doc = metrics_doc(sealed, public)
        metrics_path = tmp / "metrics.json"
        metrics_path.write_text(json.dumps(doc))
        t0 = time.perf_counter()
        releases = build_backlog(tmp, url, parse_metrics(doc), reports, args.frame, keying, args.seed)
        if not args.json:
            print(
                f"backlog: {len(releases)} releases, {sum(map(len, releases))} records in {time.perf_counter() - t0:.1f} s"
            )
        for rep in range(args.repeat):
            for m in member_counts:  # interleaved, so that a change of the machine's load hits both
                work = tmp / f"run-{rep}-{m}"
                work.mkdir()
                r = drain_run(work, url, metrics_path, keys, releases, reports, m, args.open_processes, keying)
                if not args.json:
                    print(json.dumps(r), flush=True)
                runs.append(r)
    summary = []
    for m in member_counts:
        mine = [r for r in runs if r["members"] == m]
        summary.append(
            {
                "members": m,
                "runs": len(mine),
                "reports_per_s": statistics.median(r["reports_per_s"] for r in mine),
                "reports_per_s_runs": [r["reports_per_s"] for r in mine],
                "cpu_s_per_m": statistics.median(r["cpu_s_per_m"] for r in mine),
                "publish_s": statistics.median(r["publish_s"] for r in mine),
                "cores_used": statistics.median(r["cores_used"] for r in mine),
                "load_1min": statistics.median(r["load_1min"] for r in mine),
            }
        )
    ratio = summary[-1]["reports_per_s"] / summary[0]["reports_per_s"]
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "runs": runs,
        "summary": summary,
        "ratio": round(ratio, 3),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"\n| {args.scenario} | members | runs (reports/s) | median | CPU s per 10⁶ reports | cores used | "
        "publish s | load (1 min) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in summary:
        print(
            f"| {keying[0]} | {s['members']} | {', '.join(f'{x:,}' for x in s['reports_per_s_runs'])} | "
            f"{s['reports_per_s']:,} | {s['cpu_s_per_m']} | {s['cores_used']} | {s['publish_s']} | {s['load_1min']} |"
        )
    print(f"\nratio {member_counts[-1]} : {member_counts[0]} members = {ratio:.2f}")
    return 0
