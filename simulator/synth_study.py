"""The comparison of every synthetic-data generator on the project's seeded population (``ldp synth
--method all``): each one's fidelity and memorisation (:mod:`estimator.synth.evaluate`), DP and not, with
synthetic telemetry (:mod:`simulator.synth_telemetry`) among them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from estimator.synth.data import Table, plant_rare, population
from estimator.synth.evaluate import evaluate, reference
from estimator.synth.runner import CENTRAL_METHODS, generate
from estimator.synth.telemetry import synthesize
from simulator.synth_telemetry import collect_pairs

__all__ = ["telemetry_table", "compare", "ALL_METHODS", "TARGET"]

ALL_METHODS = (*CENTRAL_METHODS, "ldp-marginals")
#: the column the downstream model predicts
TARGET = "crashes"


def telemetry_table(
    table: Table,
    epsilon: float,
    rng: np.random.Generator,
    *,
    rows: int | None = None,
    mechanism: str = "oue",
    sdk_clients: int = 20,
    workdir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Table, dict[str, Any]]:
    """Every row a device reporting one assigned pair at local ε = ``epsilon``; the synthetic table built
    from the pipeline's estimates, and how each published marginal agrees with them."""
    est, info = collect_pairs(
        table, epsilon, rng, mechanism=mechanism, sdk_clients=sdk_clients, workdir=workdir, progress=progress
    )
    out, consistency = synthesize(table, est, rng, rows=rows)
    worst = max(p["max_abs_z_synthetic"] for p in consistency["pairs"])
    return out, {
        "method": "ldp-marginals",
        "rows": out.rows,
        "epsilon_local": float(epsilon),
        "protects": "each device's whole record, by its one ε-LDP report of one assigned pair (the shuffle's central amplification comes on top, not counted here)",
        **info,
        "reports": consistency["reports"],
        "max_abs_z_synthetic_vs_ldp": worst,
        "consistency": consistency["pairs"],
    }


def compare(
    rows: int,
    epsilon: float,
    delta: float,
    seed: int,
    *,
    methods: Sequence[str] = ALL_METHODS,
    planted: int = 5,
    aim_degree: int = 3,
    gan_steps: int = 1500,
    ldp_epsilon: float | None = None,
    workdir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train (``rows`` records plus ``planted`` rare ones) and held-out (``rows``) samples of the population;
    every generator in ``methods`` run on the training sample at ``epsilon`` (the marginal methods and the
    DP-GAN: central (ε, δ); synthetic telemetry: local ε = ``ldp_epsilon``, default ``epsilon``)."""
    say = progress or (lambda _m: None)
    rng = np.random.default_rng(seed)
    train, plants = plant_rare(population(rows, seed), planted, rng)
    holdout = population(rows, seed + 1_000_003)
    ref = reference(train, holdout, TARGET)
    out = []
    for m in methods:
        say(f"{m}: generating")
        if m == "ldp-marginals":
            syn, info = telemetry_table(
                train, ldp_epsilon or epsilon, rng, rows=train.rows, workdir=workdir, progress=say
            )
            info.pop("consistency")
        else:
            syn, info = generate(
                m, train, epsilon, delta, rng, rows=train.rows, progress=say, aim_degree=aim_degree, gan_steps=gan_steps
            )
        row = {"generator": m, **evaluate(syn, train, holdout, plants, TARGET)}
        row["epsilon"] = info.get("epsilon", info.get("epsilon_local"))
        row["privacy"] = (
            "local" if m == "ldp-marginals" else ("none" if m in ("exact-marginals", "gan-nodp", "copy") else "central")
        )
        out.append(row)
        say(f"{m}: 2-way error {row['tv_2way']:.3f}, accuracy {row['accuracy_synthetic_to_real']:.3f}")
    return {
        "rows": rows,
        "epsilon": epsilon,
        "delta": delta,
        "seed": seed,
        "target": TARGET,
        "reference": ref,
        "generators": out,
    }
