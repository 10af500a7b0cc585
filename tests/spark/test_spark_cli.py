"""``ldp estimate --engine spark`` through the real command line, and its errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession

from estimator.jobs.batch import estimate_dataset
from ldp_cli.main import main
from tests.spark.conftest import DAYS


def test_ldp_estimate_on_spark_writes_the_default_engines_table(
    spark: SparkSession, dataset: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.parquet"
    days = f"{DAYS[0]}..{DAYS[-1]}"
    # the fixture's session is the one running in this process: the CLI reuses it, and leaves it running
    argv = ["estimate", "--dataset", str(dataset["root"]), "--metric", "hcms", "--days", days, "--per-day"]
    rc = main([*argv, "--norm-sub", "--out", str(out), "--no-progress", "--engine", "spark", "--master", "local[2]"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    want = estimate_dataset(dataset["root"], "hcms", range(DAYS[0], DAYS[-1] + 1), per_day=True, norm_sub=True)
    assert summary == want.summary()
    got = pd.read_parquet(out)
    assert list(got.columns) == list(want.table.columns)
    for col in got.columns:
        np.testing.assert_array_equal(got[col].to_numpy(), want.table[col].to_numpy(), err_msg=col)
    assert not spark.sparkContext._jsc.sc().isStopped()


def test_a_missing_dataset_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["estimate", "--dataset", str(tmp_path / "nope"), "--metric", "olh", "--engine", "spark"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no part files of metric 'olh'" in err and str(tmp_path / "nope") in err


@pytest.mark.parametrize("master", ["nosuch://host", "local[0]", "local[two]", ""])
def test_a_bad_master_is_a_clear_error(
    dataset: dict[str, Any], master: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        ["estimate", "--dataset", str(dataset["root"]), "--metric", "olh", "--engine", "spark", "--master", master]
    )
    assert rc == 2
    assert f"--master {master!r} is not a Spark master URL" in capsys.readouterr().err


def test_master_needs_the_spark_engine(dataset: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["estimate", "--dataset", str(dataset["root"]), "--metric", "olh", "--master", "local[2]"])
    assert rc == 2
    assert "--master and --spark-reader are for --engine spark" in capsys.readouterr().err


def test_another_master_than_the_running_sessions_is_refused(
    spark: SparkSession, dataset: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        ["estimate", "--dataset", str(dataset["root"]), "--metric", "olh", "--engine", "spark", "--master", "local[1]"]
    )
    assert rc == 2
    assert "a Spark session on 'local[2]' is running in this process" in capsys.readouterr().err


def test_spark_stages_are_announced_on_stderr_only_when_asked(
    spark: SparkSession, dataset: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #30: a Spark estimate ran up to 38 s silently. With --progress a line per stage goes to stderr and
    stdout stays one JSON object; with --json alone (or piped, as here) nothing is added."""
    argv = ["estimate", "--dataset", str(dataset["root"]), "--metric", "hcms", "--json", "--engine", "spark"]
    argv += ["--master", "local[2]"]
    assert main([*argv, "--progress"]) == 0
    forced = capsys.readouterr()
    assert json.loads(forced.out)["metric"] == "hcms" and forced.out.count("\n") == 1
    stages = [line for line in forced.err.splitlines() if line.startswith("ldp estimate --engine spark: ")]
    said = [s.split(": ", 1)[1].split(" (at ")[0] for s in stages]
    assert len(said) == 3 and said[0] == "using the running Spark session", forced.err
    assert re.fullmatch(r"hcms: job 1 of 2, the batch facts of \d+ files", said[1]), said
    assert said[2] == "hcms: job 2 of 2, the reports' states (read, accumulate, tree reduce)"
    assert main(argv) == 0
    assert "--engine spark:" not in capsys.readouterr().err
