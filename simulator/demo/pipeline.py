"""``ldp demo``'s main run: the real pipeline on one machine, fed by simulated devices, checked against the truth.

:func:`run_pipeline` starts :class:`~simulator.stack.LocalPipeline` (the FastAPI collector, the shuffler, the
streaming estimator with its HTTP API and the Parquet sink, on the embedded log or on Kafka), feeds it a
seeded population of simulated devices that privatize their values with the SDK's encoders and upload
wire-format frames over HTTP (plus a few real :class:`~client_sdk.client.TelemetryClient` devices going
through ledger, outbox and uploader), and prints, per metric, the estimates with their 95% confidence
intervals against the truth and the central ε the shuffle gives. It checks that every uploaded report was
counted once and that the streaming estimates equal the batch job's over the Parquet dataset, and writes
``demo.json`` and a plot. With :attr:`DemoConfig.sealed` every metric's reports are sealed to a fresh
analyzer key; with :attr:`DemoConfig.tokens` every upload pays with an anonymous token and one install
floods a metric (:mod:`simulator.demo.tokens`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DemoConfig", "KeepRunning", "run_pipeline", "serve_until_stopped"]


@dataclasses.dataclass
class DemoConfig:
    """What one demo run does (``ldp demo``'s options, checked and with their defaults filled in)."""

    devices: int
    metrics: Path
    sdk_devices: int = 4
    kafka: str | None = None  #: HOST:PORT of a Kafka broker; None: the embedded log
    min_batch: int = 1000  #: the shuffler's crowd threshold
    frame_reports: int = 1000
    sealed: bool = False
    tokens: bool = False
    tokens_per_day: int | None = None  #: --tokens: K (None: one per metric)
    flood: int = 300  #: --tokens: the flooding install's uploads beyond its first
    clients: int = 4
    top: int = 8
    workdir: Path | None = None  #: None: a fresh temporary folder, removed when the run (or --serve) ends
    distribution: str = "zipf:1.1"
    seed: int = 20261130
    out: Path = Path("out")
    plot: bool = True
    port: int = 0  #: the estimator's port (0: a free one)
    serve: bool = False  #: the pipeline is kept running afterwards (only changes what the run prints)
    progress: bool = True  #: bars on stderr for the long phases, when stderr is a terminal (--no-progress: never)


@dataclasses.dataclass
class KeepRunning:
    """``--serve``: the demo's pipeline, left running after the run for the caller to stop (:meth:`stop`)."""

    pipe: Any = None
    scratch: Path | None = None  #: the run's temporary work folder, removed once the pipeline is stopped

    def stop(self) -> None:
        """Stop the pipeline, then remove the temporary work folder (device keys, stores, logs) if there is one."""
        try:
            if self.pipe is not None:
                self.pipe.stop()
        finally:
            if self.scratch is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)
                self.scratch = None


@dataclasses.dataclass
class _Run:
    """One run's prepared pieces: the metrics (sealed with ``--sealed``), the day, folders and the issuer."""

    cfg: DemoConfig
    metrics: Any
    metrics_path: Path
    names: list[str]
    day: int
    workdir: Path
    scratch: bool = False  #: the work folder is a temporary one, removed at the end
    keys_dir: Path | None = None
    seal_to: Any = None
    issuer: Any = None
    collector_options: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Fed:
    """What the devices sent: the true values per metric, the reports the pipeline must count, the flood."""

    truth: dict[str, np.ndarray]
    expected: dict[str, int]
    flooded: Any


@dataclasses.dataclass
class _Seen:
    """What the pipeline made of it: the live estimates, the counts, the shuffler's stats and held reports."""

    live: dict[str, Any]
    counted: dict[str, int]
    shuffler: dict[str, Any]
    held: int
    dataset: Path
    estimator_url: str


@contextlib.contextmanager
def _started(pipe: Any, keep: KeepRunning | None) -> Iterator[Any]:
    """Run ``pipe`` for the demo; with ``keep`` it outlives the block (``keep.pipe``), for the caller to stop."""
    pipe.start()
    try:
        yield pipe
    except BaseException:
        pipe.stop()
        raise
    if keep is None:
        pipe.stop()
    else:
        keep.pipe = pipe


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


def _prepare(cfg: DemoConfig) -> _Run:
    """Load the metrics (ValueError if any has expired), make the work folder and, with ``sealed``, a fresh
    analyzer key and a copy of the metrics file that seals every metric to it."""
    from ldp_core.days import utc_day
    from ldp_core.metrics import load_metrics

    metrics = load_metrics(cfg.metrics, reject_expired=False)
    day = utc_day(time.time())
    expired = metrics.expired(day)
    if expired:
        raise ValueError(f"metrics {expired} in {cfg.metrics} have expired; renew them or pick another file")
    workdir = cfg.workdir or Path(tempfile.mkdtemp(prefix="ldp-demo-"))
    run = _Run(cfg, metrics, cfg.metrics, list(metrics), day, workdir, scratch=cfg.workdir is None)
    if cfg.sealed:
        try:
            _seal_all(run)
        except BaseException:
            if run.scratch:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
    return run


