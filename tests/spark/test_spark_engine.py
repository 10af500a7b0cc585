"""The Spark engine (:mod:`estimator.jobs.spark`) against the default one, on the same dataset written by the sink."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pyspark.sql import SparkSession

from estimator.jobs.batch import BatchResult, accumulate, estimate_dataset
from estimator.jobs.spark import READERS, Reader, SparkEngine
from pipeline.dataset import list_parts
from tests.spark.conftest import DAYS, assert_same_states, part_count

METRICS = ["olh", "hcms", "latency", "battery"]


def _same_result(a: BatchResult, b: BatchResult) -> None:
    assert a.summary() == b.summary()
    assert a.estimates.keys() == b.estimates.keys()
    assert list(a.table.columns) == list(b.table.columns)
    for col in a.table.columns:
        np.testing.assert_array_equal(a.table[col].to_numpy(), b.table[col].to_numpy(), err_msg=col)
    assert a.table.attrs == b.table.attrs


def test_the_dataset_has_several_files_per_day(dataset: dict[str, Any]) -> None:
    for metric in METRICS:
        for day in DAYS:
            assert part_count(dataset["root"], metric, day) >= 2, (metric, day)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("metric", METRICS)
def test_states_equal_the_default_engines_bit_for_bit(
    spark: SparkSession, dataset: dict[str, Any], metric: str, reader: Reader
) -> None:
    parts = list_parts(dataset["root"], metric)
    for per_day in (False, True):
        want = accumulate(parts, per_day=per_day)
        assert_same_states(SparkEngine(spark, reader=reader)(parts, per_day=per_day), want)


@pytest.mark.parametrize("metric", METRICS)
def test_estimates_equal_the_default_engines(spark: SparkSession, dataset: dict[str, Any], metric: str) -> None:
    days = range(DAYS[0], DAYS[1] + 1)
    for per_day in (False, True):
        want = estimate_dataset(dataset["root"], metric, days, per_day=per_day, progress=False)
        got = estimate_dataset(
            dataset["root"], metric, days, per_day=per_day, progress=False, engine=SparkEngine(spark)
        )
        _same_result(got, want)
