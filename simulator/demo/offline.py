"""``ldp demo --offline``: one seeded population through every frequency oracle in memory (the real encoders
and estimators), each oracle's accuracy set against its theoretical variance, and a plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ldp_core.mechanisms import FREQUENCY_MECHANISMS
from simulator.population import parse_distribution
from simulator.run import SimulationResult, simulate, spec_for

__all__ = ["DEFAULT_MECHANISMS", "run_offline", "simulate_oracles", "accuracy_row"]

#: the oracles ``ldp demo --offline`` runs unless told otherwise
DEFAULT_MECHANISMS = ["grr", "oue", "olh", "hr", "cms", "hcms", "rappor"]


def simulate_oracles(
    names: list[str], epsilon: float, domain: int, users: int, distribution: str, seed: int, progress: bool = True
) -> list[SimulationResult]:
    """Each oracle of ``names`` over its own seeded draw of ``users`` values (rr: domain 2), with a progress
    bar on stderr; ValueError for an unknown oracle or distribution before any runs."""
    unknown = [m for m in names if m not in FREQUENCY_MECHANISMS]
    if unknown:
        raise ValueError(f"unknown mechanisms {unknown}; choose from {sorted(FREQUENCY_MECHANISMS)}")
    from tqdm import tqdm

    parse_distribution(distribution, domain)  # fail early on a bad argument
    results: list[SimulationResult] = []
    total = users * len(names)
    with tqdm(total=total, unit="report", unit_scale=True, file=sys.stderr, leave=False, disable=not progress) as bar:
        for i, name in enumerate(names):
            spec = spec_for(name, epsilon, 2 if name == "rr" else domain)
            rng = np.random.default_rng([seed, i])
            dist = parse_distribution(distribution, spec.domain_size)
            bar.set_description(name)
            results.append(simulate(spec, users, dist, rng, seed=seed, progress=bar.update))
    return results


def accuracy_row(res: SimulationResult) -> tuple[dict[str, Any], str]:
    """One oracle's ``demo.json`` entry (its result, MSE, theoretical MSE and 95% CI coverage) and its table
    line (per user, with the encode and aggregate rates)."""
    acc = res.accuracy()
    mse, theory, cover = acc["mse"], acc["theory_mse"], acc["ci_coverage"]
    enc = res.users / max(res.seconds["encode"], 1e-9) / 1e6
    agg = res.users / max(res.seconds["aggregate"] + res.seconds["estimate"], 1e-9) / 1e6
    line = (
        f"{res.spec.name:>9} {mse / res.users:>10.4f} {theory / res.users:>10.4f} {mse / theory:>6.2f} "
        f"{cover:>8.3f} {enc:>10.2f} {agg:>10.2f}"
    )
    return {**res.to_json_obj(), "mse": mse, "theory_mse": theory, "ci_coverage": cover}, line


def run_offline(
    names: list[str],
    epsilon: float,
    domain: int,
    users: int,
    distribution: str,
    seed: int,
    out: Path,
    plot: bool = True,
    progress: bool = True,
) -> int:
    """Run :func:`simulate_oracles`, print each oracle's accuracy, write ``out``/demo.json and (``plot``)
    ``out``/demo.png; returns the exit code (0). ``progress``: the bar on stderr (the caller decides when)."""
    from simulator.demo.plots import plot_offline

    results = simulate_oracles(names, epsilon, domain, users, distribution, seed, progress)
    print(f"ldp demo: {users:,} simulated users, {distribution}, ε={epsilon:g}, d={domain}, seed {seed}")
    print(
        f"{'mechanism':>9} {'MSE/n':>10} {'theory/n':>10} {'ratio':>6} {'CI cover':>8} {'enc Mrep/s':>10} {'agg Mrep/s':>10}"
    )
    summary = []
    for res in results:
        row, line = accuracy_row(res)
        print(line)
        summary.append(row)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(summary))
    if plot:
        plot_offline(results, out / "demo.png")
        print(f"plot: {out / 'demo.png'}")
    print(f"results: {out / 'demo.json'}")
    return 0
