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
        "privacy",
        "gaussian",
        "--noise-multiplier",
        "1.0",
        "--sample-rate",
        "0.01",
        "--steps",
        "100",
        "--delta",
        "1e-5",
        "--json",
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


def test_shuffle_reports_per_user_is_the_per_person_bound(capsys):
    """--reports-per-user R: the same keys as without it, and ε is the bound for ⌈users / R⌉ people of R·ε₀ each
    (a neighbouring dataset changes all R reports of one person)."""
    from estimator.accounting.shuffle import numerical_epsilon

    base = run_inprocess(
        capsys, "privacy", "shuffle", "--epsilon0", "1", "--users", "1000", "--delta", "1e-6", "--json"
    )
    per_person = run_inprocess(
        capsys,
        "privacy",
        "shuffle",
        "--epsilon0",
        "1",
        "--users",
        "1000",
        "--delta",
        "1e-6",
        "--reports-per-user",
        "2",
        "--json",
    )
    assert set(base) <= set(per_person)
    assert base["reports_per_user"] == 1 and base["people"] == 1000
    assert per_person["epsilon0"] == 1.0 and per_person["users"] == 1000
    assert per_person["reports_per_user"] == 2 and per_person["people"] == 500
    assert per_person["epsilon"] == numerical_epsilon(2.0, 500, 1e-6)
    assert per_person["epsilon"] > 4 * base["epsilon"]  # the per-report figure understated it
    odd = run_inprocess(
        capsys,
        "privacy",
        "shuffle",
        "--epsilon0",
        "1",
        "--users",
        "1001",
        "--delta",
        "1e-6",
        "--reports-per-user",
        "2",
        "--json",
    )
    assert odd["people"] == 501  # at least ⌈1001 / 2⌉ people sent them
    with pytest.raises(SystemExit) as refused:
        main(["privacy", "shuffle", "--epsilon0", "1", "--users", "10", "--delta", "1e-6", "--reports-per-user", "0"])
    assert refused.value.code == 2


def test_gaussian_in_process_full_batch_is_exact(capsys):
    obj = run_inprocess(
        capsys,
        "privacy",
        "gaussian",
        "--noise-multiplier",
        "2.0",
        "--sample-rate",
        "1",
        "--steps",
        "4",
        "--delta",
        "1e-5",
        "--json",
    )
    # 4 steps of multiplier 2 = one Gaussian with multiplier 1
    assert obj["epsilon_exact"] == pytest.approx(float(dpa.get_epsilon_gaussian(1.0, 1e-5)), rel=1e-9)
    assert obj["epsilon_exact"] <= obj["epsilon_pld"] <= obj["epsilon_exact"] + 2e-3
    assert obj["epsilon_rdp"] > obj["epsilon_pld"]
    assert obj["epsilon"] == obj["epsilon_exact"]


def test_gaussian_reports_incomplete_rdp(capsys):
    obj = run_inprocess(
        capsys,
        "privacy",
        "gaussian",
        "--noise-multiplier",
        "0.5",
        "--sample-rate",
        "0.2",
        "--steps",
        "1",
        "--delta",
        "1e-5",
        "--discretization",
        "1e-3",
        "--json",
    )
    assert obj["rdp_complete"] is False and 1.1 in obj["rdp_dropped_orders"]
    assert obj["epsilon_rdp"] >= obj["epsilon_pld"]
    main(
        [
            "privacy",
            "gaussian",
            "--noise-multiplier",
            "0.5",
            "--sample-rate",
            "0.2",
            "--steps",
            "1",
            "--delta",
            "1e-5",
            "--discretization",
            "1e-3",
        ]
    )
    text = capsys.readouterr().out
    assert "incomplete" in text and "did not converge" in text and "protects:" in text


def test_replace_neighbours_flag(capsys):
    add = run_inprocess(
        capsys,
        "privacy",
        "gaussian",
        "--noise-multiplier",
        "4",
        "--sample-rate",
        "1",
        "--steps",
        "1",
        "--delta",
        "1e-6",
        "--json",
    )
    rep = run_inprocess(
        capsys,
        "privacy",
        "gaussian",
        "--noise-multiplier",
        "4",
        "--sample-rate",
        "1",
        "--steps",
        "1",
        "--delta",
        "1e-6",
        "--neighbors",
        "replace",
        "--json",
    )
    assert rep["neighbors"] == "replace"
    # replace-one with multiplier 4 is add/remove with multiplier 2
    assert rep["epsilon_exact"] == pytest.approx(float(dpa.get_epsilon_gaussian(2.0, 1e-6)), rel=1e-9)
    assert rep["epsilon_exact"] > add["epsilon_exact"]


