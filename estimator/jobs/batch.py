"""Batch estimation over the Parquet dataset the sink writes (:mod:`collector.sinks.parquet`).

For one metric and a range of UTC days, every part file is read, its records
are added to the spec's accumulator, and the accumulator's estimate is
turned into a table (pandas): ``item``, ``label`` (for a metric whose
domain is a dictionary), ``estimate``, ``std_error``, ``ci_low``,
``ci_high``, ``frequency`` (``estimate / n``), ``adjusted_ci_low`` and
``could_be_noise`` (Bonferroni over the domain's d items:
:func:`estimator.result.noise_test`), and ``day`` first when the table is
per day. Accumulators are sums of integer statistics, so the
estimates are exactly those of the offline estimator
(:meth:`~estimator.oracles.base.Accumulator.estimate`) over the same
reports, whatever the file order.

With ``norm_sub`` the ``estimate`` column holds the Norm-Sub consistent
counts (Wang et al., NDSS 2020); the standard errors and intervals stay
those of the unbiased estimate.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from estimator.accounting.shuffle_days import DayBound, day_bound, person_guarantee
from estimator.errors import BatchError, SpecChoiceError
from estimator.mechanisms.numeric import DistributionEstimate, MeanEstimate
from estimator.oracles import state_for
from estimator.oracles.base import LinearState
from estimator.result import Estimate
from ldp_core.days import parse_day
from ldp_core.mechanisms.base import MechanismSpec, ReportSpec
from ldp_core.metrics import MetricDefinition
from pipeline.csv_export import write_csv
from pipeline.dataset import PartFile, list_parts, read_part, read_part_spec
from pipeline.text import printable

__all__ = [
    "BatchError",
    "BatchResult",
    "parse_day_range",
    "Accumulated",
    "Engine",
    "accumulate",
    "estimate_dataset",
    "estimate_table",
    "write_table",
    "plot_estimates",
]


def parse_day_range(days: str | None = None, start: str | None = None, end: str | None = None) -> range | None:
    """``"A..B"`` (inclusive; day numbers or ISO dates) or ``start``/``end``; ``None`` means every day."""
    if days is not None:
        if start is not None or end is not None:
            raise BatchError("give either --days A..B or --start/--end, not both")
        if ".." in days:
            a, b = days.split("..", 1)
        else:
            a = b = days
        lo, hi = parse_day(a), parse_day(b)
    elif start is None and end is None:
        return None
    else:
        lo = parse_day(start) if start is not None else 0
        hi = parse_day(end) if end is not None else 2**32 - 1
    if hi < lo:
        raise BatchError(f"the day range ends ({hi}) before it starts ({lo})")
    return range(lo, hi + 1)


@dataclasses.dataclass
class Accumulated:
    """One key's accumulator with what the files under it say: their days, count, batches and the
    largest central (ε, δ) of their shuffles."""

    acc: LinearState
    days: set[int]
    files: int = 0
    batches: int = 0
    central_epsilon: float | None = None
    central_delta: float | None = None
    #: per day, the shuffle entry (footer metadata) of its batch with the largest central ε
    worst_by_day: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def note_worst(self, day: int, shuffle: dict[str, Any] | None) -> None:
        """Keep ``shuffle`` as ``day``'s worst batch if its central ε is the largest seen for that day."""
        if shuffle is None or shuffle.get("central_epsilon") is None:
            return
        cur = self.worst_by_day.get(day)
        if cur is None or float(shuffle["central_epsilon"]) > float(cur["central_epsilon"]):
            self.worst_by_day[day] = shuffle


