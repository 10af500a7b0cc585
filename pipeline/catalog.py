"""Which spec a report batch was made under: spec ids resolved through metrics files.

A wire frame carries only its metric name and its spec's 16-hex-digit id.
The server-side consumers (sinks, estimators) need the spec itself to read
the records, so they resolve the id through the declared metrics
(:mod:`ldp_core.metrics`). A metric whose parameters changed keeps its old
spec id in older data; pass every metrics file that was in force
(``--metrics old.json --metrics new.json``) and all their specs resolve.

There is no default metrics file: a consumer that guessed one (the example
file of a source checkout, which is not installed with the package) would
reject or mislabel real data. The command line requires ``--metrics`` or
``$LDP_METRICS`` (:func:`ldp_cli.options.metrics_files`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from ldp_core.errors import SpecMismatchError
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.metrics import MetricDefinition, MetricSet, load_metrics
from pipeline.errors import ConfigError

__all__ = ["SpecCatalog"]


class SpecCatalog:
    """Spec ids to specs, and metric names to their definitions.

    Callable as ``catalog(metric, spec_id) -> spec`` (the resolver form that
    :func:`ldp_core.wire.frames.decode_frame` accepts). An unknown id, or an id
    declared for another metric, raises :class:`SpecMismatchError`.
    """

    def __init__(self, metric_sets: Iterable[MetricSet] = (), specs: Iterable[tuple[str, ReportSpec]] = ()) -> None:
        self.metrics: dict[str, MetricDefinition] = {}
        self._by_id: dict[str, ReportSpec] = {}
        self._metric_of: dict[str, set[str]] = {}
        for ms in metric_sets:
            for name, m in ms.items():
                self.metrics.setdefault(name, m)
                self.add(name, m.spec)
        for name, spec in specs:
            self.add(name, spec)

    @classmethod
    def from_files(cls, paths: Iterable[str | os.PathLike[str]]) -> SpecCatalog:
        """Load metrics files (expired metrics included: old data stays readable); at least one is required
        (:class:`~pipeline.errors.ConfigError` otherwise)."""
        files = list(paths or [])
        if not files:
            raise ConfigError("no metrics file: pass --metrics FILE or set $LDP_METRICS")
        return cls(load_metrics(p, reject_expired=False) for p in files)

    def add(self, metric: str, spec: ReportSpec) -> None:
        """Declare that ``metric`` may carry reports of ``spec``."""
        self._by_id[spec.spec_id] = spec
        self._metric_of.setdefault(spec.spec_id, set()).add(metric)

    def get(self, spec_id: str) -> ReportSpec | None:
        return self._by_id.get(spec_id)

    def __call__(self, metric: str, spec_id: str) -> ReportSpec:
        spec = self._by_id.get(spec_id)
        if spec is None:
            raise SpecMismatchError(
                f"metric {metric!r}: spec {spec_id} is in no metrics file this process loaded; "
                "pass the metrics file that declared it (--metrics)"
            )
        if metric not in self._metric_of[spec_id]:
            raise SpecMismatchError(
                f"metric {metric!r}: spec {spec_id} is declared for {sorted(self._metric_of[spec_id])}, not this metric"
            )
        return spec

    def __contains__(self, spec_id: object) -> bool:
        return spec_id in self._by_id

    def specs(self) -> Mapping[str, ReportSpec]:
        return dict(self._by_id)
