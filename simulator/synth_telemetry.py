"""Synthetic telemetry end to end: devices report one assigned 2-way marginal of their record under local DP
through the real SDK, collector and shuffler (the local stack on the embedded log), the streaming estimator
estimates each pair, and :func:`estimator.synth.telemetry.synthesize` turns the estimates into a table.

``sdk_clients`` devices are real :class:`~client_sdk.client.TelemetryClient` instances (record -> ledger ->
encoder -> outbox -> uploader over HTTP); the others privatize with the same spec's batch encoder and upload
wire-format frames (:func:`simulator.stack.fleet_batches`'s way), so a run of thousands of devices stays fast.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from estimator.synth.data import SynthError, Table
from estimator.synth.telemetry import PairEstimate, joint_codes, metrics_document, pair_metric_name, pairs_of
from ldp_core.days import utc_day
from ldp_core.metrics import load_metrics
from ldp_core.wire.frames import ReportBatch

__all__ = ["collect_pairs"]


def _sdk_reports(
    collector_url: str,
    metrics_path: Path,
    table: Table,
    assigned: np.ndarray,
    rows: np.ndarray,
    rng: np.random.Generator,
    folder: Path,
) -> None:
    from client_sdk.client import TelemetryClient
    from client_sdk.config import ClientConfig
    from client_sdk.policy import LocalPolicy

    metrics = load_metrics(metrics_path, reject_expired=False)
    eps = max(m.daily_epsilon for m in metrics.values())
    policy = LocalPolicy(per_metric_daily=eps, total_daily=eps)  # one report of one pair a day: ε in all
    pairs = pairs_of(table)
    for i in rows:
        pair = pairs[int(assigned[i])]
        name = pair_metric_name(table, pair)
        value = f"{table.labels[pair[0]][table.codes[i, pair[0]]]}|{table.labels[pair[1]][table.codes[i, pair[1]]]}"
        config = ClientConfig(mode="simulation", simulation_seed=int(rng.integers(0, 2**31)), batch_max_age=0.0)
        with TelemetryClient(folder / f"device-{i}", collector_url, policy, metrics, config=config) as client:
            client.record(name, value)
            if not client.flush(timeout=60.0) or client.pending_reports():
                raise RuntimeError(f"SDK device {i} did not upload its report: {client.errors()}")


def collect_pairs(
    table: Table,
    epsilon: float,
    rng: np.random.Generator,
    *,
    mechanism: str = "oue",
    sdk_clients: int = 20,
    workdir: str | Path | None = None,
    min_batch: int = 20,
    frame_reports: int = 250,
    progress: Callable[[str], None] | None = None,
    timeout: float = 120.0,
) -> tuple[list[PairEstimate], dict[str, Any]]:
    """Every row of ``table`` is a device: it is assigned a pair and reports it at ``epsilon`` through the
    local stack. Returns each pair's estimate as the estimator's HTTP API serves it, and run figures."""
    import httpx

    from simulator.stack import LocalPipeline, upload

    say = progress or (lambda _m: None)
    if table.rows < 1:
        raise SynthError("no devices")
    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ldp-synth-"))
    base.mkdir(parents=True, exist_ok=True)
    metrics_path = base / "synth-metrics.json"
    metrics_path.write_text(json.dumps(metrics_document(table, epsilon, mechanism)))
    metrics = load_metrics(metrics_path, reject_expired=False)
    pairs = pairs_of(table)
    assigned = rng.integers(0, len(pairs), table.rows)  # independent of the data: public
    sdk_rows = np.arange(min(sdk_clients, table.rows))
    t0 = time.monotonic()
    with LocalPipeline(base / "stack", metrics_path, min_batch=min_batch, partitions=1) as stack:
        say(f"local stack up; {len(sdk_rows)} SDK devices report")
        _sdk_reports(stack.collector_url, metrics_path, table, assigned, sdk_rows, rng, base / "devices")
        day = utc_day(time.time())
        batches: list[ReportBatch] = []
        rest = np.arange(len(sdk_rows), table.rows)
        for k, pair in enumerate(pairs):
            who = rest[assigned[rest] == k]
            if who.size == 0:
                continue
            name = pair_metric_name(table, pair)
            spec = metrics[name].spec
            recs = spec.encode(joint_codes(table.take(who), pair), rng)
            for part in np.array_split(recs, max(1, who.size // frame_reports)):
                batches.append(ReportBatch(name, spec, day, part.copy(), rng.bytes(16)))
        stats = upload(stack.collector_url, batches, clients=2)
        say(f"{stats.reports} more reports uploaded in {len(batches)} frames")
        waited, buffered = stack.wait_settled(stats.reports + len(sdk_rows), timeout=timeout)
        say(f"shuffler released everything but {buffered} reports; estimating {len(pairs)} pairs")
        out = []
        with httpx.Client(base_url=stack.estimator_url, timeout=30.0) as http:
            for pair in pairs:
                r = http.get(f"/v1/estimates/{pair_metric_name(table, pair)}")
                if r.status_code == 404:
                    continue
                r.raise_for_status()
                body = r.json()
                out.append(
                    PairEstimate(
                        pair,
                        np.array([np.nan if v is None else v for v in body["counts"]], dtype=np.float64),
                        np.array([np.nan if v is None else v for v in body["std_error"]], dtype=np.float64),
                        int(body["n"]),
                    )
                )
    return out, {
        "devices": table.rows,
        "sdk_devices": int(len(sdk_rows)),
        "buffered_reports": int(buffered),
        "epsilon_per_device": float(epsilon),
        "mechanism": mechanism,
        "seconds": round(time.monotonic() - t0, 2),
    }
