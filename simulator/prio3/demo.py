"""``ldp demo --prio3``: the demo's Prio3 metrics through both aggregators, beside local DP on the same data.

A seeded population of devices draws one value per metric (a crash flag, session minutes, a theme among
8, uses of 6 features). Each device shards and seals its values with the device code
(:func:`ldp_core.prio3.report.make_report`); most upload them as wire frames over HTTP to the collector,
``sdk_devices`` of them through the real :class:`~client_sdk.prio3.Prio3Client` (outbox and uploader), and
one frame is sent twice (a replay). The leader reads the log, runs the aggregation jobs with the helper
over HTTP, and the collector's combine step unshards each metric's two aggregate shares. Each Prio3
aggregate is printed beside the truth; the run fails unless every one is equal.

Side by side, the same values are privatized with local DP (GRR, OUE and the hybrid mean mechanism at
``ldp_epsilon``) and estimated with the project's estimators, in memory: exact vs noisy, bytes per
report, and CPU per report on the device and on each server. With ``central_epsilon`` the Prio3
aggregators add discrete Laplace noise to their aggregate shares (:mod:`ldp_core.prio3.noise`): the
collector's result is the noised one (``central``), and the exact one is unsharded in process from
both aggregators' unreleased shares to check it against the truth.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from simulator.prio3.stack import DEMO_METRICS, Prio3Stack, new_deployment

__all__ = ["Prio3DemoConfig", "run_prio3_demo", "draw_values"]


@dataclasses.dataclass
class Prio3DemoConfig:
    devices: int = 1000
    sdk_devices: int = 4
    seed: int = 20261130
    frame_reports: int = 250
    ldp_epsilon: float = 1.0
    central_epsilon: float | None = None
    ports: tuple[int, int, int] = (0, 0, 0)
    workdir: Path | None = None
    out: Path = Path("out")
    plot: bool = True
    on_phase: Callable[[str], None] | None = None


def draw_values(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """The demo population: one value per device and metric."""
    theme_p = 1.0 / np.arange(1, 9) ** 1.1
    return {
        "prio3.crashed": (rng.random(n) < 0.12).astype(np.int64),
        "prio3.session_minutes": np.minimum(240, np.round(rng.exponential(35.0, n))).astype(np.int64),
        "prio3.theme": rng.choice(8, n, p=theme_p / theme_p.sum()).astype(np.int64),
        "prio3.feature_uses": np.minimum(15, rng.poisson([0.5, 1.0, 2.0, 3.0, 4.0, 6.0], (n, 6))).astype(np.int64),
    }


def _truth(name: str, v: np.ndarray) -> int | list[int]:
    if name == "prio3.theme":
        return [int(c) for c in np.bincount(v, minlength=8)]
    if name == "prio3.feature_uses":
        return [int(c) for c in v.sum(axis=0)]
    return int(v.sum())


def _as_list(v: Any) -> list[float]:
    return [float(x) for x in np.atleast_1d(np.asarray(v, dtype=np.float64))]


def _ldp(name: str, v: np.ndarray, eps: float, rng: np.random.Generator) -> dict[str, Any]:
    """The same values through local DP: encode (device), accumulate and estimate (server), timed."""
    from estimator.oracles import state_for
    from ldp_core.mechanisms import make_spec

    n = len(v)
    if name == "prio3.crashed":
        spec, vals = make_spec("grr", epsilon=eps, domain_size=2), v
    elif name == "prio3.theme":
        spec, vals = make_spec("oue", epsilon=eps, domain_size=8), v
    elif name == "prio3.session_minutes":
        spec, vals = make_spec("hm", epsilon=eps, low=0, high=240), v.astype(np.float64)
    else:
        spec, vals = make_spec("hm", epsilon=eps, low=0, high=15, dims=6), v.astype(np.float64)
    t0 = time.process_time()
    records = spec.encode(vals, rng)
    t1 = time.process_time()
    acc = state_for(spec)
    acc.update(records)
    est = acc.estimate()
    t2 = time.process_time()
    if hasattr(est, "mean"):  # a sum is n times the mean
        value, std = np.asarray(est.mean) * n, np.sqrt(np.asarray(est.variance)) * n
    else:
        value, std = np.asarray(est.counts), np.sqrt(np.asarray(est.variance))
        if name == "prio3.crashed":
            value, std = value[1:], std[1:]
    return {
        "mechanism": spec.name,
        "epsilon": eps,
        "estimate": [round(x, 1) for x in _as_list(value)],
        "std": [round(x, 1) for x in _as_list(std)],
        "bytes_per_report": spec.record_size,
        "device_cpu_us": 1e6 * (t1 - t0) / n,
        "server_cpu_us": 1e6 * (t2 - t1) / n,
    }


def _central(got: Any, exact: Any) -> dict[str, Any]:
    """The row for the aggregate the collector got with both aggregators' noise (``got``: its Prio3Result)."""
    noise = got.noise
    leader = noise["leader"]
    return {
        "epsilon": leader["epsilon"],
        "sensitivity": leader["sensitivity"],
        "std": noise["std"],
        "value": [int(x) for x in np.atleast_1d(got.value)],
        "added_by": "each aggregator, to its own aggregate share before releasing it",
        "std_per_aggregator": float(np.sqrt(leader["variance"])),
        "error": [int(a) - int(b) for a, b in zip(np.atleast_1d(got.value), np.atleast_1d(exact), strict=True)],
    }


