"""The command-line contracts: ``ldp privacy pate`` (keys epsilon, epsilon_data_dependent, answered) with
every votes-file format, its errors, and ``ldp pate --json`` with a plot."""

from __future__ import annotations

import json
import math
import pathlib

import dp_accounting
import numpy as np
import pytest

from estimator.pate.accounting import ORDERS
from ldp_cli.main import main


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _votes() -> np.ndarray:
    v = np.zeros((30, 10), dtype=np.int64)
    v[:, 0], v[:, 1] = 23, 2
    v[:5, 0], v[:5, 1] = 13, 12
    return v


def test_privacy_pate_epsilon_is_dp_accountings(capsys: pytest.CaptureFixture[str]) -> None:
    obj = _run(capsys, ["privacy", "pate", "--sigma", "40", "--queries", "300", "--delta", "1e-5", "--json"])
    acc = dp_accounting.rdp.RdpAccountant(list(ORDERS))
    acc.compose(dp_accounting.GaussianDpEvent(40 / math.sqrt(2)), 300)
    assert obj["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
    assert "answered" not in obj and obj["protects"]


@pytest.mark.parametrize("fmt", ["npy", "npz", "json"])
def test_privacy_pate_with_a_votes_file(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, fmt: str) -> None:
    v = _votes()
    flags = np.array([0] * 5 + [1] * 25)
    path = tmp_path / f"votes.{fmt}"
    if fmt == "npy":
        np.save(path, v)
    elif fmt == "npz":
        np.savez(path, votes=v, answered=flags)
    else:
        path.write_text(json.dumps({"votes": v.tolist(), "answered": flags.tolist()}))
    argv = ["privacy", "pate", "--sigma", "4", "--queries", "30", "--delta", "1e-5", "--votes", str(path)]
    obj = _run(capsys, [*argv, "--threshold", "18", "--sigma1", "6", "--seed", "3", "--json"])
    assert obj["answered"] == (25 if fmt != "npy" else obj["answered"])
    assert obj["answered_from"] == ("threshold_check_run_here" if fmt == "npy" else "file")
    assert obj["epsilon_data_dependent"] <= obj["epsilon_data_independent"] + 1e-9
    assert obj["epsilon_data_independent"] <= obj["epsilon_confident"] + 1e-9
    assert obj["epsilon_data_dependent_published"] > 0 and obj["teachers"] == 25


def test_privacy_pate_refuses_bad_input_with_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "v.json"
    bad.write_text(json.dumps([[1, 2], [3]]))
    good = tmp_path / "v.npy"
    np.save(good, _votes())
    base = ["privacy", "pate", "--sigma", "4", "--delta", "1e-5"]
    cases = [
        ([*base, "--queries", "30", "--votes", str(tmp_path / "missing.npy")], "not found"),
        ([*base, "--queries", "2", "--votes", str(bad)], "queries × classes"),
        ([*base, "--queries", "29", "--votes", str(good)], "has 30 queries"),
        ([*base, "--queries", "30", "--threshold", "3"], "go together"),
    ]
    for argv, message in cases:
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
        assert code == 2
        assert message in capsys.readouterr().err


def test_ldp_pate_json_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    plot = tmp_path / "pate.png"
    obj = _run(capsys, ["pate", "--no-dpsgd", "--seed", "0", "--plot", str(plot), "--json"])
    for key in ("teachers", "queries", "answered", "student_accuracy", "epsilon", "epsilon_data_dependent"):
        assert key in obj
    assert obj["teachers"] == 25 and obj["answered"] <= obj["queries"]
    assert obj["epsilon_data_dependent"] <= obj["epsilon"] + 1e-9
    assert obj["student_accuracy"] > 0.7  # ten classes: chance is 0.1
    assert plot.stat().st_size > 10_000
    assert obj["randomness"] == "seeded" and "seed" in obj["seed_warning"]


def test_the_text_outputs_say_what_they_protect(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from estimator.pate import experiment

    path = tmp_path / "v.npy"
    np.save(path, _votes())
    argv = ["privacy", "pate", "--sigma", "4", "--queries", "30", "--delta", "1e-5", "--votes", str(path)]
    assert main([*argv, "--threshold", "18", "--sigma1", "6", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "data-dependent, published with smooth sensitivity" in out and "protects:" in out
    real = experiment.run_pate
    small = (experiment.Config("gnmax", 8.0, 60), experiment.Config("confident", 8.0, 120, 20.0, 12.5))
    monkeypatch.setattr(experiment, "run_pate", lambda *a, **k: real(*a, **{**k, "configs": small}))
    assert main(["pate", "--seed", "2", "--no-dpsgd", "--federated"]) == 0
    out = capsys.readouterr().out
    assert "Confident-GNMax T=20 σ1=12.5 σ2=8 vs GNMax σ=8" in out
    assert "equal to the plain sum: True" in out and "against everyone including the server" in out
    assert "protects:" in out and "seeded run" in out
