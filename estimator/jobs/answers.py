"""What ``ldp estimate`` answers for every kind of metric: one entry point, and per kind its table, text, JSON
object and plot.

The kind is the spec's (``spec.kind``), read from the chosen part file's footer before any report is read:

- ``frequency`` (rr, grr, oue, rappor, olh, cms, hcms, hr, and the repeated counter loloha): one row per domain
  item, ``item``, ``label`` (dictionary domains), ``estimate``, ``std_error``, ``ci_low``, ``ci_high``,
  ``frequency`` (:func:`estimator.jobs.batch.estimate_table`);
- ``mean`` (duchi, pm, hm, and the repeated counter 1bitmean): one row per attribute, ``attribute``, ``mean``,
  ``std_error``, ``ci_low``, ``ci_high``, ``n``;
- ``distribution`` (Square Wave ``sw``, and the repeated counter dbitflip): one row per bin, ``bin``, ``low``,
  ``high``, ``share``, ``share_low``, ``share_high``, plus the quantiles with their intervals
  (:func:`estimator.jobs.batch.numeric_table`);
- ``heavy_hitters`` (pem, sfp): one row per discovered value, best first, ``rank``, ``value``, ``estimate``,
  ``std_error``, ``ci_low``, ``ci_high``, ``frequency`` (:mod:`estimator.jobs.heavy_hitters`: discovery needs all
  of the range's reports at once, so it is not a sum over files and has no ``--per-day`` or ``--norm-sub``).

Every table gets a ``day`` column first when the estimate is per day. The JSON object (:func:`answer_json`) is
the summary line's keys plus ``kind``, ``confidence``, ``per_day`` and ``rows`` (the table's rows as objects),
and ``quantiles`` for a distribution; docs/ESTIMATE.md lists them per kind.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from estimator.errors import BatchError, SpecChoiceError
from estimator.jobs.batch import BatchResult, Engine, accumulate, estimate_dataset, plot_estimates
from estimator.jobs.heavy_hitters import HeavyHitterResult, discover_dataset, plot_heavy_hitters
from estimator.mechanisms.numeric import DistributionEstimate
from estimator.result import NOISE_RULE
from ldp_core.mechanisms.base import MechanismSpec
from ldp_core.metrics import MetricDefinition
from pipeline.dataset import list_parts, read_part_spec
from pipeline.text import printable

if TYPE_CHECKING:
    from estimator.jobs.spark import SparkEngine

__all__ = [
    "KINDS",
    "Answer",
    "estimate_metric",
    "answer_json",
    "answer_text",
    "output_table",
    "plot_answer",
    "heavy_hitters_json",
    "heavy_hitters_text",
]

#: the kinds of metric ``ldp estimate`` answers (``spec.kind``)
KINDS = ("frequency", "mean", "distribution", "heavy_hitters")


@dataclasses.dataclass(frozen=True)
class Answer:
    """One metric's estimate, whatever its kind: a :class:`BatchResult` or, for heavy hitters, a
    :class:`HeavyHitterResult`."""

    kind: str
    result: BatchResult | HeavyHitterResult
    confidence: float
    per_day: bool

    @property
    def table(self) -> pd.DataFrame:
        return self.result.table


def estimate_metric(
    root: str | os.PathLike[str],
    metric: str,
    days: Iterable[int] | None = None,
    *,
    spec_id: str | None = None,
    confidence: float = 0.95,
    norm_sub: bool = False,
    per_day: bool = False,
    definition: MetricDefinition | None = None,
    progress: bool | None = None,
    engine: Engine | None = None,
    top: int = 30,
    include_noise: bool = False,
) -> Answer:
    """Estimate ``metric`` over ``days`` (``None``: all) of the dataset at ``root``, whatever its kind.

    ``engine``: ``None`` or :func:`~estimator.jobs.batch.accumulate` for this process, or a
    :class:`~estimator.jobs.spark.SparkEngine`. ``top``: the number of values a heavy-hitter metric discovers
    (the other kinds estimate every item); ``include_noise``: list its ``top`` best even when they could be
    noise (flagged), not only the values that stand out. ``norm_sub`` is for frequency metrics only, ``per_day`` for every
    kind but heavy hitters: asked of another kind, a :class:`BatchError` says so."""
    day_list = None if days is None else list(days)
    parts = list_parts(root, metric, day_list)
    if not parts:
        where = "" if day_list is None else " in that day range"
        raise BatchError(f"no part files of metric {metric!r}{where} under {root}")
    ids = sorted({p.spec_id for p in parts})
    if spec_id is None and len(ids) > 1:
        raise SpecChoiceError(
            f"metric {metric!r} has reports under several specs in this range: {ids}; "
            "choose one with --spec-id (estimates of different specs do not add)"
        )
    chosen = [p for p in parts if p.spec_id == (spec_id or ids[0])]
    if not chosen:
        raise BatchError(f"metric {metric!r} has no reports under spec {spec_id} in this range (it has {ids})")
    kind = read_part_spec(chosen[0]).kind
    if kind not in KINDS:
        raise BatchError(f"metric {metric!r} is of kind {kind!r}, which `ldp estimate` does not know")
    if norm_sub and kind != "frequency":
        raise BatchError(f"--norm-sub is for frequency metrics; {metric!r} is a {kind} metric")
    if kind == "heavy_hitters":
        if per_day:
            raise BatchError(
                f"--per-day: heavy-hitter discovery ({metric!r}) needs the whole range's reports at once; "
                "run one estimate per day instead"
            )
        spark = None if engine is None or engine is accumulate else _spark(engine)
        hh = discover_dataset(
            root,
            metric,
            day_list,
            top=top,
            spec_id=spec_id,
            confidence=confidence,
            engine=spark,
            parts=parts,
            include_noise=include_noise,
        )
        return Answer(kind, hh, confidence, False)
    res = estimate_dataset(
        root,
        metric,
        day_list,
        spec_id=spec_id,
        confidence=confidence,
        norm_sub=norm_sub,
        per_day=per_day,
        definition=definition,
        progress=progress,
        engine=engine or accumulate,
    )
    return Answer(kind, res, confidence, per_day)


def _spark(engine: Engine) -> SparkEngine:
    from estimator.jobs.spark import SparkEngine

    if not isinstance(engine, SparkEngine):
        raise BatchError("heavy-hitter discovery runs in this process or on a SparkEngine")
    return engine


def _clean(v: Any) -> Any:
    """A JSON-safe scalar: numpy types to Python ones, NaN and infinities to null."""
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def _rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    cols = list(table.columns)
    return [{c: _clean(v) for c, v in zip(cols, row)} for row in table.itertuples(index=False, name=None)]


def _quantiles(answer: Answer) -> list[dict[str, Any]]:
    """A distribution's quantiles, one object per (day when per day, level)."""
    assert isinstance(answer.result, BatchResult)
    out = []
    for day, est in sorted(answer.result.estimates.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        assert isinstance(est, DistributionEstimate)
        for q, v, lo, hi in zip(est.quantile_levels, est.quantiles, est.quantiles_low, est.quantiles_high):
            row: dict[str, Any] = {} if day is None else {"day": int(day)}
            row.update({"q": float(q), "value": _clean(v), "ci_low": _clean(lo), "ci_high": _clean(hi)})
            out.append(row)
    return out


def output_table(answer: Answer) -> pd.DataFrame:
    """The table ``--out`` writes: the rows; for a distribution the bins and then its quantiles, one row each,
    told apart by ``row`` (``bin`` or ``quantile``): a quantile row has ``q``, ``q_value``, ``q_low`` and
    ``q_high`` (the level, the value in the metric's units and its interval; docs/ESTIMATE.md), a bin row the
    bin's columns."""
    t = answer.table
    if answer.kind != "distribution":
        return t
    bins = t.copy()
    bins["row"] = "bin"
    q = pd.DataFrame(_quantiles(answer)).rename(columns={"value": "q_value", "ci_low": "q_low", "ci_high": "q_high"})
    q["row"] = "quantile"
    out = pd.concat([bins, q], ignore_index=True)
    for col in ("day", "bin"):
        if col in out.columns:
            out[col] = out[col].astype("Int64")
    first = [c for c in t.columns] + ["row", "q", "q_value", "q_low", "q_high"]
    return out[first]


def heavy_hitters_json(result: HeavyHitterResult) -> dict[str, Any]:
    """``ldp heavy-hitters --json`` and ``ldp estimate --json`` for a heavy-hitter metric: the summary line's
    keys, ``n`` (= ``reports``), ``kind``, ``confidence``, ``per_day`` (false) and ``rows``."""
    out: dict[str, Any] = {k: _clean(v) for k, v in result.summary().items()}
    out.update({"n": result.n, "kind": "heavy_hitters", "confidence": result.confidence, "per_day": False})
    out["rows"] = _rows(result.table)
    return out


def answer_json(answer: Answer) -> dict[str, Any]:
    """One JSON-ready object for any kind (module docstring; docs/ESTIMATE.md lists the keys)."""
    if isinstance(answer.result, HeavyHitterResult):
        return heavy_hitters_json(answer.result)
    out: dict[str, Any] = {k: _clean(v) for k, v in answer.result.summary().items()}
    out.update({"kind": answer.kind, "confidence": answer.confidence, "per_day": answer.per_day})
    if answer.kind == "frequency":
        first = next(iter(answer.result.estimates.values()))
        out["postprocessing"] = first.postprocessing
        out["noise_rule"] = NOISE_RULE
    out["rows"] = _rows(answer.table)
    if answer.kind == "distribution":
        out["quantiles"] = _quantiles(answer)
    return out


def _printable_table(t: pd.DataFrame) -> str:
    """``t`` as text, every string cell through :func:`pipeline.text.printable` (device-supplied values)."""
    shown = t.copy(deep=False)
    for col in shown.columns:
        if not (pd.api.types.is_numeric_dtype(shown[col]) or pd.api.types.is_bool_dtype(shown[col])):
            shown[col] = shown[col].map(printable)
    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.max_rows", 10_000):
        return str(shown.to_string(index=False))


def heavy_hitters_text(result: HeavyHitterResult) -> str:
    """The discovered values as a person reads them (escaped), with a line on what was left out as noise."""
    t = result.table
    text = _printable_table(t) if len(t) else "(no value stands out from the noise)"
    rule = (
        f"could_be_noise: the value's {round(100 * result.confidence):g}% interval widened for "
        f"{result.discovery.tested} candidates (Bonferroni) reaches 0"
    )
    if not result.include_noise:
        rule += "; such values are left out (--include-noise shows them, flagged)"
    return text + "\n" + rule


def answer_text(answer: Answer, top: int = 30) -> str:
    """The table a person reads: a frequency metric's ``top`` largest estimates, a mean's attributes, a
    distribution's bins and then its quantiles, a heavy-hitter metric's discovered values."""
    t = answer.table
    if isinstance(answer.result, HeavyHitterResult):
        return heavy_hitters_text(answer.result)
    if answer.kind == "frequency":
        d = answer.result.spec.domain_size if isinstance(answer.result.spec, MechanismSpec) else len(t)
        shown = t.sort_values("estimate", ascending=False, kind="stable").head(top)
        return (
            _printable_table(shown)
            + f"\ncould_be_noise: the item's {round(100 * answer.confidence):g}% interval widened for all {d} "
            "items (Bonferroni) reaches 0"
        )
    if not len(t):
        return "(nothing found)"
    text = _printable_table(t)
    if answer.kind == "distribution":
        lines = ["quantiles:"]
        for q in _quantiles(answer):
            day = f"day {q['day']} " if "day" in q else ""
            lines.append(
                f"  {day}p{round(q['q'] * 100, 6):g}: {_fmt(q['value'])} [{_fmt(q['ci_low'])}, {_fmt(q['ci_high'])}]"
            )
        text += "\n" + "\n".join(lines)
    return text


def _fmt(v: float | None) -> str:
    return "nan" if v is None else f"{v:.4g}"


def plot_answer(answer: Answer, path: str | os.PathLike[str], *, top: int = 30) -> None:
    """A PNG per kind: the ``top`` largest counts with intervals, the means with intervals, the histogram with
    bands and quantiles, or the discovered values' bars with intervals."""
    if isinstance(answer.result, HeavyHitterResult):
        plot_heavy_hitters(answer.result, path)
    else:
        plot_estimates(answer.result, path, top=top)
