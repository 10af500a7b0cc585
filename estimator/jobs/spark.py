"""Batch estimation on Apache Spark: the pass of :func:`estimator.jobs.batch.accumulate`, run as a Spark job.

:class:`SparkEngine` is an :class:`estimator.jobs.batch.Engine`: give it to
:func:`~estimator.jobs.batch.estimate_dataset` (``ldp estimate --engine spark``)
and the files of the chosen metric and spec are spread over Spark tasks,
several files per task. Each task reads its files in Arrow batches, turns
every batch into the spec's records, splits it by day (a task may read
files of several days) and adds each day's records into that day's
accumulator with the same numba kernels as the default engine
(``mapInArrow``). A task emits one row per day it saw: the day, ``n`` and
the accumulator's integer sums, serialized (a few kB; :func:`pack_sums`).
Those rows are merged by a tree reduce (:meth:`pyspark.RDD.treeAggregate`);
the reports themselves never leave the task that read them, so nothing of
size n is shuffled. All sums are int64 and addition is exact in any order,
so the states, and the estimates computed from them, equal the default
engine's bit for bit.

Who reads a task's files (``reader``):

- ``"arrow"`` (default): the task's input is a list of (path, day) rows and
  the Python worker reads the files itself with pyarrow, so the reports
  never pass through the JVM. A file is one task's (the sink's files are one
  chunk each, of bounded size).
- ``"spark"``: Spark's Parquet reader (row-group splits, data locality on
  HDFS, any file system Spark reads), whose rows the JVM converts to Arrow
  one by one for ``mapInArrow``: on this machine that conversion, not the
  kernels, takes most of the time (docs/benchmarks/PIPELINE.md).

One Spark job covers one (metric, spec): a spec fixes the columns. The per-file facts the default engine takes from each
file's footer (format, spec id, shuffle batches, central ε and δ) come from a
small job over the file paths (:func:`_file_facts`), which also refuses a
file that is not of the chosen spec.

The pitfalls, each handled here (docs/SPARK.md says more):

- Python workers run ``PYSPARK_PYTHON``, else ``python3`` from ``PATH``: not
  this venv (and fail on ``import numpy``). A SparkContext started from Python
  reads only the environment variable (``spark.pyspark.python`` is
  spark-submit's), so :func:`spark_session` sets ``PYSPARK_PYTHON`` to
  :data:`sys.executable` unless it is set already.
- Spark has no unsigned integers: Parquet ``uint8/16/32`` arrive as
  ``short/int/long``, packed-bit columns (``fixed_size_binary``) as variable
  ``binary``. :func:`batch_to_records` range-checks and narrows each column
  back to the spec's dtype, and checks every binary value's width.
- Partition folders have their column types inferred (``day=20419`` would be
  an int, a ``day=2025-11-08`` a date); inference is turned off
  (``spark.sql.sources.partitionColumnTypeInference.enabled``) and ``day`` is
  cast to int explicitly.
- numba caches compiled kernels in ``NUMBA_CACHE_DIR``, keyed by the source
  file's path and mtime: the project must be installed on the workers (code
  shipped with ``addPyFile`` lands in a new temporary folder every run, or a
  zip, where nothing is cached), and the cache folder must be writable.
- numba's parallel kernels start ``NUMBA_NUM_THREADS`` (all cores) threads
  per worker, and Spark already runs one worker per core: executors get
  ``NUMBA_NUM_THREADS=1``.
- PySpark forks its Python workers from a daemon; GNU OpenMP (one of numba's
  threading layers) is not fork-safe. Executors get
  ``NUMBA_THREADING_LAYER=workqueue``, which is, and is enough for one thread.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from estimator.errors import BatchError
from estimator.jobs.batch import Accumulated
from estimator.oracles import state_for
from ldp_core.mechanisms import spec_from_dict
from ldp_core.mechanisms.base import ReportSpec
from pipeline.dataset import FORMAT, PartFile, read_part_spec, table_to_records
from pipeline.errors import DatasetError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DEFAULT_MASTER",
    "READERS",
    "Reader",
    "EXECUTOR_ENV",
    "SparkEngine",
    "spark_session",
    "check_master",
    "batch_to_records",
    "pack_sums",
    "unpack_sums",
]

DEFAULT_MASTER = "local[*]"

Reader = Literal["spark", "arrow"]
READERS: tuple[Reader, ...] = ("spark", "arrow")

#: Environment of the Python workers (``spark.executorEnv.*``), unless the caller sets them.
EXECUTOR_ENV: dict[str, str] = {"NUMBA_NUM_THREADS": "1", "NUMBA_THREADING_LAYER": "workqueue"}

_MASTER_RE = re.compile(
    r"^(local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?|local-cluster\[\d+,\d+,\d+\]|spark://\S+|yarn|k8s://\S+)$"
)

#: the output of a task: one row per (metric, spec, day) it read
_PARTIAL_SCHEMA = "metric string, spec_id string, day int, n long, sums binary"


def check_master(master: str) -> str:
    """``master`` if it is a Spark master URL this engine knows, else :class:`BatchError` saying which are."""
    if not _MASTER_RE.match(master):
        raise BatchError(
            f"--master {master!r} is not a Spark master URL: use local, local[N], local[*], "
            "spark://HOST:PORT, yarn or k8s://URL"
        )
    return master


def _require_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise BatchError(
            "the Spark engine needs PySpark: install the project's `spark` extra (pip install -e '.[spark]')"
        ) from None


def spark_session(
    master: str = DEFAULT_MASTER, *, app_name: str = "ldp-estimate", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A SparkSession set up for :class:`SparkEngine` (see the module docstring for each setting).

    ``conf`` adds or overrides Spark settings. On a cluster the workers need this
    project installed in a Python at the same path (or ``PYSPARK_PYTHON`` naming one).
    """
    _require_pyspark()
    from pyspark.sql import SparkSession

    check_master(master)
    settings: dict[str, str] = {
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # one Arrow batch per 2^17 rows: the kernels' per-call cost is paid rarely
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(1 << 17),
    }
    # SparkContext reads the workers' Python from the environment only (spark.pyspark.python is spark-submit's)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    cache = os.environ.get("NUMBA_CACHE_DIR") or str(Path(tempfile.gettempdir()) / "ldp-numba-cache")
    settings["spark.executorEnv.NUMBA_CACHE_DIR"] = cache
    for k, v in EXECUTOR_ENV.items():
        settings[f"spark.executorEnv.{k}"] = v
    if master.startswith("local"):
        # a local job needs no network beyond loopback
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master != master:
        raise BatchError(
            f"a Spark session on {active.sparkContext.master!r} is running in this process; "
            f"it cannot also run on {master!r}"
        )
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # py4j and Spark raise many kinds; all mean the session did not start
        raise BatchError(f"Spark could not start with master {master!r}: {_last_line(exc)}") from exc
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# -- Arrow batch <-> records ---------------------------------------------------------------------


