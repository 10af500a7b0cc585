"""Batch heavy-hitter discovery over the Parquet dataset (``ldp heavy-hitters``).

Every part file of the metric in the day range is read, the records of one
spec are concatenated (PEM's levels need all of a day range's reports at
once: discovery is not a sum of per-file statistics), and
:func:`estimator.mechanisms.heavy_hitters.discover` runs over them. The table has one
row per discovered value, best first: ``rank``, ``value``, ``estimate``,
``std_error``, ``ci_low``, ``ci_high``, ``frequency``, ``adjusted_ci_low``,
``could_be_noise``. Only values that are not *could be noise* (Bonferroni over
every value ranked at the end: :meth:`Discovery.noise`) are reported, unless
``include_noise``: then the ``top`` best, flagged.
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
from estimator.mechanisms.heavy_hitters import PEM_RANKINGS, Discovery, discover
from estimator.result import NOISE_RULE
from ldp_core.mechanisms.heavy_hitters import PEMSpec, SFPSpec
from pipeline.dataset import PartFile, list_parts, read_part, read_part_spec
from pipeline.text import printable

if TYPE_CHECKING:
    from estimator.jobs.spark import SparkEngine

__all__ = ["HeavyHitterResult", "discover_dataset", "discovery_table", "plot_heavy_hitters"]


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
    include_noise: bool = False  # whether the table holds values that could be noise
    ranking: str | None = None  # how PEM ranked its candidates (None: SFP)

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
            "candidates": self.discovery.tested,
            "noise_rule": NOISE_RULE,
            "include_noise": self.include_noise,
            **({"ranking": self.ranking} if self.ranking is not None else {}),
            "significant": int(np.count_nonzero(~self.discovery.noise(self.confidence)[1])),
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
    include_noise: bool = False,
    ranking: str | None = None,
) -> HeavyHitterResult:
    """Discover ``metric``'s ``top`` values over ``days`` (``None``: all) of the dataset at ``root``.

    ``engine``: a :class:`estimator.jobs.spark.SparkEngine` runs the passes on Spark, with the same result
    (:mod:`estimator.jobs.heavy_hitters_spark`); without one the reports are read into this process.
    ``parts``: the metric's part files in that range, when the caller has listed them already
    (:func:`pipeline.dataset.list_parts`); they are then not listed again. ``include_noise``: report the
    ``top`` best values, flagged, rather than only the values that are not *could be noise*. ``ranking``: how
    PEM ranks its candidates (``"posterior"``, the default, or ``"estimate"``; docs/HEAVY_HITTERS.md), refused
    for an SFP metric."""
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

        disc, per_part = discover_spark(engine, metric, spec, parts, top, confidence, ranking=ranking)
    else:
        datas = [read_part(p) for p in parts]
        records = np.concatenate([d.records for d in datas])
        disc = discover(spec, records, top, confidence=confidence, ranking=ranking)
        field, size = ("level", spec.num_levels) if isinstance(spec, PEMSpec) else ("position", spec.num_positions)
        per_part = [int(x) for x in np.bincount(records[field], minlength=size)]
    table = discovery_table(disc, top, confidence, include_noise)
    days_seen = sorted({p.day for p in parts})
    rank = (ranking or PEM_RANKINGS[0]) if isinstance(spec, PEMSpec) else None
    return HeavyHitterResult(
        metric, spec, days_seen, disc.n, len(parts), disc, table, per_part, confidence, include_noise, rank
    )


def discovery_table(disc: Discovery, top: int, confidence: float = 0.95, include_noise: bool = False) -> pd.DataFrame:
    """The reported values of a discovery, best first (module docstring): the ``top`` best that are not
    *could be noise*, or with ``include_noise`` the ``top`` best, flagged."""
    low, noise = disc.noise(confidence)
    keep = np.arange(len(disc.found)) if include_noise else np.nonzero(~noise)[0]
    keep = keep[:top]
    found = [disc.found[i] for i in keep]
    n = disc.n
    return pd.DataFrame(
        {
            "rank": np.arange(1, len(found) + 1, dtype=np.int64),
            "value": [h.value for h in found],
            "estimate": np.array([h.estimate for h in found], dtype=np.float64),
            "std_error": np.array([float(np.sqrt(max(h.variance, 0.0))) for h in found], dtype=np.float64),
            "ci_low": np.array([h.ci_low for h in found], dtype=np.float64),
            "ci_high": np.array([h.ci_high for h in found], dtype=np.float64),
            "frequency": np.array([h.estimate / n if n else 0.0 for h in found], dtype=np.float64),
            "adjusted_ci_low": low[keep].astype(np.float64),
            "could_be_noise": noise[keep].astype(bool),
        }
    )


def plot_heavy_hitters(result: HeavyHitterResult, path: str | os.PathLike[str], title: str | None = None) -> None:
    """Horizontal bars of the discovered values' estimates with their confidence intervals (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = result.table.iloc[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.3 * max(4, len(t)) + 1))
    est = t["estimate"].to_numpy()
    err = np.vstack([est - t["ci_low"].to_numpy(), t["ci_high"].to_numpy() - est])
    noise = t["could_be_noise"].to_numpy(dtype=bool)
    colors = np.where(noise, "#bbbbbb", "#4477aa")
    ax.barh(range(len(t)), est, xerr=err, color=list(colors), ecolor="#222222", capsize=2)
    ax.set_yticks(range(len(t)), [printable(v) + (" (could be noise)" if z else "") for v, z in zip(t["value"], noise)])
    ax.set_xlabel(
        f"estimated devices (of {result.n} reports), {round(100 * result.confidence):g}% CI; "
        f"grey: could be noise (Bonferroni over {result.discovery.tested} candidates)"
    )
    ax.set_title(title or f"{result.metric}: heavy hitters ({result.spec.name}, ε={result.spec.epsilon:g})")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
