"""The ``ldp simulate --mechanism {pem,sfp}`` contract, through the installed ``ldp`` script.

Contract (issue 15): ``ldp simulate --mechanism {pem,sfp} --epsilon E --input FILE [--top K] [--seed S]
--json`` prints one object with the keys ``mechanism, epsilon, users, seed, seconds, found, true_top,
recall, precision``; ``found`` is a list of ``[value, estimate, ci_low, ci_high]``, best first;
``true_top`` the K most frequent true values with their counts. Without ``--input``, ``--users N
--distribution zipf:S`` draws the population. Documented extras: ``spec, length, keep, levels``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from estimator.result import simultaneous_z, z_value
from simulator.heavy_hitters import SFP_REPORT_CONFIDENCE

LDP = Path(sys.executable).with_name("ldp")
CONTRACT = {"mechanism", "epsilon", "users", "seed", "seconds", "found", "true_top", "recall", "precision"}
EXTRAS = {"spec", "length", "keep", "levels", "could_be_noise", "candidates", "alphabet"}

POPULATION = {"hello": 3000, "world": 2000, "café": 1500, "naïve": 800, "zebra": 400, "quiet": 1}


def ldp(*args: str) -> subprocess.CompletedProcess[str]:
    assert LDP.exists(), f"the ldp script is not installed next to {sys.executable}"
    return subprocess.run([str(LDP), *args], capture_output=True, text=True, timeout=600, check=False)


def run_json(*args: str) -> dict[str, Any]:
    out = ldp("simulate", *args, "--json")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip().splitlines()) == 1, "--json prints exactly one line"
    obj: dict[str, Any] = json.loads(out.stdout)
    return obj


@pytest.fixture()
def population_file(tmp_path: Path) -> Path:
    lines = [f"{v}\t{c}" for v, c in POPULATION.items() if c > 1] + ["quiet"]  # both line forms
    path = tmp_path / "pop.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def check_contract(obj: dict[str, Any], mechanism: str, epsilon: float, users: int, seed: int, top: int) -> None:
    assert CONTRACT <= set(obj), f"missing keys {sorted(CONTRACT - set(obj))}"
    flags = obj["could_be_noise"]
    assert len(flags) == len(obj["found"]) and all(isinstance(z, bool) for z in flags)
    assert isinstance(obj["candidates"], int) and obj["candidates"] >= len(obj["found"])
    assert set(obj) - CONTRACT <= EXTRAS, f"undocumented keys {sorted(set(obj) - CONTRACT - EXTRAS)}"
    assert obj["mechanism"] == mechanism and obj["epsilon"] == epsilon and isinstance(obj["epsilon"], float)
    assert type(obj["users"]) is int and obj["users"] == users
    assert type(obj["seed"]) is int and obj["seed"] == seed
    assert set(obj["seconds"]) == {"encode", "decode"} and all(v >= 0 for v in obj["seconds"].values())
    found = obj["found"]
    assert len(found) <= top
    for row in found:
        assert len(row) == 4 and isinstance(row[0], str)
        value, est, lo, hi = row
        assert all(isinstance(x, float) and math.isfinite(x) for x in (est, lo, hi)) and lo <= est <= hi
    assert [r[1] for r in found] == sorted((r[1] for r in found), reverse=True), "found is best first"
    truth = obj["true_top"]
    assert len(truth) == top and all(len(t) == 2 and type(t[1]) is int for t in truth)
    hits = len({r[0] for r in found} & {t[0] for t in truth})
    assert obj["recall"] == hits / top
    assert obj["precision"] == (hits / len(found) if found else 0.0)
    if mechanism == "sfp":  # SFP reports only the words that pass Bonferroni over all words ranked at 50%
        z = simultaneous_z(SFP_REPORT_CONFIDENCE, obj["candidates"])
        assert all(est - z * (hi - est) / z_value(0.95) > 0 for _, est, _, hi in found)


@pytest.mark.parametrize("mechanism", ["pem", "sfp"])
def test_input_file_contract(mechanism: str, population_file: Path) -> None:
    args = ["--mechanism", mechanism, "--epsilon", "8", "--input", str(population_file), "--top", "3", "--seed", "11"]
    obj = run_json(*args)
    check_contract(obj, mechanism, 8.0, sum(POPULATION.values()), 11, 3)
    assert obj["true_top"] == [["hello", 3000], ["world", 2000], ["café", 1500]]
    assert obj["length"] >= len("naïve".encode())
    again = run_json(*args)
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in obj.items() if k != "seconds"}


def test_pem_finds_the_file_s_heavy_values(population_file: Path) -> None:
    obj = run_json("--mechanism", "pem", "--epsilon", "8", "--input", str(population_file), "--top", "3", "--seed", "2")
    assert obj["recall"] == 1.0 and [r[0] for r in obj["found"]][:2] == ["hello", "world"]


@pytest.mark.parametrize("mechanism", ["pem", "sfp"])
def test_synthetic_population_contract(mechanism: str) -> None:
    args = ["--mechanism", mechanism, "--epsilon", "6", "--users", "30000", "--distribution", "zipf:1.3"]
    obj = run_json(*args, "--top", "5", "--seed", "3", "--length", "4", "--domain", "300")
    check_contract(obj, mechanism, 6.0, 30000, 3, 5)
    assert sum(c for _, c in obj["true_top"]) <= 30000 and obj["length"] == 4


def test_default_top_is_the_table_s(population_file: Path) -> None:
    obj = run_json("--mechanism", "pem", "--epsilon", "4", "--input", str(population_file), "--seed", "1")
    assert len(obj["true_top"]) == 20 or len(obj["true_top"]) == len(POPULATION)


@pytest.mark.parametrize(
    "lines,word",
    [
        (["hello\tmany"], "integer"),
        (["hello\t0"], "at least 1"),
        (["\t5"], "empty value"),
        ([""], "no values"),
    ],
)
def test_bad_input_file_exits_2(tmp_path: Path, lines: list[str], word: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = ldp("simulate", "--mechanism", "pem", "--epsilon", "2", "--input", str(path), "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("ldp simulate: error: ") and word in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "extra,word",
    [
        (["--input", "/nonexistent/pop.txt"], "cannot read"),
        (["--input", "POP", "--users", "10"], "--input is the population"),
        ([], "--input FILE or --users"),
        (["--users", "100", "--range", "0:1"], "--range"),
        (["--users", "100", "--top", "0"], "--top"),
        (["--users", "100", "--oracle", "hcms"], "PEM's frequency oracle"),
        (["--users", "100", "--alphabet", "ab"], "PEM's candidate pruning"),
    ],
)
def test_bad_arguments_exit_2(population_file: Path, extra: list[str], word: str) -> None:
    extra = [str(population_file) if x == "POP" else x for x in extra]
    out = ldp("simulate", "--mechanism", "sfp", "--epsilon", "2", *extra, "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("ldp simulate: error: ") and word in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_frequency_oracles_refuse_input() -> None:
    out = ldp("simulate", "--mechanism", "olh", "--epsilon", "2", "--domain", "8", "--input", "x", "--users", "9")
    assert out.returncode == 2 and "--input" in out.stderr and "Traceback" not in out.stderr


def test_pem_over_the_hadamard_sketch(population_file: Path) -> None:
    """``--oracle hcms``: the same contract; the spec names its oracle and sketch; the heavy values are found;
    a fixed seed reproduces the run (the hash family is drawn from the seeded generator)."""
    args = ["--mechanism", "pem", "--epsilon", "4", "--input", str(population_file), "--seed", "5", "--top", "3"]
    obj, again = (run_json(*args, "--oracle", "hcms") for _ in range(2))
    check_contract(obj, "pem", 4.0, sum(POPULATION.values()), 5, 3)
    assert (obj["spec"]["oracle"], obj["spec"]["num_hashes"], obj["spec"]["width"]) == ("hcms", 64, 1024)
    assert {r[0] for r in obj["found"][:2]} == {"hello", "world"}
    assert again["found"] == obj["found"]


def test_pem_with_an_alphabet(population_file: Path) -> None:
    """``--alphabet``: the same contract, the alphabet echoed; every reported value is made of it, and
    the three-level parameters of the alphabet rule are used."""
    args = ["--mechanism", "pem", "--epsilon", "8", "--users", "20000", "--distribution", "zipf:1.3"]
    obj = run_json(*args, "--top", "5", "--seed", "4", "--domain", "300", "--alphabet", "zyxwvutsrqponmlkjihgfedcba")
    check_contract(obj, "pem", 8.0, 20000, 4, 5)
    assert obj["alphabet"] == "abcdefghijklmnopqrstuvwxyz" and obj["levels"] == 3
    assert all(set(r[0]) <= set(obj["alphabet"]) for r in obj["found"]) and obj["recall"] >= 0.6
    bad = ldp("simulate", "--mechanism", "pem", "--epsilon", "2", "--users", "100", "--alphabet", "", "--json")
    assert bad.returncode == 2 and "--alphabet needs" in bad.stderr and "Traceback" not in bad.stderr