def batch_to_records(batch: pa.RecordBatch, spec: ReportSpec) -> np.ndarray:
    """The records of ``batch`` (Spark's Arrow types: signed and widened, binary for packed bits) in
    ``spec.record_dtype``; :class:`DatasetError` if a column is missing, null or out of its field's range."""
    import pyarrow as pa

    dtype = spec.record_dtype
    n = batch.num_rows
    out = np.empty(n, dtype=dtype)
    names = batch.schema.names
    for name in dtype.names or ():
        if name not in names:
            raise DatasetError(f"column {name!r} of spec {spec.name} ({spec.spec_id}) is missing; Spark read {names}")
        col = batch.column(names.index(name))
        if col.null_count:
            raise DatasetError(f"column {name!r} has {col.null_count} null values")
        ftype = dtype.fields[name][0]  # type: ignore[index]  # a structured dtype: fields is set
        if ftype.subdtype is not None:
            width = ftype.itemsize
            if pa.types.is_fixed_size_binary(col.type):
                if col.type.byte_width != width:
                    raise DatasetError(f"column {name!r} is {col.type}, expected {width} bytes per value")
                data = np.frombuffer(col.buffers()[1], dtype=np.uint8, count=n * width, offset=col.offset * width)
            elif pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                off_type = np.int64 if pa.types.is_large_binary(col.type) else np.int32
                offsets = np.frombuffer(
                    col.buffers()[1], dtype=off_type, count=n + 1, offset=col.offset * off_type(0).itemsize
                )
                if n and not np.all(np.diff(offsets) == width):
                    raise DatasetError(f"column {name!r} holds values that are not {width} bytes long")
                data = np.frombuffer(
                    col.buffers()[2], dtype=np.uint8, count=n * width, offset=int(offsets[0]) if n else 0
                )
            else:
                raise DatasetError(f"column {name!r} is {col.type}, expected binary of {width} bytes")
            out[name] = data.view(ftype.base).reshape((n, *ftype.shape))
        else:
            if not pa.types.is_integer(col.type):
                raise DatasetError(f"column {name!r} is {col.type}, expected integers ({ftype})")
            values = col.to_numpy(zero_copy_only=False)
            info = np.iinfo(ftype)
            if n and (values.min() < info.min or values.max() > info.max):
                raise DatasetError(f"column {name!r} has values outside {ftype}'s range [{info.min}, {info.max}]")
            out[name] = values
    return out


