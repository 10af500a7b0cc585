"""``ldp demo``: the main job, the whole pipeline on one machine.

By default it runs the real pipeline with no broker: the FastAPI collector
on 127.0.0.1 (uvicorn), the shuffler, the streaming estimator (with its HTTP
API) and the Parquet sink, all on the embedded log, fed by a seeded
population of simulated devices that privatize their values with the SDK's
encoders and upload wire-format frames over HTTP (plus a few real
:class:`~client_sdk.client.TelemetryClient` devices going through ledger,
outbox and uploader). It prints, per metric, the estimates with their 95%
confidence intervals against the truth and the central ε the shuffle gives,
checks that every uploaded report was counted once and that the streaming
estimates equal the batch job's over the Parquet dataset, and writes a plot.
``--kafka HOST:PORT`` runs the same on a Kafka broker. ``--sealed`` seals every
metric's reports to an analyzer key; ``--tokens`` runs the token issuer beside a
collector that requires anonymous upload tokens: every device enrolls, fetches its
tokens and pays each upload with one, and one install floods a metric far beyond
its allowance (docs/TOKENS.md).

``--offline`` runs the earlier in-memory simulation instead: one seeded Zipf
population through every frequency oracle (real encoders and estimators),
each oracle's accuracy against its theoretical variance, and a plot.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ldp_core.mechanisms import FREQUENCY_MECHANISMS
from simulator.population import parse_distribution
from simulator.run import SimulationResult, simulate, spec_for

__all__ = ["register", "run", "run_offline", "run_pipeline", "DEFAULT_MECHANISMS"]

DEFAULT_METRICS = Path(__file__).resolve().parents[2] / "metrics" / "example.json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline on simulated devices and compare the estimates with the "
        "truth (--offline: every oracle in memory)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("--devices", type=int, default=None, help="simulated devices (default 20,000; 500 with --tokens)")
    p.add_argument(
        "--sdk-devices",
        type=int,
        default=4,
        help="of which this many run the real TelemetryClient end to end (default 4)",
    )
    p.add_argument("--metrics", type=Path, default=DEFAULT_METRICS, help="metrics file (default metrics/example.json)")
    p.add_argument(
        "--kafka",
        default=None,
        metavar="HOST:PORT",
        help="run on this Kafka broker instead of the embedded log (topics and groups get a per-run suffix)",
    )
    p.add_argument(
        "--min-batch", type=int, default=None, help="the shuffler's crowd threshold (default 1000; 250 with --tokens)"
    )
    p.add_argument(
        "--frame-reports",
        type=int,
        default=1000,
        help="reports per uploaded frame (default 1000; below --min-batch some may stay in the shuffler)",
    )
    p.add_argument(
        "--sealed",
        action="store_true",
        help="seal every metric's reports to a fresh analyzer key (docs/SEALED.md): the collector and the "
        "shuffler carry ciphertexts, the estimator and the sink open them",
    )
    p.add_argument(
        "--tokens",
        action="store_true",
        help="run the token issuer and a collector that requires tokens (docs/TOKENS.md): each device fetches "
        "its tokens and pays every upload with one (one upload per device and metric); one install floods a "
        "metric with crafted reports beyond its allowance",
    )
    p.add_argument(
        "--tokens-per-day",
        type=int,
        default=None,
        metavar="K",
        help="--tokens: the issuer's K tokens per device per UTC day (default: one per metric)",
    )
    p.add_argument(
        "--flood",
        type=int,
        default=300,
        metavar="N",
        help="--tokens: the flooding install's uploads (default 300; 0 for none)",
    )
    p.add_argument("--clients", type=int, default=4, help="concurrent HTTP upload clients (default 4)")
    p.add_argument("--top", type=int, default=8, help="rows printed per metric (default 8)")
    p.add_argument("--workdir", type=Path, default=None, help="keep the run's log, state and dataset here")
    p.add_argument("--offline", action="store_true", help="the in-memory simulation of every oracle instead")
    p.add_argument("--mechanisms", default=",".join(DEFAULT_MECHANISMS), help="--offline: comma-separated list")
    p.add_argument("--epsilon", type=float, default=2.0, help="--offline: epsilon of every oracle")
    p.add_argument("--domain", type=int, default=128, help="--offline: domain size")
    p.add_argument("--users", type=int, default=200_000, help="--offline: simulated users")
    p.add_argument("--distribution", default="zipf:1.1", help="zipf:S or uniform (both modes)")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--out", type=Path, default=Path("out"), help="folder for demo.png and demo.json")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument(
        "--serve",
        action="store_true",
        help="after the run keep the pipeline and the dashboard running until interrupted (Ctrl-C or SIGTERM)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=0,
        help="the estimator's port (its API and the dashboard at /; default: a free one)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.offline:
        if args.serve:
            raise ValueError("--serve keeps the pipeline's dashboard running; --offline runs no pipeline")
        return run_offline(args)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be from 0 to 65535, got {args.port}")
    if not args.serve:
        return run_pipeline(args)
    kept = args.keep_running = _KeepRunning()
    try:
        code = run_pipeline(args)
        if kept.pipe is not None:
            serve_until_stopped(kept.pipe)
    finally:
        if kept.pipe is not None:
            kept.pipe.stop()
            print("stopped.", flush=True)
    return code


@dataclasses.dataclass
class _KeepRunning:
    """``--serve``: the demo's pipeline, left running after the run for ``run`` to stop when interrupted."""

    pipe: Any = None


