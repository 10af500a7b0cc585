"""``ldp estimate --engine spark`` answers every kind of metric (frequency, mean, distribution, the repeated
counters, heavy hitters) with the default engine's JSON object, key for key.

Integer sums are exact in any order and heavy-hitter discovery runs the same code over the same sums, so the
two engines must agree exactly; only ``seconds`` (a heavy-hitter run's wall time) differs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from ldp_cli.main import main
from tests.support.kinds_dataset import METRICS, write_kinds_dataset


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return write_kinds_dataset(tmp_path_factory.mktemp("spark-kinds"))


def _answer(capsys: pytest.CaptureFixture[str], root: Path, metric: str, *extra: str) -> dict[str, Any]:
    argv = ["estimate", "--dataset", str(root), "--metric", metric, "--json", "--no-progress", "--top", "10"]
    assert main([*argv, *extra]) == 0
    obj: dict[str, Any] = json.loads(capsys.readouterr().out)
    obj.pop("seconds", None)
    return obj


def test_every_kind_on_spark_gives_the_default_engines_answer(
    spark: SparkSession, kinds: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    seen = set()
    for metric in METRICS:
        want = _answer(capsys, kinds["root"], metric)
        # the fixture's session is the one running in this process: the CLI reuses it, and leaves it running
        got = _answer(capsys, kinds["root"], metric, "--engine", "spark", "--master", "local[2]")
        assert got == want, metric
        seen.add(got["kind"])
    assert seen == {"frequency", "mean", "distribution", "heavy_hitters"}
    assert not spark.sparkContext._jsc.sc().isStopped()
