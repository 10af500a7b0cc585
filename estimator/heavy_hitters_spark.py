"""Heavy-hitter discovery on Apache Spark: ``ldp heavy-hitters --engine spark``.

Discovery is not one sum over the reports (PEM's level j ranks extensions of
the candidates level j - 1 kept), but every statistic it looks at is one:

- PEM, level j: the OLH support counts ``C_x`` of the level's candidate keys
  and the level's report count n_j (:class:`PEMLevelSums`). One Spark job per
  level; the driver picks the next level's candidates from the merged counts.
- SFP: the integer sums of each fragment position's CMS/HCMS sketch, with the
  position's report count, and of the word sketch (:class:`SFPSums`). One job.

Each job is :class:`estimator.spark.SparkEngine`'s: the tasks read their part
files (``mapInArrow``), add each Arrow batch into their accumulator with the
numba kernels and emit its int64 sums (a few kB to a few MB: a sketch, or
one count per candidate); the partial states are merged by a tree reduce, so
no report leaves the task that read it. Integer addition is exact in any
order, so the merged sums equal the default engine's and
:func:`~estimator.heavy_hitters.discover_pem_from` /
:func:`~estimator.heavy_hitters.discover_sfp_from` then compute the same
estimates, bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from client_sdk.heavy_hitters import PEMSpec, SFPSpec
from estimator.errors import BatchError
from estimator.heavy_hitters import Discovery, add_sketch, discover_pem_from, discover_sfp_from, sketch_sums
from estimator.kernels.candidates import olh_candidate_support
from estimator.spark import Make, _last_line, unpack_sums
from pipeline.dataset import PartFile

if TYPE_CHECKING:
    from estimator.spark import SparkEngine

__all__ = ["PEMLevelSums", "SFPSums", "discover_spark"]


class PEMLevelSums:
    """A task's sums for PEM level ``level``: ``support`` (C_x of each of ``keys``), ``n_level`` (reports at
    the level) and ``parts`` (reports per level), over all the reports it was given (``n``)."""

    def __init__(self, spec: PEMSpec, level: int, keys: np.ndarray) -> None:
        self.spec, self.level, self.keys = spec, level, np.ascontiguousarray(keys, dtype=np.uint32)
        self.n = 0
        self.sums = {
            "support": np.zeros(self.keys.shape[0], dtype=np.int64),
            "n_level": np.zeros(1, dtype=np.int64),
            "parts": np.zeros(spec.num_levels, dtype=np.int64),
        }

    def update(self, records: np.ndarray) -> None:
        self.spec.check_records(records)
        self.n += int(records.shape[0])
        sel = records["level"] == self.level
        self.sums["support"] += olh_candidate_support(
            records["seed"][sel], records["y"][sel], self.spec.olh.hash_range, self.keys
        )
        self.sums["n_level"][0] += int(np.count_nonzero(sel))
        self.sums["parts"] += np.bincount(records["level"], minlength=self.spec.num_levels)


class SFPSums:
    """A task's sums for SFP: ``parts`` (reports per fragment position), each position's fragment sketch
    (``f{pos}_*``) and the word sketch (``w_*``), as :func:`~estimator.heavy_hitters.sketch_sums` names them."""

    def __init__(self, spec: SFPSpec) -> None:
        self.spec = spec
        self.n = 0
        self.sums: dict[str, np.ndarray] = {"parts": np.zeros(spec.num_positions, dtype=np.int64)}
        for pos in range(spec.num_positions):
            self.sums.update({f"f{pos}_{k}": v for k, v in sketch_sums(spec.fragment_spec).items()})
        self.sums.update({f"w_{k}": v for k, v in sketch_sums(spec.word_spec).items()})

    @staticmethod
    def split(spec: SFPSpec, sums: dict[str, np.ndarray]) -> tuple[list[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        """``sums`` as (each position's fragment sketch sums, the word sketch sums)."""
        frag = [
            {k[len(f"f{pos}_") :]: v for k, v in sums.items() if k.startswith(f"f{pos}_")}
            for pos in range(spec.num_positions)
        ]
        return frag, {k[2:]: v for k, v in sums.items() if k.startswith("w_")}

    def update(self, records: np.ndarray) -> None:
        spec = self.spec
        spec.check_records(records)
        self.n += int(records.shape[0])
        self.sums["parts"] += np.bincount(records["position"], minlength=spec.num_positions)
        frag, word = self.split(spec, self.sums)
        f_records = spec.part_records(records, "f_")
        for pos in range(spec.num_positions):
            add_sketch(spec.fragment_spec, f_records[records["position"] == pos], frag[pos])
        add_sketch(spec.word_spec, spec.part_records(records, "w_"), word)


def _merged(
    engine: SparkEngine, metric: str, spec: PEMSpec | SFPSpec, parts: Sequence[PartFile], make: Make
) -> tuple[int, dict[str, np.ndarray]]:
    """One Spark job: ``make``'s sums over all of ``parts`` (every day added up), and n."""
    try:
        states = engine._states(metric, spec, parts, make)
    except BatchError:
        raise
    except Exception as exc:  # a failed Spark job: Py4J and PySpark errors carry the worker's message
        raise BatchError(f"the Spark job over {metric!r} failed: {_last_line(exc)}") from exc
    n, total = 0, make(spec).sums
    for _, (n_day, packed) in sorted(states.items()):
        n += n_day
        for k, v in unpack_sums(packed).items():
            total[k] = total[k] + v
    return n, total


def discover_spark(
    engine: SparkEngine,
    metric: str,
    spec: PEMSpec | SFPSpec,
    parts: Sequence[PartFile],
    top: int,
    confidence: float = 0.95,
) -> tuple[Discovery, list[int]]:
    """:func:`~estimator.heavy_hitters.discover` over the reports of ``parts`` (all of ``spec``), on Spark;
    and the reports per PEM level or SFP position. See the module docstring."""
    if not parts:
        raise BatchError(f"no part files of metric {metric!r} to discover from")
    if isinstance(spec, PEMSpec) and spec.oracle != "olh":
        raise BatchError(
            f"metric {metric!r} is PEM over the {spec.oracle!r} oracle, which runs on the default engine only "
            "(the Spark passes sum OLH support counts); drop --engine spark"
        )
    try:
        engine._facts(spec, parts)  # refuses a file that is not of this spec, before any pass
    except BatchError:
        raise
    except Exception as exc:
        raise BatchError(f"the Spark job over {metric!r} failed: {_last_line(exc)}") from exc
    if isinstance(spec, SFPSpec):
        n, sums = _merged(engine, metric, spec, parts, cast(Make, SFPSums))
        frag, word = SFPSums.split(spec, sums)
        positions = [(int(c), f) for c, f in zip(sums["parts"], frag)]
        return discover_sfp_from(spec, n, positions, word, top, confidence=confidence), [int(x) for x in sums["parts"]]
    counts: list[int] = []

    def support(level: int, keys: np.ndarray) -> tuple[np.ndarray, int, int]:
        nonlocal counts
        n, sums = _merged(engine, metric, spec, parts, functools.partial(PEMLevelSums, level=level, keys=keys))
        counts = [int(x) for x in sums["parts"]]
        return sums["support"], int(sums["n_level"][0]), n

    return discover_pem_from(spec, support, top, confidence=confidence), counts