@contextlib.contextmanager
def _pipeline(args: argparse.Namespace, pipe: Any) -> Iterator[Any]:
    """Run ``pipe`` for the demo; with ``--serve`` it outlives the block (see :class:`_KeepRunning`)."""
    pipe.start()
    try:
        yield pipe
    except BaseException:
        pipe.stop()
        raise
    kept: _KeepRunning | None = getattr(args, "keep_running", None)
    if kept is None:
        pipe.stop()
    else:
        kept.pipe = pipe


def serve_until_stopped(pipe: Any, stop: threading.Event | None = None, poll: float = 0.5) -> None:
    """Keep the pipeline and the dashboard up until ``stop`` is set, or SIGTERM or Ctrl-C comes (the previous
    handlers are put back afterwards); a failed component thread ends the wait with its error."""
    import signal

    stop = stop or threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    on_main = threading.current_thread() is threading.main_thread()
    if on_main:
        for sig in previous:
            signal.signal(sig, lambda *_: stop.set())
    print(
        f"serving: dashboard {pipe.estimator_url}/   collector {pipe.collector_url}   (Ctrl-C stops)",
        flush=True,
    )
    try:
        while not stop.wait(poll):
            pipe.check()
    finally:
        if on_main:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    print("stopping the pipeline ...", flush=True)


def _label(metrics: Any, name: str, i: int, words: dict[str, dict[int, str]]) -> str:
    return words.get(name, {}).get(i) or metrics[name].domain.label(i)


