"""Frequency oracles against the pure-ldp package (1.2.0), side by side.

One seeded Zipf dataset (``--n`` values over ``--d`` items) is written to a
temporary ``.npy`` file. Then, for every mechanism both projects have
(GRR/DE, OUE, RAPPOR, OLH, CMS, HCMS, HR):

* **ours**, in this process: the batch encoder ``spec.encode`` over the
  data in chunks, then ``accumulator_for(spec)``: ``update`` over all reports
  and ``estimate()``. One untimed run over the same data comes first, so
  numba compile (or cache load) time of every size-dependent path is
  excluded from the timed runs; it is measured separately.
* **pure-ldp**, in a subprocess of ``.bench-venv/bin/python``
  (``benchmarks/pureldp_side.py``) on the same data file: its client's
  ``privatise`` one report at a time (its API has no batch encoder), then
  its server's ``aggregate`` per report and ``estimate_all`` over the domain.
  Where that is too slow for ``--n`` reports it runs on a prefix of the
  data (``--pureldp-n``), and its server throughput is projected to ``--n``
  by scaling its aggregation time linearly and keeping its estimation time
  fixed -- a projection that does not understate pure-ldp's throughput.
* **first call in a fresh process**: a child interpreter imports the
  mechanism and runs encode + update + estimate on 2^17 values, once with
  an empty numba cache directory (cold: pays compilation) and once with the
  project's ``.cache/numba`` (warm: must not pay it again).

Every figure is the median over ``--repeats`` runs, given per second of wall
clock and per second of process CPU time (all threads; what load from other
processes does not dilute). MSE is the mean over the
domain of (estimated count - true count)^2; the theoretical figure is
``spec.count_variance(true_counts).mean()``.

Usage (from the repository root)::

    bash benchmarks/pureldp_env.sh            # once: the pure-ldp venv
    .venv/bin/python benchmarks/bench_oracles.py --n 1000000 --d 1024 --epsilon 2 --repeats 3

Results go to ``benchmarks/results/oracles.json`` and ``oracles.png``; a table
goes to stdout and progress to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["main", "zipf_values", "bench_spec", "pureldp_params", "ALL_MECHANISMS", "VARIANTS", "TARGETS"]

ALL_MECHANISMS = ["grr", "oue", "rappor", "rappor-prr", "olh", "cms", "hcms", "hr", "hr-blocks"]

#: Benchmark rows that are a registered mechanism with non-default parameters.
#: ``rappor-prr`` is RAPPOR without the instantaneous response (p=0, q=1), which
#: is what pure-ldp's RAPPOR implements: the like-for-like accuracy comparison.
#: ``hr-blocks`` is the block (general-ε) Hadamard response, the variant that
#: pure-ldp's HadamardResponseClient switches to for ε > 1.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "rappor-prr": ("rappor", {"p": 0.0, "q": 1.0}),
    "hr-blocks": ("hr", {"variant": "blocks"}),
}

#: Default prefix of the data that pure-ldp runs on, per mechanism: about
#: 5-15 s of its per-report Python work per repeat on this machine.
PURELDP_N = {
    "grr": 1_000_000,
    "hr": 200_000,
    "hr-blocks": 200_000,
    "oue": 20_000,
    "cms": 20_000,
    "hcms": 100_000,
    "rappor": 20_000,
    "rappor-prr": 20_000,
    "olh": 5_000,
}

#: Rows whose pure-ldp counterpart is another mechanism, so MSEs are not compared.
NOT_LIKE_FOR_LIKE = {"rappor": "not like for like (pure-ldp's RAPPOR has no instantaneous response); see rappor-prr"}
#: Rows whose pure-ldp estimator is regularized and non-negative (Lasso + ElasticNet):
#: compared with our estimate after Norm-Sub, the unbiased one being worse by design.
REGULARIZED = {"rappor-prr"}

#: The issue's targets (benchmarks, not tests) at d=1024, n=10^6, ε=2.
TARGETS: dict[str, Any] = {
    "server_speedup": {"olh": 100.0, "oue": 100.0, "cms": 100.0, "hcms": 100.0, "grr": 20.0, "hr": 20.0},
    "encode_rate": {"grr": 5e6, "olh": 5e6, "hcms": 5e6},
    "olh_hash_evals_per_core": 300e6,
    "mse_rel_tolerance": 0.05,
}

#: pure-ldp's own figures quoted in the issue (server aggregate + estimate, reports/s).
ISSUE_PURELDP_RATES = {"grr": 3.2e6, "hr": 2.8e6, "oue": 264e3, "hcms": 134e3, "cms": 91e3, "olh": 1.1e3}

#: Values of the fresh-process first-call job: large enough that size-dependent
#: paths (e.g. OLH's multi-threaded kernel) are taken, as in a real job.
FIRST_CALL_VALUES = 1 << 17


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def zipf_values(n: int, d: int, s: float, seed: int) -> np.ndarray:
    """``n`` iid draws from the truncated Zipf law P(v) ∝ (v+1)^-s on ``0..d-1``."""
    w = 1.0 / np.arange(1, d + 1, dtype=np.float64) ** s
    cdf = np.cumsum(w / w.sum())
    cdf[-1] = 1.0
    u = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,))).random(n)
    return np.searchsorted(cdf, u, side="right").astype(np.int32)


def bench_spec(label: str, eps: float, d: int) -> Any:
    """The spec measured under the row ``label`` (a registry name or a :data:`VARIANTS` key)."""
    from ldp_core.mechanisms import make_spec

    name, params = VARIANTS.get(label, (label, {}))
    return make_spec(name, epsilon=eps, domain_size=d, **params)


def pureldp_params(spec: Any) -> dict[str, Any]:
    """The pure-ldp constructor parameters that match ``spec``'s."""
    name = spec.name
    if name == "olh":
        return {"g": int(spec.g)}
    if name in ("cms", "hcms"):
        return {"k": int(spec.num_hashes), "m": int(spec.width)}
    if name == "rappor":
        # pure-ldp's RAPPOR is the permanent response only (no IRR), with f, a Bloom
        # filter of m bits, k hashes and some cohorts; we hand it our spec's f (the same
        # permanent ε∞ = 2k ln((1 - f/2)/(f/2)), Erlingsson et al. CCS 2014, Sec. 3.1).
        return {
            "f": float(spec.f),
            "m": int(spec.num_bits),
            "k": int(spec.num_hashes),
            "cohorts": int(spec.num_cohorts),
        }
    return {}


