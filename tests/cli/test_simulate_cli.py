"""The ``ldp simulate --json`` contract, in process and through the installed script.

The JSON object carries at least the contract keys ``mechanism, epsilon, domain,
users, seed, true, estimate, variance, seconds`` (``seconds`` has exactly
``encode, aggregate, estimate``); any other key must be one of the documented
extras below. Bad arguments exit with status 2 and a one-line message, never
a traceback.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldp_cli.main import main
from ldp_core.mechanisms import FREQUENCY_MECHANISMS, make_spec

NAMES = sorted(FREQUENCY_MECHANISMS)
CONTRACT = {"mechanism", "epsilon", "domain", "users", "seed", "true", "estimate", "variance", "seconds"}
EXTRAS = {"spec", "spec_id", "ci_low", "ci_high", "could_be_noise"}
LDP = Path(sys.executable).with_name("ldp")


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["simulate", *args, "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1, "--json prints exactly one line"
    return json.loads(out)


def check_contract(obj: dict[str, Any], name: str, epsilon: float, domain: int, users: int, seed: int) -> None:
    assert CONTRACT <= set(obj), f"missing keys {sorted(CONTRACT - set(obj))}"
    assert set(obj) - CONTRACT <= EXTRAS, f"undocumented keys {sorted(set(obj) - CONTRACT - EXTRAS)}"
    assert obj["mechanism"] == name
    assert isinstance(obj["epsilon"], float) and obj["epsilon"] == epsilon
    assert type(obj["domain"]) is int and obj["domain"] == domain
    assert type(obj["users"]) is int and obj["users"] == users
    assert type(obj["seed"]) is int and obj["seed"] == seed
    true, est, var = obj["true"], obj["estimate"], obj["variance"]
    assert len(true) == len(est) == len(var) == domain
    assert all(type(c) is int and c >= 0 for c in true) and sum(true) == users
    assert all(isinstance(e, float) and math.isfinite(e) for e in est)
    assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in var)
    assert set(obj["seconds"]) == {"encode", "aggregate", "estimate"}
    assert all(isinstance(s, float) and s >= 0 for s in obj["seconds"].values())
    flags = obj["could_be_noise"]
    assert len(flags) == domain and all(isinstance(z, bool) for z in flags)
    assert all(z for z, lo, e in zip(flags, obj["ci_low"], est) if lo <= 0), "an interval with 0 is always flagged"


@pytest.mark.parametrize("name", NAMES)
def test_json_contract_every_mechanism(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    domain = 2 if name == "rr" else 16
    args = ["--mechanism", name, "--epsilon", "1.5", "--users", "3000", "--seed", "42"]
    if name != "rr":
        args += ["--domain", str(domain)]
    obj = run_json(capsys, *args)
    check_contract(obj, name, 1.5, domain, 3000, 42)
    spec = make_spec("rr", epsilon=1.5) if name == "rr" else make_spec(name, epsilon=1.5, domain_size=domain)
    np.testing.assert_allclose(obj["variance"], spec.count_variance(np.array(obj["true"])), rtol=1e-12)
    # the estimates are within 6 theoretical standard deviations of the truth, item by item
    z = (np.array(obj["estimate"]) - np.array(obj["true"])) / np.sqrt(obj["variance"])
    assert np.all(np.abs(z) < 6), z


def test_rr_has_domain_two(capsys: pytest.CaptureFixture[str]) -> None:
    obj = run_json(capsys, "--mechanism", "rr", "--epsilon", "1", "--users", "500", "--seed", "1")
    check_contract(obj, "rr", 1.0, 2, 500, 1)
    obj = run_json(capsys, "--mechanism", "rr", "--epsilon", "1", "--domain", "2", "--users", "500", "--seed", "1")
    assert obj["domain"] == 2


def test_same_seed_same_output(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--mechanism", "grr", "--epsilon", "2", "--domain", "10", "--users", "2000"]
    a = run_json(capsys, *args, "--seed", "7")
    b = run_json(capsys, *args, "--seed", "7")
    c = run_json(capsys, *args, "--seed", "8")
    strip = lambda o: {k: v for k, v in o.items() if k != "seconds"}  # noqa: E731
    assert strip(a) == strip(b)
    assert a["true"] != c["true"] and a["estimate"] != c["estimate"]


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["simulate", "--mechanism", "grr", "--epsilon", "1", "--domain", "5", "--users", "300", "--seed", "3"])
        == 0
    )
    out = capsys.readouterr().out
    assert "grr" in out and "seed=3" in out and "standardized errors" in out


BAD_ARGS = [
    (["--mechanism", "grr", "--epsilon", "0", "--domain", "8"], "epsilon"),
    (["--mechanism", "grr", "--epsilon", "-1", "--domain", "8"], "epsilon"),
    (["--mechanism", "grr", "--epsilon", "nan", "--domain", "8"], "epsilon"),
    (["--mechanism", "grr", "--epsilon", "31", "--domain", "8"], "epsilon"),
    (["--mechanism", "grr", "--epsilon", "1", "--domain", "1"], "domain"),
    (["--mechanism", "oue", "--epsilon", "1", "--domain", "0"], "domain"),
    (["--mechanism", "grr", "--epsilon", "1"], "--domain"),
    (["--mechanism", "rr", "--epsilon", "1", "--domain", "3"], "domain 2"),
    (["--mechanism", "rr", "--epsilon", "0"], "epsilon"),
]


@pytest.mark.parametrize("args,word", BAD_ARGS, ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_bad_arguments_exit_2(args: list[str], word: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *args, "--users", "100", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("ldp simulate: error: ") and word in captured.err
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args,word",
    [
        (["--users", "0"], "--users"),
        (["--users", "-5"], "--users"),
        (["--seed", "-1"], "--seed"),
        (["--distribution", "zipf:x"], "distribution"),
    ],
)
def test_bad_population_arguments_exit_2(args: list[str], word: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--mechanism", "grr", "--epsilon", "1", "--domain", "4", "--users", "10"]
    assert main([*base, *args, "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ldp simulate: error: ") and word in err and "Traceback" not in err


@pytest.mark.parametrize("args", [["--epsilon", "abc"], ["--mechanism", "laplace"], ["--users", "many"]])
def test_unparsable_arguments_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    base = {"--mechanism": "grr", "--epsilon": "1", "--users": "10"}
    base.update(dict(zip(args[::2], args[1::2])))
    argv = ["simulate", "--domain", "4", "--json"] + [x for kv in base.items() for x in kv]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_installed_script(capsys: pytest.CaptureFixture[str]) -> None:
    """The console script gives the same object as an in-process run with the same seed."""
    assert LDP.exists(), f"the ldp script is not installed next to {sys.executable}"
    args = ["--mechanism", "grr", "--epsilon", "1", "--domain", "6", "--users", "800", "--seed", "5"]
    out = subprocess.run(
        [str(LDP), "simulate", *args, "--json"], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout)
    check_contract(obj, "grr", 1.0, 6, 800, 5)
    here = run_json(capsys, *args)
    assert {k: v for k, v in obj.items() if k != "seconds"} == {k: v for k, v in here.items() if k != "seconds"}


def test_installed_script_bad_argument() -> None:
    args = [str(LDP), "simulate", "--mechanism", "grr", "--epsilon", "0", "--domain", "6", "--users", "10", "--json"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2
    assert out.stderr.startswith("ldp simulate: error: ") and "epsilon" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


# -- numeric mechanisms -----------------------------------------------------------------------------------

NUMERIC_CONTRACT = {"mechanism", "epsilon", "users", "seed", "seconds"}
MEAN_KEYS = {"true_mean", "mean", "mean_variance", "ci_low", "ci_high"}
SW_KEYS = {"bins", "true_hist", "hist", "quantiles", "true_quantiles"}
NUMERIC_EXTRAS = {"range", "distribution", "spec", "spec_id", "estimated_variance", "edges", "hist_low", "hist_high"}
NUMERIC_EXTRAS |= {"iterations", "bootstrap"}


@pytest.mark.parametrize("name", ["duchi", "pm", "hm"])
@pytest.mark.parametrize("dist", ["uniform", "beta:2,5", "normal:40,15", "zipf:1.2"])
def test_json_contract_of_the_mean_mechanisms(name: str, dist: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Keys as the issue writes them; the estimate within 5 theoretical standard deviations (mean_variance,
    the variance of the mean at these users' values) of the true mean."""
    obj = run_json(
        capsys,
        "--mechanism",
        name,
        "--epsilon",
        "1",
        "--users",
        "20000",
        "--range",
        "0:60",
        "--seed",
        "5",
        "--distribution",
        dist,
    )
    assert NUMERIC_CONTRACT | MEAN_KEYS <= set(obj) and set(obj) - NUMERIC_CONTRACT - MEAN_KEYS <= NUMERIC_EXTRAS
    assert obj["mechanism"] == name and obj["users"] == 20000 and obj["seed"] == 5 and obj["epsilon"] == 1.0
    assert 0 <= obj["true_mean"] <= 60 and obj["mean_variance"] > 0
    assert abs(obj["mean"] - obj["true_mean"]) < 5 * math.sqrt(obj["mean_variance"])
    assert obj["ci_low"] < obj["mean"] < obj["ci_high"]
    assert set(obj["seconds"]) == {"encode", "aggregate", "estimate"}