def test_noise_and_steps_for_a_target(capsys):
    obj = run_inprocess(
        capsys,
        "privacy",
        "gaussian-noise",
        "--target-epsilon",
        "2",
        "--sample-rate",
        "1",
        "--steps",
        "9",
        "--delta",
        "1e-5",
        "--json",
    )
    assert obj["epsilon_pld"] <= 2.0
    assert obj["noise_multiplier"] / 3 == pytest.approx(dpa.get_sigma_gaussian(2.0, 1e-5), rel=3e-3)
    steps = run_inprocess(
        capsys,
        "privacy",
        "gaussian-steps",
        "--noise-multiplier",
        str(obj["noise_multiplier"]),
        "--sample-rate",
        "1",
        "--target-epsilon",
        "2",
        "--delta",
        "1e-5",
        "--json",
    )
    assert steps["steps"] == 9


def test_shuffle_epsilon0_and_local(capsys):
    obj = run_inprocess(
        capsys,
        "privacy",
        "shuffle-epsilon0",
        "--target-epsilon",
        "0.5",
        "--users",
        "100000",
        "--delta",
        "1e-6",
        "--json",
    )
    assert obj["epsilon"] <= 0.5 and obj["epsilon0"] > 0.5
    loc = run_inprocess(capsys, "privacy", "local", "--epsilon", "1", "--reports", "10", "--delta", "1e-6", "--json")
    assert loc["epsilon_basic"] == pytest.approx(10.0)
    p_top = (math.e / (1 + math.e)) ** 10
    assert loc["epsilon_pld"] == pytest.approx(10 + math.log(1 - 1e-6 / p_top), abs=2e-4)
    assert "not the fact that the user sent reports" in loc["protects"]


def test_bad_input_exits_with_a_message(capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            ["privacy", "gaussian", "--noise-multiplier", "1", "--sample-rate", "2", "--steps", "3", "--delta", "1e-5"]
        )
    assert exc.value.code == 2
    assert "must be in (0, 1]" in capsys.readouterr().err
    # δ = 1 passes the flag's range check but no accountant accepts it: exit 2 with the reason
    assert main(["privacy", "shuffle", "--epsilon0", "1", "--users", "10", "--delta", "1"]) == 2
    assert "delta must be in (0, 1)" in capsys.readouterr().err


