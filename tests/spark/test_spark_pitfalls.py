"""The known pitfalls of running the numba kernels under PySpark, each checked where it bites
(docs/SPARK.md): the workers' Python and environment, Spark's types for the dataset's columns, the
``day=`` partitions, and that no raw report crosses a shuffle."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from estimator.jobs.spark import READERS, Reader, SparkEngine, batch_to_records, pack_sums, unpack_sums
from estimator.kernels import olh as olh_kernels
from ldp_core.mechanisms import make_spec
from pipeline.dataset import list_parts, records_to_table
from pipeline.errors import DatasetError


def _probe(_: Iterator[int]) -> Iterator[tuple[str, str | None, int, str, str | None]]:
    """Run in a Python worker: an OLH accumulator's parallel kernel, then what the worker saw."""
    import numba

    from estimator.oracles import state_for

    spec = make_spec("olh", epsilon=2.0, domain_size=16)
    rng = np.random.default_rng(1)
    acc = state_for(spec)
    acc.update(spec.encode(rng.integers(0, 16, 500), rng))
    yield (
        sys.executable,
        os.environ.get("NUMBA_NUM_THREADS"),
        int(numba.config.NUMBA_NUM_THREADS),
        str(numba.threading_layer()),
        os.environ.get("NUMBA_CACHE_DIR"),
    )


def test_workers_run_this_python_with_one_numba_thread_and_a_shared_cache(spark: SparkSession) -> None:
    rows = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_probe).collect()
    assert len(rows) == 2
    cache = os.environ["NUMBA_CACHE_DIR"]
    for exe, env_threads, threads, layer, cache_dir in rows:
        assert exe == sys.executable  # PYSPARK_PYTHON; without it the workers' python3 has no numpy
        assert (env_threads, threads) == ("1", 1)  # one numba thread per task slot
        assert layer == "workqueue"  # fork-safe, unlike GNU OpenMP
        assert cache_dir == cache
    # numba keys its cache by the kernel's source folder: <folder name>_<sha1 of its absolute path>
    # (numba.core.caching._CacheLocator.get_suitable_cache_subpath), so a module shipped to a new
    # temporary folder every run (addPyFile) would never hit it
    kernels_dir = os.path.dirname(os.path.abspath(olh_kernels.__file__))
    folder = Path(cache) / f"kernels_{hashlib.sha1(kernels_dir.encode()).hexdigest()}"
    assert list(folder.glob("olh.*.nbi")), f"no numba index of {kernels_dir}/olh.py under {folder}"


def test_spark_reads_unsigned_as_wider_signed_and_packed_bits_as_binary(
    spark: SparkSession, dataset: dict[str, Any]
) -> None:
    olh = spark.read.parquet(*[str(p.path) for p in list_parts(dataset["root"], "olh")]).schema
    assert olh["seed"].dataType == T.LongType()  # Parquet uint32
    assert dataset["specs"]["olh"].record_dtype["seed"] == np.dtype("<u4")
    lat = spark.read.parquet(*[str(p.path) for p in list_parts(dataset["root"], "latency")]).schema
    assert lat["value"].dataType == T.BinaryType()  # fixed_size_binary, as variable binary


def _spark_like(records: np.ndarray, spec: Any) -> pa.RecordBatch:
    """``records`` as Spark hands them to ``mapInArrow``: integers widened to signed, bytes as binary."""
    table = records_to_table(records, spec).drop_columns(["spec_id"])
    cols = []
    for f in table.schema:
        col = table.column(f.name).combine_chunks()
        if pa.types.is_fixed_size_binary(f.type):
            cols.append(pa.array(col.to_pylist(), pa.binary()))
        else:
            cols.append(col.cast(pa.int64()))
    return pa.RecordBatch.from_arrays(cols, names=table.column_names)


