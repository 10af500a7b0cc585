"""Heavy-hitter discovery on Apache Spark: ``ldp heavy-hitters --engine spark``.

Discovery is not one sum over the reports (PEM's level j ranks extensions of
the candidates level j - 1 kept), but every statistic it looks at is one:

- PEM, level j: the OLH support counts ``C_x`` of the level's candidate keys
  and the level's report count n_j (:class:`PEMLevelSums`). One Spark job per
  level; the driver picks the next level's candidates from the merged counts.
  With ``cache_levels`` (the default) the files are read once: a first job
  splits each task's reports by level into (seed, y) arrays and persists
  them in the executors (memory, spilling to disk), and each level's job
  counts the candidates' support over the cached arrays of that level
  only, instead of reading and decoding every file again
  (:class:`PEMLevelCache`).
- SFP: the integer sums of each fragment position's CMS/HCMS sketch, with the
  position's report count, and of the word sketch (:class:`SFPSums`). One job.

Each job is :class:`estimator.jobs.spark.SparkEngine`'s: the tasks read their part
files (``mapInArrow``), add each Arrow batch into their accumulator with the
numba kernels and emit its int64 sums (a few kB to a few MB: a sketch, or
one count per candidate); the partial states are merged by a tree reduce, so
no report leaves the task that read it. Integer addition is exact in any
order, so the merged sums equal the default engine's and
:func:`~estimator.mechanisms.heavy_hitters.discover_pem_from` /
:func:`~estimator.mechanisms.heavy_hitters.discover_sfp_from` then compute the same
estimates, bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from estimator.errors import BatchError
from estimator.jobs.spark import Make, _last_line, unpack_sums
from estimator.kernels.candidates import olh_candidate_support
from estimator.mechanisms.heavy_hitters import (
    PEM_RANKINGS,
    Discovery,
    add_sketch,
    check_ranking,
    discover_pem_from,
    discover_sfp_from,
    sketch_sums,
)
from ldp_core.mechanisms import spec_from_dict
from ldp_core.mechanisms.heavy_hitters import PEMSpec, SFPSpec
from pipeline.dataset import PartFile, table_to_records

if TYPE_CHECKING:
    from estimator.jobs.spark import SparkEngine

__all__ = ["PEMLevelCache", "PEMLevelSums", "SFPSums", "discover_spark"]


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
    (``f{pos}_*``) and the word sketch (``w_*``), as :func:`~estimator.mechanisms.heavy_hitters.sketch_sums` names them."""

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


def _split_levels(spec_dict: dict[str, Any]) -> Any:
    """The ``mapPartitions`` function of :class:`PEMLevelCache`: a task's (path, day) rows in, one
    (level, reports, seed bytes, y bytes) row per level out (the level's reports of all the task's files)."""

    def run(rows: Iterable[tuple[str, int]]) -> Iterator[tuple[int, int, bytes, bytes]]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        spec = spec_from_dict(spec_dict)
        assert isinstance(spec, PEMSpec)
        names = list(spec.record_dtype.names or ())
        seeds: list[list[np.ndarray]] = [[] for _ in range(spec.num_levels)]
        ys: list[list[np.ndarray]] = [[] for _ in range(spec.num_levels)]
        for path, _ in rows:
            for rb in pq.ParquetFile(path).iter_batches(batch_size=1 << 17, columns=names):
                recs = table_to_records(pa.Table.from_batches([rb]), spec)
                spec.check_records(recs)
                order = np.argsort(recs["level"], kind="stable")
                bounds = np.searchsorted(recs["level"][order], np.arange(spec.num_levels + 1))
                for j in range(spec.num_levels):
                    sel = order[bounds[j] : bounds[j + 1]]
                    seeds[j].append(recs["seed"][sel])
                    ys[j].append(recs["y"][sel])
        for j in range(spec.num_levels):
            seed = np.concatenate(seeds[j]) if seeds[j] else np.zeros(0, np.uint32)
            y = np.concatenate(ys[j]) if ys[j] else np.zeros(0, spec.record_dtype["y"])
            yield j, int(seed.shape[0]), np.ascontiguousarray(seed, "<u4").tobytes(), np.ascontiguousarray(y).tobytes()

    return run


def _level_support(hash_range: int, y_dtype: str, keys: np.ndarray) -> Any:
    """A cached level row's support counts of ``keys`` (the per-level job's map)."""

    def run(row: tuple[int, int, bytes, bytes]) -> np.ndarray:
        seed = np.frombuffer(row[2], dtype="<u4")
        y = np.frombuffer(row[3], dtype=y_dtype)
        return olh_candidate_support(seed, y, hash_range, keys)

    return run


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + b


