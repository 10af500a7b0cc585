"""argparse ``type=`` checks shared by the ``ldp`` sub-commands: each raises
:class:`argparse.ArgumentTypeError` with the bound it wants and the text it got.

Also the batch jobs' engine options (:func:`add_engine_options`, :func:`engine_from_args`), shared by
``ldp estimate`` and ``ldp heavy-hitters``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from estimator.jobs.spark import SparkEngine

__all__ = [
    "positive_int",
    "probability",
    "positive",
    "seed",
    "nonnegative",
    "nonnegative_int",
    "seed_list",
    "bits_list",
    "noise_multiplier_list",
    "add_engine_options",
    "engine_from_args",
]


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


def probability(text: str) -> float:
    """A probability in (0, 1] (a sampling rate: 0 would sample nothing)."""
    v = float(text)
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return v


def unit_interval(text: str) -> float:
    """A number in [0, 1], ends included (an accuracy threshold, a share)."""
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return v


def open_unit(text: str) -> float:
    """A number strictly between 0 and 1 (a fraction of a data set, a δ)."""
    v = float(text)
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return v


def positive(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def seed(text: str) -> int:
    """A seed for numpy's SeedSequence-based generators: an integer in [0, 2**63)."""
    v = int(text)
    if not 0 <= v < 2**63:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**63), got {text}")
    return v


def nonnegative(v: str) -> float:
    """A finite number >= 0."""
    x = float(v)
    if not (x >= 0 and x != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {v!r}")
    return x


def nonnegative_int(v: str) -> int:
    try:
        x = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {v!r}") from None
    if x < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {v!r}")
    return x


def seed_list(text: str) -> tuple[int, ...]:
    """Comma-separated seeds, each an integer >= 0."""
    try:
        out = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seeds, got {text!r}") from None
    if not out or any(v < 0 for v in out):
        raise argparse.ArgumentTypeError(f"seeds must be integers >= 0, got {text!r}")
    return out


def bits_list(text: str) -> tuple[int, ...]:
    """Comma-separated bits per coordinate, each in [2, 32]."""
    try:
        out = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or any(not 2 <= b <= 32 for b in out):
        raise argparse.ArgumentTypeError(f"bits per coordinate must be in [2, 32], got {text!r}")
    return out


def noise_multiplier_list(text: str) -> tuple[float, ...]:
    """Comma-separated noise multipliers, each a finite number > 0."""
    try:
        out = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not out or any(not (0 < z < float("inf")) for z in out):
        raise argparse.ArgumentTypeError(f"noise multipliers must be finite numbers > 0, got {text!r}")
    return out


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """``--engine {default,spark}``, ``--master URL`` and ``--spark-reader {arrow,spark}`` (docs/SPARK.md)."""
    p.add_argument(
        "--engine",
        choices=("default", "spark"),
        default="default",
        help="where the pass over the files runs: this process (default) or Apache Spark (docs/SPARK.md)",
    )
    p.add_argument("--master", default=None, help="Spark master URL for --engine spark (default local[*])")
    p.add_argument(
        "--spark-reader",
        choices=("arrow", "spark"),
        default=None,
        help="who reads the files in a Spark task: pyarrow in the Python worker (default) or Spark's Parquet reader",
    )


def engine_from_args(args: argparse.Namespace) -> SparkEngine | None:
    """The :class:`~estimator.jobs.spark.SparkEngine` the options of :func:`add_engine_options` ask for, or None for
    the default engine; :class:`~estimator.errors.BatchError` if ``--master``/``--spark-reader`` come without
    ``--engine spark`` or the master URL is not one. The caller closes the engine. Its stages are announced on
    stderr by the rule of :mod:`ldp_cli.progress` (``--no-progress``, ``--progress``, ``--json``)."""
    from estimator.errors import BatchError

    if (args.master is not None or args.spark_reader is not None) and args.engine != "spark":
        raise BatchError("--master and --spark-reader are for --engine spark")
    if args.engine != "spark":
        return None
    from estimator.jobs.spark import DEFAULT_MASTER, SparkEngine
    from ldp_cli.progress import lines

    return SparkEngine(
        master=DEFAULT_MASTER if args.master is None else args.master,
        reader=args.spark_reader or "arrow",
        on_stage=lines(args, f"ldp {args.command} --engine spark"),
    )