def test_batch_to_records_narrows_back_and_refuses_what_does_not_fit() -> None:
    rng = np.random.default_rng(3)
    olh = make_spec("olh", epsilon=2.0, domain_size=64)
    recs = olh.encode(rng.integers(0, 64, 200), rng)
    np.testing.assert_array_equal(batch_to_records(_spark_like(recs, olh), olh), recs)
    pm = make_spec("pm", epsilon=4.0, low=0, high=100, dims=3, sample=2)
    precs = pm.encode(100 * rng.random((50, 3)), rng)
    np.testing.assert_array_equal(batch_to_records(_spark_like(precs, pm), pm), precs)

    good = _spark_like(recs[:3], olh)
    too_big = pa.RecordBatch.from_arrays([pa.array([1, 2**32, 3], pa.int64()), good.column(1)], names=good.schema.names)
    with pytest.raises(DatasetError, match="outside uint32's range"):
        batch_to_records(too_big, olh)
    negative = pa.RecordBatch.from_arrays([pa.array([1, -1, 3], pa.int64()), good.column(1)], names=good.schema.names)
    with pytest.raises(DatasetError, match="outside"):
        batch_to_records(negative, olh)
    nulls = pa.RecordBatch.from_arrays([pa.array([1, None, 3], pa.int64()), good.column(1)], names=good.schema.names)
    with pytest.raises(DatasetError, match="null"):
        batch_to_records(nulls, olh)
    with pytest.raises(DatasetError, match="'y' of spec olh .* is missing"):
        batch_to_records(pa.RecordBatch.from_arrays([good.column(0)], names=["seed"]), olh)
    pgood = _spark_like(precs[:2], pm)
    short = [
        pa.array([b"\x00" * 3, b"\x00" * 4], pa.binary()) if n == "attr" else pgood.column(n)
        for n in pgood.schema.names
    ]
    with pytest.raises(DatasetError, match="not 2 bytes long"):
        batch_to_records(pa.RecordBatch.from_arrays(short, names=pgood.schema.names), pm)


def test_day_partitions_are_typed_by_inference_unless_it_is_off(spark: SparkSession, tmp_path: Path) -> None:
    for folder in ("numbers/day=20400", "dates/day=2025-11-08"):
        (tmp_path / folder).mkdir(parents=True)
        pq.write_table(pa.table({"x": [1]}), tmp_path / folder / "f.parquet")
    key = "spark.sql.sources.partitionColumnTypeInference.enabled"
    assert spark.conf.get(key) == "false"  # the engine's session setting
    assert spark.read.parquet(str(tmp_path / "numbers")).schema["day"].dataType == T.StringType()
    assert spark.read.parquet(str(tmp_path / "dates")).schema["day"].dataType == T.StringType()
    spark.conf.set(key, "true")
    try:
        assert spark.read.parquet(str(tmp_path / "numbers")).schema["day"].dataType == T.IntegerType()
        assert spark.read.parquet(str(tmp_path / "dates")).schema["day"].dataType == T.DateType()
    finally:
        spark.conf.set(key, "false")


@pytest.mark.parametrize("reader", READERS)
def test_tasks_read_several_files_and_no_report_is_shuffled(
    spark: SparkSession, dataset: dict[str, Any], reader: Reader
) -> None:
    files = list_parts(dataset["root"], "hcms")
    spec = dataset["specs"]["hcms"]
    partials = SparkEngine(spark, reader=reader).partials("hcms", spec, files)
    assert partials.rdd.getNumPartitions() < len(files)
    plan = partials._jdf.queryExecution().executedPlan().toString()
    assert "MapInArrow" in plan and "Exchange" not in plan, plan
    rows = partials.collect()
    assert sum(r.n for r in rows) == sum(len(b) for b in dataset["batches"] if b.metric == "hcms")
    assert max(len(r.sums) for r in rows) < 8 * spec.num_hashes * spec.width + 512  # one int64 sketch, a header


def test_packed_sums_round_trip_and_refuse_cut_bytes() -> None:
    sums = {"signed": np.arange(12, dtype=np.int64).reshape(3, 4) - 5, "rows": np.array([2**62, -1], dtype=np.int64)}
    back = unpack_sums(pack_sums(sums))
    assert back.keys() == sums.keys()
    for k in sums:
        assert back[k].dtype == sums[k].dtype
        np.testing.assert_array_equal(back[k], sums[k])
    with pytest.raises(DatasetError, match="cut short"):
        unpack_sums(pack_sums(sums)[:-1])
    with pytest.raises(DatasetError, match="too many"):
        unpack_sums(pack_sums(sums) + b"\x00")
