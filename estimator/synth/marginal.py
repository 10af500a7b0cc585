"""MST and AIM (McKenna, Miklau & Sheldon 2021; McKenna, Mullins, Sheldon & Miklau 2022): select marginals
privately, measure them with Gaussian noise, fit a graphical model with ``mbi``, sample records from it.

``mbi`` 2.0 ships the estimation (a Markov random field fitted to noisy marginals) but not the mechanisms;
their selection steps are written here after the papers. Two simplifications: no domain compression of
rare values (the columns here have at most a handful of values), and AIM's model-size limit counts the cells
of the measured marginals instead of the junction tree's memory. Every random step draws from the
``rng`` argument; every privacy cost is added to a :class:`Ledger` in ρ-zCDP (:mod:`.zcdp`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from estimator.synth.data import SynthError, Table, marginal
from estimator.synth.mbi_model import Measurement, fit, model_marginal, sample
from estimator.synth.zcdp import epsilon_of_rho, exponential_rho, gaussian_rho, rho_for_epsilon

__all__ = ["Ledger", "SynthResult", "mst", "aim", "exact_marginals", "exponential_mechanism"]

Progress = Callable[[str], None]


@dataclasses.dataclass
class Ledger:
    """The zCDP spent, step by step: ("gaussian", σ, ρ) and ("exponential", ε, ρ) entries."""

    budget: float
    steps: list[tuple[str, float, float]] = dataclasses.field(default_factory=list)

    @property
    def spent(self) -> float:
        return float(sum(r for _, _, r in self.steps))

    def gaussian(self, sigma: float) -> None:
        self._add(("gaussian", sigma, gaussian_rho(sigma)))

    def exponential(self, epsilon: float) -> None:
        self._add(("exponential", epsilon, exponential_rho(epsilon)))

    def _add(self, step: tuple[str, float, float]) -> None:
        if self.spent + step[2] > self.budget * (1 + 1e-9):
            raise SynthError(f"step {step} would exceed the zCDP budget ρ = {self.budget:g} (spent {self.spent:g})")
        self.steps.append(step)


@dataclasses.dataclass
class SynthResult:
    """A synthetic table and what it cost: the zCDP ρ spent, its (ε, δ), the marginals measured."""

    method: str
    table: Table
    rho: float | None
    epsilon: float | None
    delta: float | None
    cliques: list[tuple[str, ...]]
    ledger: Ledger | None = None
    model: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method,
            "rows": self.table.rows,
            "rho": self.rho,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "cliques": [list(c) for c in self.cliques],
        }
        if self.ledger is not None:
            out["gaussian_measurements"] = sum(1 for k, _, _ in self.ledger.steps if k == "gaussian")
            out["selections"] = sum(1 for k, _, _ in self.ledger.steps if k == "exponential")
        out.update(self.extra)
        return out


def exponential_mechanism(scores: np.ndarray, epsilon: float, sensitivity: float, rng: np.random.Generator) -> int:
    """Index r drawn with probability ∝ exp(ε·score_r / (2·sensitivity)) (Gumbel-max, exact)."""
    s = np.asarray(scores, dtype=np.float64) * (epsilon / (2.0 * sensitivity))
    return int(np.argmax(s + rng.gumbel(size=s.size)))


def _measure(table: Table, clique: tuple[int, ...], sigma: float, rng: np.random.Generator) -> Measurement:
    x = marginal(table, clique)
    return Measurement(tuple(table.columns[j] for j in clique), x + rng.normal(0.0, sigma, x.size), sigma)


def _budget(epsilon: float, delta: float) -> float:
    return rho_for_epsilon(epsilon, delta)


def mst(
    table: Table,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    *,
    rows: int | None = None,
    iters: int = 1000,
    progress: Progress | None = None,
) -> SynthResult:
    """MST: a third of ρ measures every 1-way marginal, a third picks a maximum spanning tree of 2-way
    marginals by d−1 exponential-mechanism steps (score: the L1 error of the independence model fitted to
    the noisy 1-ways, sensitivity 1), a third measures the tree's d−1 2-way marginals."""
    say = progress or (lambda _m: None)
    rho = _budget(epsilon, delta)
    ledger = Ledger(rho)
    d = len(table.columns)
    if d < 2:
        raise SynthError("MST needs at least two columns")
    sigma1 = math.sqrt(3.0 * d / (2.0 * rho))
    ones = []
    for j in range(d):
        ones.append(_measure(table, (j,), sigma1, rng))
        ledger.gaussian(sigma1)
    say(f"measured {d} 1-way marginals (σ = {sigma1:.1f})")
    pad = [_names(table, c) for k in (1, 2) for c in itertools.combinations(range(d), k)]
    model = fit(table, ones, iters=iters, pad=pad)
    eps_sel = math.sqrt(8.0 * (rho / 3.0) / (d - 1))
    comp = list(range(d))  # union-find over columns: the tree's components

    def root(a: int) -> int:
        while comp[a] != a:
            a = comp[a]
        return a

    pairs = list(itertools.combinations(range(d), 2))
    score = {
        p: float(np.abs(marginal(table, p) - model_marginal(model, (table.columns[p[0]], table.columns[p[1]]))).sum())
        for p in pairs
    }
    tree: list[tuple[int, int]] = []
    for _ in range(d - 1):
        cand = [p for p in pairs if root(p[0]) != root(p[1])]
        k = exponential_mechanism(np.array([score[p] for p in cand]), eps_sel, 1.0, rng)
        ledger.exponential(eps_sel)
        a, b = cand[k]
        comp[root(a)] = root(b)
        tree.append((a, b))
    say(f"selected a spanning tree of {d - 1} pairs (ε = {eps_sel:.3f} each)")
    sigma2 = math.sqrt(3.0 * (d - 1) / (2.0 * rho))
    twos = []
    for p in tree:
        twos.append(_measure(table, p, sigma2, rng))
        ledger.gaussian(sigma2)
    model = fit(table, ones + twos, iters=iters, pad=pad)
    say(f"fitted the model to {len(ones) + len(twos)} marginals")
    out = sample(model, table, rows or table.rows, rng)
    return SynthResult(
        "mst",
        out,
        ledger.spent,
        epsilon_of_rho(ledger.spent, delta),
        delta,
        [m.clique for m in ones + twos],
        ledger,
        model,
        {"sigma_1way": sigma1, "sigma_2way": sigma2, "epsilon_selection": eps_sel},
    )