def test_json_contract_of_square_wave(capsys: pytest.CaptureFixture[str]) -> None:
    obj = run_json(
        capsys,
        "--mechanism",
        "sw",
        "--epsilon",
        "2",
        "--users",
        "50000",
        "--range",
        "0:60",
        "--bins",
        "32",
        "--seed",
        "3",
        "--bootstrap",
        "10",
    )
    assert NUMERIC_CONTRACT | SW_KEYS <= set(obj) and set(obj) - NUMERIC_CONTRACT - SW_KEYS <= NUMERIC_EXTRAS
    assert obj["bins"] == 32 and len(obj["hist"]) == len(obj["true_hist"]) == 32
    assert abs(sum(obj["hist"]) - 1) < 1e-9 and abs(sum(obj["true_hist"]) - 1) < 1e-9
    assert set(obj["quantiles"]) == set(obj["true_quantiles"]) == {"p50", "p90", "p99"}
    for q in obj["quantiles"].values():
        assert set(q) == {"value", "ci_low", "ci_high"} and q["ci_low"] <= q["ci_high"]
    # the median within its interval widened by one bin (60/32), as in tests/mechanisms/test_numeric.py
    med = obj["quantiles"]["p50"]
    assert med["ci_low"] - 60 / 32 <= obj["true_quantiles"]["p50"] <= med["ci_high"] + 60 / 32


@pytest.mark.parametrize(
    "args,word",
    [
        (["--mechanism", "pm", "--epsilon", "1"], "--range"),
        (["--mechanism", "pm", "--epsilon", "1", "--range", "5:1"], "--range"),
        (["--mechanism", "pm", "--epsilon", "1", "--range", "a:b"], "--range"),
        (["--mechanism", "pm", "--epsilon", "1", "--range", "0:1", "--domain", "4"], "--range"),
        (["--mechanism", "pm", "--epsilon", "1", "--range", "0:1", "--bins", "4"], "--bins"),
        (["--mechanism", "sw", "--epsilon", "1", "--range", "0:1", "--bins", "1"], "bins"),
        (["--mechanism", "hm", "--epsilon", "1", "--range", "0:1", "--distribution", "beta:0,1"], "positive"),
        (["--mechanism", "hm", "--epsilon", "1", "--range", "0:1", "--distribution", "gamma:2"], "distribution"),
        (["--mechanism", "grr", "--epsilon", "1", "--domain", "4", "--range", "0:1"], "--range"),
    ],
)
def test_bad_numeric_arguments_exit_2(args: list[str], word: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *args, "--users", "100", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ldp simulate: error: ") and word in err and "Traceback" not in err
