"""A local SparkSession for the whole test session, and a small dataset written by the real Parquet sink.

PySpark is the optional ``spark`` extra, which ``scripts/bootstrap`` installs: these tests import it at
the top and so fail (they are never skipped) where it is missing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark.sql import SparkSession

from collector.sinks.parquet import ParquetSink
from estimator.jobs.spark import spark_session
from ldp_core.mechanisms import make_spec
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import open_transport
from tests.support.shuffled_data import publish

DAYS = [20400, 20401, 20402]


def dataset_specs() -> dict[str, ReportSpec]:
    """Two frequency oracles (OLH, HCMS) and two numeric metrics (a mean and a distribution)."""
    return {
        "olh": make_spec("olh", epsilon=2.0, domain_size=64),
        "hcms": make_spec("hcms", epsilon=3.0, domain_size=200, num_hashes=16, width=32, hash_seed=5),
        "latency": make_spec("pm", epsilon=4.0, low=0, high=100, dims=3, sample=2),
        "battery": make_spec("sw", epsilon=2.0, low=0, high=1, bins=16),
    }


def simulated_batches(
    specs: dict[str, ReportSpec], days: list[int], per_metric_day: int, rng: np.random.Generator
) -> list[ReportBatch]:
    """A population's reports: Zipf-like items for the frequency metrics, Beta values for the numeric ones,
    cut into batches of random sizes (several batches per metric and day)."""
    out = []
    for day in days:
        for metric, spec in sorted(specs.items()):
            for _ in range(per_metric_day):
                n = int(rng.integers(40, 160))
                if metric in ("olh", "hcms"):
                    d = spec.domain_size  # type: ignore[attr-defined]
                    w = 1.0 / np.arange(1, d + 1) ** 1.1
                    values: Any = rng.choice(d, size=n, p=w / w.sum())
                elif metric == "latency":
                    values = 100 * rng.beta(2.0, 5.0, size=(n, 3))
                else:
                    values = rng.beta(2.0, 2.0, size=n)
                out.append(ReportBatch(metric, spec, day, spec.encode(values, rng), rng.bytes(16)))
    return out


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """local[2], UI off, 2 shuffle partitions, 1 GB of driver memory (the module's other settings apply)."""
    session = spark_session(
        "local[2]",
        app_name="ldp-tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("spark-dataset")
    specs = dataset_specs()
    batches = simulated_batches(specs, DAYS, 4, np.random.default_rng(2026))
    transport = open_transport(f"sqlite:///{root}/log.sqlite3", synchronous="NORMAL")
    transport.create_topic(SHUFFLED_TOPIC, 2)
    publish(transport, SHUFFLED_TOPIC, batches)
    catalog = SpecCatalog()
    for metric, spec in specs.items():
        catalog.add(metric, spec)
    # chunks of at most 3 batches: several part files per metric and day
    sink = ParquetSink(transport, root / "ds", catalog, flush_seconds=0.0)
    sink.run(idle_timeout=0.5, max_records=3)
    sink.close()
    transport.close()
    return {"root": root / "ds", "specs": specs, "batches": batches}


def part_count(root: Path, metric: str, day: int) -> int:
    return len(list((root / f"metric={metric}" / f"day={day}").glob("part-*.parquet")))


def assert_same_states(got: Mapping[Any, Any], want: Mapping[Any, Any]) -> None:
    """The Spark engine's partial states (``got``) equal the default engine's (``want``) bit for bit: the same keys,
    days, files, batches, central figure, each day's worst batch, and the same integer sums of the same dtype."""
    assert got.keys() == want.keys()
    for key, w in want.items():
        g = got[key]
        assert (g.days, g.files, g.batches) == (w.days, w.files, w.batches)
        assert (g.central_epsilon, g.central_delta) == (w.central_epsilon, w.central_delta)
        assert g.worst_by_day == w.worst_by_day  # each day's worst batch: the per-person ε composes them
        assert g.acc.n == w.acc.n > 0
        assert g.acc.sums.keys() == w.acc.sums.keys()
        for k, arr in w.acc.sums.items():
            assert g.acc.sums[k].dtype == arr.dtype
            np.testing.assert_array_equal(g.acc.sums[k], arr)