# -- ours ---------------------------------------------------------------------
def _time_ours(
    spec: Any, values: np.ndarray, truth: np.ndarray, rng: np.random.Generator, chunk: int
) -> dict[str, float]:
    from estimator.oracles import accumulator_for

    t_enc = c_enc = 0.0
    parts = []
    for start in range(0, values.size, chunk):
        v = values[start : start + chunk]
        t0, c0 = time.perf_counter(), time.process_time()
        parts.append(spec.encode(v, rng))
        t_enc += time.perf_counter() - t0
        c_enc += time.process_time() - c0
    reports = np.concatenate(parts)
    del parts
    acc = accumulator_for(spec)
    t0, c0 = time.perf_counter(), time.process_time()
    acc.update(reports)
    t1 = time.perf_counter()
    est = acc.estimate()
    t2, c2 = time.perf_counter(), time.process_time()
    err = np.asarray(est.counts, dtype=np.float64) - truth
    err_ns = np.asarray(est.norm_sub().counts, dtype=np.float64) - truth
    return {
        "mse_normsub": float(np.mean(err_ns**2)),
        "encode_s": t_enc,
        "encode_cpu_s": c_enc,
        "server_cpu_s": c2 - c0,
        "aggregate_s": t1 - t0,
        "estimate_s": t2 - t1,
        "mse": float(np.mean(err**2)),
        "sq_err_std": float(np.std(err**2)),
        "bias_mean": float(np.mean(err)),
    }


def run_ours(name: str, values: np.ndarray, d: int, eps: float, repeats: int, seed: int, chunk: int) -> dict[str, Any]:
    spec = bench_spec(name, eps, d)
    truth = np.bincount(values, minlength=d).astype(np.float64)
    # warm-up: one untimed run over the same data, so every size-dependent path
    # (serial or parallel kernel) is compiled or loaded before the timed runs
    t0 = time.perf_counter()
    _time_ours(spec, values, truth, np.random.default_rng(0), chunk)
    warmup = time.perf_counter() - t0
    runs = []
    for r in range(repeats):
        # spawn keys keep the encoders' streams independent of the data's stream
        # (default_rng([seed, 0, 0]) would equal default_rng(seed): trailing zeros)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, ALL_MECHANISMS.index(name), r)))
        res = _time_ours(spec, values, truth, rng, chunk)
        runs.append(res)
        log(
            f"ours {name} repeat {r + 1}/{repeats}: encode {res['encode_s']:.3f}s aggregate {res['aggregate_s']:.3f}s "
            f"estimate {res['estimate_s']:.3f}s mse {res['mse']:.4g}"
        )
    return {
        "name": name,
        "n": int(values.size),
        "spec": spec.to_dict(),
        "spec_id": spec.spec_id,
        "record_size": int(spec.record_size),
        "theory_var_mean": float(np.mean(spec.count_variance(truth))),
        "in_process_warmup_s": warmup,
        "runs": runs,
    }


