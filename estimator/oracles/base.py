"""Server-side accumulators: linear sufficient statistics per mechanism.

An accumulator's state is ``n`` plus a dict of numpy arrays of sums. Every
update adds to those sums, so merging two accumulators (partitions, consumer
instances, days) is adding their states, and gives exactly the state one
pass over all reports would have. :meth:`Accumulator.state` and
:meth:`Accumulator.from_state` serialize it for snapshots.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Self

import numpy as np

from estimator.result import Estimate
from ldp_core.errors import SpecMismatchError
from ldp_core.mechanisms.base import MechanismSpec, ReportSpec
from ldp_core.wire.frames import ReportBatch

__all__ = ["LinearState", "Accumulator"]


class LinearState(ABC):
    """Sums of one spec's reports, whatever they estimate; see the module docstring.

    :class:`Accumulator` (frequency oracles) and the numeric accumulators
    (:mod:`estimator.mechanisms.numeric`) add their own ``estimate``.
    """

    #: the spec class this accumulator serves (checked at construction)
    spec_type: type[ReportSpec]

    def __init__(self, spec: ReportSpec) -> None:
        if not isinstance(spec, self.spec_type):
            raise TypeError(f"{type(self).__name__} serves {self.spec_type.__name__}, got {type(spec).__name__}")
        self.spec = spec
        self.n = 0
        self.sums: dict[str, np.ndarray] = self._empty_sums()

    @abstractmethod
    def _empty_sums(self) -> dict[str, np.ndarray]:
        """Zeroed sufficient statistics."""

    @abstractmethod
    def _add(self, records: np.ndarray) -> None:
        """Add ``records`` (already checked to have the spec's dtype) into :attr:`sums`."""

    @abstractmethod
    def estimate(self, confidence: float = 0.95) -> Any:
        """The estimate, with its variance and confidence interval."""

    # -- generic linear-state machinery ----------------------------------
    def update(self, batch: ReportBatch | np.ndarray) -> None:
        """Add a batch of reports (a :class:`ReportBatch` or a record array)."""
        if isinstance(batch, ReportBatch):
            if batch.spec.spec_id != self.spec.spec_id:
                raise SpecMismatchError(
                    f"batch spec {batch.spec.spec_id} is not this accumulator's {self.spec.spec_id}"
                )
            records = batch.records
        else:
            records = np.asarray(batch)
            if records.dtype != self.spec.record_dtype:
                raise SpecMismatchError(f"records of dtype {records.dtype} do not match {self.spec.record_dtype}")
        if records.size:
            self._add(records)
            self.n += int(records.size)

    def merge(self, other: LinearState) -> Self:
        """Add ``other``'s state into this one (in place); returns ``self``."""
        if type(other) is not type(self) or other.spec.spec_id != self.spec.spec_id:
            raise SpecMismatchError("only accumulators of the same spec merge")
        for key, arr in other.sums.items():
            self.sums[key] += arr
        self.n += other.n
        return self

    def state(self) -> dict[str, Any]:
        """A copy of the state: ``{"spec": ..., "n": ..., "sums": {...}}``."""
        return {"spec": self.spec.to_dict(), "n": self.n, "sums": {k: v.copy() for k, v in self.sums.items()}}

    @classmethod
    def from_state(cls, spec: ReportSpec, state: dict[str, Any]) -> Self:
        acc = cls(spec)
        if state.get("spec") not in (None, spec.to_dict()):
            raise SpecMismatchError("state was saved under another spec")
        acc.n = int(state["n"])
        for key, arr in state["sums"].items():
            if key not in acc.sums or np.shape(arr) != acc.sums[key].shape:
                raise SpecMismatchError(f"state field {key!r} does not fit spec {spec.name}")
            acc.sums[key] = np.array(arr, dtype=acc.sums[key].dtype)
        return acc

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name}, n={self.n})"


class Accumulator(LinearState):
    """A frequency oracle's sums: :meth:`estimate` gives unbiased counts per domain index."""

    spec_type: type[MechanismSpec]
    spec: MechanismSpec

    def __init__(self, spec: MechanismSpec) -> None:
        super().__init__(spec)

    @abstractmethod
    def estimate(self, confidence: float = 0.95) -> Estimate:
        """Unbiased counts with variances and confidence intervals."""