def _workload(d: int, degree: int) -> list[tuple[int, ...]]:
    return list(itertools.combinations(range(d), degree))


def aim(
    table: Table,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    *,
    rows: int | None = None,
    degree: int = 3,
    max_cells: int = 20000,
    max_rounds: int | None = None,
    iters: int = 300,
    progress: Progress | None = None,
) -> SynthResult:
    """AIM over the workload of every ``degree``-way marginal: 1-ways measured first, then rounds that pick
    the worst-approximated candidate of the workload's downward closure by the exponential mechanism
    (score w_r·(‖M_r(D) − M_r(model)‖₁ − √(2/π)·σ·n_r), sensitivity max w_r), measure it, refit;
    σ halves and ε doubles when a measurement barely changed the model; the last round spends what is
    left. ``max_rounds`` stops earlier (the rest of the budget is then not spent)."""
    say = progress or (lambda _m: None)
    rho = _budget(epsilon, delta)
    ledger = Ledger(rho)
    d = len(table.columns)
    if not 1 <= degree <= d:
        raise SynthError(f"degree must be in 1..{d}, got {degree}")
    workload = _workload(d, degree)
    cands = sorted({s for w in workload for k in range(1, degree + 1) for s in itertools.combinations(w, k)})
    weight = {c: float(sum(len(set(c) & set(w)) for w in workload)) for c in cands}
    cells = {c: int(np.prod([table.shape[j] for j in c])) for c in cands}
    truth = {c: marginal(table, c) for c in cands}
    T, alpha = 16 * d, 0.9
    sigma = math.sqrt(T / (2.0 * alpha * rho))
    eps = math.sqrt(8.0 * (1.0 - alpha) * rho / T)
    ms = []
    for j in range(d):
        ms.append(_measure(table, (j,), sigma, rng))
        ledger.gaussian(sigma)
    pad = [_names(table, c) for c in cands]
    model = fit(table, ms, iters=iters, pad=pad)
    used_cells = sum(cells[(j,)] for j in range(d))
    say(f"measured {d} 1-way marginals (σ = {sigma:.1f})")
    rounds, terminate = 0, False
    while not terminate and (max_rounds is None or rounds < max_rounds):
        rounds += 1
        left = rho - ledger.spent
        if left < 2.0 * (gaussian_rho(sigma) + exponential_rho(eps)):
            sigma = math.sqrt(1.0 / (2.0 * alpha * left))
            eps = math.sqrt(8.0 * (1.0 - alpha) * left)
            terminate = True
        limit = max_cells * (ledger.spent + gaussian_rho(sigma) + exponential_rho(eps)) / rho
        small = [c for c in cands if used_cells + cells[c] <= limit] or [c for c in cands if len(c) == 1]
        bias = math.sqrt(2.0 / math.pi) * sigma
        scores = np.array(
            [
                weight[c] * (np.abs(truth[c] - model_marginal(model, _names(table, c))).sum() - bias * cells[c])
                for c in small
            ]
        )
        pick = small[exponential_mechanism(scores, eps, max(weight[c] for c in small), rng)]
        ledger.exponential(eps)
        ms.append(_measure(table, pick, sigma, rng))
        ledger.gaussian(sigma)
        used_cells += cells[pick]
        before = model_marginal(model, _names(table, pick))
        model = fit(table, ms, iters=iters, pad=pad)  # cold: a warm start makes jax compile again
        after = model_marginal(model, _names(table, pick))
        say(
            f"round {rounds}: measured {'×'.join(_names(table, pick))} (σ = {sigma:.1f}), ρ spent {ledger.spent:.4f} of {rho:.4f}"
        )
        if not terminate and np.abs(after - before).sum() <= bias * cells[pick]:
            sigma, eps = sigma / 2.0, eps * 2.0
    model = fit(table, ms, iters=max(iters, 1000), pad=pad)
    out = sample(model, table, rows or table.rows, rng)
    return SynthResult(
        "aim",
        out,
        ledger.spent,
        epsilon_of_rho(ledger.spent, delta),
        delta,
        [m.clique for m in ms],
        ledger,
        model,
        {"rounds": rounds, "degree": degree, "budget_spent": terminate},
    )


def _names(table: Table, clique: Sequence[int]) -> tuple[str, ...]:
    return tuple(table.columns[j] for j in clique)


def exact_marginals(
    table: Table, rng: np.random.Generator, *, rows: int | None = None, degree: int = 2, iters: int = 1000
) -> SynthResult:
    """The non-private baseline: the model fitted to every exact ``degree``-way marginal (no noise, no
    privacy), then sampled like the DP methods."""
    ms = [
        Measurement(_names(table, c), marginal(table, c), 1.0)
        for c in itertools.combinations(range(len(table.columns)), degree)
    ]
    model = fit(table, ms, iters=iters, total=float(table.rows))
    return SynthResult(
        f"exact-{degree}way",
        sample(model, table, rows or table.rows, rng),
        None,
        None,
        None,
        [m.clique for m in ms],
        None,
        model,
    )
