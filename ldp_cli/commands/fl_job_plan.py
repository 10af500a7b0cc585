"""``ldp fl job``'s plan: ``--budget-session FILE --partner NAME`` (the whole plan debited once, before round 1,
under the task id: :mod:`estimator.fl.budget`) and ``--select svt|em`` (candidate tasks run one after the other
and chosen privately on the operator's validation rows: :mod:`estimator.selection.fl_job`)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import unit_interval
from ldp_cli.commands.budget import add_budget_flags
from ldp_cli.commands.dpsgd_select import float_list

__all__ = ["add_plan_flags", "Plan", "make_plan", "run_selection"]


def _int_list(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        vals = ()
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text}")
    return vals


def add_plan_flags(j: argparse.ArgumentParser) -> None:
    add_budget_flags(j)
    g = j.add_argument_group(
        "private selection of the task's configuration",
        "every combination of the candidate values runs as its own task <task>.c<i> over the pipeline, one after "
        "the other, scored on the operator's private validation rows and chosen with the sparse vector technique "
        "(svt: the first above --select-threshold) or the exponential mechanism (em); the printed total composes "
        "every candidate's rounds and the choice (docs/fl/RUNNING.md)",
    )
    g.add_argument("--select", choices=["svt", "em"], default=None, help="choose the configuration privately")
    g.add_argument(
        "--candidate-noise-multipliers", type=float_list, default=None, help="σ values (default: the task's)"
    )
    g.add_argument("--candidate-clips", type=float_list, default=None, help="clipping norms (default: the task's)")
    g.add_argument("--candidate-rounds", type=_int_list, default=None, help="round counts (default: the task's)")
    g.add_argument("--validation", default=None, metavar="FILE.npz", help="private validation rows (arrays x, y)")
    g.add_argument("--select-epsilon", type=_positive, default=1.0, help="ε of the choice itself (default 1)")
    g.add_argument("--select-threshold", type=unit_interval, default=None, help="svt: validation accuracy to reach")
    g.add_argument(
        "--select-state",
        default=None,
        metavar="FILE",
        help="the search's state (noisy threshold, answers; default <task file>.select-<task>.json)",
    )


class Plan:
    """What the job will run: the task alone, or the candidates; and the debit made for it (or None)."""

    def __init__(self, spec: Any, candidates: list[Any] | None = None) -> None:
        self.spec, self.candidates = spec, candidates
        self.debit: dict[str, Any] | None = None
        self.validation: tuple[np.ndarray, np.ndarray] | None = None
        self.state: Any = None  # the search's SearchState


def make_plan(args: argparse.Namespace, spec: Any) -> Plan | int:
    """Check the flags, build the candidates, and debit the whole plan when ``--budget-session`` is given:
    the Plan, or the exit code 3 after a refusal (nothing spent, nothing run)."""
    from estimator.accounting.ledger import REFUSED_EXIT_CODE, BudgetLedger, LedgerError, LedgerRefusal
    from estimator.fl.budget import BUDGET_KIND, task_event, task_ref
    from estimator.selection.fl_job import candidate_specs, selection_event
    from ldp_core.fl.errors import FLError

    if args.budget_session and not args.partner:
        raise SystemExit("ldp fl job: --budget-session needs --partner (the partner the job is debited to)")
    candidates = None
    if args.select:
        if not args.validation:
            raise SystemExit(
                "ldp fl job: --select needs --validation FILE.npz (the private rows the candidates are scored on)"
            )
        if args.select == "svt" and args.select_threshold is None:
            raise SystemExit("ldp fl job: --select svt needs --select-threshold (a validation accuracy in [0, 1])")
        candidates = candidate_specs(
            spec, args.candidate_noise_multipliers, args.candidate_clips, args.candidate_rounds
        )
    plan = Plan(spec, candidates)
    if candidates is not None:  # every input checked before anything is debited
        _search(args, plan)
    if not args.budget_session:
        return plan

    def event_for(session_neighbors: Any) -> Any:
        if candidates is None:
            return task_event(spec, session_neighbors)
        return selection_event(candidates, args.select_epsilon, session_neighbors)

    label = f"fl job {spec.task}" + (f" --select {args.select} over {len(candidates)} candidates" if candidates else "")
    try:
        with BudgetLedger(args.budget_session) as ledger:
            try:
                event, rel = event_for(ledger.settings["neighbors"])
            except FLError as exc:
                raise SystemExit(f"ldp fl job: --budget-session: {exc}") from None
            debit = ledger.debit(args.partner, BUDGET_KIND, event, label, neighbors=rel, ref=task_ref(spec))
    except LedgerRefusal as exc:
        print(f"ldp fl job: refused by the budget session ({exc.reason}): {exc}", file=sys.stderr)
        print(json.dumps({"refused": True, "reason": exc.reason, "error": str(exc)}), flush=True)
        return REFUSED_EXIT_CODE
    except LedgerError as exc:
        raise SystemExit(f"ldp fl job: {exc}") from None
    plan.debit = debit
    return plan


def _search(args: argparse.Namespace, plan: Plan) -> None:
    """The validation rows and the search's state file (refused when it belongs to another plan)."""
    from estimator.fl.fltrust_root import file_sha256, load_root_data
    from estimator.selection.fl_job import SearchState
    from ldp_core.fl.errors import FLError

    spec, candidates = plan.spec, plan.candidates
    assert candidates is not None
    try:
        plan.validation = load_root_data(args.validation, spec.build_model())
    except FLError as exc:
        raise SystemExit(f"ldp fl job: --validation: {exc}") from None
    fingerprint = {
        "task": spec.task,
        "candidates": [c.to_dict() for c in candidates],
        "method": args.select,
        "epsilon_select": args.select_epsilon,
        "threshold": args.select_threshold,
        "validation_sha256": file_sha256(args.validation),
    }
    path = args.select_state or f"{os.path.splitext(args.task)[0]}.select-{spec.task}.json"
    plan.state = SearchState(path, fingerprint)


def _params(status: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(status["params"]), "<f4").astype(np.float32)


def run_selection(
    args: argparse.Namespace, plan: Plan, run_one: Callable[[Any], dict[str, Any] | None], show: Callable[[str], None]
) -> dict[str, Any] | None:
    """The search over ``plan.candidates``, each run by ``run_one(spec)`` (its final status, or None when stopped):
    the chosen candidate's status (the last one run when none was chosen) with ``selection`` added."""
    from estimator.selection.fl_job import select_task, selection_total

    spec, candidates, state, validation = plan.spec, plan.candidates, plan.state, plan.validation
    assert candidates is not None and state is not None and validation is not None
    statuses: dict[str, dict[str, Any]] = {}

    class _Stopped(Exception):
        pass

    def run_candidate(cand: Any) -> np.ndarray:
        st = run_one(cand)
        if st is None or not st.get("done"):
            raise _Stopped()
        statuses[cand.task] = st
        return _params(st)

    rng = None if spec.seed is None else np.random.default_rng([spec.seed, 0x5E1EC7])
    try:
        result = select_task(
            candidates, args.select, args.select_epsilon, validation, run_candidate, state,
            args.select_threshold, rng, show,
        )  # fmt: skip
    except _Stopped:
        return None
    chosen = result["chosen"]
    last = candidates[chosen] if chosen is not None else candidates[max(len(result["answers"]) - 1, 0)]
    status = statuses.get(last.task) or run_one(last)  # restored from its checkpoints (its job is done)
    if status is None:
        return None
    result.update(selection_total(candidates, args.select_epsilon, spec.delta))
    result["state_file"] = state.path
    status["selection"] = result
    return status