def worst_shuffle(shuffles: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The shuffle entry with the largest central ε (None if none has one)."""
    with_eps = [s for s in shuffles if s.get("central_epsilon") is not None]
    return max(with_eps, key=lambda s: float(s["central_epsilon"])) if with_eps else None


class Engine(Protocol):
    """What runs the pass over the files: :func:`accumulate` here, or
    :class:`estimator.jobs.spark.SparkEngine`. Both must give the same states."""

    def __call__(
        self, parts: Sequence[PartFile], *, per_day: bool = False, progress: Callable[[int], Any] | None = None
    ) -> dict[tuple[str, int | None], Accumulated]: ...


def accumulate(
    parts: Sequence[PartFile], *, per_day: bool = False, progress: Callable[[int], Any] | None = None
) -> dict[tuple[str, int | None], Accumulated]:
    """Accumulators keyed by ``(spec_id, day or None)`` over ``parts``, in this process."""
    out: dict[tuple[str, int | None], Accumulated] = {}
    for part in parts:
        data = read_part(part)
        key = (data.spec.spec_id, part.day if per_day else None)
        a = out.get(key)
        if a is None:
            a = out[key] = Accumulated(state_for(data.spec), set())
        a.acc.update(data.records)
        a.days.add(part.day)
        a.files += 1
        a.batches += len(data.shuffles)
        for s in data.shuffles:
            ce, cd = s.get("central_epsilon"), s.get("central_delta")
            if ce is not None and (a.central_epsilon is None or ce > a.central_epsilon):
                a.central_epsilon = float(ce)
            if cd is not None and (a.central_delta is None or cd > a.central_delta):
                a.central_delta = float(cd)
        a.note_worst(part.day, worst_shuffle(data.shuffles))
        if progress is not None:
            progress(1)
    return out


def estimate_table(
    est: Estimate, spec: MechanismSpec, definition: MetricDefinition | None = None, day: int | None = None
) -> pd.DataFrame:
    """One row per domain item (see the module docstring)."""
    d = spec.domain_size
    cols: dict[str, Any] = {}
    if day is not None:
        cols["day"] = np.full(d, day, dtype=np.int64)
    cols["item"] = np.arange(d, dtype=np.int64)
    if definition is not None and hasattr(definition.domain, "values"):
        cols["label"] = [definition.domain.label(i) for i in range(d)]
    cols["estimate"] = est.counts
    cols["std_error"] = est.std_error
    cols["ci_low"] = est.ci_low
    cols["ci_high"] = est.ci_high
    cols["frequency"] = est.counts / est.n if est.n else np.zeros(d)
    cols["adjusted_ci_low"], cols["could_be_noise"] = est.noise()
    return pd.DataFrame(cols)


def numeric_table(est: MeanEstimate | DistributionEstimate, day: int | None = None) -> pd.DataFrame:
    """A numeric metric's rows: one per attribute (``attribute, mean, std_error, ci_low, ci_high``) for a
    mean, one per bin (``bin, low, high, share, share_low, share_high``) for a distribution, whose quantiles
    go into the table's ``attrs``."""
    cols: dict[str, Any] = {}
    if isinstance(est, MeanEstimate):
        d = est.mean.size
        if day is not None:
            cols["day"] = np.full(d, day, dtype=np.int64)
        cols["attribute"] = np.arange(d, dtype=np.int64)
        cols["mean"] = est.mean
        cols["std_error"] = est.std_error
        cols["ci_low"] = est.ci_low
        cols["ci_high"] = est.ci_high
        cols["n"] = np.full(d, est.n, dtype=np.int64)
        return pd.DataFrame(cols)
    b = est.hist.size
    if day is not None:
        cols["day"] = np.full(b, day, dtype=np.int64)
    cols["bin"] = np.arange(b, dtype=np.int64)
    cols["low"] = est.edges[:-1]
    cols["high"] = est.edges[1:]
    cols["share"] = est.hist
    cols["share_low"] = est.hist_low
    cols["share_high"] = est.hist_high
    table = pd.DataFrame(cols)
    table.attrs["quantiles"] = est.to_dict()["quantiles"]
    return table


@dataclasses.dataclass
class BatchResult:
    """The estimate(s) of one metric under one spec over a range of days."""

    metric: str
    spec: ReportSpec
    days: list[int]
    n: int
    #: by day when per day, else {None: estimate}; a numeric metric's are MeanEstimate or DistributionEstimate
    estimates: dict[int | None, Any]
    table: pd.DataFrame
    files: int
    batches: int
    central_epsilon: float | None
    central_delta: float | None
    #: the per-person composition over the days (:func:`estimator.accounting.shuffle_days.person_guarantee`)
    person: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        p = self.person or {}
        return {
            "metric": self.metric,
            "mechanism": self.spec.name,
            "spec_id": self.spec.spec_id,
            "epsilon": self.spec.epsilon,
            "days": [min(self.days), max(self.days)] if self.days else [],
            "n": self.n,
            "files": self.files,
            "batches": self.batches,
            "central_epsilon": self.central_epsilon,
            "central_delta": self.central_delta,
            "central_epsilon_scope": "one shuffled batch (one day of one person)",
            "central_epsilon_per_person": p.get("epsilon"),
            "central_delta_per_person": p.get("delta"),
            "central_person_days": p.get("days"),
            "central_composition": p.get("composition"),
            "central_epsilon_pld": p.get("epsilon_pld"),
            "central_epsilon_basic": p.get("epsilon_basic"),
            "central_neighbours": p.get("neighbours"),
            "central_protects": p.get("protects"),
        }


def estimate_dataset(
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
    engine: Engine = accumulate,
) -> BatchResult:
    """Estimate ``metric`` over ``days`` (``None``: all) of the dataset at ``root``.

    ``progress``: ``True`` shows a progress bar, ``None`` (default) shows it
    only on a terminal and once the run has lasted a second, ``False`` never.
    ``engine`` makes the accumulators from the chosen files (default: this
    process, :func:`accumulate`; on Spark: :class:`estimator.jobs.spark.SparkEngine`).
    """
    parts = list_parts(root, metric, days)
    if not parts:
        where = "" if days is None else f" on days {_describe(days)}"
        raise BatchError(f"no part files of metric {metric!r}{where} under {Path(root)}")
    ids = sorted({p.spec_id for p in parts})
    if spec_id is None and len(ids) > 1:
        raise SpecChoiceError(
            f"metric {metric!r} has reports under several specs in this range: {ids}; "
            "choose one with --spec-id (estimates of different specs do not add)"
        )
    chosen = spec_id if spec_id else ids[0]
    parts = [p for p in parts if p.spec_id == chosen]
    if not parts:
        raise BatchError(f"metric {metric!r} has no reports under spec {chosen} in this range (it has {ids})")
    if read_part_spec(parts[0]).kind == "heavy_hitters":
        raise BatchError(
            f"metric {metric!r} is a heavy-hitter metric: its values are discovered, not summed "
            "(estimator.jobs.answers.estimate_metric or estimator.jobs.heavy_hitters.discover_dataset)"
        )
    from tqdm import tqdm

    with tqdm(
        total=len(parts),
        unit="file",
        desc=metric,
        delay=1.0,
        disable=(not progress) if progress is not None else None,
        leave=False,
    ) as bar:
        accs = engine(parts, per_day=per_day, progress=bar.update)
    spec = next(iter(accs.values())).acc.spec
    estimates: dict[int | None, Any] = {}
    tables = []
    for (_, day), a in sorted(accs.items(), key=lambda kv: -1 if kv[0][1] is None else kv[0][1]):
        est = a.acc.estimate(confidence)
        if isinstance(spec, MechanismSpec):
            if norm_sub:
                est = est.norm_sub()
            tables.append(estimate_table(est, spec, definition, day))
        else:
            tables.append(numeric_table(est, day))
        estimates[day] = est
    table = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    ce = [a.central_epsilon for a in accs.values() if a.central_epsilon is not None]
    cd = [a.central_delta for a in accs.values() if a.central_delta is not None]
    result = BatchResult(
        metric,
        spec,
        sorted({d for a in accs.values() for d in a.days}),
        sum(a.acc.n for a in accs.values()),
        estimates,
        table,
        sum(a.files for a in accs.values()),
        sum(a.batches for a in accs.values()),
        max(ce) if ce else None,
        max(cd) if cd else None,
        person_guarantee(_worst_days(accs.values())),
    )
    table.attrs.update({k: v for k, v in result.summary().items() if v is not None})
    return result


def _worst_days(accs: Iterable[Accumulated]) -> list[DayBound]:
    """Each day's worst batch over ``accs`` (one person is in one batch a day), as day bounds."""
    worst = Accumulated(None, set())  # type: ignore[arg-type]
    for a in accs:
        for day, shuffle in a.worst_by_day.items():
            worst.note_worst(day, shuffle)
    bounds = (day_bound(day, shuffle) for day, shuffle in sorted(worst.worst_by_day.items()))
    return [b for b in bounds if b is not None]


def _describe(days: Iterable[int]) -> str:
    ds = list(days)
    if not ds:
        return "(none)"
    return f"{min(ds)}..{max(ds)}" if len(ds) > 1 else str(ds[0])


def write_table(table: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write ``table`` as CSV or Parquet, chosen by the file name's suffix (CSV through
    :func:`pipeline.csv_export.write_csv`: no string cell a spreadsheet would run as a formula)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix.lower() == ".csv":
        write_csv(table, p)
    elif p.suffix.lower() in (".parquet", ".pq"):
        table.to_parquet(p, index=False)
    else:
        raise BatchError(f"--out {p}: use a .csv or .parquet file name")


def plot_estimates(
    result: BatchResult,
    path: str | os.PathLike[str],
    *,
    top: int = 30,
    truth: np.ndarray | None = None,
    title: str | None = None,
) -> None:
    """Bar-and-whisker plot of the ``top`` largest estimates with their confidence intervals (PNG); for a
    numeric metric, its mean(s) with intervals or its histogram with bands and quantiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from estimator.result import noise_test, z_value

    if not isinstance(result.spec, MechanismSpec):
        _plot_numeric(result, path, title)
        return
    spec = result.spec

    ests = list(result.estimates.values())
    confidence = ests[0].confidence
    # per day: the total over the days (independent days: variances add)
    counts = np.sum([e.counts for e in ests], axis=0)
    half = z_value(confidence) * np.sqrt(np.sum([e.variance for e in ests], axis=0))
    lo, hi = counts - half, counts + half
    if len(ests) == 1:
        lo, hi = ests[0].ci_low, ests[0].ci_high
    unbiased = np.sum([e.counts if e.unbiased is None else e.unbiased for e in ests], axis=0)
    _, noise = noise_test(unbiased, np.sqrt(np.sum([e.variance for e in ests], axis=0)), counts.size, confidence)
    order = np.argsort(-counts, kind="stable")[:top]
    x = np.arange(order.size)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.32 * order.size + 2), 4.0))
    if truth is not None:
        ax.bar(x, np.asarray(truth)[order], color="#cfd8e3", label="truth")
    yerr = np.vstack([counts[order] - lo[order], hi[order] - counts[order]])
    for flagged, color, what in ((False, "#b03a2e", "estimate"), (True, "#999999", "could be noise")):
        sel = noise[order] == flagged
        if sel.any():
            ax.errorbar(
                x[sel],
                counts[order][sel],
                yerr=yerr[:, sel],
                fmt="o",
                ms=3,
                color=color,
                capsize=2,
                label=f"{what}, {round(100 * confidence):g}% CI"
                + (f" (Bonferroni over {counts.size} items)" if flagged else ""),
            )
    labels = result.table["label"].iloc[: spec.domain_size] if "label" in result.table.columns else None
    if labels is not None:
        ax.set_xticks(x, [printable(labels.iloc[i]) for i in order], rotation=60, ha="right", fontsize=7)
    else:
        ax.set_xticks(x, [str(i) for i in order], rotation=60, fontsize=7)
    days = f"days {min(result.days)}..{max(result.days)}" if len(result.days) > 1 else f"day {result.days[0]}"
    ax.set_title(
        title or f"{result.metric}: {result.spec.name} ε={result.spec.epsilon:g}, n={result.n:,}, {days}", fontsize=10
    )
    ax.set_ylabel("count")
    ax.set_xlabel("item" if labels is None else "label")
    ax.axhline(0, color="#888", lw=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_numeric(result: BatchResult, path: str | os.PathLike[str], title: str | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = result.spec
    days = f"days {min(result.days)}..{max(result.days)}" if len(result.days) > 1 else f"day {result.days[0]}"
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    items = sorted(result.estimates.items(), key=lambda kv: -1 if kv[0] is None else kv[0])
    first = items[0][1]
    if isinstance(first, MeanEstimate):
        for i, (day, est) in enumerate(items):
            x = np.arange(est.mean.size) + 0.8 * i / max(1, len(items))
            yerr = np.vstack([est.mean - est.ci_low, est.ci_high - est.mean])
            ax.errorbar(x, est.mean, yerr=yerr, fmt="o", capsize=3, label="all days" if day is None else f"day {day}")
        ax.set_xlabel("attribute")
        ax.set_ylabel(f"mean ({round(100 * first.confidence):g}% CI)")
        ax.set_xticks(np.arange(first.mean.size))
    else:
        for day, est in items:
            centres = (est.edges[:-1] + est.edges[1:]) / 2
            (line,) = ax.plot(
                centres, est.hist, drawstyle="steps-mid", label="all days" if day is None else f"day {day}"
            )
            ax.fill_between(centres, est.hist_low, est.hist_high, step="mid", alpha=0.25, color=line.get_color())
        for q, v in zip(first.quantile_levels, first.quantiles):
            ax.axvline(v, color="#555", ls=":", lw=1)
            ax.annotate(f"p{round(q * 100):g}", (v, ax.get_ylim()[1] * 0.95), fontsize=7, ha="center")
        ax.set_xlabel("value")
        ax.set_ylabel(f"share of users per bin ({round(100 * first.confidence):g}% band)")
    ax.set_title(title or f"{result.metric}: {spec.name} ε={spec.epsilon:g}, n={result.n:,}, {days}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
