"""Batch heavy-hitter discovery over the Parquet dataset (``ldp heavy-hitters``).

Every part file of the metric in the day range is read, the records of one
spec are concatenated (PEM's levels need all of a day range's reports at
once: discovery is not a sum of per-file statistics), and
:func:`estimator.mechanisms.heavy_hitters.discover` runs over them. The table has one
row per discovered value, best first: ``rank``, ``value``, ``estimate``,
``std_error``, ``ci_low``, ``ci_high``, ``frequency``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from estimator.errors import BatchError, SpecChoiceError
from estimator.mechanisms.heavy_hitters import Discovery, discover
from ldp_core.mechanisms.heavy_hitters import PEMSpec, SFPSpec
from pipeline.dataset import PartFile, list_parts, read_part, read_part_spec

if TYPE_CHECKING:
    from estimator.jobs.spark import SparkEngine

__all__ = ["HeavyHitterResult", "discover_dataset", "plot_heavy_hitters"]


@dataclasses.dataclass(frozen=True)
class HeavyHitterResult:
    metric: str
    spec: PEMSpec | SFPSpec
    days: list[int]
    n: int
    files: int
    discovery: Discovery
    table: pd.DataFrame
    parts: list[int]  # reports per PEM level or SFP fragment position
    confidence: float = 0.95  # of the intervals

    def summary(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "mechanism": self.spec.name,
            "spec_id": self.spec.spec_id,
            "epsilon": self.spec.epsilon,
            "days": [self.days[0], self.days[-1]] if self.days else [],
            "reports": self.n,
            "files": self.files,
            "found": len(self.table),
            "reports_per_part": self.parts,
            "seconds": self.discovery.seconds,
        }


def discover_dataset(
    root: str | os.PathLike[str],
    metric: str,
    days: Iterable[int] | None = None,
    *,
    top: int = 20,
    spec_id: str | None = None,
    confidence: float = 0.95,
    engine: SparkEngine | None = None,
    parts: Sequence[PartFile] | None = None,
) -> HeavyHitterResult:
    """Discover ``metric``'s ``top`` values over ``days`` (``None``: all) of the dataset at ``root``.

    ``engine``: a :class:`estimator.jobs.spark.SparkEngine` runs the passes on Spark, with the same result
    (:mod:`estimator.jobs.heavy_hitters_spark`); without one the reports are read into this process.
    ``parts``: the metric's part files in that range, when the caller has listed them already
    (:func:`pipeline.dataset.list_parts`); they are then not listed again."""
    if top < 1:
        raise BatchError(f"--top must be at least 1, got {top}")
    parts = list_parts(root, metric, days) if parts is None else list(parts)
    if not parts:
        raise BatchError(f"no part files of metric {metric!r} in that day range under {Path(root)}")
    specs = {p.spec_id: read_part_spec(p) for p in parts}
    ids = sorted(specs)
    if spec_id is None and len(ids) > 1:
        raise SpecChoiceError(
            f"metric {metric!r} has reports under several specs in this range: {ids}; choose --spec-id"
        )
    chosen = spec_id if spec_id else ids[0]
    parts = [p for p in parts if p.spec_id == chosen]
    if not parts:
        raise BatchError(f"metric {metric!r} has no reports under spec {chosen} in this range (it has {ids})")
    spec = specs[parts[0].spec_id]
    if not isinstance(spec, (PEMSpec, SFPSpec)):
        raise BatchError(
            f"metric {metric!r} is a {spec.kind} metric ({spec.name}); `ldp heavy-hitters` discovers strings "
            "(pem, sfp): use `ldp estimate`"
        )
    if engine is not None:
        from estimator.jobs.heavy_hitters_spark import discover_spark

        disc, per_part = discover_spark(engine, metric, spec, parts, top, confidence)
    else:
        datas = [read_part(p) for p in parts]
        records = np.concatenate([d.records for d in datas])
        disc = discover(spec, records, top, confidence=confidence)
        field, size = ("level", spec.num_levels) if isinstance(spec, PEMSpec) else ("position", spec.num_positions)
        per_part = [int(x) for x in np.bincount(records[field], minlength=size)]
    found = disc.top(top)
    n = disc.n
    table = pd.DataFrame(
        {
            "rank": np.arange(1, len(found) + 1, dtype=np.int64),
            "value": [h.value for h in found],
            "estimate": [h.estimate for h in found],
            "std_error": [float(np.sqrt(h.variance)) for h in found],
            "ci_low": [h.ci_low for h in found],
            "ci_high": [h.ci_high for h in found],
            "frequency": [h.estimate / n for h in found],
        }
    )
    days_seen = sorted({p.day for p in parts})
    return HeavyHitterResult(metric, spec, days_seen, n, len(parts), disc, table, per_part, confidence)


def plot_heavy_hitters(result: HeavyHitterResult, path: str | os.PathLike[str], title: str | None = None) -> None:
    """Horizontal bars of the discovered values' estimates with their confidence intervals (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = result.table.iloc[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.3 * max(4, len(t)) + 1))
    est = t["estimate"].to_numpy()
    err = np.vstack([est - t["ci_low"].to_numpy(), t["ci_high"].to_numpy() - est])
    ax.barh(range(len(t)), est, xerr=err, color="#4477aa", ecolor="#222222", capsize=2)
    ax.set_yticks(range(len(t)), [repr(v) for v in t["value"]])
    ax.set_xlabel(f"estimated devices (of {result.n} reports), {round(100 * result.confidence):g}% CI")
    ax.set_title(title or f"{result.metric}: heavy hitters ({result.spec.name}, ε={result.spec.epsilon:g})")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
