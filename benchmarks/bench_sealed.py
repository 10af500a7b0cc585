"""Sealed reports: bytes per report, sealing and opening rates, next to the plain path.

    .venv/bin/python benchmarks/bench_sealed.py                      # sizes, seal, open, streaming step
    .venv/bin/python benchmarks/bench_sealed.py --batch 10000000     # + a batch job: 10^7 sealed reports opened
                                                                     #   across --processes worker processes

* **sizes**: frame bytes per report, plain and sealed, for each metric of ``metrics/example.json`` and a
  batch of ``--frame`` reports (the header is shared by a frame's reports; the record overhead is 52 bytes).
* **seal** (device side): records sealed per second on one core (two X25519 operations each: the
  ephemeral key pair and the exchange).
* **open** (analyzer side), one core, side by side (the three interleaved in each of the ``--repeat`` rounds):
  the compiled batch opener (``ldp_opener``, native/opener: one call per batch, GIL released), the Python
  opener (``ldp_core.wire.hpke.single_shot_opener``: one X25519 exchange, five HMAC-SHA256, one AES-GCM),
  and ``cryptography``'s X25519 exchange alone (the reference: ``open_compiled_vs_x25519`` and
  ``open_python_vs_x25519``); then ``cryptography``'s own HPKE decrypt when present, and the plain path:
  decoding the same reports' plain frame. ``open_per_s`` / ``open_vs_x25519`` are the default opener's
  (the compiled one when it is installed).
* **stream**: the streaming estimator's per-record step for a shuffled batch (decode the envelope, open,
  count into the tally), sealed and plain, reports per second on one core.
* **batch**: ``--batch`` sealed reports (``--distinct`` sealed for real, repeated to the count: opening
  costs the same per record) opened by :class:`ldp_core.wire.sealing.BatchOpener` across ``--processes``
  processes; wall-clock seconds.

Single-process rates are per CPU-second of the benchmark's process (per core), medians of ``--repeat``
runs (the machine is shared: medians, not bests); the batch job is wall-clock. Results go to
``benchmarks/results/sealed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from estimator.service.state import Tally
from ldp_core.metrics import load_metrics
from ldp_core.wire import hpke
from ldp_core.wire.frames import ReportBatch, decode_frame, encode_frame
from ldp_core.wire.sealing import (
    AnalyzerKey,
    BatchOpener,
    KeyRing,
    _Opener,
    native_opener_available,
    seal_batch,
    sealed_info,
)
from pipeline.envelope import ShuffleMeta, decode_envelope, encode_envelope, open_sealed

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "sealed.json"


def _median_rate(n: int, repeat: int, fn: Any) -> float:
    """Per CPU-second of this process (= per core: everything here is single-threaded), so that the other
    tenants of the shared machine do not count against it; the median of ``repeat`` runs."""
    rates = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        rates.append(n / max(time.process_time() - t0, 1e-9))
    return float(statistics.median(rates))


def _interleaved(n: int, repeat: int, fns: dict[str, Any]) -> dict[str, float]:
    """As :func:`_median_rate` for several functions, run in turn within each round, so that a change in the
    machine's load falls on all of them alike."""
    rates: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.process_time()
            fn()
            rates[k].append(n / max(time.process_time() - t0, 1e-9))
    return {k: float(statistics.median(v)) for k, v in rates.items()}


def _machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "load": os.getloadavg()[0]}


def sizes(frame: int) -> list[dict[str, Any]]:
    metrics = load_metrics(ROOT / "metrics" / "example.json", reject_expired=False)
    key = AnalyzerKey(os.urandom(32))
    rng = np.random.default_rng(1)
    out = []
    print(
        f"{'metric':<16} {'mechanism':<8} {'record':>6} {'plain B/report':>15} {'sealed B/report':>16} {'overhead':>9}"
    )
    for name, m in metrics.items():
        if not hasattr(m.spec, "domain_size"):  # heavy hitters, numeric: encoded from other inputs
            continue
        recs = m.spec.encode(rng.integers(0, m.spec.domain_size, frame), rng)
        b = ReportBatch(name, m.spec, 20_000, recs)
        plain = len(encode_frame(b)) / frame
        sealed = len(encode_frame(seal_batch(b, key.public))) / frame
        row = {
            "metric": name,
            "mechanism": m.spec.name,
            "record_bytes": m.spec.record_size,
            "plain_bytes_per_report": round(plain, 2),
            "sealed_bytes_per_report": round(sealed, 2),
            "overhead_bytes_per_report": round(sealed - plain, 2),
        }
        out.append(row)
        print(
            f"{name:<16} {m.spec.name:<8} {m.spec.record_size:>6} {plain:>15.2f} {sealed:>16.2f} {sealed - plain:>9.2f}"
        )
    return out