class PEMLevelCache:
    """PEM's reports, read once and kept in the executors split by level (see the module docstring).

    ``rdd`` holds one row (level, reports, seed bytes, y bytes) per task and level, persisted; ``parts``
    is the reports per level. :meth:`support` is one level's job; :meth:`close` unpersists."""

    def __init__(self, engine: SparkEngine, spec: PEMSpec, parts: Sequence[PartFile]) -> None:
        from pyspark import StorageLevel

        self.spec = spec
        sc = engine.spark.sparkContext
        rows = [(str(p.path), p.day) for p in parts]
        slices = max(1, min(len(rows), 2 * sc.defaultParallelism))
        self.rdd = sc.parallelize(rows, slices).mapPartitions(_split_levels(spec.to_dict()))
        self.rdd.persist(StorageLevel.MEMORY_AND_DISK)
        self.parts = [0] * spec.num_levels
        for level, count in self.rdd.map(lambda r: (r[0], r[1])).collect():  # fills the cache
            self.parts[level] += count

    def support(self, level: int, keys: np.ndarray) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.uint32)
        y_dtype = self.spec.record_dtype["y"].str
        zero = np.zeros(keys.shape[0], dtype=np.int64)
        out: np.ndarray = (
            self.rdd.filter(lambda r: r[0] == level and r[1] > 0)
            .map(_level_support(self.spec.olh.hash_range, y_dtype, keys))
            .treeAggregate(zero, _add, _add, depth=2)
        )
        return out

    def close(self) -> None:
        self.rdd.unpersist()


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
    *,
    cache_levels: bool = True,
    ranking: str | None = None,
) -> tuple[Discovery, list[int]]:
    """:func:`~estimator.mechanisms.heavy_hitters.discover` over the reports of ``parts`` (all of ``spec``), on Spark;
    and the reports per PEM level or SFP position. See the module docstring (``cache_levels``, ``ranking``:
    PEM's; ``None``: the default ranking)."""
    check_ranking(spec, ranking)
    rank = ranking or PEM_RANKINGS[0]
    if not parts:
        raise BatchError(f"no part files of metric {metric!r} to discover from")
    if isinstance(spec, PEMSpec) and spec.oracle != "olh":
        raise BatchError(
            f"metric {metric!r} is PEM over the {spec.oracle!r} oracle, which runs on the default engine only "
            "(the Spark passes sum OLH support counts); drop --engine spark"
        )
    engine.spark  # noqa: B018 - the session starts (and is announced) before the first stage
    engine._stage(f"{metric}: the batch facts of {len(parts)} files")
    try:
        engine._facts(spec, parts)  # refuses a file that is not of this spec, before any pass
    except BatchError:
        raise
    except Exception as exc:
        raise BatchError(f"the Spark job over {metric!r} failed: {_last_line(exc)}") from exc
    if isinstance(spec, SFPSpec):
        engine._stage(f"{metric}: one pass over every position's reports (SFP)")
        n, sums = _merged(engine, metric, spec, parts, cast(Make, SFPSums))
        frag, word = SFPSums.split(spec, sums)
        positions = [(int(c), f) for c, f in zip(sums["parts"], frag)]
        return discover_sfp_from(spec, n, positions, word, top, confidence=confidence), [int(x) for x in sums["parts"]]
    if cache_levels:
        engine._stage(f"{metric}: reading the reports of {spec.num_levels} levels into Spark's cache (PEM)")
        try:
            cache = PEMLevelCache(engine, spec, parts)
        except Exception as exc:
            raise BatchError(f"the Spark job over {metric!r} failed: {_last_line(exc)}") from exc
        n_all = sum(cache.parts)

        def cached(level: int, keys: np.ndarray) -> tuple[np.ndarray, int, int]:
            engine._stage(f"{metric}: level {level + 1} of {spec.num_levels}, {len(keys)} candidate prefixes")
            try:
                return cache.support(level, keys), cache.parts[level], n_all
            except Exception as exc:
                raise BatchError(f"the Spark job over {metric!r} failed: {_last_line(exc)}") from exc

        try:
            return discover_pem_from(spec, cached, top, confidence=confidence, ranking=rank), list(cache.parts)
        finally:
            cache.close()
    counts: list[int] = []

    def support(level: int, keys: np.ndarray) -> tuple[np.ndarray, int, int]:
        nonlocal counts
        n, sums = _merged(engine, metric, spec, parts, functools.partial(PEMLevelSums, level=level, keys=keys))
        counts = [int(x) for x in sums["parts"]]
        return sums["support"], int(sums["n_level"][0]), n

    return discover_pem_from(spec, support, top, confidence=confidence, ranking=rank), counts