def first_call_child(name: str, d: int, eps: float) -> None:
    """Body of ``--first-call``: import, then time two identical small jobs."""
    t0 = time.perf_counter()
    from estimator.oracles import accumulator_for

    spec = bench_spec(name, eps, d)
    accumulator_for(spec)
    t1 = time.perf_counter()
    # numba's own start-up (target and registry initialization), shown apart:
    # the first call of any cached kernel, here a trivial histogram
    from estimator.kernels.counting import histogram

    histogram(np.zeros(1, dtype=np.uint8), np.zeros(1, dtype=np.int64))
    t2 = time.perf_counter()
    values = zipf_values(FIRST_CALL_VALUES, d, 1.1, 1)
    times = []
    for _ in range(2):
        s = time.perf_counter()
        acc = accumulator_for(spec)
        acc.update(spec.encode(values, np.random.default_rng(2)))
        acc.estimate()
        times.append(time.perf_counter() - s)
    print(json.dumps({"import_s": t1 - t0, "numba_init_s": t2 - t1, "first_s": times[0], "second_s": times[1]}))


def run_first_call(name: str, d: int, eps: float, cache_dir: Path) -> dict[str, float]:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), NUMBA_DEBUG_CACHE="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--first-call", name, "--d", str(d), "--epsilon", str(eps)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"first-call child for {name} failed:\n{out.stderr[-2000:]}")
    lines = out.stdout.strip().splitlines()
    res = json.loads(lines[-1])
    res["process_wall_s"] = wall
    # numba's cache debug lines: "data saved" = compiled now, "data loaded" = taken from the cache
    res["kernels_compiled"] = sum(1 for ln in lines if ln.startswith("[cache] data saved"))
    res["kernels_loaded"] = sum(1 for ln in lines if ln.startswith("[cache] data loaded"))
    return res


# -- pure-ldp -------------------------------------------------------------------
def run_pureldp(
    data_file: Path, jobs: list[dict[str, Any]], d: int, eps: float, repeats: int, seed: int, tmp: Path
) -> dict[str, Any]:
    py = ROOT / ".bench-venv" / "bin" / "python"
    if not py.exists():
        raise RuntimeError("no .bench-venv: run `bash benchmarks/pureldp_env.sh` first")
    job = {
        "data": str(data_file),
        "d": d,
        "epsilon": eps,
        "repeats": repeats,
        "seed": seed,
        "out": str(tmp / "pureldp.json"),
        "mechanisms": jobs,
    }
    job_file = tmp / "pureldp_job.json"
    job_file.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([str(py), str(ROOT / "benchmarks" / "pureldp_side.py"), str(job_file)], check=True, env=env, cwd=tmp)
    return json.loads((tmp / "pureldp.json").read_text())


