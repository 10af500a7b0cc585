"""``ldp heavy-hitters``: batch discovery of a string metric's frequent values over the Parquet dataset.

    ldp heavy-hitters --dataset ldp-data/dataset --metric search_word --days 20419..20425 \\
        [--top 20] [--out table.csv] [--plot heavy.png] [--ranking posterior|estimate] [--engine spark [--master URL]]

Days are day numbers (days since 1970-01-01, UTC) or ISO dates; ``--days A..B`` is inclusive; without it
every day is used. Prints a JSON summary line, then the table (or writes it to ``--out``); ``--json`` prints
one JSON object instead, the one ``ldp estimate --json`` gives for a heavy-hitter metric. Only values that
stand out from the noise are listed (Bonferroni over every candidate ranked; ``--include-noise`` lists the
``--top`` best, flagged ``could_be_noise``); printed values have control characters escaped.

``--engine spark`` runs the passes over the files on Apache Spark (the ``spark`` extra; ``--master``,
default ``local[*]``; the same options as ``ldp estimate``), with the same output
(:mod:`estimator.jobs.heavy_hitters_spark`, docs/SPARK.md).
"""

from __future__ import annotations

import argparse
import json
import sys

from ldp_cli.commands.argtypes import add_engine_options, engine_from_args
from ldp_cli.options import summary
from ldp_cli.progress import add_progress_flags

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "heavy-hitters",
        help="batch job: discover a string metric's most frequent values (pem, sfp) over days of the dataset",
        description=summary(__doc__),
    )
    p.add_argument("--dataset", required=True, help="root folder of the Parquet dataset (ldp sink --dataset)")
    p.add_argument("--metric", required=True, help="metric name (a heavy_hitters metric)")
    p.add_argument("--days", default=None, help="A..B inclusive (day numbers or ISO dates), or one day")
    p.add_argument("--top", type=int, default=20, help="values to discover (default 20)")
    p.add_argument("--spec-id", default=None, help="the spec to use when the range holds several")
    p.add_argument("--out", default=None, metavar="FILE", help="table.csv or table.parquet (default: print it)")
    p.add_argument("--plot", default=None, help="write a PNG of the discovered values with their CIs")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence level of the intervals (default 0.95)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (as `ldp estimate --json` for this metric; docs/ESTIMATE.md)",
    )
    p.add_argument(
        "--include-noise",
        action="store_true",
        help="list the --top best values even when they could be noise (flagged could_be_noise), "
        "not only those that stand out (docs/HEAVY_HITTERS.md)",
    )
    p.add_argument(
        "--ranking",
        choices=("posterior", "estimate"),
        default=None,
        help="pem only: rank candidates by their posterior over every level's estimates (default), or each "
        "level by its own estimate (the decode before 6 Dec 2026: faster, lower recall; docs/HEAVY_HITTERS.md)",
    )
    add_engine_options(p)
    add_progress_flags(p)  # with --engine spark: a line per stage on stderr
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from estimator.jobs.answers import heavy_hitters_json, heavy_hitters_text
    from estimator.jobs.batch import parse_day_range, write_table
    from estimator.jobs.heavy_hitters import discover_dataset, plot_heavy_hitters

    if not 0.0 < args.confidence < 1.0:
        raise ValueError(f"--confidence must be in (0, 1), got {args.confidence}")

    engine = engine_from_args(args)  # a BatchError is a ValueError: `ldp` prints it and exits 2
    try:
        days = parse_day_range(args.days)
        result = discover_dataset(
            args.dataset,
            args.metric,
            days,
            top=args.top,
            spec_id=args.spec_id,
            confidence=args.confidence,
            engine=engine,
            include_noise=args.include_noise,
            ranking=args.ranking,
        )
    finally:
        if engine is not None:
            engine.close()
    # with --json stdout holds one JSON object; what was written is said on stderr
    notes = sys.stderr if args.json else sys.stdout
    if args.json:
        print(json.dumps(heavy_hitters_json(result), ensure_ascii=False))
    else:
        print(json.dumps(result.summary(), ensure_ascii=False))
    if args.out:
        write_table(result.table, args.out)
        print(f"table: {args.out} ({len(result.table)} rows)", file=notes)
    elif not args.json:
        print(heavy_hitters_text(result))
    if args.plot:
        plot_heavy_hitters(result, args.plot)
        print(f"plot: {args.plot}", file=notes)
    return 0
