"""``ldp privacy``: the JSON contract (names, flags, keys), through the installed
console script and in-process."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import dp_accounting as dpa
import pytest

from ldp_cli.main import main

LDP = Path(sys.executable).with_name("ldp")


def run_ldp(*args: str) -> dict:
    """Run the installed ``ldp`` script; stdout must be exactly one JSON object."""
    proc = subprocess.run([str(LDP), *args], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout)
    assert isinstance(obj, dict)
    return obj


def run_inprocess(capsys, *args: str) -> dict:
    assert main(list(args)) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_gaussian_json_contract_via_console_script():
    obj = run_ldp(
        "privacy", "gaussian", "--noise-multiplier", "1.0", "--sample-rate", "0.01",
        "--steps", "100", "--delta", "1e-5", "--json",
    )
    assert {"epsilon_pld", "epsilon_rdp"} <= set(obj)
    assert obj["epsilon_pld"] == pytest.approx(0.718, abs=1e-3)
    assert obj["epsilon_rdp"] == pytest.approx(1.214, abs=1e-3)
    assert "protects" in obj


def test_shuffle_json_contract_via_console_script():
    obj = run_ldp("privacy", "shuffle", "--epsilon0", "4", "--users", "100000", "--delta", "1e-6", "--json")
    # Feldman, McMillan, Talwar's published example (see test_shuffle_amplification.py)
    assert 0.1675 - 5.3e-4 <= obj["epsilon"] <= 0.1728
    assert obj["epsilon_closed_form"] == pytest.approx(0.5378040242374512, rel=1e-9)
    assert obj["epsilon0"] == 4.0 and obj["users"] == 100000


def test_gaussian_in_process_full_batch_is_exact(capsys):
    obj = run_inprocess(
        capsys, "privacy", "gaussian", "--noise-multiplier", "2.0", "--sample-rate", "1",
        "--steps", "4", "--delta", "1e-5", "--json",
    )
    # 4 steps of multiplier 2 = one Gaussian with multiplier 1
    assert obj["epsilon_exact"] == pytest.approx(float(dpa.get_epsilon_gaussian(1.0, 1e-5)), rel=1e-9)
    assert obj["epsilon_exact"] <= obj["epsilon_pld"] <= obj["epsilon_exact"] + 2e-3
    assert obj["epsilon_rdp"] > obj["epsilon_pld"]
    assert obj["epsilon"] == obj["epsilon_exact"]


def test_gaussian_reports_incomplete_rdp(capsys):
    obj = run_inprocess(
        capsys, "privacy", "gaussian", "--noise-multiplier", "0.5", "--sample-rate", "0.2",
        "--steps", "1", "--delta", "1e-5", "--discretization", "1e-3", "--json",
    )
    assert obj["rdp_complete"] is False and 1.1 in obj["rdp_dropped_orders"]
    assert obj["epsilon_rdp"] >= obj["epsilon_pld"]
    main(["privacy", "gaussian", "--noise-multiplier", "0.5", "--sample-rate", "0.2", "--steps", "1", "--delta", "1e-5",
          "--discretization", "1e-3"])
    text = capsys.readouterr().out
    assert "incomplete" in text and "did not converge" in text and "protects:" in text


def test_replace_neighbours_flag(capsys):
    add = run_inprocess(capsys, "privacy", "gaussian", "--noise-multiplier", "4", "--sample-rate", "1",
                        "--steps", "1", "--delta", "1e-6", "--json")
    rep = run_inprocess(capsys, "privacy", "gaussian", "--noise-multiplier", "4", "--sample-rate", "1",
                        "--steps", "1", "--delta", "1e-6", "--neighbors", "replace", "--json")
    assert rep["neighbors"] == "replace"
    # replace-one with multiplier 4 is add/remove with multiplier 2
    assert rep["epsilon_exact"] == pytest.approx(float(dpa.get_epsilon_gaussian(2.0, 1e-6)), rel=1e-9)
    assert rep["epsilon_exact"] > add["epsilon_exact"]


def test_noise_and_steps_for_a_target(capsys):
    obj = run_inprocess(capsys, "privacy", "gaussian-noise", "--target-epsilon", "2", "--sample-rate", "1",
                        "--steps", "9", "--delta", "1e-5", "--json")
    assert obj["epsilon_pld"] <= 2.0
    assert obj["noise_multiplier"] / 3 == pytest.approx(dpa.get_sigma_gaussian(2.0, 1e-5), rel=3e-3)
    steps = run_inprocess(capsys, "privacy", "gaussian-steps", "--noise-multiplier", str(obj["noise_multiplier"]),
                          "--sample-rate", "1", "--target-epsilon", "2", "--delta", "1e-5", "--json")
    assert steps["steps"] == 9


def test_shuffle_epsilon0_and_local(capsys):
    obj = run_inprocess(capsys, "privacy", "shuffle-epsilon0", "--target-epsilon", "0.5", "--users", "100000",
                        "--delta", "1e-6", "--json")
    assert obj["epsilon"] <= 0.5 and obj["epsilon0"] > 0.5
    loc = run_inprocess(capsys, "privacy", "local", "--epsilon", "1", "--reports", "10", "--delta", "1e-6", "--json")
    assert loc["epsilon_basic"] == pytest.approx(10.0)
    p_top = (math.e / (1 + math.e)) ** 10
    assert loc["epsilon_pld"] == pytest.approx(10 + math.log(1 - 1e-6 / p_top), abs=2e-4)
    assert "not the fact that the user sent reports" in loc["protects"]


def test_bad_input_exits_with_a_message(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["privacy", "gaussian", "--noise-multiplier", "1", "--sample-rate", "2", "--steps", "3", "--delta", "1e-5"])
    assert exc.value.code == 2
    assert "must be in (0, 1]" in capsys.readouterr().err
    # δ = 1 passes the flag's range check but no accountant accepts it: exit 2 with the reason
    assert main(["privacy", "shuffle", "--epsilon0", "1", "--users", "10", "--delta", "1"]) == 2
    assert "delta must be in (0, 1)" in capsys.readouterr().err


def test_bad_delta_via_console_script():
    proc = subprocess.run(
        [str(LDP), "privacy", "shuffle", "--epsilon0", "1", "--users", "10", "--delta", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2 and "delta" in proc.stderr and proc.stdout == ""
