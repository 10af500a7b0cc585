"""``ldp privacy pate``: the ε of PATE's GNMax and Confident-GNMax aggregators (:mod:`estimator.pate`).

``--json`` keys: ``epsilon`` (data-independent: Q answered GNMax queries at σ), with ``--threshold`` and
``--sigma1`` ``epsilon_confident`` (Q threshold checks and Q answers, the most Q queries can cost), and with
``--votes FILE`` ``answered``, ``epsilon_data_independent`` (the checks plus the answered queries),
``epsilon_data_dependent`` (Papernot et al. 2018) and ``epsilon_data_dependent_published`` (released with
smooth sensitivity). The votes file's format is in :mod:`estimator.pate.privacy` and ``--help``.
"""

from __future__ import annotations

import argparse

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import probability as _prob
from ldp_cli.commands.argtypes import seed as _seed
from ldp_cli.commands.privacy.common import emit, fmt

__all__ = ["register_pate_command", "run_pate_privacy"]

VOTES_HELP = (
    "the teachers' vote counts, queries × classes: a .npy array; a .npz with the array 'votes' (or its only "
    "array) and optionally 'answered' (one 0/1 flag per query); or .json, a list of lists or "
    '{"votes": [[...]], "answered": [...]}. Without answered flags, every query counts as answered, or with '
    "--threshold the threshold check is run here on the votes"
)


def register_pate_command(ps: argparse._SubParsersAction) -> None:
    q = ps.add_parser(
        "pate",
        help="ε of PATE's GNMax / Confident-GNMax (data-independent, and data-dependent from a votes file)",
        description="Data-independent RDP of GNMax (λ/σ² per answer: one record changes one teacher's vote, "
        "the histogram moves by 1 in two coordinates) and of Confident-GNMax's threshold check (λ/(2σ₁²) on "
        "every query), converted to (ε, δ); with --votes the data-dependent ε of Papernot et al. 2018 and its "
        "smooth-sensitivity release. See docs/PATE.md.",
    )
    q.add_argument("--sigma", type=_positive, required=True, help="GNMax's noise σ (σ₂ of Confident-GNMax)")
    q.add_argument("--queries", type=_positive_int, required=True, help="queries Q (answered ones without a threshold)")
    q.add_argument("--delta", type=_prob, required=True, help="target δ")
    q.add_argument("--threshold", type=float, default=None, help="Confident-GNMax's threshold T on the top vote count")
    q.add_argument("--sigma1", type=_positive, default=None, help="noise σ₁ of the threshold check")
    q.add_argument("--votes", default=None, metavar="FILE", help=VOTES_HELP)
    q.add_argument(
        "--order",
        type=_positive,
        default=None,
        help="RDP order of the published data-dependent ε (default: the best one for these votes, chosen on the data)",
    )
    q.add_argument(
        "--seed",
        type=_seed,
        default=None,
        help="seed of the threshold checks and the smooth-sensitivity noise, for a study (default: the OS CSPRNG)",
    )
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=run_pate_privacy)


def run_pate_privacy(args: argparse.Namespace) -> int:
    import numpy as np

    from estimator.pate.privacy import pate_privacy
    from ldp_core.randomness import secure_generator

    if (args.threshold is None) != (args.sigma1 is None):
        raise ValueError("--threshold and --sigma1 go together (Confident-GNMax)")
    if args.order is not None and args.votes is None:
        raise ValueError("--order applies to the data-dependent ε: give --votes")
    rng = secure_generator() if args.seed is None else np.random.default_rng(args.seed)
    obj = pate_privacy(args.sigma, args.queries, args.delta, args.threshold, args.sigma1, args.votes, rng, args.order)
    lines = [
        f"{args.queries} answered GNMax queries, σ = {args.sigma:g}, δ = {args.delta:g}:",
        f"  ε (data-independent, RDP λ/σ² per answer) = {fmt(obj['epsilon'])}",
    ]
    if "epsilon_confident" in obj:
        lines.append(
            f"  Confident-GNMax (T = {args.threshold:g}, σ₁ = {args.sigma1:g}), all {args.queries} answered: "
            f"ε = {fmt(obj['epsilon_confident'])}"
        )
    if "answered" in obj:
        lines += [
            f"  votes of {obj['teachers']} teachers: {obj['answered']} of {args.queries} answered "
            f"({obj['answered_from'].replace('_', ' ')})",
            f"  ε (data-independent, these answers) = {fmt(obj['epsilon_data_independent'])}",
            f"  ε (data-dependent, not for publication) = {fmt(obj['epsilon_data_dependent'])}",
            f"  ε (data-dependent, published with smooth sensitivity) = {fmt(obj['epsilon_data_dependent_published'])}",
        ]
    return emit(args, obj, lines)