def test_bad_delta_via_console_script():
    proc = subprocess.run(
        [str(LDP), "privacy", "shuffle", "--epsilon0", "1", "--users", "10", "--delta", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and "delta" in proc.stderr and proc.stdout == ""


# -- central releases and budgets (estimator/accounting/central.py, odometer.py) ---------------------


def run_code(capsys, *args: str) -> tuple[int, dict]:
    code = main(list(args))
    return code, json.loads(capsys.readouterr().out)


def test_central_laplace_calibrates_and_releases(capsys):
    from estimator.accounting.central import LaplaceCounts

    obj = run_inprocess(capsys, "privacy", "central", "--mechanism", "laplace", "--epsilon", "0.5", "--json")
    want = LaplaceCounts(0.5)
    assert obj["scale"] == float(want.scale) == 2.0 and obj["epsilon_achieved"] == pytest.approx(0.5)
    assert obj["variance"] == pytest.approx(want.variance) and obj["std"] == pytest.approx(math.sqrt(want.variance))
    assert "released" not in obj and "everyone who sees the released counts" in obj["protects"]
    # replace-one neighbours differ by two contributions: twice the noise for the same ε
    rep = run_inprocess(
        capsys,
        "privacy",
        "central",
        "--mechanism",
        "laplace",
        "--epsilon",
        "0.5",
        "--neighbors",
        "replace",
        "--sensitivity",
        "3",
        "--json",
    )
    assert rep["scale"] == pytest.approx(12.0) and rep["epsilon_achieved"] <= 0.5 + 1e-12
    counts = [1000, 0, 250000, 7]
    rel = run_inprocess(
        capsys,
        "privacy",
        "central",
        "--mechanism",
        "laplace",
        "--epsilon",
        "0.1",
        "--counts",
        ",".join(map(str, counts)),
        "--json",
    )
    assert len(rel["released"]) == 4 and all(isinstance(v, int) for v in rel["released"])
    assert "counts" not in rel  # the exact counts are never printed
    assert all(abs(r - c) < 10 * 10 * rel["std"] for r, c in zip(rel["released"], counts))


def test_central_gaussian_needs_a_delta_and_meets_the_target(capsys):
    from estimator.accounting.central import GaussianCounts

    obj = run_inprocess(
        capsys, "privacy", "central", "--mechanism", "gaussian", "--epsilon", "1", "--delta", "1e-6", "--json"
    )
    assert obj["sigma"] == pytest.approx(GaussianCounts.for_epsilon(1.0, 1e-6).sigma)
    assert obj["epsilon_achieved"] <= 1.0 and obj["delta"] == 1e-6
    assert obj["variance"] < obj["sigma"] ** 2
    assert main(["privacy", "central", "--mechanism", "gaussian", "--epsilon", "1"]) == 2
    assert "--delta is required" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["privacy", "central", "--mechanism", "laplace", "--epsilon", "1", "--counts", "1,two"])
    assert exc.value.code == 2


def test_budget_zcdp_admits_more_small_releases_than_basic(capsys):
    code, z = run_code(
        capsys, "privacy", "budget", "--epsilon", "1", "--delta", "1e-6", "--release", "laplace:0.01x500", "--json"
    )
    # docs/PRIVACY.md: ε = 1, δ = 1e-6 admits 487 releases of ε = 0.01 (basic composition: 100)
    assert code == 1 and z["filter"] == "ZCDPFilter" and z["releases"] == 487 and z["refused"] == 13
    assert [r["admitted"] for r in z["plan"]] == [True] * 487 + [False] * 13
    assert z["plan"][0] == {"release": "laplace:0.01", "admitted": True, "cost": {"rho": pytest.approx(5e-5)}}
    assert {"guarantee", "spent", "remaining", "budget", "fraction_spent", "neighbors", "protects"} <= set(z)
    assert z["guarantee"] == {"epsilon": 1.0, "delta": 1e-6} and z["fraction_spent"] <= 1.0
    code, b = run_code(
        capsys, "privacy", "budget", "--epsilon", "1", "--filter", "basic", "--release", "laplace:0.01x100", "--json"
    )
    assert code == 0 and b["releases"] == 100 and b["refused"] == 0 and b["spent"]["epsilon"] == pytest.approx(1.0)
    code, b = run_code(
        capsys,
        "privacy",
        "budget",
        "--epsilon",
        "1",
        "--filter",
        "basic",
        "--release",
        "laplace:0.5",
        "--release",
        "sparse-vector:0.6",
        "--release",
        "laplace:0.5",
        "--json",
    )
    # a refused release spends nothing; later ones are still tried
    assert code == 1 and [r["admitted"] for r in b["plan"]] == [True, False, True]


def test_budget_gaussian_releases_and_bad_input(capsys):
    code, z = run_code(
        capsys,
        "privacy",
        "budget",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--release",
        "gaussian:20x2",
        "--neighbors",
        "replace",
        "--json",
    )
    # replace-one: twice the sensitivity, ρ = (2·1)² / (2σ²)
    assert code == 0 and z["plan"][0]["cost"]["rho"] == pytest.approx(4 / (2 * 400))
    assert main(["privacy", "budget", "--epsilon", "1", "--filter", "basic", "--release", "gaussian:10"]) == 2
    assert "per_release_delta" in capsys.readouterr().err
    code, b = run_code(
        capsys,
        "privacy",
        "budget",
        "--epsilon",
        "1",
        "--delta",
        "1e-5",
        "--filter",
        "basic",
        "--per-release-delta",
        "1e-6",
        "--release",
        "gaussian:10",
        "--json",
    )
    assert code == 0 and b["spent"]["delta"] == pytest.approx(1e-6) and 0 < b["spent"]["epsilon"] < 1
    assert main(["privacy", "budget", "--epsilon", "1", "--release", "laplace:0.1"]) == 2
    assert "--delta is required" in capsys.readouterr().err
    for bad in ("laplace", "cauchy:1", "laplace:-1", "laplace:0.1x0"):
        with pytest.raises(SystemExit) as exc:
            main(["privacy", "budget", "--epsilon", "1", "--delta", "1e-6", "--release", bad])
        assert exc.value.code == 2


def test_budget_via_console_script():
    obj = run_ldp(
        "privacy",
        "budget",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--release",
        "laplace:0.1x2",
        "--release",
        "sparse-vector:0.1",
        "--json",
    )
    assert obj["releases"] == 3 and obj["refused"] == 0
    text = subprocess.run(
        [str(LDP), "privacy", "budget", "--epsilon", "0.1", "--delta", "1e-6", "--release", "laplace:1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert text.returncode == 1 and "REFUSED" in text.stdout and "protects:" in text.stdout