def _seal_all(run: _Run) -> None:
    """``--sealed``: a fresh analyzer key in the work folder and a copy of the metrics file that seals every
    metric to it."""
    from ldp_core.metrics import parse_metrics
    from ldp_core.wire.sealing import new_key_file

    workdir, metrics = run.workdir, run.metrics
    run.keys_dir = Path(workdir) / "analyzer-keys"
    _, analyzer = new_key_file(run.keys_dir)
    run.seal_to = analyzer.public
    doc = metrics.to_dict()
    for m in doc["metrics"].values():
        m["sealed"] = True
    doc["analyzer_keys"] = [run.seal_to.to_dict()]
    run.metrics_path = Path(workdir) / "metrics-sealed.json"
    run.metrics_path.write_text(json.dumps(doc, indent=2))
    run.metrics = parse_metrics(doc, reject_expired=False)


def run_pipeline(cfg: DemoConfig, keep: KeepRunning | None = None) -> int:
    """The demo's run (see the module's docstring); 0 if every check passed, else 1. With ``keep`` the
    pipeline is left running in ``keep.pipe`` (for :func:`serve_until_stopped`) instead of stopped."""
    run = _prepare(cfg)
    try:
        if cfg.tokens:
            from simulator.demo.tokens import start_issuer

            run.issuer = start_issuer(run.workdir, cfg.tokens_per_day, run.names, run.metrics_path)
            run.collector_options = run.issuer.collector_options(Path(run.workdir) / "spent-tokens.sqlite3")
        return _run(run, keep)
    finally:
        if run.issuer is not None:
            run.issuer.stop()
        if run.scratch:  # device keys, stores and logs go with the run (with --serve: once the pipeline stops)
            if keep is not None and keep.pipe is not None:
                keep.scratch = run.workdir
            else:
                shutil.rmtree(run.workdir, ignore_errors=True)


def _run(run: _Run, keep: KeepRunning | None) -> int:
    """Start the stack, feed it, read what it counted and report (see :func:`run_pipeline`)."""
    from simulator.stack import LocalPipeline

    cfg = run.cfg
    t_start = time.monotonic()
    rng = np.random.default_rng(cfg.seed)
    print(
        f"ldp demo: {cfg.devices:,} devices x {len(run.names)} metrics on "
        f"{'Kafka at ' + cfg.kafka if cfg.kafka else 'the embedded log'} (seed {cfg.seed}); "
        f"work folder {run.workdir}" + (" (removed at the end; --workdir keeps one)" if run.scratch else ""),
        flush=True,
    )
    stack = LocalPipeline(
        run.workdir,
        run.metrics_path,
        transport_url=f"kafka://{cfg.kafka}" if cfg.kafka else None,
        min_batch=cfg.min_batch,
        analyzer_keys=run.keys_dir,
        collector_options=run.collector_options,
        estimator_port=cfg.port,
    )
    with _started(stack, keep) as pipe:
        _announce(run, pipe)
        fed = _feed(run, pipe, rng)
        seen = _observe(run, pipe, fed)
    return _report(run, fed, seen, t_start)


def _announce(run: _Run, pipe: Any) -> None:
    """Print where the stack's parts listen (and the analyzer key, the issuer)."""
    if run.seal_to is not None:
        print(f"  sealed metrics: records sealed to analyzer key {run.seal_to.key_id} (private key in {run.keys_dir})")
    if run.issuer is not None:
        print(
            f"  token issuer {run.issuer.url} (K = {run.issuer.tokens_per_day} tokens/device/metric-day, blind RSA);"
            f" the collector requires a token per upload (keys {run.issuer.public_dir})",
            flush=True,
        )
    print(
        f"  collector {pipe.collector_url}   estimator {pipe.estimator_url}   "
        f"shuffler crowd >= {run.cfg.min_batch}   Parquet sink {pipe.dataset}",
        flush=True,
    )
    print(f"  dashboard {pipe.estimator_url}/", flush=True)


