"""Membership inference through the hook against a PATE student and a classifier trained on DP synthetic
data (``ldp attack mia --target pate|synth``), seeded.

Two checks per target, each with a false-alarm rate below 1e-6:

* the non-private reference (the same model trained on the pool; for synthetic data the ``copy`` generator,
  which resamples the training rows) is caught: its AUC exceeds ½ + 5·SE, SE = √((n₁ + n₂ + 1)/(12·n₁·n₂)) the
  AUC's standard error when scores do not depend on membership (Mann-Whitney, n₁ members, n₂ others); a
  memoryless model passes that with probability Φ̄(5) = 2.9e-7;
* the private pipeline's ε lower bound never exceeds its printed ε: the bound is computed at confidence
  1 − 1e-7 for each of the four scores, so a sound ε is crossed with probability at most 4e-7.
"""

from __future__ import annotations

import json
import math

import pytest

from estimator.attacks.targets import PateTargetStudy, SynthTargetStudy, run_pate_target, run_synth_target
from estimator.pate.accounting import data_independent
from ldp_cli.main import main

CONFIDENCE = 1 - 1e-7


def _caught(row: dict, score: str) -> None:
    n1 = row["target_members"]
    n2 = row["pool"] - n1
    se = math.sqrt((n1 + n2 + 1) / (12 * n1 * n2))
    assert row["attacks"][score]["auc"] > 0.5 + 5 * se, (row["attacks"][score]["auc"], se)


def test_a_pate_student_against_the_model_trained_on_the_pool() -> None:
    r = run_pate_target(PateTargetStudy(sigmas=(8.0,), shadows=6, confidence=CONFIDENCE, seed=0))
    direct, student = r["rows"]
    assert not direct["dp"] and direct["printed_epsilon"] is None
    _caught(direct, "shadow")
    assert student["printed_epsilon"] == pytest.approx(data_independent(8.0, 200, 1e-5)["epsilon"])
    assert 0.0 <= student["epsilon_lower_bound"] <= student["printed_epsilon"]


def test_a_classifier_on_dp_synthetic_data_against_the_copy_baseline() -> None:
    study = SynthTargetStudy(method="dpgan", epsilons=(2.0,), gan_steps=20, shadows=2, confidence=CONFIDENCE)
    copy, gan = run_synth_target(study)["rows"]
    assert not copy["dp"] and gan["printed_epsilon"] == 2.0
    _caught(copy, "loss")
    assert 0.0 <= gan["epsilon_lower_bound"] <= 2.0


def test_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["attack", "mia", "--target", "pate", "--sigmas", "8", "--shadows", "2", "--pool", "60", "--json"]
    assert main([*argv, "--no-progress"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["target"] == "pate" and obj["study"]["pool"] == 60
    assert [r["setting"] for r in obj["rows"]] == ["softmax on the pool (no PATE, no DP)", "PATE student, GNMax σ=8"]
    for r in obj["rows"]:
        assert {"printed_epsilon", "epsilon_lower_bound", "attacks"} <= set(r)
    assert main(["attack", "mia", "--target", "synth", "--plot", "x.png"]) == 2
    assert "not available with --target" in capsys.readouterr().err
