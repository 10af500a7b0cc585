"""``ldp fl clinics --select``: DP-FedAvg's σ chosen privately, every candidate and the choice composed
(checked against dp_accounting's own PLDs), the sparse vector technique stopping at the first candidate
above the threshold."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld

import simulator.scenarios.fl.clinics_select as cs
from ldp_cli.main import main
from simulator.scenarios.fl.clinics import ClinicsConfig


def _reference(sigmas: list[float], q: float, rounds: int, eps_sel: float, delta: float) -> float:
    total = pld.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(eps_sel, 0.0), 1e-4)
    for z in sigmas:
        total = total.compose(
            pld.from_gaussian_mechanism(z, sampling_prob=q, value_discretization_interval=1e-4).self_compose(rounds)
        )
    return float(total.get_epsilon_for_delta(delta))


def test_em_choice_and_the_composed_epsilon(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["fl", "clinics", "--select", "em", "--rounds", "6", "--candidate-noise-multipliers", "4,2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["candidates_trained"] == 2 and out["chosen"] in (0, 1)
    # the estimator's accountant is at its default discretization; dp_accounting directly at 1e-4
    assert out["epsilon"] == pytest.approx(_reference([4.0, 2.0], 0.5, 6, 1.0, 1e-5), rel=5e-3)
    assert out["epsilon"] > out["epsilon_training_all_candidates"] > out["epsilon_chosen_run"]


def test_svt_stops_at_the_first_candidate_above(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threshold 0: every score (>= 0) is above it, and the run answers ⊥ only if ν − ρ < −s for the
    recorded score s. With ε_select = 4, Δ = 20 (monotone, c = 1) both noise scales are 10 rows; the test
    requires s >= 300, and ν − ρ < −300 needs ν < −150 or ρ > 150, each with probability <= e^{-15}:
    a wrong answer has probability < 2e^{-15} < 1e-6. Then the first candidate is chosen and the second
    is never trained; the total still charges both."""
    seen: list[int] = []
    real = cs.svt_select

    def recorded(score: Any, *a: Any, **k: Any) -> Any:
        def wrapped(i: int) -> int:
            seen.append(score(i))
            return seen[-1]

        return real(wrapped, *a, **k)

    monkeypatch.setattr(cs, "svt_select", recorded)
    r = cs.select_clinics_noise(ClinicsConfig(rounds=6), (2.0, 3.0), "svt", 4.0, threshold=0.0, cap=20)
    assert seen[0] >= 300, seen
    assert r["chosen"] == 0 and r["candidates_trained"] == 1
    assert r["epsilon"] == pytest.approx(_reference([2.0, 3.0], 0.5, 6, 4.0, 1e-5), rel=5e-3)
