"""One entry point per generator, for the command line and the comparison: ``generate(method, ...)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from estimator.synth.data import SynthError, Table
from estimator.synth.dpgan import GANConfig

__all__ = ["CENTRAL_METHODS", "generate"]

#: the generators that read the raw table (central model); ``ldp-marginals`` (local model) is run by
#: :mod:`simulator.synth_study`, since its data travels through the collection pipeline
CENTRAL_METHODS = ("mst", "aim", "dpgan", "exact-marginals", "gan-nodp", "copy")


def generate(
    method: str,
    table: Table,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    *,
    rows: int | None = None,
    progress: Callable[[str], None] | None = None,
    aim_degree: int = 3,
    gan_steps: int = 1500,
    budget_session: str | None = None,
    partner: str | None = None,
) -> tuple[Table, dict[str, Any]]:
    """The synthetic table of ``method`` and its privacy figures (``epsilon``/``delta`` None: not private).
    With ``budget_session`` the run is first debited to ``partner`` (kind ``synth``,
    :func:`estimator.synth.budget.debit_synth`): a refusal raises ``LedgerRefusal`` and nothing is generated;
    the result's ``budget`` holds the debit."""
    from estimator.synth.budget import debit_synth

    debit = debit_synth(budget_session, partner, method, epsilon, delta, table.rows, gan_steps, GANConfig().batch)
    out, info = _generate(method, table, epsilon, delta, rng, rows, progress, aim_degree, gan_steps, debit)
    return out, {**info, "budget": debit}


def _generate(
    method: str,
    table: Table,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    rows: int | None,
    progress: Callable[[str], None] | None,
    aim_degree: int,
    gan_steps: int,
    debit: dict[str, Any] | None,
) -> tuple[Table, dict[str, Any]]:
    from estimator.synth import marginal

    if method == "mst":
        r = marginal.mst(table, epsilon, delta, rng, rows=rows, progress=progress)
        return r.table, r.summary()
    if method == "aim":
        r = marginal.aim(table, epsilon, delta, rng, rows=rows, degree=aim_degree, progress=progress)
        return r.table, r.summary()
    if method == "exact-marginals":
        r = marginal.exact_marginals(table, rng, rows=rows)
        return r.table, r.summary()
    if method in ("dpgan", "gan-nodp"):
        from estimator.synth.dpgan import dpgan

        private = method == "dpgan"
        sigma = None if debit is None else debit["settings"]["noise_multiplier"]  # what was charged is what runs
        cfg = (
            GANConfig(steps=gan_steps, noise_multiplier=sigma)
            if private
            else GANConfig(steps=gan_steps, clip_norm=None, noise_multiplier=0.0)
        )
        out, info = dpgan(table, epsilon if private else None, delta, rng, rows=rows, config=cfg, progress=progress)
        return out, {"method": method, "rows": out.rows, **info}
    if method == "copy":  # the memorising reference: training records drawn with replacement
        m = int(rows or table.rows)
        return table.take(rng.integers(0, table.rows, m)), {"method": "copy", "rows": m, "epsilon": None}
    raise SynthError(f"unknown method {method!r}: one of {', '.join(CENTRAL_METHODS)} or ldp-marginals")
