"""``ldp fl job --select svt|em``: a federated task's configuration chosen privately among candidates.

Candidates. Every combination of the candidate noise multipliers, clipping norms and round counts becomes its
own task, ``<task>.c<i>`` (:func:`candidate_specs`): the same clients, model, sampling and seed, run from
scratch over the pipeline by its own aggregation job (its own checkpoints, so a crash resumes it), one after
the other; devices join each candidate's task id in turn. Tasks whose devices check a signed configuration
(SecAgg, local DP-SGD, distributed noise, compression) are refused: the signature names one task.

Scores. The job's operator holds private validation rows (``x``, ``y`` in an .npz file, the format of FLTrust's
root data). A candidate's score is the count of validation rows its final model classifies correctly: one row
added or removed moves every score by at most 1, all the same way (monotone). The choice is the sparse vector
technique against ``threshold`` (a validation accuracy, as the count ⌈threshold · n_val⌉; later candidates are
never trained) or the exponential mechanism over all candidates (:mod:`estimator.selection.mechanisms`),
ε_select either way.

The total. :func:`selection_total` composes, with the estimator's accountant (PLD, RDP as a second opinion),
*every* candidate's client-level rounds (the number SVT trains depends on the data, so all are charged) and
the choice, PureDP(ε_select), under the task's relation: add/remove one client with Poisson sampling
(SelfComposed(PoissonSampled(q, Gaussian(z)), T) per candidate, as ``ldp fl clinics --select``), replace one
client with a fixed count (SelfComposed(Gaussian(z), T), no amplification credited, and the choice, stated
add/remove, priced at 2 ε_select under replace by group privacy). It protects one client (all its data) or
one validation row; someone who is both is covered by the same total, since every part is composed.

Resuming. The candidate jobs resume from their checkpoints; the choice's noise must not be drawn twice (a
second draw is a second release). The search keeps its state in a file (:class:`SearchState`, mode 0600): the
SVT's noisy threshold offset, written before the first query, and every answer, written before it is shown;
the exponential mechanism's choice, written before it is shown. A restart with the same plan goes on from
there; one with another plan is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from estimator.accounting.accountant import Neighbors, account
from estimator.accounting.central import SparseVector
from estimator.fl.budget import check_debitable, task_event, task_relation
from estimator.fl.task import FLTaskSpec
from estimator.selection.mechanisms import AboveThreshold, SelectionError, exponential_mechanism
from ldp_core.files import write_atomic
from ldp_core.privacy_events import ComposedEvent, PrivacyEvent, PureDPEvent

__all__ = [
    "candidate_specs",
    "selection_event",
    "selection_total",
    "SearchState",
    "select_task",
    "PROTECTS",
]

Method = Literal["svt", "em"]

PROTECTS = (
    "one client (all its data) in the candidates' rounds, or one of the operator's validation rows in the "
    "choice, against observers of every candidate's models and of the choice"
)


def candidate_specs(
    spec: FLTaskSpec,
    noise_multipliers: Sequence[float] | None = None,
    clip_norms: Sequence[float] | None = None,
    rounds: Sequence[int] | None = None,
) -> list[FLTaskSpec]:
    """Every combination (noise multiplier outermost) as a task ``<task>.c<i>``; each must be debitable
    (fedavg with central Gaussian noise: :func:`estimator.fl.budget.check_debitable`)."""
    if spec.secagg or spec.local_dp_sgd is not None or spec.noise is not None or spec.compression is not None:
        raise SelectionError(
            "--select runs each candidate as its own task, and this task's devices check a signed configuration "
            "(secagg, local_dp_sgd, distributed noise or compression) that names one task; select without them"
        )
    zs = tuple(noise_multipliers or (spec.noise_multiplier,))
    cs = tuple(clip_norms or ((spec.clip_norm,) if spec.clip_norm is not None else ()))
    ts = tuple(rounds or (spec.rounds,))
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in ts):
        raise SelectionError(f"every candidate round count must be a positive integer, got {ts}")
    if not cs:
        raise SelectionError("the task has no clip_norm and no candidate clipping norm was given")
    out = []
    for i, (z, c, t) in enumerate(itertools.product(zs, cs, ts)):
        if not (math.isfinite(z) and z > 0 and math.isfinite(c) and c > 0):
            raise SelectionError(f"candidate noise multipliers and clipping norms must be > 0, got σ={z}, C={c}")
        cand = dataclasses.replace(
            spec, task=f"{spec.task}.c{i}", noise_multiplier=float(z), clip_norm=float(c), rounds=t, task_signature=None
        )
        check_debitable(cand)
        out.append(cand)
    return out


def selection_event(
    candidates: Sequence[FLTaskSpec], epsilon_select: float, session_neighbors: Neighbors | None = None
) -> tuple[PrivacyEvent, Neighbors]:
    """(Composed(every candidate's rounds, PureDP(ε_select)), the relation it is stated under) for a session of
    ``session_neighbors`` (default: the task's relation); the rounds as :func:`estimator.fl.budget.task_event`."""
    runs = [task_event(c, session_neighbors) for c in candidates]
    relations = {r for _, r in runs}
    assert len(relations) == 1  # every candidate has the task's sampling
    return ComposedEvent((*(e for e, _ in runs), PureDPEvent(epsilon_select))), relations.pop()


def selection_total(candidates: Sequence[FLTaskSpec], epsilon_select: float, delta: float) -> dict[str, Any]:
    """The composed total (module docstring): ``epsilon`` and its parts, for the task's relation."""
    rel = task_relation(candidates[0])
    event, _ = selection_event(candidates, epsilon_select, rel)
    assert isinstance(event, ComposedEvent)
    total = account(event, delta, rel)
    runs = ComposedEvent(event.events[:-1]) if len(event.events) > 2 else event.events[0]
    return {
        "epsilon": total.epsilon,
        "epsilon_pld": total.epsilon_pld,
        "epsilon_rdp": total.epsilon_rdp,
        "epsilon_training_all_candidates": account(runs, delta, rel).epsilon,
        "epsilon_each_candidate": [account(e, delta, rel).epsilon for e in event.events[:-1]],
        "delta": delta,
        "neighbors": rel,
        "amplification_credited": rel == "add_or_remove",
    }


def plan_fingerprint(plan: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


class SearchState:
    """The search's file (module docstring): ``{"plan": sha256, "svt": {rho, answers} | None, "chosen": i}``."""

    def __init__(self, path: str, plan: dict[str, Any]) -> None:
        self.path = path
        self.plan = plan_fingerprint(plan)
        self.data: dict[str, Any] = {"plan": self.plan, "svt": None, "chosen": None, "done": False}
        if os.path.exists(path):
            try:
                with open(path) as f:
                    have = json.load(f)
            except (OSError, ValueError) as exc:
                raise SelectionError(
                    f"the search state {path!r} is unreadable ({exc}); it is never overwritten"
                ) from None
            if have.get("plan") != self.plan:
                raise SelectionError(
                    f"the search state {path!r} belongs to another plan (candidates, method, ε_select, threshold or "
                    "validation data changed); a new plan is a new task id (or remove the file if no candidate ran)"
                )
            self.data = have

    def save(self) -> None:
        write_atomic(self.path, json.dumps(self.data).encode())
        os.chmod(self.path, 0o600)


def select_task(
    candidates: Sequence[FLTaskSpec],
    method: Method,
    epsilon_select: float,
    validation: tuple[np.ndarray, np.ndarray],
    run_candidate: Callable[[FLTaskSpec], np.ndarray],
    state: SearchState,
    threshold: float | None = None,
    rng: np.random.Generator | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Run the search (module docstring): ``run_candidate(spec)`` runs (or resumes) one candidate's job to its
    end and returns its final parameters. The result's ``chosen`` is None when SVT found none above."""
    if method == "svt" and (threshold is None or not 0.0 <= threshold <= 1.0):
        raise SelectionError("the sparse vector technique needs --select-threshold: a validation accuracy in [0, 1]")
    x, y = validation
    model = candidates[0].build_model()
    trained: list[int] = []

    def score(i: int) -> int:
        params = run_candidate(candidates[i])
        trained.append(i)
        return int(np.sum(model.predict(params, x) == y))

    count_threshold = None if threshold is None else math.ceil(threshold * len(y))
    d = state.data
    if method == "svt":
        assert count_threshold is not None
        svt = SparseVector(epsilon_select, count_threshold, 1, 1, monotonic=True)
        at = AboveThreshold.resumed(svt, d["svt"], rng) if d["svt"] is not None else AboveThreshold(svt, rng)
        d["svt"] = at.state()
        state.save()  # the noisy threshold, before any query
        for i in range(len(candidates)):
            if at.halted:
                break
            if i >= len(at.answers):
                above = at.test(score(i))
                d["svt"] = at.state()
                state.save()  # the answer, before it is shown
                progress(f"candidate {candidates[i].task}: {'above' if above else 'below'} the threshold")
        chosen = next((i for i, a in enumerate(at.answers) if a), None)
        answers = list(at.answers)
    else:
        if d["chosen"] is None:
            counts = [score(i) for i in range(len(candidates))]
            d["chosen"] = exponential_mechanism(counts, epsilon_select, 1.0, monotonic=True, rng=rng)
            state.save()  # the choice, before it is shown
        chosen, answers = int(d["chosen"]), []
    d["done"] = True
    state.save()
    return {
        "method": method,
        "candidates": [
            {"task": c.task, "noise_multiplier": c.noise_multiplier, "clip_norm": c.clip_norm, "rounds": c.rounds}
            for c in candidates
        ],
        "chosen": chosen,
        "chosen_task": None if chosen is None else candidates[chosen].task,
        "candidates_scored_now": len(trained),
        "answers": answers,
        "epsilon_select": epsilon_select,
        "threshold_count": count_threshold,
        "validation_rows": int(len(y)),
        "sensitivity": 1,
        "protects": PROTECTS,
    }