def run_pipeline(args: argparse.Namespace) -> int:
    import logging

    from ldp_core.days import utc_day
    from ldp_core.metrics import load_metrics

    if args.devices is None:
        args.devices = 500 if args.tokens else 20_000
    if args.min_batch is None:
        args.min_batch = 250 if args.tokens else 1000
    if args.devices < 1 or args.sdk_devices < 0 or args.frame_reports < 1 or args.min_batch < 1:
        raise ValueError("--devices, --frame-reports and --min-batch must be positive, --sdk-devices >= 0")
    if not args.tokens and (args.tokens_per_day is not None or args.flood != 300):
        raise ValueError("--tokens-per-day and --flood go with --tokens")
    if args.flood < 0:
        raise ValueError("--flood must be >= 0")
    parse_distribution(args.distribution, 2)
    from ldp_cli.options import setup_logging

    setup_logging(logging.WARNING, "%(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.ERROR)  # metadata warnings while topics are created
    metrics = load_metrics(args.metrics, reject_expired=False)
    names = list(metrics)
    day = utc_day(time.time())
    expired = metrics.expired(day)
    if expired:
        raise ValueError(f"metrics {expired} in {args.metrics} have expired; renew them or pick another file")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ldp-demo-"))
    keys_dir = None
    seal_to = None
    if args.sealed:
        from ldp_core.metrics import parse_metrics
        from ldp_core.wire.sealing import new_key_file

        keys_dir = Path(workdir) / "analyzer-keys"
        _, analyzer = new_key_file(keys_dir)
        seal_to = analyzer.public
        doc = metrics.to_dict()
        for m in doc["metrics"].values():
            m["sealed"] = True
        doc["analyzer_keys"] = [seal_to.to_dict()]
        sealed_path = Path(workdir) / "metrics-sealed.json"
        sealed_path.write_text(json.dumps(doc, indent=2))
        metrics = parse_metrics(doc, reject_expired=False)
        args.metrics = sealed_path
    url = f"kafka://{args.kafka}" if args.kafka else None
    issuer = None
    collector_options: dict[str, Any] = {}
    if args.tokens:
        from simulator.token_fleet import LocalIssuer

        k = len(names) if args.tokens_per_day is None else args.tokens_per_day
        if k < len(names):
            raise ValueError(
                f"--tokens-per-day {k} is too few: each device uploads once per metric, so K must be at least "
                f"{len(names)} (the metrics in {args.metrics})"
            )
        issuer = LocalIssuer(Path(workdir) / "issuer", tokens_per_day=k).start()
        collector_options = issuer.collector_options(Path(workdir) / "spent-tokens.sqlite3")
    try:
        return _run_pipeline(args, metrics, names, day, workdir, url, keys_dir, seal_to, issuer, collector_options)
    finally:
        if issuer is not None:
            issuer.stop()


def _run_pipeline(
    args: argparse.Namespace,
    metrics: Any,
    names: list[str],
    day: int,
    workdir: Path,
    url: str | None,
    keys_dir: Path | None,
    seal_to: Any,
    issuer: Any,
    collector_options: dict[str, Any],
) -> int:
    from estimator.jobs.batch import estimate_dataset
    from pipeline.catalog import SpecCatalog
    from simulator.stack import (
        LocalPipeline,
        add_truth,
        demo_labels,
        empty_truth,
        fleet_batches,
        sdk_devices,
        truth_reports,
        upload,
    )

    t_start = time.monotonic()
    rng = np.random.default_rng(args.seed)
    print(
        f"ldp demo: {args.devices:,} devices x {len(names)} metrics on "
        f"{'Kafka at ' + args.kafka if args.kafka else 'the embedded log'} (seed {args.seed}); work folder {workdir}",
        flush=True,
    )
    with _pipeline(
        args,
        LocalPipeline(
            workdir,
            args.metrics,
            transport_url=url,
            min_batch=args.min_batch,
            analyzer_keys=keys_dir,
            collector_options=collector_options,
            estimator_port=getattr(args, "port", 0),
        ),
    ) as pipe:
        if seal_to is not None:
            print(f"  sealed metrics: records sealed to analyzer key {seal_to.key_id} (private key in {keys_dir})")
        if issuer is not None:
            print(
                f"  token issuer {issuer.url} (K = {issuer.tokens_per_day} tokens/device/day, blind RSA); the "
                f"collector requires a token per upload (keys {issuer.public_dir})",
                flush=True,
            )
        print(
            f"  collector {pipe.collector_url}   estimator {pipe.estimator_url}   "
            f"shuffler crowd >= {args.min_batch}   Parquet sink {pipe.dataset}",
            flush=True,
        )
        print(f"  dashboard {pipe.estimator_url}/", flush=True)
        truth = {n: empty_truth(metrics, n) for n in names}
        n_sdk = min(args.sdk_devices, args.devices)
        client_options = None
        if issuer is not None:

            def client_options(i: int, folder: Path) -> dict[str, Any]:
                bundle = folder.with_name(folder.name + "-enrollment.json")
                bundle.parent.mkdir(parents=True, exist_ok=True)
                issuer.enroll(f"sdk-device-{i}").save(bundle)
                return {
                    "issuer_url": issuer.url,
                    "enrollment_path": bundle,
                    "token_origin": collector_options["token_origin"],
                    "token_stock": issuer.tokens_per_day,
                }

        if n_sdk:
            t0 = time.monotonic()
            for name, counts in sdk_devices(
                pipe.collector_url,
                args.metrics,
                names,
                n_sdk,
                rng,
                workdir=workdir / "sdk-devices",
                distribution=args.distribution,
                client_options=client_options,
            ).items():
                truth[name] = add_truth(metrics, name, truth[name], counts)
            print(
                f"  {n_sdk} SDK devices: record -> ledger -> outbox -> uploader in {time.monotonic() - t0:.1f} s",
                flush=True,
            )
        fleet = fleet_batches(
            metrics,
            names,
            args.devices - n_sdk,
            day,
            rng,
            frame_reports=1 if issuer is not None else args.frame_reports,  # with tokens each device uploads its own
            distribution=args.distribution,
        )
        for name, counts in fleet.truth.items():
            truth[name] = add_truth(metrics, name, truth[name], counts)
        sent = fleet.batches
        if seal_to is not None:
            from ldp_core.wire.sealing import seal_batch

            t0 = time.monotonic()
            sent = [seal_batch(b, seal_to) for b in fleet.batches]
            print(
                f"  sealed {sum(len(b) for b in sent):,} reports (+52 bytes each) in {time.monotonic() - t0:.1f} s",
                flush=True,
            )
        flooded = None
        if issuer is not None and args.flood:  # before the fleet: its reports join the fleet's released crowds
            flooded = _flood(pipe.collector_url, issuer, metrics, names, day, args.flood, rng)
        paid = None
        if issuer is not None:
            from simulator.token_fleet import pay_fleet

            t0 = time.monotonic()
            paid = pay_fleet(issuer, fleet.batches, args.devices - n_sdk) if fleet.devices else None
            n_paid = paid.fetched if paid is not None else 0
            print(
                f"  {args.devices - n_sdk:,} devices enrolled and fetched {n_paid:,} tokens "
                f"({len(names)} each, one per metric) in {time.monotonic() - t0:.1f} s",
                flush=True,
            )
        stats = upload(pipe.collector_url, sent, clients=args.clients, headers=paid.headers if paid else None)
        print(
            f"  {args.devices - n_sdk:,} devices uploaded {stats.reports:,} reports in {stats.batches} frames "
            f"in {stats.seconds:.1f} s ({stats.rate:,.0f} reports/s, {stats.retries} retries)",
            flush=True,
        )
        expected = {n: truth_reports(metrics, n, truth[n]) for n in names}
        if flooded is not None:
            expected[flooded.metric] += flooded.accepted_reports  # counted, not part of the truth
        waited, held = pipe.wait_settled(sum(expected.values()), timeout=120)
        print(
            f"  the streaming estimator counted every released report {waited:.1f} s after the last upload"
            + (f"; {held:,} reports wait in the shuffler for a crowd of {args.min_batch}" if held else ""),
            flush=True,
        )
        pipe.wait_sink(sum(expected.values()) - held, timeout=120)
        import httpx

        live = {
            n: httpx.get(f"{pipe.estimator_url}/v1/estimates/{n}", params={"day": day}, timeout=60).json()
            for n in names
        }
        counted = pipe.counted()
        shuffler_stats = pipe.shuffler.stats.to_dict()
    catalog = SpecCatalog([metrics])
    words = {n: demo_labels(metrics, n) for n in names}
    summary: dict[str, Any] = {
        "devices": args.devices,
        "day": day,
        "transport": "kafka" if args.kafka else "embedded",
        "sealed": bool(args.sealed),
        "tokens": None,
        "metrics": {},
        "shuffler": shuffler_stats,
        "held_by_shuffler": held,
    }
    batch_equal = True
    print()
    for name in names:
        m = metrics[name]
        est = live[name]
        if m.kind == "heavy_hitters":
            row = _heavy_hitters_row(pipe.dataset, m, truth[name], day, args.top)
            same = row.pop("reports_per_part") == est.get("reports_per_part")  # the stream's level counts
            batch_equal &= same
            row.update(
                uploaded=expected[name],
                counted=counted.get(name, 0),
                batch_equals_streaming=same,
                reports_per_day=m.max_reports_per_day,
                person_epsilon=m.max_reports_per_day * m.spec.epsilon,
                central_epsilon=est.get("central_epsilon"),
                central_delta=est.get("central_delta"),
            )
            summary["metrics"][name] = row
            live[name] = {**est, "found": row["found"], "true_top": row["true_top"]}
            continue
        if m.kind != "frequency":
            res = estimate_dataset(pipe.dataset, name, [day], progress=False)
            row, same = _numeric_row(m, est, truth[name], res.table)
            batch_equal &= same
            row.update(uploaded=expected[name], counted=counted.get(name, 0))
            summary["metrics"][name] = row
            continue
        counts, lo, hi = (np.array(est[k], dtype=np.float64) for k in ("counts", "ci_low", "ci_high"))
        t = truth[name]
        res = estimate_dataset(pipe.dataset, name, [day], progress=False, definition=catalog.metrics.get(name))
        same = bool(
            np.array_equal(res.table["estimate"].to_numpy(), counts)
            and np.array_equal(res.table["ci_low"].to_numpy(), lo)
            and np.array_equal(res.table["ci_high"].to_numpy(), hi)
        )
        batch_equal &= same
        cover = float(np.mean((lo <= t) & (t <= hi)))
        rmse = float(np.sqrt(np.mean((counts - t) ** 2)))
        ce = est.get("central_epsilon")
        r = m.max_reports_per_day
        central = (
            f"central ε={ce:.3g} per person (δ={est['central_delta']:g}; locally {r}×ε={r * m.spec.epsilon:g})"
            if ce is not None
            else "central ε n/a"
        )
        print(
            f"{name}: {m.spec.name} ε={m.spec.epsilon:g}, d={len(counts)}, n={est['n']:,} in "
            f"{est['batches']} shuffled batches; {central}; RMSE {rmse:,.1f}, 95% CI coverage {cover:.0%}"
        )
        print(f"  {'item':>18} {'truth':>8} {'estimate':>9} {'95% CI':>20}")
        for i in np.argsort(-t, kind="stable")[: args.top]:
            print(
                f"  {_label(metrics, name, int(i), words):>18} {int(t[i]):>8,} {counts[i]:>9,.0f} "
                f"{'[' + format(lo[i], ',.0f') + ', ' + format(hi[i], ',.0f') + ']':>20}"
            )
        summary["metrics"][name] = {
            "mechanism": m.spec.name,
            "epsilon": m.spec.epsilon,
            "n": est["n"],
            "reports_per_day": r,
            "person_epsilon": r * m.spec.epsilon,
            "uploaded": expected[name],
            "counted": counted.get(name, 0),
            "central_epsilon": ce,
            "central_delta": est.get("central_delta"),
            "rmse": rmse,
            "ci_coverage": cover,
            "batch_equals_streaming": same,
            "truth": t.tolist(),
            "estimate": est["counts"],
            "ci_low": est["ci_low"],
            "ci_high": est["ci_high"],
        }
    tokens_ok = True
    if issuer is not None:
        summary["tokens"], tokens_ok = _token_summary(
            issuer, collector_options["spent_path"], expected, flooded, live, metrics, truth
        )
    once = sum(counted.values()) + held == sum(expected.values()) and all(
        counted.get(n, 0) <= expected[n] for n in names
    )
    print()
    print(
        f"every uploaded report counted exactly once: {'yes' if once else 'NO'} "
        f"({sum(counted.values()):,} counted + {held:,} below the crowd threshold = "
        f"{sum(expected.values()):,} uploaded)"
    )
    print(f"streaming estimates equal the batch job over the Parquet dataset: {'yes' if batch_equal else 'NO'}")
    args.out.mkdir(parents=True, exist_ok=True)
    summary["seconds"] = time.monotonic() - t_start
    (args.out / "demo.json").write_text(json.dumps(summary))
    if not args.no_plot:
        _plot_pipeline(metrics, live, truth, words, args.out / "demo.png")
        print(f"plot: {args.out / 'demo.png'}")
    print(f"results: {args.out / 'demo.json'}   ({summary['seconds']:.0f} s)")
    print(
        f"dashboard: {pipe.estimator_url}/"
        + ("" if getattr(args, "serve", False) else "   (gone with the pipeline; --serve keeps it)")
    )
    return 0 if once and batch_equal and tokens_ok else 1


def _flood(url: str, issuer: Any, metrics: Any, names: list[str], day: int, attempts: int, rng: Any) -> Any:
    """One install floods the first metric with a crafting rule (docs/PRIVACY.md §6); ``None`` if none has."""
    from simulator.crafted import CRAFTABLE
    from simulator.token_fleet import flood

    target = next((n for n in names if metrics[n].kind == "frequency" and metrics[n].spec.name in CRAFTABLE), None)
    if target is None:
        print("  flood: no metric here has a crafting rule (grr, oue, olh); skipped")
        return None
    res = flood(url, issuer, metrics, target, day, attempts, rng)
    refused = ", ".join(f"{k}: {n:,}" for k, n in res.outcomes.items() if not k.startswith("202"))
    print(
        f"  flood: one install sent {attempts + 1:,} uploads of crafted {target} reports for item {res.target}: "
        f"{res.accepted:,} accepted (its {res.tokens} tokens x {res.reports_per_upload} report"
        f"{'s' if res.reports_per_upload > 1 else ''}), {res.refused:,} refused ({refused}); "
        f"the issuer refused it more tokens ({', '.join(f'{k}: {n}' for k, n in res.issuer_refusals.items())})",
        flush=True,
    )
    return res


def _token_summary(
    issuer: Any,
    spent_path: str,
    expected: dict[str, int],
    flooded: Any,
    live: dict[str, Any],
    metrics: Any,
    truth: Any,
) -> tuple[dict[str, Any], bool]:
    """Print the issued/spent/refused counts; the demo.json entry and whether the counts add up: every upload
    spent one token and the flood got no more than its K."""
    import sqlite3

    issued = issuer.issued()
    with sqlite3.connect(spent_path) as conn:  # the collector's own record of redeemed tokens
        spent = int(conn.execute("SELECT COUNT(*) FROM spent").fetchone()[0])
    honest = sum(expected.values()) - (flooded.accepted_reports if flooded is not None else 0)
    flood_spent = flooded.accepted if flooded is not None else 0
    refused = flooded.refused if flooded is not None else 0
    print(
        f"tokens: {issued:,} issued, {spent:,} spent ({honest:,} by the fleet, one per upload of one report; "
        f"{flood_spent:,} by the flooder), {refused:,} uploads refused"
    )
    out: dict[str, Any] = {"issued": issued, "spent": spent, "refused": refused, "flood": None}
    ok = spent <= issued and spent == honest + flood_spent
    if flooded is not None:
        from ldp_core.mechanisms import frequency_spec
        from simulator.crafted import influence

        spec = frequency_spec(metrics[flooded.metric].spec)
        est = live[flooded.metric]
        t = flooded.target
        bound = flooded.tokens * flooded.reports_per_upload * influence(spec)
        got = est["counts"][t]
        print(
            f"  flooded item {t} of {flooded.metric}: true count {int(truth[flooded.metric][t]):,}, estimate "
            f"{got:,.0f} (95% CI {est['ci_low'][t]:,.0f}..{est['ci_high'][t]:,.0f}); the flood can add at most "
            f"K x max_reports_per_day x Δ = {flooded.tokens} x {flooded.reports_per_upload} x "
            f"{influence(spec):.2f} = {bound:,.1f}"
        )
        ok &= flooded.accepted <= issuer.tokens_per_day
        out["flood"] = {**flooded.to_dict(), "estimate": got, "bound": bound}
    return out, ok


def _heavy_hitters_row(dataset: Path, m: Any, ranks: np.ndarray, day: int, top: int) -> dict[str, Any]:
    """Discover a string metric's words from the day's Parquet parts (``ldp heavy-hitters``) and print them by name
    beside the truth (docs/HEAVY_HITTERS.md)."""
    from estimator.jobs.heavy_hitters import discover_dataset
    from simulator.stack import demo_words

    words = demo_words(m.domain.length)
    true = np.bincount(np.asarray(ranks, dtype=np.int64), minlength=len(words))
    order = np.argsort(-true, kind="stable")[:top]
    true_top = [[words[i], int(true[i])] for i in order]
    counts = {words[i]: int(c) for i, c in enumerate(true) if c}
    res = discover_dataset(dataset, m.name, [day], top=top)
    found = res.table[["value", "estimate", "ci_low", "ci_high"]].values.tolist()
    hits = len({f[0] for f in found} & {t[0] for t in true_top})
    recall = hits / len(true_top) if true_top else 0.0
    print(
        f"{m.name}: {m.spec.name} ε={m.spec.epsilon:g} discovered {len(found)} words from {res.n:,} reports "
        f"(no word listed in advance); recall@{top} {recall:.2f}, decode {res.discovery.seconds:.1f} s"
    )
    print(f"  {'word':>18} {'truth':>8} {'estimate':>9} {'95% CI':>20}")
    for value, e, lo, hi in found:
        print(
            f"  {value!r:>18} {counts.get(value, 0):>8,} {e:>9,.0f} {'[' + format(lo, ',.0f') + ', ' + format(hi, ',.0f') + ']':>20}"
        )
    return {
        "kind": "heavy_hitters",
        "mechanism": m.spec.name,
        "epsilon": m.spec.epsilon,
        "n": res.n,
        "found": found,
        "true_top": true_top,
        "recall": recall,
        "seconds": res.discovery.seconds,
        "reports_per_part": res.parts,
    }


def _plot_heavy_hitters(ax: Any, m: Any, est: dict[str, Any]) -> None:
    found = est["found"][::-1]
    truth = dict(est["true_top"])
    y = np.arange(len(found))
    e = np.array([f[1] for f in found], dtype=np.float64)
    err = np.vstack([e - [f[2] for f in found], np.array([f[3] for f in found]) - e]) if found else None
    ax.barh(y, [truth.get(f[0], 0) for f in found], color="#cfd8e3", label="truth")
    ax.errorbar(e, y, xerr=err, fmt="o", ms=3, color="#b03a2e", capsize=2, label="estimate, 95% CI")
    ax.set_yticks(y, [repr(f[0]) for f in found], fontsize=7)
    ax.set_title(f"{m.name}: {m.spec.name} ε={m.spec.epsilon:g}, discovered words, n={est['n']:,}", fontsize=10)


def _central(est: dict[str, Any], m: Any) -> str:
    ce, r = est.get("central_epsilon"), m.max_reports_per_day
    if ce is None:
        return "central ε n/a"
    return f"central ε={ce:.3g} per person (δ={est['central_delta']:g}; locally {r}×ε={r * m.spec.epsilon:g})"


def _numeric_row(m: Any, est: dict[str, Any], values: np.ndarray, table: Any) -> tuple[dict[str, Any], bool]:
    """Print a numeric metric's live estimate against the devices' true values; its demo.json entry, and
    whether the batch job over the Parquet dataset gave the same numbers."""
    head = f"{m.name}: {m.spec.name} ε={m.spec.epsilon:g}, range [{m.spec.low:g}, {m.spec.high:g}], n={est['n']:,} in "
    head += f"{est['batches']} shuffled batches; {_central(est, m)}"
    row: dict[str, Any] = {
        "kind": m.kind,
        "mechanism": m.spec.name,
        "epsilon": m.spec.epsilon,
        "n": est["n"],
        "reports_per_day": m.max_reports_per_day,
        "person_epsilon": m.max_reports_per_day * m.spec.epsilon,
        "central_epsilon": est.get("central_epsilon"),
        "central_delta": est.get("central_delta"),
    }
    if m.kind == "mean":
        mean, lo, hi = est["mean"][0], est["ci_low"][0], est["ci_high"][0]
        truth = float(values.mean())
        covered = bool(lo <= truth <= hi)
        same = bool(np.array_equal(table["mean"].to_numpy(), np.array(est["mean"], dtype=np.float64)))
        print(head)
        print(f"  true mean {truth:,.3f}   estimate {mean:,.3f}   95% CI [{lo:,.3f}, {hi:,.3f}]   covered: {covered}")
        row.update(true_mean=truth, mean=mean, ci_low=lo, ci_high=hi, ci_covers=covered, batch_equals_streaming=same)
        return row, same
    edges = np.array(est["edges"], dtype=np.float64)
    hist = np.array(est["hist"], dtype=np.float64)
    true_hist = np.histogram(np.clip(values, edges[0], edges[-1]), bins=edges)[0] / max(1, values.size)
    tv = float(0.5 * np.abs(hist - true_hist).sum())
    same = bool(np.array_equal(table["share"].to_numpy(), hist))
    print(head)
    print(f"  histogram of {hist.size} bins: total variation from the truth {tv:.3f}")
    quantiles = {}
    for q, v in est["quantiles"].items():
        true_q = float(np.quantile(values, float(q[1:]) / 100))
        quantiles[q] = {**v, "truth": true_q}
        print(
            f"  {q:>4}: true {true_q:,.2f}   estimate {v['value']:,.2f}   95% CI [{v['ci_low']:,.2f}, {v['ci_high']:,.2f}]"
        )
    row.update(
        tv=tv,
        quantiles=quantiles,
        edges=est["edges"],
        hist=est["hist"],
        true_hist=true_hist.tolist(),
        batch_equals_streaming=same,
    )
    return row, same


def _plot_numeric(ax: Any, m: Any, est: dict[str, Any], values: np.ndarray) -> None:
    if m.kind == "mean":
        ax.hist(values, bins=40, color="#cfd8e3", label="true values")
        ax.axvline(float(values.mean()), color="k", ls="--", lw=1, label=f"true mean {values.mean():.2f}")
        ax.axvspan(est["ci_low"][0], est["ci_high"][0], color="#b03a2e", alpha=0.3, label="estimate, 95% CI")
        ax.axvline(est["mean"][0], color="#b03a2e", lw=1.5)
        ax.set_xlabel("value")
    else:
        edges = np.array(est["edges"], dtype=np.float64)
        centres = (edges[:-1] + edges[1:]) / 2
        true_hist = np.histogram(np.clip(values, edges[0], edges[-1]), bins=edges)[0] / max(1, values.size)
        ax.bar(centres, true_hist, width=np.diff(edges), color="#cfd8e3", label="truth")
        ax.plot(centres, est["hist"], color="#b03a2e", drawstyle="steps-mid", label="estimate")
        ax.fill_between(centres, est["hist_low"], est["hist_high"], step="mid", color="#b03a2e", alpha=0.25)
        for q, v in est["quantiles"].items():
            ax.axvline(v["value"], color="#555", ls=":", lw=1)
            ax.annotate(q, (v["value"], max(true_hist) * 0.95), fontsize=7, ha="center")
        ax.set_xlabel("value")
    ce = est.get("central_epsilon")
    extra = f", central ε={ce:.2g}" if ce is not None else ""
    ax.set_title(f"{m.name}: {m.spec.name} ({m.kind}) ε={m.spec.epsilon:g}{extra}, n={est['n']:,}", fontsize=10)
    ax.legend(fontsize=7)


def _plot_pipeline(
    metrics: Any,
    live: dict[str, Any],
    truth: dict[str, np.ndarray],
    words: dict[str, dict[int, str]],
    path: Path,
    top: int = 20,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(live)
    cols = 2
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        est, t, m = live[name], truth[name], metrics[name]
        if m.kind == "heavy_hitters":
            _plot_heavy_hitters(ax, m, est)
            continue
        if m.kind != "frequency":
            _plot_numeric(ax, m, est, t)
            continue
        counts, lo, hi = (np.array(est[k], dtype=np.float64) for k in ("counts", "ci_low", "ci_high"))
        order = np.argsort(-t, kind="stable")[:top]
        x = np.arange(order.size)
        ax.bar(x, t[order], color="#cfd8e3", label="truth")
        ax.errorbar(
            x,
            counts[order],
            yerr=np.vstack([counts[order] - lo[order], hi[order] - counts[order]]),
            fmt="o",
            ms=3,
            color="#b03a2e",
            capsize=2,
            label="estimate, 95% CI",
        )
        ax.set_xticks(x, [_label(metrics, name, int(i), words) for i in order], rotation=60, ha="right", fontsize=7)
        ce = est.get("central_epsilon")
        extra = f", central ε={ce:.2g}" if ce is not None else ""
        ax.set_title(f"{name}: {m.spec.name} ε={m.spec.epsilon:g}{extra}, n={est['n']:,}", fontsize=10)
        ax.axhline(0, color="#888", lw=0.5)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("count")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


DEFAULT_MECHANISMS = ["grr", "oue", "olh", "hr", "cms", "hcms", "rappor"]


def _plot_offline(results: list[SimulationResult], path: Path, top: int = 25) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 2
    rows = (len(results) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.2 * rows), squeeze=False, sharey=True)
    for ax, res in zip(axes.flat, results):
        order = np.argsort(-res.true_counts, kind="stable")[:top]
        x = np.arange(order.size)
        est = res.estimate
        ax.bar(x, res.true_counts[order] / res.users, color="#cfd8e3", label="truth")
        err = np.vstack([est.counts[order] - est.ci_low[order], est.ci_high[order] - est.counts[order]]) / res.users
        ax.errorbar(
            x, est.counts[order] / res.users, yerr=err, fmt="o", ms=3, color="#b03a2e", label="estimate, 95% CI"
        )
        ax.set_title(
            f"{res.spec.name}  (ε={res.spec.epsilon:g}, d={res.spec.domain_size}, n={res.users:,})", fontsize=10
        )
        ax.set_xticks(x[::5])
        ax.set_xlabel("item (rank by true frequency)")
    for ax in axes.flat[len(results) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("frequency")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_offline(args: argparse.Namespace) -> int:
    names = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    unknown = [m for m in names if m not in FREQUENCY_MECHANISMS]
    if unknown:
        raise ValueError(f"unknown mechanisms {unknown}; choose from {sorted(FREQUENCY_MECHANISMS)}")
    from tqdm import tqdm

    parse_distribution(args.distribution, args.domain)  # fail early on a bad argument
    results: list[SimulationResult] = []
    with tqdm(total=args.users * len(names), unit="report", unit_scale=True, file=sys.stderr, leave=False) as bar:
        for i, name in enumerate(names):
            spec = spec_for(name, args.epsilon, 2 if name == "rr" else args.domain)
            rng = np.random.default_rng([args.seed, i])
            dist = parse_distribution(args.distribution, spec.domain_size)
            bar.set_description(name)
            results.append(simulate(spec, args.users, dist, rng, seed=args.seed, progress=bar.update))

    print(
        f"ldp demo: {args.users:,} simulated users, {args.distribution}, ε={args.epsilon:g}, d={args.domain}, seed {args.seed}"
    )
    print(
        f"{'mechanism':>9} {'MSE/n':>10} {'theory/n':>10} {'ratio':>6} {'CI cover':>8} {'enc Mrep/s':>10} {'agg Mrep/s':>10}"
    )
    summary = []
    for res in results:
        err = res.estimate.counts - res.true_counts
        mse, theory = float(np.mean(err**2)), float(res.variance.mean())
        cover = float(np.mean((res.estimate.ci_low <= res.true_counts) & (res.true_counts <= res.estimate.ci_high)))
        enc = res.users / max(res.seconds["encode"], 1e-9) / 1e6
        agg = res.users / max(res.seconds["aggregate"] + res.seconds["estimate"], 1e-9) / 1e6
        print(
            f"{res.spec.name:>9} {mse / res.users:>10.4f} {theory / res.users:>10.4f} {mse / theory:>6.2f} {cover:>8.3f} {enc:>10.2f} {agg:>10.2f}"
        )
        summary.append({**res.to_json_obj(), "mse": mse, "theory_mse": theory, "ci_coverage": cover})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "demo.json").write_text(json.dumps(summary))
    if not args.no_plot:
        _plot_offline(results, args.out / "demo.png")
        print(f"plot: {args.out / 'demo.png'}")
    print(f"results: {args.out / 'demo.json'}")
    return 0
