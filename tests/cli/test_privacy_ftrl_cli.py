"""``ldp privacy ftrl``: the contract of issue 13 (flags, key ``epsilon``), through the console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from estimator.fl.ftrl import ftrl_epsilon, ftrl_epsilon_rdp
from ldp_cli.main import main

LDP = Path(sys.executable).with_name("ldp")


def test_ftrl_json_contract_via_console_script() -> None:
    args = ["privacy", "ftrl", "--noise-multiplier", "1.0", "--rounds", "100", "--delta", "1e-5", "--json"]
    proc = subprocess.run([str(LDP), *args], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout)
    assert obj["epsilon"] == ftrl_epsilon(1.0, 100, 1e-5)
    assert obj["epsilon_rdp"] == ftrl_epsilon_rdp(1.0, 100, 1e-5)
    assert (obj["rounds"], obj["delta"], obj["noise_multiplier"], obj["restarts"]) == (100, 1e-5, 1.0, 0)
    assert obj["nodes_per_client"] == 7  # ⌈log2(101)⌉
    assert "protects" in obj


def test_ftrl_restarts_and_neighbors(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["privacy", "ftrl", "--noise-multiplier", "2.5", "--rounds", "100", "--delta", "1e-5"]
    assert main([*argv, "--restart-every", "2", "--neighbors", "replace", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["epsilon"] == ftrl_epsilon(2.5, 100, 1e-5, 2, "replace")
    assert (obj["trees"], obj["restarts"], obj["nodes_per_client"], obj["neighbors"]) == (50, 49, 100, "replace")


@pytest.mark.parametrize(
    "bad",
    [
        ["--noise-multiplier", "0", "--rounds", "10", "--delta", "1e-5"],
        ["--noise-multiplier", "1", "--rounds", "0", "--delta", "1e-5"],
        ["--noise-multiplier", "1", "--rounds", "10", "--delta", "1.5"],
        ["--noise-multiplier", "1", "--rounds", "10"],
    ],
)
def test_ftrl_bad_input_is_a_clear_error(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["privacy", "ftrl", *bad, "--json"])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err