# -- summary ----------------------------------------------------------------------
def _med(runs: list[dict[str, float]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def _mse_stats(runs: list[dict[str, float]], d: int) -> dict[str, float]:
    mses = [r["mse"] for r in runs]
    mean = float(np.mean(mses))
    # standard error of the mean MSE: squared errors pooled over items and repeats
    se = float(math.sqrt(np.mean([r["sq_err_std"] ** 2 for r in runs]) / (d * len(runs))))
    return {"mse_median": float(np.median(mses)), "mse_mean": mean, "mse_se": se}


def summarize(
    name: str, ours: dict[str, Any] | None, theirs: dict[str, Any] | None, n: int, d: int, theory_sub: float | None
) -> dict[str, Any]:
    row: dict[str, Any] = {"mechanism": name}
    if ours is not None:
        runs = ours["runs"]
        enc, agg, est = _med(runs, "encode_s"), _med(runs, "aggregate_s"), _med(runs, "estimate_s")
        server = float(statistics.median(r["aggregate_s"] + r["estimate_s"] for r in runs))
        row["ours"] = {
            "n": ours["n"],
            "encode_rate": ours["n"] / _med(runs, "encode_s"),
            "server_rate": ours["n"] / server,
            "aggregate_s": agg,
            "estimate_s": est,
            "encode_s": enc,
            "theory_var_mean": ours["theory_var_mean"],
            "encode_rate_cpu": ours["n"] / _med(runs, "encode_cpu_s"),
            "server_rate_cpu": ours["n"] / _med(runs, "server_cpu_s"),
            **_mse_stats(runs, d),
        }
        row["ours"]["mse_over_theory"] = row["ours"]["mse_mean"] / ours["theory_var_mean"]
        row["ours"]["mse_over_theory_se"] = row["ours"]["mse_se"] / ours["theory_var_mean"]
        # after Norm-Sub (non-negative, sums to n): comparable with estimators that clip or regularize
        row["ours"]["mse_normsub_over_theory"] = (
            float(np.mean([r["mse_normsub"] for r in runs])) / ours["theory_var_mean"]
        )
        if name == "olh":
            row["ours"]["olh_hash_evals_per_s"] = ours["n"] * d / server
            row["ours"]["olh_hash_evals_per_cpu_s"] = ours["n"] * d / _med(runs, "server_cpu_s")
    if theirs is not None and "runs" in theirs and any("estimate_error" in r for r in theirs["runs"]):
        runs = theirs["runs"]
        row["pureldp"] = {
            "n": theirs["n"],
            "classes": theirs["classes"],
            "params": theirs["params"],
            "encode_rate": theirs["n"] / _med(runs, "encode_s"),
            "aggregate_only_rate": theirs["n"] / _med(runs, "aggregate_s"),
            "error": next(r["estimate_error"] for r in runs if "estimate_error" in r),
        }
    elif theirs is not None and "runs" in theirs:
        runs = theirs["runs"]
        m = theirs["n"]
        agg, est = _med(runs, "aggregate_s"), _med(runs, "estimate_s")
        server = float(statistics.median(r["aggregate_s"] + r["estimate_s"] for r in runs))
        row["pureldp"] = {
            "n": m,
            "classes": theirs["classes"],
            "params": theirs["params"],
            "encode_rate": m / _med(runs, "encode_s"),
            "server_rate_measured": m / server,
            "server_rate": n / (agg * n / m + est),
            "aggregate_s": agg,
            "estimate_s": est,
            "encode_rate_cpu": m / _med(runs, "encode_cpu_s"),
            "server_rate_cpu": n / (_med(runs, "aggregate_cpu_s") * n / m + _med(runs, "estimate_cpu_s")),
            **_mse_stats(runs, d),
        }
        if theory_sub:
            row["pureldp"]["theory_var_mean_ours_at_n"] = theory_sub
            row["pureldp"]["mse_over_theory"] = row["pureldp"]["mse_mean"] / theory_sub
            row["pureldp"]["mse_over_theory_se"] = row["pureldp"]["mse_se"] / theory_sub
    elif theirs is not None:
        row["pureldp"] = {"error": theirs.get("error", "no result")}
    if "ours" in row and "server_rate" in row.get("pureldp", {}):
        row["speedup_server"] = row["ours"]["server_rate"] / row["pureldp"]["server_rate"]
    if "ours" in row and "encode_rate" in row.get("pureldp", {}):
        row["speedup_encode"] = row["ours"]["encode_rate"] / row["pureldp"]["encode_rate"]
    if "ours" in row and "server_rate_cpu" in row.get("pureldp", {}):
        row["speedup_server_cpu"] = row["ours"]["server_rate_cpu"] / row["pureldp"]["server_rate_cpu"]
        row["speedup_encode_cpu"] = row["ours"]["encode_rate_cpu"] / row["pureldp"]["encode_rate_cpu"]
    return row


def check_targets(rows: dict[str, dict[str, Any]], cores: int) -> list[dict[str, Any]]:
    out = []
    for name, target in TARGETS["server_speedup"].items():
        r = rows.get(name, {})
        got = r.get("speedup_server")
        out.append(
            {
                "target": f"{name} server aggregate+estimate >= {target:g}x pure-ldp (same run, wall clock)",
                "value": got,
                "met": None if got is None else got >= target,
            }
        )
        got = r.get("speedup_server_cpu")
        out.append(
            {
                "target": f"{name} server aggregate+estimate >= {target:g}x pure-ldp (same run, per CPU-second)",
                "value": got,
                "met": None if got is None else got >= target,
            }
        )
        ours_rate = r.get("ours", {}).get("server_rate")
        got = None if ours_rate is None else ours_rate / ISSUE_PURELDP_RATES[name]
        out.append(
            {
                "target": f"{name} server aggregate+estimate >= {target:g}x the issue's pure-ldp figure "
                f"({_fmt_rate(ISSUE_PURELDP_RATES[name])}/s)",
                "value": got,
                "met": None if got is None else got >= target,
            }
        )
    for name, target in TARGETS["encode_rate"].items():
        got = rows.get(name, {}).get("ours", {}).get("encode_rate")
        out.append(
            {
                "target": f"{name} batch encode >= {target / 1e6:g}M reports/s",
                "value": got,
                "met": None if got is None else got >= target,
            }
        )
    evals = rows.get("olh", {}).get("ours", {}).get("olh_hash_evals_per_s")
    per_core = None if evals is None else evals / cores
    out.append(
        {
            "target": f"olh exact estimation >= {TARGETS['olh_hash_evals_per_core'] / 1e6:g}M hash evaluations/s "
            f"per core ({cores} cores)",
            "value": per_core,
            "met": None if per_core is None else per_core >= TARGETS["olh_hash_evals_per_core"],
        }
    )
    per_cpu_s = rows.get("olh", {}).get("ours", {}).get("olh_hash_evals_per_cpu_s")
    out.append(
        {
            "target": f"olh exact estimation >= {TARGETS['olh_hash_evals_per_core'] / 1e6:g}M hash evaluations "
            "per CPU-second",
            "value": per_cpu_s,
            "met": None if per_cpu_s is None else per_cpu_s >= TARGETS["olh_hash_evals_per_core"],
        }
    )
    tol = TARGETS["mse_rel_tolerance"]
    for name, r in rows.items():
        o = r.get("ours")
        if not o:
            continue
        ratio, se = o["mse_over_theory"], o["mse_over_theory_se"]
        out.append(
            {
                "target": f"{name} MSE within {tol:.0%} of theoretical variance",
                "value": ratio,
                "noise_se": se,
                "met": abs(ratio - 1) <= tol,
            }
        )
        p = r.get("pureldp", {})
        if name in NOT_LIKE_FOR_LIKE:
            out.append({"target": f"{name} MSE vs pure-ldp: {NOT_LIKE_FOR_LIKE[name]}", "value": None, "met": None})
        elif "mse_over_theory" in p:
            # both normalized by our theory at their own n; worse beyond noise = more than 2 standard errors above
            mine, how = (
                (o["mse_normsub_over_theory"], "ours after Norm-Sub")
                if name in REGULARIZED
                else (ratio, "normalized by theory")
            )
            diff = mine - p["mse_over_theory"]
            noise = 2 * math.hypot(se, p["mse_over_theory_se"])
            out.append(
                {
                    "target": f"{name} MSE not worse than pure-ldp beyond noise ({how})",
                    "value": diff,
                    "noise_2se": noise,
                    "met": diff <= noise,
                }
            )
    return out


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
            fh.seek(0)
            flags = next((ln for ln in fh if ln.startswith("flags")), "")
            info["simd"] = [f for f in ("sse4_2", "avx", "avx2", "avx512f") if f" {f} " in flags + " "]
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as fh:
            info["mem_total"] = fh.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    import numba

    info["numpy"] = np.__version__
    info["numba"] = numba.__version__
    info["numba_threads"] = numba.get_num_threads()
    try:
        info["numba_threading_layer"] = numba.threading_layer()
    except ValueError:
        info["numba_threading_layer"] = f"not yet chosen (config: {numba.config.THREADING_LAYER})"
    try:
        import xxhash

        info["xxhash"] = xxhash.VERSION
    except ImportError:
        pass
    return info


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout
        return out.stdout.strip() + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return None


# -- output ---------------------------------------------------------------------------
def _fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _fmt(x: float | None, spec: str = ".3g", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def table(results: dict[str, Any]) -> str:
    """A Markdown table of the summary rows."""
    head = (
        "| mechanism | ours encode/s | pure-ldp encode/s | encode × | ours server/s "
        "| pure-ldp server/s (n measured) | server × "
        "| ours MSE / theory | pure-ldp MSE / theory |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for name, r in results["rows"].items():
        o, p = r.get("ours", {}), r.get("pureldp", {})
        pn = f" ({p['n']:,})" if "n" in p else ""
        if "error" in p:
            pn += f" estimation failed: {p['error'][:80]}"
        lines.append(
            f"| {name} | {_fmt_rate(o.get('encode_rate'))} | {_fmt_rate(p.get('encode_rate'))} "
            f"| {_fmt(r.get('speedup_encode'), '.3g', '×')} "
            f"| {_fmt_rate(o.get('server_rate'))} | {_fmt_rate(p.get('server_rate'))}{pn} "
            f"| {_fmt(r.get('speedup_server'), '.3g', '×')} "
            f"| {_fmt(o.get('mse_over_theory'), '.3f')} ± {_fmt(o.get('mse_over_theory_se'), '.3f')} "
            f"| {_fmt(p.get('mse_over_theory'), '.3f')} ± {_fmt(p.get('mse_over_theory_se'), '.3f')} |"
        )
    return head + "\n".join(lines)


def cpu_table(results: dict[str, Any]) -> str:
    """Rates per second of process CPU time (all threads): what load from other
    processes on the machine does not dilute."""
    lines = [
        "| mechanism | ours encode/CPU-s | pure-ldp encode/CPU-s | encode × | ours server/CPU-s "
        "| pure-ldp server/CPU-s | server × |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results["rows"].items():
        o, p = r.get("ours", {}), r.get("pureldp", {})
        lines.append(
            f"| {name} | {_fmt_rate(o.get('encode_rate_cpu'))} | {_fmt_rate(p.get('encode_rate_cpu'))} "
            f"| {_fmt(r.get('speedup_encode_cpu'), '.3g', '×')} "
            f"| {_fmt_rate(o.get('server_rate_cpu'))} | {_fmt_rate(p.get('server_rate_cpu'))} "
            f"| {_fmt(r.get('speedup_server_cpu'), '.3g', '×')} |"
        )
    return "\n".join(lines)


def targets_table(results: dict[str, Any]) -> str:
    lines = ["| target | measured | met |", "|---|---:|:---:|"]
    for t in results["targets"]:
        v = t["value"]
        if v is None:
            shown = "-"
        elif "server" in t["target"]:
            shown = f"{v:.3g}×"
        elif "encode" in t["target"] or "hash" in t["target"]:
            shown = _fmt_rate(v) + "/s"
        elif "noise_2se" in t:
            shown = f"{v:+.3f} (noise ±{t['noise_2se']:.3f})"
        else:
            shown = f"{v:.3f} (± {t.get('noise_se', 0):.3f})"
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {shown} | {met} |")
    return "\n".join(lines)


def first_call_table(results: dict[str, Any]) -> str:
    lines = [
        "| mechanism | import + numba start-up (s) | cold cache: first job (s) | kernels compiled "
        "| warm cache: first job (s) "
        "| kernels compiled / loaded | same job again in-process (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, fc in results.get("first_call", {}).items():
        if "error" in fc:
            lines.append(f"| {name} | error | error | - | error | - | - |")
            continue
        c, w = fc["cold"], fc["cached"]
        startup = w["import_s"] + w.get("numba_init_s", 0.0)
        lines.append(
            f"| {name} | {startup:.2f} | {c['first_s']:.2f} | {c.get('kernels_compiled', '-')} | {w['first_s']:.2f} "
            f"| {w.get('kernels_compiled', '-')} / {w.get('kernels_loaded', '-')} | {w['second_s']:.3f} |"
        )
    return "\n".join(lines)


def report(results: dict[str, Any]) -> str:
    """Every table, Markdown, as printed on stdout."""
    return "\n\n".join([table(results), cpu_table(results), targets_table(results), first_call_table(results)])


def plot(results: dict[str, Any], path: Path) -> None:
    """Throughput bars (log scale, ours vs pure-ldp) and MSE / theory markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    rows = results["rows"]
    names = list(rows)
    x = np.arange(len(names))
    fig, axes = plt.subplots(1, 3, figsize=(19, 5.4), gridspec_kw={"width_ratios": [1.15, 1.15, 1]})
    ticks = [f"{m}\n{_fmt_rate(rows[m].get('pureldp', {}).get('n'))}" for m in names]
    for ax, key, title in (
        (axes[0], "encode_rate", "client encode (reports/s)"),
        (axes[1], "server_rate", "server aggregate + estimate (reports/s)"),
    ):
        ours = [rows[m].get("ours", {}).get(key, np.nan) for m in names]
        theirs = [rows[m].get("pureldp", {}).get(key, np.nan) for m in names]
        ax.bar(
            x - 0.2,
            ours,
            0.4,
            label="ldp-telemetry (ours), n = 10^6" if results["args"]["n"] == 10**6 else "ldp-telemetry (ours)",
            color="#1f77b4",
        )
        ax.bar(x + 0.2, theirs, 0.4, label="pure-ldp 1.2.0 (its n under each name)", color="#ff7f0e")
        ax.set_yscale("log")
        ax.set_xticks(x, ticks, fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", which="major", alpha=0.3)
        for i, m in enumerate(names):
            s = rows[m].get("speedup_encode" if key == "encode_rate" else "speedup_server")
            if s and np.isfinite(ours[i]):
                ax.annotate(f"{s:.0f}×", (x[i] - 0.2, ours[i]), ha="center", va="bottom", fontsize=7)
    handles, labels = axes[0].get_legend_handles_labels()
    ax = axes[2]
    series = (
        (-0.15, "ours", "mse_over_theory", "o", "#1f77b4", "ours"),
        (0.0, "ours", "mse_normsub_over_theory", "o", "none", "ours after Norm-Sub"),
        (0.15, "pureldp", "mse_over_theory", "s", "#ff7f0e", "pure-ldp"),
    )
    for off, side, key, marker, face, label in series:
        ys = np.array([rows[m].get(side, {}).get(key, np.nan) for m in names], dtype=float)
        es = np.array(
            [rows[m].get(side, {}).get("mse_over_theory_se", 0.0) if key == "mse_over_theory" else 0.0 for m in names],
            dtype=float,
        )
        edge = "#1f77b4" if side == "ours" else "#ff7f0e"
        ax.errorbar(x + off, ys, yerr=2 * es, fmt=marker, mfc=face, mec=edge, ecolor=edge, capsize=3, label=label)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhspan(0.95, 1.05, color="g", alpha=0.15, label="target: within 5%")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(x, names, fontsize=8)
    ax.set_title("MSE / our theoretical variance at the same n (±2 s.e.)")
    ax.legend(fontsize=8, loc="lower left")
    a = results["args"]
    fig.suptitle(
        f"frequency oracles, d={a['d']}, n={a['n']:,}, ε={a['epsilon']:g}, Zipf s={a['zipf']:g}; "
        f"median of {a['repeats']} repeats; "
        f"{results['machine'].get('cpu_model', '')}, {results['machine']['nproc']} cores, shared with other jobs",
        fontsize=10,
    )
    fig.legend(handles, labels, loc="upper left", fontsize=8, ncol=2, bbox_to_anchor=(0.01, 0.96))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- main -------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=1_000_000, help="reports (users); default 10^6")
    ap.add_argument("--d", type=int, default=1024, help="domain size; default 1024")
    ap.add_argument("--epsilon", type=float, default=2.0, help="ε; default 2")
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed runs per side and mechanism (medians are reported); default 3"
    )
    ap.add_argument(
        "--mechanisms", default=",".join(ALL_MECHANISMS), help=f"comma-separated subset of {','.join(ALL_MECHANISMS)}"
    )
    ap.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent s of the data; default 1.1")
    ap.add_argument("--seed", type=int, default=20240601, help="seed of the data and of both sides' randomness")
    ap.add_argument(
        "--chunk", type=int, default=1 << 17, help="values per spec.encode call on our side; default 131072"
    )
    ap.add_argument(
        "--pureldp-n", default="", help="per-mechanism pure-ldp prefix sizes, e.g. olh=5000,oue=20000 (capped at --n)"
    )
    ap.add_argument("--no-pureldp", action="store_true", help="skip the pure-ldp side")
    ap.add_argument("--no-first-call", action="store_true", help="skip the fresh-process first-call measurements")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "oracles.json")
    ap.add_argument("--plot", type=Path, default=ROOT / "benchmarks" / "results" / "oracles.png")
    ap.add_argument("--replot", action="store_true", help="only re-render the table and plot from --out")
    ap.add_argument("--first-call", metavar="MECH", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    mechs = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    bad = [m for m in mechs if m not in ALL_MECHANISMS]
    if bad:
        ap.error(f"unknown mechanism(s) {bad}; choose from {ALL_MECHANISMS}")
    args.mechanism_list = mechs
    sizes = dict(PURELDP_N)
    for item in filter(None, args.pureldp_n.split(",")):
        k, _, v = item.partition("=")
        if k not in ALL_MECHANISMS or not v.isdigit():
            ap.error(f"--pureldp-n: bad item {item!r}, expected NAME=INT")
        sizes[k] = int(v)
    args.pureldp_sizes = {k: min(v, args.n) for k, v in sizes.items()}
    return args


def available(name: str) -> str | None:
    """None if both halves of ``name`` import, else why not."""
    try:
        from estimator.oracles import ACCUMULATORS
        from ldp_core.mechanisms import spec_class

        name = VARIANTS.get(name, (name, {}))[0]
        spec_class(name)
        module, cls = ACCUMULATORS[name].split(":")
        getattr(importlib.import_module(module), cls)
        return None
    except Exception as exc:  # missing module while other helpers are still writing it
        return f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba"))
    args = parse_args(argv)
    if args.first_call:
        first_call_child(args.first_call, args.d, args.epsilon)
        return 0
    if args.replot:
        results = json.loads(args.out.read_text())
        results["targets"] = check_targets(results["rows"], results["machine"].get("nproc") or 1)
        print(report(results))
        plot(results, args.plot)
        return 0

    command = (
        "NUMBA_CACHE_DIR="
        + shlex.quote(os.environ["NUMBA_CACHE_DIR"])
        + " "
        + " ".join(
            shlex.quote(a)
            for a in [
                os.path.relpath(sys.executable, ROOT),
                os.path.relpath(__file__, ROOT),
                *(sys.argv[1:] if argv is None else argv),
            ]
        )
    )
    mechs = []
    skipped = {}
    for m in args.mechanism_list:
        why = available(m)
        if why:
            skipped[m] = why
            log(f"skipping {m}: not available yet ({why})")
        else:
            mechs.append(m)
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    commit = git_commit()  # at the start: other work may commit while this runs
    log(f"data: Zipf(s={args.zipf}) n={args.n:,} d={args.d} seed={args.seed}")
    values = zipf_values(args.n, args.d, args.zipf, args.seed)

    ours: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_oracles_") as tmpname:
        tmp = Path(tmpname)
        data_file = tmp / "values.npy"
        np.save(data_file, values)
        for m in mechs:
            log(f"ours: {m}")
            ours[m] = run_ours(m, values, args.d, args.epsilon, args.repeats, args.seed, args.chunk)

        theirs: dict[str, Any] = {"mechanisms": {}}
        if not args.no_pureldp and mechs:
            jobs = [
                {
                    "name": m,
                    "kind": VARIANTS.get(m, (m, {}))[0],
                    "n": args.pureldp_sizes[m],
                    "params": pureldp_params(bench_spec(m, args.epsilon, args.d)),
                }
                for m in mechs
            ]
            log(f"pure-ldp: {[(j['name'], j['n']) for j in jobs]}")
            theirs = run_pureldp(data_file, jobs, args.d, args.epsilon, args.repeats, args.seed, tmp)

        first_call: dict[str, Any] = {}
        if not args.no_first_call:
            for m in (m for m in mechs if m not in VARIANTS):
                log(f"first call in fresh processes: {m}")
                try:
                    with tempfile.TemporaryDirectory(prefix="numba_cold_") as cold:
                        c = run_first_call(m, args.d, args.epsilon, Path(cold))
                    run_first_call(m, args.d, args.epsilon, Path(os.environ["NUMBA_CACHE_DIR"]))  # fill the cache
                    w = run_first_call(m, args.d, args.epsilon, Path(os.environ["NUMBA_CACHE_DIR"]))
                    first_call[m] = {"cold": c, "cached": w}
                except Exception as exc:
                    first_call[m] = {"error": str(exc)}

    rows = {}
    for m in mechs:
        sub = theirs["mechanisms"].get(m)
        theory_sub = None
        if sub and "n" in sub:
            spec = bench_spec(m, args.epsilon, args.d)
            theory_sub = float(np.mean(spec.count_variance(np.bincount(values[: sub["n"]], minlength=args.d))))
        rows[m] = summarize(m, ours[m], sub, args.n, args.d, theory_sub)

    machine = machine_info()
    results = {
        "command": command,
        "started_utc": started,
        "git_commit": commit,
        "args": {
            k: v
            for k, v in vars(args).items()
            if k in ("n", "d", "epsilon", "repeats", "zipf", "seed", "chunk", "pureldp_sizes")
        },
        "machine": machine,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "pureldp_versions": theirs.get("versions"),
        "issue_pureldp_server_rates": ISSUE_PURELDP_RATES,
        "skipped": skipped,
        "rows": rows,
        "first_call": first_call,
        "ours_raw": ours,
        "pureldp_raw": theirs.get("mechanisms", {}),
    }
    results["targets"] = check_targets(rows, machine["nproc"] or 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=float) + "\n")
    plot(results, args.plot)
    print(report(results))
    log(f"wrote {args.out} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
