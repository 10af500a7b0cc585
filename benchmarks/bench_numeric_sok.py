"""Mean mechanisms side by side with the PETS 2025 SoK's implementations (sok-ldp-data-analysis).

The SoK ("SoK: Descriptive Statistics Under Local Differential Privacy", PETS 2025; its code is the repository
``mad-lab-fau/sok-ldp-data-analysis``, MIT-licensed) is not on PyPI. Clone it anywhere and
point ``--sok-dir`` (or ``$SOK_DIR``) at the clone; only its ``sok_ldp_analysis.ldp.mean`` modules are imported
(numpy, and scipy through the package's ``__init__``), so the project's ``.venv`` runs both sides::

    git clone https://github.com/mad-lab-fau/sok-ldp-data-analysis "$SOK_DIR"   # measured at 5f58c16
    .venv/bin/python benchmarks/bench_numeric_sok.py --sok-dir "$SOK_DIR" --plot docs/img/numeric_sok.png

What is compared, on the same values (beta(2, 5) on [0, 60]) and the same ε, one core each:

* **speed**: device-side encode of ``--users`` values (ours: ``spec.encode``, fixed-point records ready for
  the wire; theirs: ``mechanism()``, float64 outputs) and the server's estimate from those reports (ours: the
  accumulator's integer sums, then ``estimate()``; theirs: ``mean()``), medians of ``--repeat`` runs;
* **accuracy**: the MSE of the mean over ``--trials`` collections of ``--accuracy-users`` users, divided by
  the theoretical variance of the mean at those users' values (each mechanism's
  ``summand_variance`` summed over users, divided by n², in the value's units): a ratio near 1 on both sides
  says both implement the same mechanism (the ratio's own standard error is about √(2/trials));
* the 1-D pairs are Duchi et al. (``duchi`` / ``Wang2019Duchi1D``), the Piecewise Mechanism (``pm`` /
  ``Wang2019Piecewise1D``), the Hybrid Mechanism (``hm`` / ``Wang2019Hybrid1D``) and 1BitMean (``1bitmean`` /
  ``Ding2017``; ours with its α-point rounding, which adds no variance); the multi-attribute pair is HM with
  attribute sampling (``hm`` with ``dims`` / ``Wang2019``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from estimator.mechanisms.numeric import MeanAccumulator
from estimator.mechanisms.repeated import OneBitMeanAccumulator
from ldp_core.mechanisms.numeric import DuchiSpec, HybridSpec, PiecewiseSpec
from ldp_core.mechanisms.repeated import OneBitMeanSpec

LOW, HIGH = 0.0, 60.0


def load_sok(sok_dir: str) -> tuple[Any, Any]:
    path = Path(sok_dir).expanduser().resolve()
    if not (path / "sok_ldp_analysis" / "ldp" / "mean" / "wang2019.py").is_file():
        raise SystemExit(f"bench_numeric_sok: no sok_ldp_analysis/ldp/mean/wang2019.py under {path} (--sok-dir)")
    sys.path.insert(0, str(path))
    return (
        importlib.import_module("sok_ldp_analysis.ldp.mean.wang2019"),
        importlib.import_module("sok_ldp_analysis.ldp.mean.ding2017"),
    )


def pairs(wang: Any, ding: Any, eps: float, rng: np.random.Generator) -> list[tuple[str, Any, Any, Any]]:
    """(name, our spec, our accumulator class, their estimator) for the 1-D mechanisms."""
    r = (LOW, HIGH)
    return [
        ("duchi", DuchiSpec(epsilon=eps, low=LOW, high=HIGH), MeanAccumulator, wang.Wang2019Duchi1D(eps, r, rng)),
        ("pm", PiecewiseSpec(epsilon=eps, low=LOW, high=HIGH), MeanAccumulator, wang.Wang2019Piecewise1D(eps, r, rng)),
        ("hm", HybridSpec(epsilon=eps, low=LOW, high=HIGH), MeanAccumulator, wang.Wang2019Hybrid1D(eps, r, rng)),
        (
            "1bitmean",
            OneBitMeanSpec(epsilon=eps, low=LOW, high=HIGH),
            OneBitMeanAccumulator,
            ding.Ding2017(eps, r, rng=rng),
        ),
    ]


def theory_of_mean(spec: Any, values: np.ndarray) -> float:
    """Var of the mean estimate in the value's units: Σ_i Var[summand_i] / n² × (unit)²."""
    n = values.size if values.ndim == 1 else values.shape[0]
    if isinstance(spec, OneBitMeanSpec):
        return float(spec.summand_variance(spec.unit(values)).sum()) / n**2 * (HIGH - LOW) ** 2
    return float(spec.summand_variance(spec.normalize(values)).sum()) / n**2 * spec.half_width**2


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def speed(wang: Any, ding: Any, eps: float, users: int, repeat: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(11)
    values = rng.beta(2, 5, users) * HIGH
    out: dict[str, dict[str, float]] = {}
    for name, spec, acc_cls, theirs in pairs(wang, ding, eps, rng):
        cells: dict[str, list[float]] = {k: [] for k in ("ours_encode", "sok_encode", "ours_server", "sok_server")}
        for _ in range(repeat):
            rec, t = timed(lambda spec=spec: spec.encode(values, rng))
            cells["ours_encode"].append(users / t)

            def server(rec: np.ndarray = rec, acc_cls: Any = acc_cls, spec: Any = spec) -> Any:
                acc = acc_cls(spec)
                acc.update(rec)
                return acc.estimate()

            _, t = timed(server)
            cells["ours_server"].append(users / t)
            u, t = timed(lambda theirs=theirs: theirs.mechanism(values))
            cells["sok_encode"].append(users / t)
            _, t = timed(lambda u=u, theirs=theirs: theirs.mean(u))
            cells["sok_server"].append(users / t)
        out[name] = {k: statistics.median(v) for k, v in cells.items()}
    return out


def accuracy(wang: Any, ding: Any, eps: float, users: int, trials: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(12)
    sums: dict[str, dict[str, list[float]]] = {}
    for _ in range(trials):
        values = rng.beta(2, 5, users) * HIGH
        truth = float(values.mean())
        for name, spec, acc_cls, theirs in pairs(wang, ding, eps, rng):
            acc = acc_cls(spec)
            acc.update(spec.encode(values, rng))
            ours = float(acc.estimate().mean[0])
            sok = float(theirs.estimate_mean(values))
            cell = sums.setdefault(name, {"ours": [], "sok": [], "theory": []})
            cell["ours"].append((ours - truth) ** 2)
            cell["sok"].append((sok - truth) ** 2)
            cell["theory"].append(theory_of_mean(spec, values))
    return {
        name: {
            "ours_mse_over_theory": float(np.mean(c["ours"]) / np.mean(c["theory"])),
            "sok_mse_over_theory": float(np.mean(c["sok"]) / np.mean(c["theory"])),
            "theory_rmse": float(np.sqrt(np.mean(c["theory"]))),
        }
        for name, c in sums.items()
    }


def multi(wang: Any, eps: float, dims: int, users: int, repeat: int, trials: int, acc_users: int) -> dict[str, Any]:
    """HM with attribute sampling: d attributes, k = max(1, min(d, ⌊ε/2.5⌋)) sampled (both sides' default)."""
    rng = np.random.default_rng(13)
    spec = HybridSpec(epsilon=eps, low=LOW, high=HIGH, dims=dims)
    theirs = wang.Wang2019(eps, (LOW, HIGH), rng)
    values = rng.beta(2, 5, (users, dims)) * HIGH
    enc_o, enc_s = [], []
    for _ in range(repeat):
        _, t = timed(lambda: spec.encode(values, rng))
        enc_o.append(users / t)
        _, t = timed(lambda: theirs.mechanism(values))
        enc_s.append(users / t)
    err_o, err_s, th = [], [], []
    for _ in range(trials):
        v = rng.beta(2, 5, (acc_users, dims)) * HIGH
        truth = v.mean(axis=0)
        acc = MeanAccumulator(spec)
        acc.update(spec.encode(v, rng))
        err_o.append(float(((acc.estimate().mean - truth) ** 2).sum()))
        err_s.append(float(((theirs.estimate_mean(v) - truth) ** 2).sum()))
        th.append(theory_of_mean(spec, v))
    return {
        "dims": dims,
        "sample": spec.k,
        "epsilon": eps,
        "ours_encode": statistics.median(enc_o),
        "sok_encode": statistics.median(enc_s),
        "ours_mse_over_theory": float(np.mean(err_o) / np.mean(th)),
        "sok_mse_over_theory": float(np.mean(err_s) / np.mean(th)),
    }


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = [float(e) for e in result["speed"]]
    names = list(next(iter(result["speed"].values())))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, name in enumerate(names):
        color = f"C{i}"
        enc = [result["speed"][str(e)][name]["ours_encode"] / result["speed"][str(e)][name]["sok_encode"] for e in eps]
        srv = [result["speed"][str(e)][name]["ours_server"] / result["speed"][str(e)][name]["sok_server"] for e in eps]
        axes[0].plot(eps, enc, "o-", color=color, label=f"{name}: encode")
        axes[0].plot(eps, srv, "s--", color=color, label=f"{name}: server")
        acc = result["accuracy"]
        axes[1].plot(
            eps, [acc[str(e)][name]["ours_mse_over_theory"] for e in eps], "o-", color=color, label=f"{name}: ours"
        )
        axes[1].plot(
            eps, [acc[str(e)][name]["sok_mse_over_theory"] for e in eps], "x:", color=color, label=f"{name}: SoK"
        )
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("ε")
    axes[0].set_ylabel("ours / SoK, reports per second")
    axes[0].set_title(f"speed, {result['users']:,} values, one core (medians)")
    axes[0].legend(fontsize=7, ncol=2)
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("ε")
    axes[1].set_ylabel("MSE of the mean / theoretical variance")
    axes[1].set_title(f"accuracy, {result['accuracy_users']:,} users × {result['trials']} trials")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sok-dir", default=os.environ.get("SOK_DIR"), help="a checkout of sok-ldp-data-analysis")
    ap.add_argument("--users", type=int, default=1_000_000, help="values per speed run (default 10^6)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--epsilons", default="0.5,1,2,4")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--accuracy-users", type=int, default=10_000)
    ap.add_argument("--dims", type=int, default=8, help="attributes of the multi-attribute comparison")
    ap.add_argument("--multi-epsilon", type=float, default=8.0, help="ε of the multi-attribute comparison (k = 3)")
    ap.add_argument("--multi-users", type=int, default=100_000)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--plot", default=None, help="write the speed ratios and MSE/theory to this PNG")
    args = ap.parse_args()
    if not args.sok_dir:
        raise SystemExit("bench_numeric_sok: give --sok-dir or set $SOK_DIR (a clone of sok-ldp-data-analysis)")
    wang, ding = load_sok(args.sok_dir)
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else []
    result: dict[str, Any] = {
        "users": args.users,
        "accuracy_users": args.accuracy_users,
        "trials": args.trials,
        "load_before": load,
        "speed": {},
        "accuracy": {},
    }
    for e in (float(x) for x in args.epsilons.split(",")):
        print(f"ε = {e:g}: speed ...", file=sys.stderr, flush=True)
        result["speed"][str(e)] = speed(wang, ding, e, args.users, args.repeat)
        print(f"ε = {e:g}: accuracy ...", file=sys.stderr, flush=True)
        result["accuracy"][str(e)] = accuracy(wang, ding, e, args.accuracy_users, args.trials)
    print("multi-attribute ...", file=sys.stderr, flush=True)
    result["multi"] = multi(
        wang,
        args.multi_epsilon,
        args.dims,
        args.multi_users,
        args.repeat,
        max(20, args.trials // 4),
        args.accuracy_users,
    )
    result["load_after"] = open("/proc/loadavg").read().split()[:3] if load else []

    print("| ε | mechanism | encode M/s ours / SoK | server M/s ours / SoK | MSE/theory ours / SoK |")
    print("|---:|---|---:|---:|---:|")
    for e, rows in result["speed"].items():
        for name, s in rows.items():
            a = result["accuracy"][e][name]
            print(
                f"| {float(e):g} | {name} | {s['ours_encode'] / 1e6:.2f} / {s['sok_encode'] / 1e6:.2f} "
                f"| {s['ours_server'] / 1e6:.1f} / {s['sok_server'] / 1e6:.1f} "
                f"| {a['ours_mse_over_theory']:.2f} / {a['sok_mse_over_theory']:.2f} |"
            )
    m = result["multi"]
    print(
        f"multi-attribute HM, d = {m['dims']}, k = {m['sample']}, ε = {m['epsilon']:g}: encode "
        f"{m['ours_encode'] / 1e6:.2f} / {m['sok_encode'] / 1e6:.3f} M users/s; MSE/theory "
        f"{m['ours_mse_over_theory']:.2f} / {m['sok_mse_over_theory']:.2f}"
    )
    print(f"load average before {result['load_before']}, after {result['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
