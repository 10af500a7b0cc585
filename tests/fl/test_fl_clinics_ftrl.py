"""The DP-FTRL row of the user's example (`ldp fl clinics --example`): after the example's four rows,
at the ε the "σ 2.0" row reaches against an adversary who knows the sample."""

from __future__ import annotations

import json

import pytest

from estimator.accounting.accountant import exact_gaussian_epsilon
from ldp_cli.main import main
from ldp_core.privacy_events import GaussianEvent, SelfComposedEvent


def test_example_has_a_dp_ftrl_row_at_the_known_sample_epsilon_of_sigma_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fl", "clinics", "--example", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert [r["setting"] for r in rows[:5]] == ["no clipping", "clip 0.5", "σ 0.5", "σ 2.0", "DP-FTRL"]
    sigma2, ftrl = rows[3], rows[4]
    assert {"setting", "accuracy", "weight_error", "epsilon"} <= set(ftrl)
    assert 0.0 <= ftrl["accuracy"] <= 1.0 and ftrl["weight_error"] >= 0.0
    assert ftrl["epsilon"] == pytest.approx(sigma2["epsilon_known_sample"], rel=1e-9)
    # 20 clinics, 10 per round: each clinic once per 2-round tree, 50 trees of depth ⌈log2 3⌉ = 2, so a
    # replaced clinic moves 100 node sums by 2·clip each: the composed Gaussian of 100 releases at z
    assert (ftrl["restart_every"], ftrl["trees"], ftrl["rounds_participated_max"]) == (2, 50, 50)
    z = ftrl["noise_multiplier"]
    by_hand = exact_gaussian_epsilon(SelfComposedEvent(GaussianEvent(z), 100), 1e-5, "replace")
    assert ftrl["epsilon"] == pytest.approx(by_hand, rel=1e-12)
    assert ftrl["epsilon_rdp"] >= ftrl["epsilon"]
    by = {a["adversary"]: a for a in ftrl["epsilon_by_adversary"]}
    assert by["observer"]["epsilon"] == by["knows_sample"]["epsilon"] == ftrl["epsilon"]
    assert by["observer"]["amplification"] is False and by["server_operator"]["epsilon"] is None
    assert ftrl["epsilon_server_operator"] is None


def test_example_text_shows_the_dp_ftrl_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fl", "clinics", "--example"]) == 0
    assert "DP-FTRL" in capsys.readouterr().out