def pack_sums(sums: Mapping[str, np.ndarray]) -> bytes:
    """An accumulator's sums as bytes: a 4-byte header length, a JSON header of each array's name,
    dtype and shape, then the arrays' bytes in that order (C order; no pickle)."""
    arrays = {k: np.ascontiguousarray(v) for k, v in sums.items()}
    header = json.dumps([[k, a.dtype.str, list(a.shape)] for k, a in arrays.items()]).encode()
    return b"".join([len(header).to_bytes(4, "little"), header, *(a.tobytes() for a in arrays.values())])


def unpack_sums(data: bytes) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack_sums`; :class:`DatasetError` if the bytes do not add up."""
    size = int.from_bytes(data[:4], "little")
    pos = 4 + size
    out: dict[str, np.ndarray] = {}
    for name, dt, shape in json.loads(data[4:pos]):
        dtype = np.dtype(dt)
        count = int(np.prod(shape, dtype=np.int64))
        if pos + count * dtype.itemsize > len(data):
            raise DatasetError(f"a partial state is cut short at {name!r}")
        out[name] = np.frombuffer(data, dtype=dtype, count=count, offset=pos).reshape(shape).copy()
        pos += count * dtype.itemsize
    if pos != len(data):
        raise DatasetError(f"a partial state has {len(data) - pos} bytes too many")
    return out


# -- the tasks -----------------------------------------------------------------------------------

_Key = tuple[str, str, int]  # metric, spec_id, day
_Partial = dict[_Key, tuple[int, bytes]]


#: makes a task's empty accumulator for a spec: anything with ``update(records)``, ``n`` and integer ``sums``
Make = Callable[[ReportSpec], Any]


def _add_by_day(
    accs: dict[int, Any], spec: ReportSpec, days: np.ndarray | int, records: np.ndarray, make: Make = state_for
) -> None:
    """Add ``records`` into the accumulator of each one's day (``days``: one per record, or one for all)."""
    if isinstance(days, np.ndarray):
        first, last = days[0], days[-1]
        if first == last and (days.size < 3 or np.all(days == first)):
            days = int(first)
    if isinstance(days, np.ndarray):
        uniq, inverse = np.unique(days, return_inverse=True)
        groups = [(int(d), records[inverse == i]) for i, d in enumerate(uniq)]
    else:
        groups = [(days, records)]
    for day, recs in groups:
        acc = accs.get(day)
        if acc is None:
            acc = accs[day] = make(spec)
        acc.update(recs)


def _state_rows(metric: str, spec: ReportSpec, accs: dict[int, Any]) -> Iterator[pa.RecordBatch]:
    """A task's output: one row per day it saw (none if it saw no report)."""
    import pyarrow as pa

    if not accs:
        return
    order = sorted(accs)
    yield pa.RecordBatch.from_arrays(
        [
            pa.array([metric] * len(order), pa.string()),
            pa.array([spec.spec_id] * len(order), pa.string()),
            pa.array(order, pa.int32()),
            pa.array([accs[d].n for d in order], pa.int64()),
            pa.array([pack_sums(accs[d].sums) for d in order], pa.binary()),
        ],
        names=["metric", "spec_id", "day", "n", "sums"],
    )


def _accumulate_batches(
    metric: str, spec_dict: dict[str, Any], make: Make = state_for
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of the ``spark`` reader: a task's report batches in (as Spark's Parquet
    reader typed them), one row per day out."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        spec = spec_from_dict(spec_dict)
        accs: dict[int, Any] = {}
        for batch in batches:
            if batch.num_rows:
                days = batch.column(batch.schema.names.index("day")).to_numpy(zero_copy_only=False)
                _add_by_day(accs, spec, days, batch_to_records(batch, spec), make)
        yield from _state_rows(metric, spec, accs)

    return run


def _read_and_accumulate(
    metric: str, spec_dict: dict[str, Any], make: Make = state_for
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of the ``arrow`` reader: a task's (path, day) rows in; it reads those
    files with pyarrow, in batches of 2^17 rows, and emits one row per day."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        spec = spec_from_dict(spec_dict)
        names = list(spec.record_dtype.names or ())
        accs: dict[int, Any] = {}
        for batch in batches:
            for path, day in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                for rb in pq.ParquetFile(path).iter_batches(batch_size=1 << 17, columns=names):
                    if rb.num_rows:
                        recs = table_to_records(pa.Table.from_batches([rb]), spec)
                        _add_by_day(accs, spec, int(day), recs, make)
        yield from _state_rows(metric, spec, accs)

    return run


def _merge_partials(a: _Partial, b: _Partial) -> _Partial:
    """Two maps of (n, packed sums) added key by key (the tree reduce's step)."""
    out = dict(a)
    for key, (n, packed) in b.items():
        if key not in out:
            out[key] = (n, packed)
            continue
        n0, packed0 = out[key]
        sums0, sums1 = unpack_sums(packed0), unpack_sums(packed)
        if sums0.keys() != sums1.keys():
            raise DatasetError(f"partial states of {key} have different fields: {sorted(sums0)} and {sorted(sums1)}")
        out[key] = (n0 + n, pack_sums({k: sums0[k] + sums1[k] for k in sums0}))
    return out


def _file_facts(spec_id: str, rows: Iterable[str]) -> Iterator[tuple[str, str | None, int, Any, Any, Any]]:
    """For each path: (path, error or None, batches, max central ε, max central δ, the shuffle entry with
    the largest central ε as JSON or None), from its footer."""
    import pyarrow.parquet as pq

    for path in rows:
        try:
            md = pq.read_schema(path).metadata or {}
        except Exception as exc:  # an unreadable file is reported by the driver, with its path
            yield path, f"cannot be read: {exc}", 0, None, None, None
            continue
        if md.get(b"ldp.format") != FORMAT.encode():
            yield path, f"is not an ldp-parquet part file (format {md.get(b'ldp.format')!r})", 0, None, None, None
            continue
        file_id = md.get(b"ldp.spec_id", b"").decode()
        if file_id != spec_id:
            yield path, f"has spec {file_id}, not the chosen one ({spec_id})", 0, None, None, None
            continue
        shuffles = json.loads(md.get(b"ldp.shuffles", b"[]"))
        ce = [float(s["central_epsilon"]) for s in shuffles if s.get("central_epsilon") is not None]
        cd = [float(s["central_delta"]) for s in shuffles if s.get("central_delta") is not None]
        worst = [s for s in shuffles if s.get("central_epsilon") is not None]
        top = json.dumps(max(worst, key=lambda s: float(s["central_epsilon"]))) if worst else None
        yield path, None, len(shuffles), max(ce) if ce else None, max(cd) if cd else None, top


# -- the engine ----------------------------------------------------------------------------------


class SparkEngine:
    """An :class:`estimator.jobs.batch.Engine` that runs the pass on ``spark`` (see the module docstring)."""

    def __init__(
        self,
        spark: SparkSession | None = None,
        *,
        master: str = DEFAULT_MASTER,
        reader: Reader = "arrow",
        depth: int = 2,
        on_stage: Callable[[str], None] | None = None,
    ) -> None:
        """``spark``: the session to use; without one, the first call starts one on ``master``
        (:func:`spark_session`) and :meth:`close` stops it. ``reader``: who reads the files in a task
        (see the module docstring). ``depth``: of the tree reduce. ``on_stage(text)``, if given, is called as
        each stage begins (the session's start, and per metric its two Spark jobs), for progress display."""
        if spark is None:
            check_master(master)
        if reader not in READERS:
            raise BatchError(f"the Spark reader is one of {READERS}, not {reader!r}")
        self.reader = reader
        self._spark = spark
        self._owned = False
        self.master = master
        self.depth = depth
        self.on_stage = on_stage

    def _stage(self, text: str) -> None:
        if self.on_stage is not None:
            self.on_stage(text)

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            _require_pyspark()
            from pyspark.sql import SparkSession

            fresh = SparkSession.getActiveSession() is None
            self._stage(f"starting Spark on {self.master}" if fresh else "using the running Spark session")
            self._spark = spark_session(self.master)
            self._owned = fresh  # a session that was running already is its starter's to stop
        return self._spark

    def close(self) -> None:
        """Stop the session if this engine started it."""
        if self._owned and self._spark is not None:
            self._spark.stop()
        self._spark, self._owned = None, False

    def __call__(
        self, parts: Sequence[PartFile], *, per_day: bool = False, progress: Callable[[int], Any] | None = None
    ) -> dict[tuple[str, int | None], Accumulated]:
        if not parts:
            return {}
        self.spark  # noqa: B018 - the session starts (and is announced) before the first job's stage
        out: dict[tuple[str, int | None], Accumulated] = {}
        groups: dict[tuple[str, str], list[PartFile]] = {}
        specs: dict[str, ReportSpec] = {}
        for p in parts:
            if p.spec_id not in specs:
                specs[p.spec_id] = read_part_spec(p)
            groups.setdefault((p.metric, specs[p.spec_id].spec_id), []).append(p)
        for (metric, _), files in groups.items():
            spec = specs[files[0].spec_id]
            try:
                self._stage(f"{metric}: job 1 of 2, the batch facts of {len(files)} files")
                facts = self._facts(spec, files)  # first: it refuses a file of another spec
                self._stage(f"{metric}: job 2 of 2, the reports' states (read, accumulate, tree reduce)")
                states = self._states(metric, spec, files)
            except BatchError:
                raise
            except Exception as exc:  # a failed Spark job: Py4J and PySpark errors carry the worker's message
                raise BatchError(f"the Spark job over {metric!r} failed: {_last_line(exc)}") from exc
            for p in files:
                key = (spec.spec_id, p.day if per_day else None)
                a = out.get(key)
                if a is None:
                    a = out[key] = Accumulated(state_for(spec), set())
                a.days.add(p.day)
                a.files += 1
                batches, ce, cd, worst = facts[str(p.path)]
                a.note_worst(p.day, None if worst is None else json.loads(worst))
                a.batches += batches
                if ce is not None and (a.central_epsilon is None or ce > a.central_epsilon):
                    a.central_epsilon = ce
                if cd is not None and (a.central_delta is None or cd > a.central_delta):
                    a.central_delta = cd
                if progress is not None:
                    progress(1)
            for (_, _, day), (n, packed) in sorted(states.items()):
                a = out[(spec.spec_id, day if per_day else None)]
                part = type(a.acc).from_state(spec, {"n": n, "sums": unpack_sums(packed)})
                a.acc.merge(part)
        return out

    def _states(self, metric: str, spec: ReportSpec, files: Sequence[PartFile], make: Make = state_for) -> _Partial:
        """Each (metric, spec, day)'s (n, packed sums) of ``make``'s accumulators, merged by the tree reduce."""
        partials = self.partials(metric, spec, files, make)
        rdd = partials.rdd.map(lambda r: {(r.metric, r.spec_id, r.day): (r.n, bytes(r.sums))})
        empty: _Partial = {}
        merged: _Partial = rdd.treeAggregate(empty, _merge_partials, _merge_partials, depth=self.depth)
        return merged

    def partials(self, metric: str, spec: ReportSpec, files: Sequence[PartFile], make: Make = state_for) -> DataFrame:
        """The tasks' output before the merge: one row (metric, spec_id, day, n, sums) per task and day
        (``make``: the tasks' accumulator, by default the spec's frequency or numeric state)."""
        from pyspark.sql import functions as F

        with warnings.catch_warnings():
            # mapInArrow checks the pandas version though it never uses pandas
            warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)
            if self.reader == "arrow":
                sc = self.spark.sparkContext
                rows = [(str(p.path), p.day) for p in files]
                slices = max(1, min(len(rows), 2 * sc.defaultParallelism))
                paths = self.spark.createDataFrame(sc.parallelize(rows, slices), "path string, day int")
                return paths.mapInArrow(_read_and_accumulate(metric, spec.to_dict(), make), _PARTIAL_SCHEMA)
            root = files[0].path.parent.parent.parent
            df = (
                self.spark.read.option("basePath", str(root))
                .parquet(*[str(p.path) for p in files])
                .select(*[F.col(f) for f in spec.record_dtype.names or ()], F.col("day").cast("int").alias("day"))
            )
            return df.mapInArrow(_accumulate_batches(metric, spec.to_dict(), make), _PARTIAL_SCHEMA)

    def _facts(self, spec: ReportSpec, files: Sequence[PartFile]) -> dict[str, tuple[int, Any, Any, Any]]:
        sc = self.spark.sparkContext
        paths = [str(p.path) for p in files]
        chosen = spec.spec_id
        rows = (
            sc.parallelize(paths, max(1, min(len(paths), sc.defaultParallelism)))
            .mapPartitions(lambda it: _file_facts(chosen, it))
            .collect()
        )
        bad = [(path, err) for path, err, *_ in rows if err is not None]
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise BatchError(f"{bad[0][0]} {bad[0][1]}{more}")
        return {path: (batches, ce, cd, worst) for path, _, batches, ce, cd, worst in rows}


def _last_line(exc: BaseException) -> str:
    """The useful line of a Spark error: the Python worker's own exception, else the first line."""
    text = str(exc).strip()
    for line in reversed(text.splitlines()):
        line = line.strip()
        if re.match(r"^[\w.]+(Error|Exception): ", line):
            return line
    return text.splitlines()[0] if text else type(exc).__name__
