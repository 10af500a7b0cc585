"""``ldp heavy-hitters --engine spark``: the same discovery as the default engine's, bit for bit.

The dataset is written the way tests/estimator/test_heavy_hitters_batch.py writes its own: a population of
words encoded by PEM and SFP, cut into batches over three days, published as shuffled batches and stored by
the real Parquet sink (several part files per day). Every statistic discovery reads is an int64 sum, merged
in whatever order Spark's tree reduce takes, so the estimates must be equal exactly, not approximately.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession

from collector.sinks.parquet import ParquetSink
from estimator.jobs.heavy_hitters import HeavyHitterResult, discover_dataset
from estimator.jobs.heavy_hitters_spark import SFPSums, discover_spark
from estimator.jobs.spark import READERS, Reader, SparkEngine
from ldp_cli.main import main
from ldp_core.mechanisms import make_spec
from ldp_core.mechanisms.heavy_hitters import PEMSpec, SFPSpec, pad_values
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.dataset import list_parts
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import open_transport
from tests.spark.conftest import DAYS
from tests.support.shuffled_data import publish

# words of at most 4 UTF-8 bytes ("thé" is 4): PEM over 32 bits instead of 64
WORDS = {"wind": 3000, "news": 2000, "thé": 1500, "maps": 1000}
SPECS = {
    # 3 levels (16 + 8 + 8 = 32 bits): three Spark jobs after the one that caches the reports by level, each
    # over candidates the driver chose from the previous level's merged counts. 2^16 first-level keys, then
    # 8 kept prefixes x 2^8 extensions: a few hundred million hash evaluations in all, not the billions of
    # 16-bit steps (8 x 2^16 keys a level), which made the test take minutes.
    "search": PEMSpec(epsilon=6.0, length=4, start_bits=16, step_bits=8),
    "emoji": SFPSpec(epsilon=8.0, length=8, num_hashes=16, width=1024, hash_bits=4),
    "emoji_cms": SFPSpec(epsilon=8.0, length=8, num_hashes=16, width=1024, hash_bits=4, sketch="cms"),
    "tab": make_spec("grr", epsilon=1.0, domain_size=4),
}


@pytest.fixture(scope="module")
def hh_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("spark-hh")
    rng = np.random.default_rng(16)
    batches: list[ReportBatch] = []
    for metric in ("search", "emoji", "emoji_cms"):
        spec = SPECS[metric]
        assert isinstance(spec, (PEMSpec, SFPSpec))
        values = np.repeat(pad_values(list(WORDS), spec.length), list(WORDS.values()), axis=0)
        recs = spec.encode(values[rng.permutation(values.shape[0])], rng)
        for i, chunk in enumerate(np.array_split(recs, 9)):
            batches.append(ReportBatch(metric, spec, DAYS[i % 3], chunk, rng.bytes(16)))
    tab = SPECS["tab"]
    batches.append(ReportBatch("tab", tab, DAYS[0], tab.encode(rng.integers(0, 4, 300), rng), rng.bytes(16)))
    t = open_transport(f"sqlite:///{tmp}/log.sqlite3", synchronous="NORMAL")
    t.create_topic(SHUFFLED_TOPIC, 2)
    publish(t, SHUFFLED_TOPIC, batches)
    root = tmp / "ds"
    # chunks of at most 2 batches: several part files per metric and day, so several tasks and partial states
    sink = ParquetSink(t, root, SpecCatalog(specs=list(SPECS.items())), flush_seconds=0.0)
    sink.run(idle_timeout=0.6, max_records=2)
    sink.close()
    t.close()
    return root


def assert_same(got: HeavyHitterResult, want: HeavyHitterResult) -> None:
    assert got.summary() | {"seconds": 0} == want.summary() | {"seconds": 0}
    assert got.discovery.candidates == want.discovery.candidates
    assert [(h.raw, h.estimate, h.variance, h.ci_low, h.ci_high) for h in got.discovery.found] == [
        (h.raw, h.estimate, h.variance, h.ci_low, h.ci_high) for h in want.discovery.found
    ]
    pd.testing.assert_frame_equal(got.table, want.table, check_exact=True)


@pytest.mark.parametrize("metric", ["search", "emoji", "emoji_cms"])
def test_spark_discovery_equals_the_default_engines_bit_for_bit(
    spark: SparkSession, hh_root: Path, metric: str
) -> None:
    want = discover_dataset(hh_root, metric, DAYS, top=4)
    got = discover_dataset(hh_root, metric, DAYS, top=4, engine=SparkEngine(spark))
    assert got.files == want.files > 3  # several files: several tasks' states were merged
    assert got.n == sum(WORDS.values())
    assert_same(got, want)
    # and it is a discovery, not two equal failures (the rarest word, 1000 of 7500, is at SFP's edge at this n)
    assert set(WORDS) - {"maps"} <= set(got.table["value"])


def test_pem_without_the_level_cache_gives_the_same_discovery(spark: SparkSession, hh_root: Path) -> None:
    # discover_dataset's PEM above reads the files once and caches them by level; this is one pass per level
    spec = SPECS["search"]
    assert isinstance(spec, PEMSpec)
    want = discover_dataset(hh_root, "search", DAYS, top=4)
    got, per_level = discover_spark(
        SparkEngine(spark), "search", spec, list_parts(hh_root, "search"), 4, cache_levels=False
    )
    assert per_level == want.parts and sum(per_level) == sum(WORDS.values())
    assert [(h.raw, h.estimate, h.variance, h.ci_low, h.ci_high) for h in got.top(4)] == [
        (h.raw, h.estimate, h.variance, h.ci_low, h.ci_high) for h in want.discovery.top(4)
    ]


@pytest.mark.parametrize("reader", READERS)
def test_tasks_emit_sketch_sums_and_no_report_is_shuffled(spark: SparkSession, hh_root: Path, reader: Reader) -> None:
    files = list_parts(hh_root, "emoji")
    spec = SPECS["emoji"]
    assert isinstance(spec, SFPSpec)
    partials = SparkEngine(spark, reader=reader).partials("emoji", spec, files, SFPSums)  # type: ignore[arg-type]
    plan = partials._jdf.queryExecution().executedPlan().toString()
    assert "MapInArrow" in plan and "Exchange" not in plan, plan
    rows = partials.collect()
    assert sum(r.n for r in rows) == sum(WORDS.values())
    # a state is 1 + positions sketches of k·m int64 and a header, whatever the number of reports
    size = 8 * spec.num_hashes * spec.width * (1 + spec.num_positions)
    assert max(len(r.sums) for r in rows) < size + 1024


def test_spark_parquet_reader_gives_the_same_discovery(spark: SparkSession, hh_root: Path) -> None:
    want = discover_dataset(hh_root, "emoji", DAYS, top=4)
    assert_same(discover_dataset(hh_root, "emoji", DAYS, top=4, engine=SparkEngine(spark, reader="spark")), want)


def test_ldp_heavy_hitters_engine_spark(
    spark: SparkSession, hh_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hh.parquet"
    # SFP: one Spark job (PEM's per-level jobs are covered above, through the same discover_dataset)
    argv = ["heavy-hitters", "--dataset", str(hh_root), "--metric", "emoji", "--top", "3", "--out", str(out)]
    # the fixture's session is the one running in this process: the command reuses it, and leaves it running
    assert main([*argv, "--engine", "spark", "--master", "local[2]"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    want = discover_dataset(hh_root, "emoji", None, top=3)
    assert summary | {"seconds": 0} == want.summary() | {"seconds": 0}
    pd.testing.assert_frame_equal(pd.read_parquet(out), want.table, check_exact=True)
    assert not spark.sparkContext._jsc.sc().isStopped()


@pytest.mark.parametrize(
    "extra,word",
    [
        (["--metric", "search", "--master", "local[2]"], "--master and --spark-reader are for --engine spark"),
        (["--metric", "search", "--spark-reader", "spark"], "--master and --spark-reader are for --engine spark"),
        (["--metric", "search", "--engine", "spark", "--master", "nowhere"], "is not a Spark master URL"),
        (["--metric", "tab", "--engine", "spark"], "use `ldp estimate`"),
    ],
)
def test_engine_option_errors_exit_2(
    hh_root: Path, extra: list[str], word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["heavy-hitters", "--dataset", str(hh_root), *extra]) == 2
    assert word in capsys.readouterr().err
