"""``ldp estimate``: batch estimation of any metric over the Parquet dataset (see :mod:`estimator.jobs.answers`).

    ldp estimate --dataset ldp-data/dataset --metric settings_tab --days 20419..20425 \\
        --out table.csv --plot estimates.png [--json] [--postprocess norm-sub] [--per-day] [--engine spark [--master URL]]

Every kind of metric is answered: frequencies, means, distributions (Square
Wave), the repeated counters (1BitMean, dBitFlip, LOLOHA) and heavy hitters
(PEM, SFP: discovered, ``--top`` values). Each kind has its table (printed,
or written by ``--out``), its plot and its JSON object (``--json``, one
object on stdout; its keys per kind are in docs/ESTIMATE.md).

Days are day numbers (days since 1970-01-01, UTC) or ISO dates; ``--days
A..B`` is inclusive. Without a range every day in the dataset is used.
Labels come from the metric's dictionary domain in the metrics file
(``--metrics``, else ``$LDP_METRICS``). The file is optional: part files carry
their own spec, so without one the estimates are the same and only the labels
are missing (a note on stderr says so); a metrics file that is given but cannot
be read is an error (exit 2), as for every other command.

``--engine spark`` runs the pass over the files on Apache Spark (the
``spark`` extra; ``--master``, default ``local[*]``), with the same output
(:mod:`estimator.jobs.spark`, docs/SPARK.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ldp_cli.commands.argtypes import add_engine_options, engine_from_args
from ldp_cli.options import add_metrics, optional_metrics_files, summary
from ldp_cli.progress import add_progress_flags, progress_enabled

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="batch job: estimate a metric (any kind) over days of the Parquet dataset",
        description=summary(__doc__),
    )
    p.add_argument("--dataset", required=True, help="root folder of the Parquet dataset (ldp sink --dataset)")
    p.add_argument("--metric", required=True, help="metric name")
    p.add_argument("--days", default=None, help="A..B inclusive (day numbers or ISO dates), or one day")
    p.add_argument("--start", default=None, help="first day (day number or ISO date)")
    p.add_argument("--end", default=None, help="last day, inclusive")
    p.add_argument("--spec-id", default=None, help="the spec to use when the range holds several")
    p.add_argument(
        "--out", default=None, metavar="FILE", help="table.csv or table.parquet (default: print the top rows)"
    )
    p.add_argument("--plot", default=None, help="write a PNG of the largest estimates with their CIs")
    p.add_argument(
        "--top",
        type=int,
        default=30,
        help="items in the plot and the printed table; values discovered for a heavy-hitter metric (default 30)",
    )
    p.add_argument(
        "--norm-sub",
        action="store_true",
        help="Norm-Sub consistent counts (non-negative, sum n); the same as --postprocess norm-sub",
    )
    p.add_argument(
        "--postprocess",
        choices=("none", "norm-sub"),
        default="none",
        help="post-processing of a frequency metric's counts: none (unbiased, may be negative; default) or "
        "norm-sub (non-negative, summing to n; intervals and could_be_noise stay the unbiased estimate's)",
    )
    p.add_argument(
        "--include-noise",
        action="store_true",
        help="heavy hitters: list the --top best values even when they could be noise (flagged)",
    )
    p.add_argument("--per-day", action="store_true", help="one estimate per day (a 'day' column)")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence level of the intervals (default 0.95)")
    add_metrics(p, "metrics file(s) for labels (repeatable; default $LDP_METRICS, else no labels)", repeatable=True)
    add_progress_flags(p)  # the files' bar and, with --engine spark, a line per stage (stderr)
    p.add_argument(
        "--json", action="store_true", help="print one JSON object (the summary and the rows; see docs/ESTIMATE.md)"
    )
    add_engine_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from estimator.jobs.answers import answer_json, answer_text, estimate_metric, output_table, plot_answer
    from estimator.jobs.batch import BatchError, parse_day_range, write_table
    from pipeline.catalog import SpecCatalog

    if not 0.0 < args.confidence < 1.0:
        raise ValueError(f"--confidence must be in (0, 1), got {args.confidence}")
    engine = None
    try:
        engine = engine_from_args(args)
        days = parse_day_range(args.days, args.start, args.end)
        files = optional_metrics_files(args.metrics)
        # labels are optional (the dataset carries its specs), but a file that was given must load
        definition = SpecCatalog.from_files(files).metrics.get(args.metric) if files else None
        if not files:
            print(
                "ldp estimate: note: no metrics file (--metrics FILE or $LDP_METRICS): items are not labelled",
                file=sys.stderr,
            )
        answer = estimate_metric(
            args.dataset,
            args.metric,
            days,
            spec_id=args.spec_id,
            confidence=args.confidence,
            norm_sub=args.norm_sub or args.postprocess == "norm-sub",
            per_day=args.per_day,
            definition=definition,
            progress=file_bar(args),
            engine=engine,
            top=args.top,
            include_noise=args.include_noise,
        )
    except BatchError as exc:
        print(f"ldp estimate: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if engine is not None:
            engine.close()
    # with --json stdout holds one JSON object; what was written is said on stderr
    notes = sys.stderr if args.json else sys.stdout
    if args.json:
        print(json.dumps(answer_json(answer), ensure_ascii=False))
    else:
        print(json.dumps(answer.result.summary(), ensure_ascii=False))
    _say_person_epsilon(answer.result.summary())
    if args.out:
        table = output_table(answer)
        write_table(table, args.out)
        print(f"table: {args.out} ({len(table)} rows)", file=notes)
    elif not args.json:
        print(answer_text(answer, args.top))
    if args.plot:
        plot_answer(answer, args.plot, top=args.top)
        print(f"plot: {args.plot}", file=notes)
    return 0


def file_bar(args: argparse.Namespace) -> bool | None:
    """The files' bar: forced by --progress, off with --no-progress or --json, else tqdm's terminal test."""
    if args.progress or args.no_progress or args.json:
        return progress_enabled(args)
    return None


def _say_person_epsilon(summary: dict[str, Any]) -> None:
    """The central ε per person composed over the days, in words on stderr (docs/PRIVACY.md §2)."""
    if summary.get("central_epsilon_per_person") is None:
        return
    days = summary["central_person_days"]
    print(
        f"ldp estimate: central ε per person over {days} day{'s' if days != 1 else ''}: "
        f"{summary['central_epsilon_per_person']:.4g} at δ = {summary['central_delta_per_person']:.3g} "
        f"({summary['central_composition']} composition; {summary['central_neighbours']}); "
        f"one day's batch: {summary['central_epsilon']:.4g}",
        file=sys.stderr,
    )
