"""``ldp synth``: each method's --json, the written table, synthetic telemetry from the command line, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from estimator.synth.data import population
from estimator.synth.io import write_table


def ldp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ldp_cli", "synth", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def small_csv(tmp_path: Path) -> Path:
    path = tmp_path / "in.csv"
    write_table(population(400, 2).select(["platform", "network", "crashes"]), path)
    return path


def test_mst_and_dpgan_write_tables_and_print_their_epsilon(small_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "mst.parquet"
    r = ldp("--method", "mst", "--input", str(small_csv), "--rows", "123", "--out", str(out), "--seed", "3", "--json")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["method"] == "mst" and body["epsilon"] == pytest.approx(1.0) and body["rho"] > 0
    assert body["seed_warning"]
    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["platform", "network", "crashes"] and len(frame) == 123
    real = pd.read_csv(small_csv, dtype=str)
    for c in frame.columns:
        assert set(frame[c]) <= set(real[c])
    r = ldp("--method", "dpgan", "--input", str(small_csv), "--steps", "40", "--epsilon", "2", "--json")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert 0 < body["epsilon"] <= 2.0 and body["noise_multiplier"] > 0 and body["rows"] == 400


def test_ldp_marginals_from_the_command_line(small_csv: Path) -> None:
    r = ldp(
        "--method",
        "ldp-marginals",
        "--input",
        str(small_csv),
        "--epsilon",
        "2",
        "--sdk-devices",
        "3",
        "--seed",
        "4",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["epsilon_local"] == 2.0 and body["devices"] == 400 and body["sdk_devices"] == 3
    assert body["reports"] == 400 and len(body["consistency"]) == 3
    assert "record" in body["protects"]


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    r = ldp("--method", "aim", "--input", str(tmp_path / "missing.csv"))
    assert r.returncode == 2 and "cannot read" in r.stderr
    one = tmp_path / "one.csv"
    one.write_text("a\nx\n")
    r = ldp("--method", "mst", "--input", str(one))
    assert r.returncode == 2 and "two columns" in r.stderr
    r = ldp("--method", "mst", "--epsilon", "0")
    assert r.returncode == 2
