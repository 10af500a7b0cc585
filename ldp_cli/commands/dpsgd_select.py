"""``ldp dpsgd --select svt|em``: the options of a private hyperparameter search and its output
(the search itself is :func:`estimator.selection.dpsgd.select_dpsgd`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import unit_interval
from ldp_cli.progress import progress_enabled

__all__ = ["add_selection_flags", "run_selection", "float_list"]


def float_list(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        vals = ()
    if not vals or not all(v > 0 and v != float("inf") for v in vals):
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers > 0, got {text}")
    return vals


def add_selection_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "private hyperparameter selection",
        "train every combination of the candidate values with DP-SGD, score each on a private validation split, "
        "and choose with the sparse vector technique (svt: the first above --select-threshold, later ones never "
        "trained) or the exponential mechanism (em); the printed ε composes every candidate's run and the choice "
        "(docs/DPSGD.md)",
    )
    g.add_argument("--select", choices=["svt", "em"], default=None, help="choose hyperparameters privately")
    g.add_argument(
        "--candidate-noise-multipliers", type=float_list, default=None, help="σ values (default: --noise-multiplier)"
    )
    g.add_argument("--candidate-lrs", type=float_list, default=None, help="learning rates (default: --lr)")
    g.add_argument("--candidate-clips", type=float_list, default=None, help="clipping norms (default: --clip)")
    g.add_argument("--select-epsilon", type=_positive, default=1.0, help="ε of the choice itself (default 1)")
    g.add_argument("--select-threshold", type=unit_interval, default=None, help="svt: validation accuracy to reach")
    g.add_argument(
        "--validation-fraction",
        type=unit_interval,
        default=0.2,
        help="share of the training rows held out (privately) for scoring (default 0.2)",
    )


def run_selection(args: argparse.Namespace, job: Any, data: Any) -> tuple[dict[str, Any], list[str]]:
    """The search's result (``ldp dpsgd``'s object with ``epsilon`` the composed total and ``selection``) and
    the text lines that say what was chosen."""
    from estimator.selection.dpsgd import candidate_grid, select_dpsgd, selection_event
    from ldp_cli.commands.budget import charge

    candidates = candidate_grid(
        args.candidate_noise_multipliers or (args.noise_multiplier,),
        args.candidate_lrs or (args.lr,),
        args.candidate_clips or (args.clip,),
    )

    if args.budget_session:  # the whole search, debited before any candidate is trained
        event = selection_event(job, candidates, args.select_epsilon)
        refused = charge(args, "dpsgd-select", event, f"dpsgd --select {args.select} on {args.data}")
        if refused is not None:
            return {"refused": refused}, []
    show = progress_enabled(args)

    def progress(line: str) -> None:
        if show:
            print(line, file=sys.stderr, flush=True)

    result = select_dpsgd(
        job,
        data,
        candidates,
        args.select,
        args.select_epsilon,
        args.validation_fraction,
        args.select_threshold,
        progress,
    )
    s = result["selection"]
    lines = [
        f"private selection ({s['method']}, ε_select = {s['epsilon_select']:g}) over {len(candidates)} candidates, "
        f"{s['candidates_scored']} trained and scored on {s['validation_examples']} validation rows:",
        f"  chosen: {json.dumps(s['chosen_candidate']) if s['chosen'] is not None else 'none above the threshold'}",
        f"  ε = {result['epsilon']:.4g} at δ = {args.delta:g} in total (every candidate's DP-SGD run "
        f"{s['epsilon_training_all_candidates']:.4g}, composed with the choice)",
    ]
    if s["chosen"] is not None:
        lines.append(f"  the chosen run alone: ε = {result['epsilon_run']:.4g}; test accuracy {result['accuracy']:.4f}")
    lines.append(f"ε protects {result['protects']}.")
    return result, lines
