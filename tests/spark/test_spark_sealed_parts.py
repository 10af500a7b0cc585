"""The Spark batch job on a sealed metric-day split into parts (issue 31).

The real shuffler splits each released sealed batch by its records' encapsulated keys over 4 partitions, so the
real Parquet sink writes the metric-day as part files from every partition, each listing the envelopes of its
parts (``release_id``, ``release_n``, ``part``, ``parts``). A hostile collector also re-posts counted ciphertexts
with fresh ones in a new upload: its release is split like the others and the sink drops the replays (the
dataset holds opened records only, so neither engine deduplicates). ``ldp estimate --engine spark`` answers
exactly what ``ldp estimate --dataset`` (the default engine) answers: the same summary (n, batches, files, the
central figure every part carries), the same table.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession

from collector.sinks.parquet import ParquetSink
from estimator.jobs.batch import accumulate, estimate_dataset
from estimator.jobs.spark import READERS, Reader, SparkEngine
from ldp_cli.main import main
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.dataset import list_parts, parse_part_name
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import open_transport
from tests.spark.conftest import assert_same_states
from tests.support.collector_support import TODAY
from tests.support.spread_members import run_shuffler, sealed_opener, sealed_upload, sealed_word_metrics

SIZE = 128
UPLOADS, PER_UPLOAD, MIN_BATCH = 10, 40, 40
REPLAYED = 12  # counted ciphertexts (two from each of 6 uploads) re-posted with 28 fresh ones


@pytest.fixture(scope="module")
def sealed_dataset(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    tmp = tmp_path_factory.mktemp("sealed-parts")
    metrics, folder = sealed_word_metrics(tmp, SIZE, epsilon=2.0)
    rng = np.random.default_rng(47)
    uploads = [sealed_upload(metrics, PER_UPLOAD, SIZE, rng) for _ in range(UPLOADS)]
    transport = open_transport(f"sqlite:///{tmp}/log.sqlite3", synchronous="NORMAL")
    transport.create_topic(SHUFFLED_TOPIC, 4)
    guarantee = lambda n, e0: (e0 / n**0.5, 1e-6, "test")  # noqa: E731 - a central figure on every part
    run_shuffler(tmp, transport, metrics, uploads, min_batch=MIN_BATCH, guarantee=guarantee)
    fresh = sealed_upload(metrics, MIN_BATCH - REPLAYED, SIZE, rng)
    replayed = np.concatenate([u.records[:2] for u in uploads[: REPLAYED // 2]])
    mixed = np.concatenate([replayed, fresh.records])[rng.permutation(MIN_BATCH)]
    attack = ReportBatch("word", fresh.spec, TODAY, mixed, uuid.uuid4().bytes)
    run_shuffler(tmp, transport, metrics, [attack], min_batch=MIN_BATCH, guarantee=guarantee)
    # chunks of at most 3 parts: several files per partition, from every partition
    sink = ParquetSink(transport, tmp / "ds", SpecCatalog([metrics]), flush_seconds=0.0, opener=sealed_opener(folder))
    sink.run(idle_timeout=0.5, max_records=3)
    sink.close()
    transport.close()
    assert sink.stats.sealed_replays_dropped == REPLAYED and sink.stats.sealed_misrouted == 0
    return {"root": tmp / "ds", "n": UPLOADS * PER_UPLOAD + MIN_BATCH - REPLAYED}


def test_the_sealed_metric_day_is_split_over_partitions_and_files(sealed_dataset: dict) -> None:  # type: ignore[type-arg]
    files = sorted((sealed_dataset["root"] / "metric=word" / f"day={TODAY}").glob("part-*.parquet"))
    partitions = {parse_part_name(f.name)["partition"] for f in files}  # type: ignore[index]
    assert len(files) > 4 and len(partitions) == 4, [f.name for f in files]


@pytest.mark.parametrize("reader", READERS)
def test_spark_states_equal_the_default_engines_on_split_parts(
    spark: SparkSession,
    sealed_dataset: dict,  # type: ignore[type-arg]
    reader: Reader,
) -> None:
    parts = list_parts(sealed_dataset["root"], "word")
    for per_day in (False, True):
        want = accumulate(parts, per_day=per_day)
        got = SparkEngine(spark, reader=reader)(parts, per_day=per_day)
        assert_same_states(got, want)
        assert sum(w.acc.n for w in want.values()) == sealed_dataset["n"]


def test_ldp_estimate_on_spark_equals_ldp_estimate_on_a_split_sealed_metric_day(
    spark: SparkSession,
    sealed_dataset: dict,  # type: ignore[type-arg]
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["estimate", "--dataset", str(sealed_dataset["root"]), "--metric", "word", "--days", str(TODAY)]
    tables = []
    summaries = []
    for i, engine in enumerate((["--engine", "default"], ["--engine", "spark", "--master", "local[2]"])):
        out = tmp_path / f"t{i}.parquet"
        capsys.readouterr()
        assert main([*argv, "--json", "--no-progress", "--out", str(out), *engine]) == 0
        summaries.append(json.loads(capsys.readouterr().out.splitlines()[0]))
        tables.append(pd.read_parquet(out))
    want, got = summaries
    assert want["n"] == sealed_dataset["n"]
    assert got == want
    assert list(tables[1].columns) == list(tables[0].columns)
    for col in tables[0].columns:
        np.testing.assert_array_equal(tables[1][col].to_numpy(), tables[0][col].to_numpy(), err_msg=col)
    # and the default engine is the estimate_dataset the service's tests compare against
    assert estimate_dataset(sealed_dataset["root"], "word", [TODAY], progress=False).summary()["n"] == want["n"]
