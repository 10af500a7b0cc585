"""``ldp dpsgd --select``: the search chooses privately, never trains past the sparse vector technique's
halt, and prints the composed ε of every candidate's run and the choice, checked here against a privacy
loss distribution built directly with dp_accounting."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld

from estimator.jobs.dpsgd import DPSGDJob
from estimator.selection.dpsgd import candidate_grid, selection_event
from estimator.selection.mechanisms import SelectionError
from ldp_cli.main import main
from ldp_core.fl.dpsgd import DPSGDConfig


def _blobs(path: Path, rows: int = 700, seed: int = 5) -> Path:
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=2.5, size=(3, 6))
    y = rng.integers(0, 3, rows)
    np.savez(path, x=means[y] + rng.normal(size=(rows, 6)), y=y)
    return path


def _reference_epsilon(cands: list[tuple[float, float]], q: float, steps: int, eps_sel: float, delta: float) -> float:
    """Every candidate's T Poisson-sampled Gaussian steps and an ε_sel-DP choice, composed as PLDs by
    dp_accounting itself (the pure-DP part as its worst case, randomized response)."""
    total = pld.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(eps_sel, 0.0), 1e-4)
    for sigma, _ in cands:
        total = total.compose(
            pld.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=1e-4).self_compose(steps)
        )
    return float(total.get_epsilon_for_delta(delta))


def _args(data: Path, *extra: str) -> list[str]:
    return [
        "dpsgd", "--data", str(data), "--model", "softmax", "--noise-multiplier", "3.0", "--clip", "1.0",
        "--sample-rate", "0.2", "--epochs", "1", "--delta", "1e-5", "--seed", "11", "--json", *extra,
    ]  # fmt: skip


def test_em_search_prints_the_composed_epsilon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _blobs(tmp_path / "d.npz")
    extra = [
        "--select",
        "em",
        "--candidate-noise-multipliers",
        "4,2",
        "--candidate-lrs",
        "0.5",
        "--select-epsilon",
        "0.5",
    ]
    assert main(_args(data, *extra)) == 0
    out = json.loads(capsys.readouterr().out)
    s = out["selection"]
    assert s["candidates_scored"] == 2 and s["chosen"] in (0, 1)
    ref = _reference_epsilon([(4.0, 0.5), (2.0, 0.5)], 0.2, 5, 0.5, 1e-5)
    assert out["epsilon"] == pytest.approx(ref, rel=2e-3)
    assert out["epsilon"] > s["epsilon_training_all_candidates"] > out["epsilon_run"]
    assert "validation_correct" not in out  # the private scores are never printed


def test_svt_search_stops_at_the_first_candidate_above(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs are recorded (the real training, wrapped) to see the private counts the test compares
    with the choice. With ε_select = 8 both noise scales are 0.25 rows: the noisy comparison differs from
    the exact one only if |ν − ρ| >= the count's distance to the threshold, which the test requires to be
    >= 8 (P[|ν − ρ| >= 8] < 1e-6 for two discrete Laplace of scale 0.25). Then the choice is the first
    candidate whose count reaches the threshold, and no later candidate is trained; the total still
    charges all three."""
    import estimator.selection.dpsgd as sel

    seen: list[int] = []
    real = sel.run_dpsgd

    def recorded(*a: object, **k: object) -> dict[str, object]:
        out = real(*a, **k)  # type: ignore[arg-type]
        seen.append(int(out["validation_correct"]))
        return out

    monkeypatch.setattr(sel, "run_dpsgd", recorded)
    data = _blobs(tmp_path / "d.npz")
    extra = ["--select", "svt", "--candidate-noise-multipliers", "300,3,3", "--select-threshold", "0.8"]
    assert main(_args(data, *extra, "--select-epsilon", "8")) == 0
    out = json.loads(capsys.readouterr().out)
    s = out["selection"]
    t = s["threshold_count"]
    assert all(abs(c - t) >= 8 for c in seen), (seen, t)
    first = next(i for i, c in enumerate(seen) if c >= t)
    assert s["chosen"] == first and s["candidates_scored"] == len(seen) == first + 1 < 3
    ref = _reference_epsilon([(300.0, 0), (3.0, 0), (3.0, 0)], 0.2, 5, 8.0, 1e-5)
    assert out["epsilon"] == pytest.approx(ref, rel=2e-3)


def test_nothing_above_the_threshold_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _blobs(tmp_path / "d.npz")
    assert main(_args(data, "--select", "svt", "--select-threshold", "1.0", "--candidate-lrs", "0.0001")) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["selection"]["chosen"] is None and out["epsilon"] > 0


def test_bad_searches_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _blobs(tmp_path / "d.npz")
    assert main(_args(data, "--select", "svt")) == 2
    assert "threshold" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(_args(data, "--select", "em", "--candidate-noise-multipliers", "0,1"))
    with pytest.raises(SelectionError, match="noise multiplier"):
        candidate_grid([0.0], [0.1], [1.0])


def test_the_event_is_every_candidate_and_the_choice() -> None:
    job = DPSGDJob("softmax", DPSGDConfig(1.0, 1.0, 0.2, 0.1), epochs=2, delta=1e-6)
    cands = candidate_grid([2.0, 4.0], [0.1, 0.3], [1.0])
    ev = selection_event(job, cands, 0.3)
    from estimator.accounting.accountant import account

    got = account(ev, 1e-6).epsilon_pld
    ref = _reference_epsilon([(c.noise_multiplier, 0) for c in cands], 0.2, 10, 0.3, 1e-6)
    assert got == pytest.approx(ref, rel=2e-3)