def _run_sdk_devices(run: _Run, pipe: Any, rng: Any, truth: dict[str, np.ndarray], n_sdk: int) -> None:
    """Drive ``n_sdk`` real TelemetryClients end to end (with ``--tokens``: enrolled, paying with tokens) and
    add their values to ``truth``."""
    from simulator.stack import add_truth, sdk_devices

    client_options = None
    if run.issuer is not None:
        from simulator.demo.tokens import sdk_token_options

        client_options = sdk_token_options(run.issuer, run.collector_options["token_origin"])
    t0 = time.monotonic()
    for name, counts in sdk_devices(
        pipe.collector_url,
        run.metrics_path,
        run.names,
        n_sdk,
        rng,
        workdir=run.workdir / "sdk-devices",
        distribution=run.cfg.distribution,
        client_options=client_options,
    ).items():
        truth[name] = add_truth(run.metrics, name, truth[name], counts)
    print(f"  {n_sdk} SDK devices: record -> ledger -> outbox -> uploader in {time.monotonic() - t0:.1f} s", flush=True)


def _feed(run: _Run, pipe: Any, rng: Any) -> _Fed:
    """The SDK devices, then the simulated fleet's batches (sealed with ``--sealed``; with ``--tokens`` after
    the flood and paid with tokens) uploaded to the collector."""
    from simulator.stack import add_truth, empty_truth, fleet_batches, truth_reports, upload

    cfg, metrics, names = run.cfg, run.metrics, run.names
    truth = {n: empty_truth(metrics, n) for n in names}
    n_sdk = min(cfg.sdk_devices, cfg.devices)
    if n_sdk:
        _run_sdk_devices(run, pipe, rng, truth, n_sdk)
    fleet = fleet_batches(
        metrics,
        names,
        cfg.devices - n_sdk,
        run.day,
        rng,
        frame_reports=1 if run.issuer is not None else cfg.frame_reports,  # with tokens each device uploads its own
        distribution=cfg.distribution,
    )
    for name, counts in fleet.truth.items():
        truth[name] = add_truth(metrics, name, truth[name], counts)
    sent = fleet.batches
    if run.seal_to is not None:
        from ldp_core.wire.sealing import seal_batch

        t0 = time.monotonic()
        sent = [seal_batch(b, run.seal_to) for b in fleet.batches]
        print(
            f"  sealed {sum(len(b) for b in sent):,} reports (+52 bytes each) in {time.monotonic() - t0:.1f} s",
            flush=True,
        )
    flooded = None
    if run.issuer is not None and cfg.flood:  # before the fleet: its reports join the fleet's released crowds
        from simulator.demo.tokens import flood_metric

        flooded = flood_metric(pipe.collector_url, run.issuer, metrics, names, run.day, cfg.flood, rng)
    paid = _pay(run, fleet, cfg.devices - n_sdk)
    stats = upload(pipe.collector_url, sent, clients=cfg.clients, headers=paid.headers if paid else None)
    print(
        f"  {cfg.devices - n_sdk:,} devices uploaded {stats.reports:,} reports in {stats.batches} frames "
        f"in {stats.seconds:.1f} s ({stats.rate:,.0f} reports/s, {stats.retries} retries)",
        flush=True,
    )
    expected = {n: truth_reports(metrics, n, truth[n]) for n in names}
    if flooded is not None:
        expected[flooded.metric] += flooded.accepted_reports  # counted, not part of the truth
    return _Fed(truth, expected, flooded)


def _pay(run: _Run, fleet: Any, devices: int) -> Any:
    """With ``--tokens``: every fleet device enrolls and fetches one token per metric (the paid fleet, or
    None without tokens or devices)."""
    if run.issuer is None:
        return None
    from tqdm import tqdm

    from simulator.token_fleet import pay_fleet

    t0 = time.monotonic()
    off = not (run.cfg.progress and sys.stderr.isatty())
    with tqdm(total=devices, desc="  enrolling", unit="device", file=sys.stderr, disable=off, leave=False) as bar:
        paid = pay_fleet(run.issuer, fleet.batches, devices, lambda _i: bar.update()) if fleet.devices else None
    n_paid = paid.fetched if paid is not None else 0
    print(
        f"  {devices:,} devices enrolled and fetched {n_paid:,} tokens "
        f"({len(run.names)} each, one per metric) in {time.monotonic() - t0:.1f} s",
        flush=True,
    )
    return paid


def _observe(run: _Run, pipe: Any, fed: _Fed) -> _Seen:
    """Wait until the estimator counted every released report and the sink wrote them; the live estimates."""
    import httpx

    total = sum(fed.expected.values())
    waited, held = pipe.wait_settled(total, timeout=120)
    print(
        f"  the streaming estimator counted every released report {waited:.1f} s after the last upload"
        + (f"; {held:,} reports wait in the shuffler for a crowd of {run.cfg.min_batch}" if held else ""),
        flush=True,
    )
    pipe.wait_sink(total - held, timeout=120)
    live = {
        n: httpx.get(f"{pipe.estimator_url}/v1/estimates/{n}", params={"day": run.day}, timeout=60).json()
        for n in run.names
    }
    return _Seen(live, pipe.counted(), pipe.shuffler.stats.to_dict(), held, pipe.dataset, pipe.estimator_url)


