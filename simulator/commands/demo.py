"""``ldp demo``: the main job on the embedded default.

One seeded Zipf population goes through every frequency oracle (the real
encoders and estimators); the command prints each oracle's accuracy against
the truth and its theoretical variance, and writes a plot of the top items'
estimates with 95% confidence intervals.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from client_sdk.mechanisms import MECHANISMS
from simulator.population import parse_distribution
from simulator.run import SimulationResult, simulate, spec_for

DEFAULT_MECHANISMS = ["grr", "oue", "olh", "hr", "cms", "hcms", "rappor"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run every frequency oracle on one simulated population and plot the estimates")
    p.add_argument("--mechanisms", default=",".join(DEFAULT_MECHANISMS), help="comma-separated list")
    p.add_argument("--epsilon", type=float, default=2.0)
    p.add_argument("--domain", type=int, default=128)
    p.add_argument("--users", type=int, default=200_000)
    p.add_argument("--distribution", default="zipf:1.1")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--out", type=Path, default=Path("out"), help="folder for demo.png and demo.json")
    p.add_argument("--no-plot", action="store_true")
    p.set_defaults(func=run)


def _plot(results: list[SimulationResult], path: Path, top: int = 25) -> None:
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
        ax.errorbar(x, est.counts[order] / res.users, yerr=err, fmt="o", ms=3, color="#b03a2e", label="estimate, 95% CI")
        ax.set_title(f"{res.spec.name}  (ε={res.spec.epsilon:g}, d={res.spec.domain_size}, n={res.users:,})", fontsize=10)
        ax.set_xticks(x[::5])
        ax.set_xlabel("item (rank by true frequency)")
    for ax in axes.flat[len(results):]:
        ax.axis("off")
    axes[0][0].set_ylabel("frequency")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    names = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    unknown = [m for m in names if m not in MECHANISMS]
    if unknown:
        raise ValueError(f"unknown mechanisms {unknown}; choose from {sorted(MECHANISMS)}")
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

    print(f"ldp demo: {args.users:,} simulated users, {args.distribution}, ε={args.epsilon:g}, d={args.domain}, seed {args.seed}")
    print(f"{'mechanism':>9} {'MSE/n':>10} {'theory/n':>10} {'ratio':>6} {'CI cover':>8} {'enc Mrep/s':>10} {'agg Mrep/s':>10}")
    summary = []
    for res in results:
        err = res.estimate.counts - res.true_counts
        mse, theory = float(np.mean(err**2)), float(res.variance.mean())
        cover = float(np.mean((res.estimate.ci_low <= res.true_counts) & (res.true_counts <= res.estimate.ci_high)))
        enc = res.users / max(res.seconds["encode"], 1e-9) / 1e6
        agg = res.users / max(res.seconds["aggregate"] + res.seconds["estimate"], 1e-9) / 1e6
        print(f"{res.spec.name:>9} {mse / res.users:>10.4f} {theory / res.users:>10.4f} {mse / theory:>6.2f} {cover:>8.3f} {enc:>10.2f} {agg:>10.2f}")
        summary.append({**res.to_json_obj(), "mse": mse, "theory_mse": theory, "ci_coverage": cover})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "demo.json").write_text(json.dumps(summary))
    if not args.no_plot:
        _plot(results, args.out / "demo.png")
        print(f"plot: {args.out / 'demo.png'}")
    print(f"results: {args.out / 'demo.json'}")
    return 0