def rates(n: int, repeat: int) -> dict[str, float]:
    metrics = load_metrics(ROOT / "metrics" / "example.json", reject_expired=False)
    name = next(iter(metrics))
    spec = metrics[name].spec
    rng = np.random.default_rng(2)
    key = AnalyzerKey(os.urandom(32))
    ring = KeyRing([key])
    plain = ReportBatch(name, spec, 20_000, spec.encode(rng.integers(0, spec.domain_size, n), rng))
    sealed = seal_batch(plain, key.public)
    plain_frame, sealed_frame = encode_frame(plain), encode_frame(sealed)
    res: dict[str, float] = {"n": n, "metric": name, "mechanism": spec.name}  # type: ignore[dict-item]
    res["seal_per_s"] = _median_rate(n, repeat, lambda: seal_batch(plain, key.public))
    raw = np.ascontiguousarray(sealed.records).view(np.uint8).reshape(n, -1)
    table = {key.key_id: (key.private, key.public_key)}
    python = _Opener(table, native=False)
    compiled = _Opener(table, native=True) if native_opener_available() else None
    encs = [X25519PublicKey.from_public_bytes(r[4:36].tobytes()) for r in raw]
    side: dict[str, Any] = {
        "x25519_exchange_per_s": lambda: [key.private.exchange(e) for e in encs],
        "open_per_s_python": lambda: python.open_raw(raw, name, spec.spec_id, 20_000, spec.record_size),
    }
    if compiled is not None:
        side["open_per_s_compiled"] = lambda: compiled.open_raw(raw, name, spec.spec_id, 20_000, spec.record_size)
    load0 = os.getloadavg()
    res.update(_interleaved(n, repeat, side))
    res["load_during_open"] = [round(x, 2) for x in load0] + [round(x, 2) for x in os.getloadavg()]  # type: ignore[assignment]
    res["open_python_vs_x25519"] = res["open_per_s_python"] / res["x25519_exchange_per_s"]
    if compiled is not None:
        res["open_compiled_vs_x25519"] = res["open_per_s_compiled"] / res["x25519_exchange_per_s"]
    default = "open_per_s_compiled" if compiled is not None else "open_per_s_python"
    res["open_per_s"] = res[default]
    res["open_vs_x25519"] = res["open_per_s"] / res["x25519_exchange_per_s"]
    fast = hpke.fast_suite()
    if fast is not None:  # cryptography's own single-shot decrypt, for comparison
        info = sealed_info(name, spec.spec_id, 20_000, key.key_id)
        msgs = [r[4:].tobytes() for r in raw]
        res["open_per_s_cryptography_hpke"] = _median_rate(
            n, repeat, lambda: [fast.decrypt(m, key.private, info) for m in msgs]
        )
    # the same exchanges from the records' raw bytes (the key object made per record, as opening must)
    raw_encs = [r[4:36].tobytes() for r in raw]
    res["x25519_from_bytes_per_s"] = _median_rate(
        n, repeat, lambda: [key.private.exchange(X25519PublicKey.from_public_bytes(e)) for e in raw_encs]
    )
    res["plain_decode_per_s"] = _median_rate(n, repeat, lambda: decode_frame(plain_frame, spec))
    res["sealed_frame_decode_per_s"] = _median_rate(n, repeat, lambda: decode_frame(sealed_frame, spec))
    # the streaming estimator's per-record step: decode the envelope, open if sealed, count into the tally
    meta = ShuffleMeta(shuffle_id="00" * 16, n=n, epsilon0=spec.epsilon)
    env_plain, env_sealed = encode_envelope(meta, plain), encode_envelope(meta, sealed)
    batch_opener = BatchOpener(ring)

    def step(env: bytes) -> None:
        sb, failed, _ = open_sealed(decode_envelope(env, spec), batch_opener, source="bench")
        assert failed == 0 and len(sb.batch) == n
        Tally().add(sb.batch.metric, sb.batch.day, sb.batch.spec, sb.batch.records, sb.meta)

    res["stream_step_per_s_sealed"] = _median_rate(n, repeat, lambda: step(env_sealed))
    res["stream_step_per_s_plain"] = _median_rate(n, repeat, lambda: step(env_plain))
    for k, v in res.items():
        print(f"{k:<34} {v:>14,.{2 if k.endswith('_vs_x25519') else 0}f}" if isinstance(v, float) else f"{k:<34} {v}")
    return res


def batch_job(total: int, distinct: int, processes: int, chunk: int) -> dict[str, Any]:
    metrics = load_metrics(ROOT / "metrics" / "example.json", reject_expired=False)
    name = next(iter(metrics))
    spec = metrics[name].spec
    rng = np.random.default_rng(3)
    key = AnalyzerKey(os.urandom(32))
    distinct = min(distinct, total)
    t0 = time.perf_counter()
    base = seal_batch(
        ReportBatch(name, spec, 20_000, spec.encode(rng.integers(0, spec.domain_size, distinct), rng)), key.public
    )
    sealing = time.perf_counter() - t0
    reps = -(-total // distinct)
    records = np.tile(np.ascontiguousarray(base.records), reps)[:total]
    print(
        f"batch job: {total:,} sealed reports ({distinct:,} distinct, sealed in {sealing:.1f} s), {processes} processes"
    )
    with BatchOpener(KeyRing([key]), processes=processes, chunk=chunk) as opener:
        opener.open_records(records[: chunk * processes * 2], name, spec, 20_000)  # start the workers
        t0 = time.perf_counter()
        plain, failed = opener.open_records(records, name, spec, 20_000)
        seconds = time.perf_counter() - t0
    assert failed == 0 and plain.size == total
    print(
        f"  opened in {seconds:.1f} s: {total / seconds:,.0f} reports/s ({total / seconds / processes:,.0f} per process)"
    )
    return {"reports": total, "processes": processes, "seconds": round(seconds, 1), "per_s": round(total / seconds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=20_000, help="reports per rate measurement")
    ap.add_argument("--frame", type=int, default=250, help="reports per frame for the size table")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--batch", type=int, default=0, help="reports of the batch job (0: skip it)")
    ap.add_argument("--distinct", type=int, default=200_000)
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--chunk", type=int, default=20_000)
    args = ap.parse_args()
    out: dict[str, Any] = {
        "machine": _machine(),
        "cryptography_hpke": hpke.fast_suite() is not None,
        "compiled_opener": native_opener_available(),
        "sizes": sizes(args.frame),
        "rates": rates(args.n, args.repeat),
    }
    if args.batch:
        out["batch_job"] = batch_job(args.batch, args.distinct, args.processes, args.chunk)
    prev = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if "batch_job" not in out and "batch_job" in prev:
        out["batch_job"] = prev["batch_job"]
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
