"""``ldp dpsgd --select``: pick DP-SGD hyperparameters privately, and account for the whole search.

Candidates are every combination of the noise multipliers, learning rates and clipping norms given. The
training rows are split (seeded, or from fresh OS entropy) into a training part and a disjoint *validation*
part; each candidate is trained with DP-SGD on the training part and scored by how many validation rows it
classifies correctly, an integer count that one validation row changes by at most 1 under add/remove and
that moves all candidates' scores the same way (monotone, see :mod:`estimator.selection.mechanisms`). The
validation set's size is treated as public. The scores are never printed.

``method="svt"``
    Candidates are trained and scored in the order given, and tested with the sparse vector technique
    against ``threshold`` (a validation accuracy, turned into the count ⌈threshold · n_val⌉); the first
    candidate above it is chosen and no later candidate is trained. ε_select is paid once, whatever the
    number of candidates tested. If none passes, nothing is chosen (the budget is spent all the same).
``method="em"``
    Every candidate is trained and scored; the exponential mechanism picks one (ε_select).

What the printed total covers. Every candidate's training reads the training rows, so the search costs the
composition of *all* candidates' DP-SGD runs, not only the chosen one. With the sparse vector technique
fewer candidates may be trained, but how many depends on the data, so charging only those would be a
privacy odometer, not a valid bound: the total charges every candidate (worst case). The selection reads the
validation rows (ε_select, pure DP). A person is in one of the two parts; the total composes both anyway
(sequential composition, a valid upper bound: ``epsilon``), by the estimator's accountant
(:func:`estimator.accounting.accountant.account`, ``dp_accounting``'s PLD with RDP as a second opinion) on
the event Composed(candidate runs..., PureDP(ε_select)). The test suite checks the figure against a PLD
built directly with ``dp_accounting``. The test split is not covered (as for ``ldp dpsgd``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from estimator.accounting.accountant import account
from estimator.accounting.central import SparseVector
from estimator.jobs.dpsgd import Dataset, DPSGDJob, run_dpsgd
from estimator.selection.mechanisms import SelectionError, exponential_mechanism, svt_select
from ldp_core.fl.dpsgd import DPSGDConfig
from ldp_core.privacy_events import ComposedEvent, PrivacyEvent, PureDPEvent
from ldp_core.randomness import secure_generator

__all__ = ["Candidate", "candidate_grid", "split_validation", "selection_event", "select_dpsgd"]

Method = Literal["svt", "em"]

PROTECTS = (
    "one example of the training or validation rows (its presence, add/remove), against anyone who sees "
    "every candidate's intermediate models and the choice, but not the batches and noise"
)


@dataclasses.dataclass(frozen=True)
class Candidate:
    noise_multiplier: float
    learning_rate: float
    clip_norm: float

    def config(self, sample_rate: float) -> DPSGDConfig:
        return DPSGDConfig(self.noise_multiplier, self.clip_norm, sample_rate, self.learning_rate)


def candidate_grid(
    noise_multipliers: Sequence[float], learning_rates: Sequence[float], clip_norms: Sequence[float]
) -> list[Candidate]:
    """Every combination, noise multiplier outermost. A candidate without noise has no finite ε: refused."""
    if any(not (math.isfinite(s) and s > 0) for s in noise_multipliers):
        raise SelectionError("every candidate noise multiplier must be > 0 (without noise no ε holds)")
    out = [Candidate(s, lr, c) for s, lr, c in itertools.product(noise_multipliers, learning_rates, clip_norms)]
    if not out:
        raise SelectionError("no candidates: give at least one noise multiplier, learning rate and clip norm")
    return out


def split_validation(
    data: Dataset, fraction: float, rng: np.random.Generator
) -> tuple[Dataset, np.ndarray, np.ndarray]:
    """(training part, x_val, y_val): a random ``fraction`` of the training rows held out for validation."""
    n = len(data.x_train)
    n_val = int(round(fraction * n))
    if not 0.0 < fraction < 1.0 or n_val < 1 or n_val >= n:
        raise SelectionError(f"cannot hold out a validation fraction of {fraction} from {n} training rows")
    order = rng.permutation(n)
    v, t = order[:n_val], order[n_val:]
    train = dataclasses.replace(data, x_train=data.x_train[t], y_train=data.y_train[t])
    return train, data.x_train[v], data.y_train[v]


def selection_event(job: DPSGDJob, candidates: Sequence[Candidate], epsilon_select: float) -> PrivacyEvent:
    """Composed(every candidate's DP-SGD run, PureDP(ε_select)): what the search costs (module docstring)."""
    runs: list[PrivacyEvent] = []
    for c in candidates:
        cfg = c.config(job.config.sample_rate)
        ev = cfg.event(job.epochs * cfg.steps_per_epoch())
        assert ev is not None  # candidate_grid refuses σ = 0
        runs.append(ev)
    return ComposedEvent((*runs, PureDPEvent(epsilon_select)))


def select_dpsgd(
    job: DPSGDJob,
    data: Dataset,
    candidates: Sequence[Candidate],
    method: Method,
    epsilon_select: float,
    validation_fraction: float = 0.2,
    threshold: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the search (module docstring) and return the chosen run's ``ldp dpsgd`` result with
    ``epsilon`` the composed total of the search and ``selection`` saying what was chosen and why it cost
    what it did. Randomness: from ``job.seed`` when given (a study), else fresh entropy for the split and
    initialization and the OS CSPRNG for the batches, the noise and the selection."""
    if method not in ("svt", "em"):
        raise SelectionError(f"method must be svt or em, got {method!r}")
    if method == "svt" and (threshold is None or not 0.0 <= threshold <= 1.0):
        raise SelectionError("the sparse vector technique needs a threshold: a validation accuracy in [0, 1]")
    if not (math.isfinite(epsilon_select) and epsilon_select > 0):
        raise SelectionError(f"the selection's epsilon must be a finite number > 0, got {epsilon_select!r}")
    seeds = np.random.SeedSequence(job.seed).spawn(len(candidates) + 2) if job.seed is not None else None
    split_rng = np.random.default_rng(seeds[0] if seeds else None)
    select_rng = np.random.default_rng(seeds[1]) if seeds else secure_generator()
    train, x_val, y_val = split_validation(data, validation_fraction, split_rng)
    results: dict[int, dict[str, Any]] = {}

    def score(i: int) -> int:
        c = candidates[i]
        run_job = dataclasses.replace(job, config=c.config(job.config.sample_rate))
        if seeds:
            init, sample, noise = (np.random.default_rng(s) for s in seeds[2 + i].spawn(3))
        else:
            _, init, sample, noise = run_job.generators()
        res = run_dpsgd(run_job, train, init, sample, noise, validation=(x_val, y_val))
        results[i] = res
        if progress is not None:
            progress(f"candidate {i + 1}/{len(candidates)} trained: {dataclasses.asdict(c)}")
        return int(res.pop("validation_correct"))

    count_threshold: int | None = None
    if method == "svt":
        assert threshold is not None
        count_threshold = math.ceil(threshold * len(y_val))
        svt = SparseVector(epsilon_select, count_threshold, 1, 1, monotonic=True)
        found = svt_select(score, len(candidates), svt, select_rng)
        chosen, scored = found.index, found.scored
    else:
        counts = [score(i) for i in range(len(candidates))]
        chosen = exponential_mechanism(counts, epsilon_select, 1.0, monotonic=True, rng=select_rng)
        scored = len(candidates)
    event = selection_event(job, candidates, epsilon_select)
    assert isinstance(event, ComposedEvent)
    total = account(event, job.delta)
    training_all = account(ComposedEvent(event.events[:-1]), job.delta)
    selection = {
        "method": method,
        "epsilon_select": epsilon_select,
        "threshold_accuracy": threshold,
        "threshold_count": count_threshold,
        "validation_examples": len(y_val),
        "training_examples": len(train.x_train),
        "candidates": [dataclasses.asdict(c) for c in candidates],
        "candidates_scored": scored,
        "chosen": chosen,
        "chosen_candidate": None if chosen is None else dataclasses.asdict(candidates[chosen]),
        "epsilon_training_all_candidates": training_all.epsilon,
        "epsilon_total": total.epsilon,
        "epsilon_total_pld": total.epsilon_pld,
        "epsilon_total_rdp": total.epsilon_rdp,
        "charged": "every candidate's DP-SGD run (worst case) and the selection, composed",
    }
    base: dict[str, Any] = (
        {"accuracy": None, "per_epoch": [], "delta": job.delta, "epsilon_run": None, "neighbors": "add_or_remove"}
        if chosen is None
        else dict(results[chosen])
    )
    if chosen is not None:
        base["epsilon_run"] = base["epsilon"]
        base["epsilon_run_pld"], base["epsilon_run_rdp"] = base["epsilon_pld"], base["epsilon_rdp"]
    base.update(
        {
            "epsilon": total.epsilon,
            "epsilon_pld": total.epsilon_pld,
            "epsilon_rdp": total.epsilon_rdp,
            "protects": PROTECTS,
            "selection": selection,
        }
    )
    return base