def _metric_rows(run: _Run, fed: _Fed, seen: _Seen, words: dict[str, dict[int, str]]) -> tuple[dict[str, Any], bool]:
    """Print each metric against its truth; the demo.json entries and whether every streaming estimate equals
    the batch job's over the Parquet dataset (``seen.live`` gets the discovered words of string metrics)."""
    from estimator.jobs.batch import estimate_dataset
    from pipeline.catalog import SpecCatalog
    from simulator.demo.rows import frequency_row, heavy_hitters_row, numeric_row

    metrics, day = run.metrics, run.day
    catalog = SpecCatalog([metrics])
    rows: dict[str, Any] = {}
    batch_equal = True
    for name in run.names:
        m, est, t = metrics[name], seen.live[name], fed.truth[name]
        uploaded, counted = fed.expected[name], seen.counted.get(name, 0)
        if m.kind == "heavy_hitters":
            row = heavy_hitters_row(seen.dataset, m, t, day, run.cfg.top)
            same = row.pop("reports_per_part") == est.get("reports_per_part")  # the stream's level counts
            row.update(
                uploaded=uploaded,
                counted=counted,
                batch_equals_streaming=same,
                reports_per_day=m.max_reports_per_day,
                person_epsilon=m.max_reports_per_day * m.spec.epsilon,
                central_epsilon=est.get("central_epsilon"),
                central_delta=est.get("central_delta"),
            )
            seen.live[name] = {**est, "found": row["found"], "true_top": row["true_top"]}
        elif m.kind != "frequency":
            res = estimate_dataset(seen.dataset, name, [day], progress=False)
            row, same = numeric_row(m, est, t, res.table)
            row.update(uploaded=uploaded, counted=counted)
        else:
            res = estimate_dataset(seen.dataset, name, [day], progress=False, definition=catalog.metrics.get(name))
            row, same = frequency_row(metrics, name, est, t, res.table, words, run.cfg.top, uploaded, counted)
        batch_equal &= same
        rows[name] = row
    return rows, batch_equal


def _report(run: _Run, fed: _Fed, seen: _Seen, t_start: float) -> int:
    """Print every metric against the truth and the run's checks, write demo.json and the plot; the exit code."""
    from simulator.stack import demo_labels

    cfg = run.cfg
    summary: dict[str, Any] = {
        "devices": cfg.devices,
        "day": run.day,
        "transport": "kafka" if cfg.kafka else "embedded",
        "sealed": bool(cfg.sealed),
        "tokens": None,
        "metrics": {},
        "shuffler": seen.shuffler,
        "held_by_shuffler": seen.held,
    }
    words = {n: demo_labels(run.metrics, n) for n in run.names}
    print()
    summary["metrics"], batch_equal = _metric_rows(run, fed, seen, words)
    tokens_ok = True
    if run.issuer is not None:
        from simulator.demo.tokens import token_summary

        summary["tokens"], tokens_ok = token_summary(
            run.issuer,
            run.collector_options["spent_path"],
            fed.expected,
            fed.flooded,
            seen.live,
            run.metrics,
            fed.truth,
        )
    counted, expected, held = seen.counted, fed.expected, seen.held
    once = sum(counted.values()) + held == sum(expected.values()) and all(
        counted.get(n, 0) <= expected[n] for n in run.names
    )
    print()
    print(
        f"every uploaded report counted exactly once: {'yes' if once else 'NO'} "
        f"({sum(counted.values()):,} counted + {held:,} below the crowd threshold = "
        f"{sum(expected.values()):,} uploaded)"
    )
    print(f"streaming estimates equal the batch job over the Parquet dataset: {'yes' if batch_equal else 'NO'}")
    _write_results(run, fed, seen, summary, words, t_start)
    return 0 if once and batch_equal and tokens_ok else 1


def _write_results(
    run: _Run, fed: _Fed, seen: _Seen, summary: dict[str, Any], words: dict[str, dict[int, str]], t_start: float
) -> None:
    """Write demo.json (with the run's seconds) and demo.png into the out folder, and say where."""
    from simulator.demo.plots import plot_pipeline

    cfg = run.cfg
    cfg.out.mkdir(parents=True, exist_ok=True)
    summary["seconds"] = time.monotonic() - t_start
    (cfg.out / "demo.json").write_text(json.dumps(summary))
    if cfg.plot:
        plot_pipeline(run.metrics, seen.live, fed.truth, words, cfg.out / "demo.png")
        print(f"plot: {cfg.out / 'demo.png'}")
    print(f"results: {cfg.out / 'demo.json'}   ({summary['seconds']:.0f} s)")
    print(f"dashboard: {seen.estimator_url}/" + ("" if cfg.serve else "   (gone with the pipeline; --serve keeps it)"))
