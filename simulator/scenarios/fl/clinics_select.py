"""``ldp fl clinics --select``: DP-FedAvg's noise multiplier chosen privately among candidates, on the
clinics scenario (:mod:`simulator.scenarios.fl.clinics`), with the choice's ε composed into the total.

Each clinic keeps the last ``validation_fraction`` of its training patients as its own validation rows.
Every candidate σ trains DP-FedAvg (clip ``cfg.clip_norm``, Poisson sampling of clinics at ``cfg.sample_rate``,
``cfg.rounds`` rounds) on the rest and is scored by Σ_k min(correct_k, m): the validation rows clinic k's
model classifies correctly, capped at m per clinic (``cap``), so one clinic added or removed moves every
score by at most Δ = m, all the same way (monotone; client-level neighbours, as DP-FedAvg's ε). The choice
is the sparse vector technique against ``threshold`` (a fraction of the largest possible score, m per
clinic) or the exponential mechanism (:mod:`estimator.selection.mechanisms`), ε_select.

The printed ``epsilon`` composes, by the estimator's accountant (PLD, RDP as a second opinion), *every*
candidate's client-level event SelfComposed(PoissonSampled(q, Gaussian(σ)), rounds) and the choice
(PureDP(ε_select)), as ``ldp dpsgd --select`` does (docs/DPSGD.md): the number of candidates the sparse
vector technique trains depends on the data, so all are charged. It protects one clinic (all its patients)
against observers of the models who do not know the sample, like the scenario's ``epsilon_observers``;
the noise is central, so nothing holds against the server operator.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import numpy as np

from estimator.accounting.accountant import account
from estimator.accounting.central import SparseVector
from estimator.fl.aggregators import ValidatingAggregator, WeightedMean
from estimator.fl.dp import FixedClippingDP
from estimator.fl.sampling import PoissonSampling
from estimator.fl.strategies import FedAvg
from estimator.selection.mechanisms import SelectionError, exponential_mechanism, svt_select
from ldp_core.fl.models import LogisticRegression
from ldp_core.privacy_events import ComposedEvent, PrivacyEvent, PureDPEvent, sampled_gaussian_event
from simulator.rounds import FederatedClient, run_rounds
from simulator.scenarios.fl.clinics import ClinicsConfig, make_clinics

__all__ = ["select_clinics_noise", "clinics_selection_event"]

PROTECTS = (
    "one clinic (all its patients; add/remove), against observers of every candidate's models and the choice "
    "who do not know the sampled clinics; not against the server operator (central noise)"
)


def clinics_selection_event(cfg: ClinicsConfig, candidates: tuple[float, ...], epsilon_select: float) -> PrivacyEvent:
    runs = [sampled_gaussian_event(z, cfg.sample_rate, cfg.rounds) for z in candidates]
    return ComposedEvent((*runs, PureDPEvent(epsilon_select)))


def _split(
    clients: list[FederatedClient], fraction: float
) -> tuple[list[FederatedClient], list[tuple[np.ndarray, np.ndarray]]]:
    train, val = [], []
    for c in clients:
        cut = len(c.y) - max(1, int(round(fraction * len(c.y))))
        if cut < 1:
            raise SelectionError(f"{c.client_id} has too few rows to hold out a validation fraction of {fraction}")
        train.append(dataclasses.replace(c, X=c.X[:cut], y=c.y[:cut]))
        val.append((c.X[cut:], c.y[cut:]))
    return train, val


def select_clinics_noise(
    cfg: ClinicsConfig,
    candidates: tuple[float, ...],
    method: Literal["svt", "em"],
    epsilon_select: float,
    threshold: float | None = None,
    cap: int = 20,
    validation_fraction: float = 0.2,
) -> dict[str, Any]:
    """Run the search (module docstring); a JSON-ready result with ``epsilon`` the composed total."""
    if not candidates or any(not (math.isfinite(z) and z > 0) for z in candidates):
        raise SelectionError("every candidate noise multiplier must be > 0 (without noise no ε holds)")
    if method == "svt" and (threshold is None or not 0.0 <= threshold <= 1.0):
        raise SelectionError("the sparse vector technique needs a threshold in [0, 1] (a fraction of the top score)")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise SelectionError(f"the per-clinic cap must be a positive integer, got {cap!r}")
    clients, test = make_clinics(cfg, np.random.default_rng([cfg.seed, 0]))
    train, val = _split(clients, validation_fraction)
    model = LogisticRegression(cfg.features)
    trained: dict[int, dict[str, Any]] = {}

    def score(i: int) -> int:
        z = candidates[i]
        agg = ValidatingAggregator(FixedClippingDP(WeightedMean(), cfg.clip_norm, z))
        rng = np.random.default_rng([cfg.seed, 2, i])
        params, hist = run_rounds(
            model, FedAvg(cfg.training), agg, train, PoissonSampling(cfg.sample_rate), cfg.rounds, rng, test=test
        )
        trained[i] = {"noise_multiplier": z, "test_accuracy": hist[-1].test_accuracy}
        return sum(min(int(np.sum(model.predict(params, x) == y)), cap) for x, y in val)

    select_rng = np.random.default_rng([cfg.seed, 3])
    top = cap * len(val)
    count_threshold = None
    if method == "svt":
        assert threshold is not None
        count_threshold = math.ceil(threshold * top)
        found = svt_select(
            score, len(candidates), SparseVector(epsilon_select, count_threshold, 1, cap, monotonic=True), select_rng
        )
        chosen = found.index
    else:
        counts = [score(i) for i in range(len(candidates))]
        chosen = exponential_mechanism(counts, epsilon_select, float(cap), monotonic=True, rng=select_rng)
    event = clinics_selection_event(cfg, candidates, epsilon_select)
    assert isinstance(event, ComposedEvent)
    total = account(event, cfg.delta)
    return {
        "scenario": "clinics",
        "method": method,
        "candidates": list(candidates),
        "candidates_trained": len(trained),
        "chosen": chosen,
        "chosen_noise_multiplier": None if chosen is None else candidates[chosen],
        "test_accuracy": None if chosen is None else trained[chosen]["test_accuracy"],
        "epsilon_select": epsilon_select,
        "sensitivity": cap,
        "threshold_count": count_threshold,
        "max_score": top,
        "epsilon": total.epsilon,
        "epsilon_pld": total.epsilon_pld,
        "epsilon_rdp": total.epsilon_rdp,
        "epsilon_training_all_candidates": account(ComposedEvent(event.events[:-1]), cfg.delta).epsilon,
        "epsilon_chosen_run": None if chosen is None else account(event.events[chosen], cfg.delta).epsilon,
        "delta": cfg.delta,
        "rounds": cfg.rounds,
        "sample_rate": cfg.sample_rate,
        "neighbors": "add or remove one clinic (all its patients)",
        "protects": PROTECTS,
    }