def _upload(st: Prio3Stack, day: int, values: dict[str, np.ndarray], cfg: Prio3DemoConfig) -> dict[str, Any]:
    """The simulated devices (all but the SDK ones): shard and seal, frames over HTTP; one frame replayed."""
    import httpx

    from ldp_core.prio3.report import make_report
    from ldp_core.wire.frames import FRAME_CONTENT_TYPE, ReportBatch, encode_frame

    keys = st.metrics.prio3_aggregators
    sim = cfg.devices - cfg.sdk_devices
    device_cpu: dict[str, float] = {}
    sent = replayed = 0
    with httpx.Client(timeout=60) as http:
        for name, vals in values.items():
            spec = st.metrics.prio3_spec(name)
            t0 = time.process_time()
            reports = [make_report(spec, v.tolist(), day, keys["leader"], keys["helper"]) for v in vals[:sim]]
            device_cpu[name] = 1e6 * (time.process_time() - t0) / max(sim, 1)
            for i in range(0, sim, cfg.frame_reports):
                chunk = reports[i : i + cfg.frame_reports]
                recs = np.frombuffer(b"".join(chunk), dtype=spec.record_dtype)
                frame = encode_frame(ReportBatch(name, spec, day, recs))
                resp = http.post(
                    st.collector_url + "/v1/reports", content=frame, headers={"content-type": FRAME_CONTENT_TYPE}
                )
                resp.raise_for_status()
                sent += len(chunk)
                if i == 0 and name == "prio3.session_minutes":  # a replay: the same reports under a new batch id
                    again = encode_frame(ReportBatch(name, spec, day, recs))
                    http.post(
                        st.collector_url + "/v1/reports", content=again, headers={"content-type": FRAME_CONTENT_TYPE}
                    ).raise_for_status()
                    replayed += len(chunk)
    return {"sent": sent, "replayed": replayed, "device_cpu_us": device_cpu}


def _sdk_devices(
    st: Prio3Stack, work: Path, day_time: float, values: dict[str, np.ndarray], cfg: Prio3DemoConfig
) -> int:
    from client_sdk.prio3 import Prio3Client

    sent = 0
    for k in range(cfg.devices - cfg.sdk_devices, cfg.devices):
        dev = Prio3Client(st.metrics, work / f"device-{k}", st.collector_url, clock=lambda: day_time)
        for name, vals in values.items():
            if not dev.record(name, vals[k].tolist()):
                raise RuntimeError(f"an SDK device did not record {name}: {dict(dev.errors)}")
            sent += 1
        if dev.flush() != "idle" or dev.pending():
            raise RuntimeError("an SDK device could not upload its Prio3 reports")
        dev.close()
    return sent


def run_prio3_demo(cfg: Prio3DemoConfig) -> tuple[int, dict[str, Any]]:
    """Run the demo; (exit code: 0 only if every Prio3 aggregate equals the truth, the result document)."""
    from ldp_core.days import utc_day

    if cfg.devices < 1 or not 0 <= cfg.sdk_devices <= cfg.devices or cfg.frame_reports < 1:
        raise ValueError("--devices must be positive, --sdk-devices in [0, --devices], --frame-reports positive")
    phase = cfg.on_phase or (lambda _t: None)
    work = Path(cfg.workdir) if cfg.workdir else Path(tempfile.mkdtemp(prefix="ldp-prio3-"))
    rng = np.random.default_rng(cfg.seed)
    values = draw_values(rng, cfg.devices)
    try:
        phase("making the aggregators' keys and the metrics file")
        dep = new_deployment(work / "ops")
        with Prio3Stack(dep, work / "run", ports=cfg.ports, central_epsilon=cfg.central_epsilon) as st:
            now = time.time()
            day = utc_day(now)
            phase(f"{cfg.devices} devices shard, seal and upload ({cfg.sdk_devices} through the SDK's outbox)")
            up = _upload(st, day, values, cfg)
            sdk = _sdk_devices(st, work, now, values, cfg)
            phase("the leader reads the log and aggregates with the helper over HTTP")
            t0 = time.monotonic()
            st.wait_settled(up["sent"] + up["replayed"] + sdk, timeout=600)
            seconds = time.monotonic() - t0
            leader, helper = st.leader.status(), st.helper.status()
            phase("collecting: the combine step unshards each metric")
            rows = []
            for name, vals in values.items():
                released = st.collect(name, day)
                # with central noise the collector only gets noised shares: the exact aggregate is read
                # from both aggregators in process (the simulation plays every party) to check it
                got = released if cfg.central_epsilon is None else st.audit_exact(name, day)
                truth = _truth(name, vals)
                row: dict[str, Any] = {
                    "metric": name,
                    "type": DEMO_METRICS[name]["type"],
                    "truth": truth,
                    "prio3": got.value,
                    "reports": got.reports,
                    "equal": got.value == truth,
                    "bytes_per_report": st.metrics.prio3_spec(name).layout.size,
                    "device_cpu_us": up["device_cpu_us"][name],
                    "ldp": _ldp(name, vals, cfg.ldp_epsilon, rng),
                }
                if cfg.central_epsilon is not None:
                    row["central"] = _central(released, got.value)
                rows.append(row)
    finally:
        if cfg.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    doc = {
        "devices": cfg.devices,
        "sdk_devices": cfg.sdk_devices,
        "replayed_reports": up["replayed"],
        "leader": {k: leader[k] for k in ("counts", "cpu_per_report_us")},
        "helper": {k: helper[k] for k in ("counts", "cpu_per_report_us")},
        "aggregation_seconds": seconds,
        "metrics": rows,
        "all_equal": all(r["equal"] for r in rows) and leader["counts"].get("replayed", 0) == up["replayed"],
    }
    cfg.out.mkdir(parents=True, exist_ok=True)
    (cfg.out / "prio3.json").write_text(json.dumps(doc, indent=2) + "\n")
    if cfg.plot:
        from simulator.prio3.plot import plot_prio3

        plot_prio3(doc, cfg.out / "prio3.png")
    return (0 if doc["all_equal"] else 1), doc
