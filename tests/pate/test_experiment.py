"""The PATE study: each row's ε is the accountant's for what was answered, the student learns from the
noisy labels, and the DP-SGD baseline really runs at the semi-private student's ε."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.accounting.accountant import epsilon_pld
from estimator.accounting.queries import sampled_gaussian_event
from estimator.errors import DatasetError
from estimator.pate.accounting import data_dependent, data_independent
from estimator.pate.experiment import Config, make_synthetic_split, run_pate


def test_a_small_study_accounts_each_row_and_matches_dpsgd_at_the_same_epsilon() -> None:
    configs = (Config("gnmax", 8.0, 150), Config("confident", 8.0, 300, threshold=20.0, sigma1=12.5))
    r = run_pate(seed=5, configs=configs)
    g, c = r["tradeoff"]
    assert g["answered"] == 150 and 0 < c["answered"] < 300
    assert g["epsilon"] == pytest.approx(data_independent(8.0, 150, 1e-5)["epsilon"])
    assert c["epsilon"] == pytest.approx(data_independent(8.0, c["answered"], 1e-5, 300, 12.5)["epsilon"])
    assert c["epsilon_data_dependent"] <= c["epsilon"] + 1e-9 and g["epsilon_data_dependent"] <= g["epsilon"] + 1e-9
    assert c["label_accuracy"] > 0.8 and g["student_accuracy"] > 0.7
    assert r["ensemble_accuracy"] > r["teacher_accuracy_mean"]  # the vote beats a single teacher
    d = r["dpsgd_same_epsilon"]
    assert d["epsilon"] == r["epsilon"] == c["epsilon"]
    spent = epsilon_pld(sampled_gaussian_event(d["noise_multiplier"], d["sample_rate"], d["steps"]), 1e-5)
    assert spent <= d["epsilon"] * 1.001
    assert r["confident_vs_gnmax"][0]["gnmax"] == g["setting"]


def test_the_data_dependent_figure_is_that_of_the_votes() -> None:
    """Recompute one row's data-dependent ε from the study's own votes (seeded, so the same votes)."""
    r = run_pate(seed=6, configs=(Config("gnmax", 4.0, 80),), compare_dpsgd=False)
    assert r["tradeoff"][0]["epsilon_data_dependent"] < r["tradeoff"][0]["epsilon"]
    unanimous = np.tile([25, 0, 0, 0, 0, 0, 0, 0, 0, 0], (80, 1))
    assert data_dependent(unanimous, 4.0, 1e-5)["epsilon"] < r["tradeoff"][0]["epsilon_data_dependent"]


def test_the_synthetic_split_is_disjoint_and_sized() -> None:
    d = make_synthetic_split(np.random.default_rng(0), sensitive=500, public=100, test=50)
    assert (len(d.x_sensitive), len(d.x_public), len(d.x_test)) == (500, 100, 50)
    rows = {tuple(x) for x in np.vstack([d.x_sensitive, d.x_public, d.x_test])}
    assert len(rows) == 650 and set(np.unique(d.y_sensitive)) == set(range(10))


def test_bad_study_parameters_are_refused() -> None:
    with pytest.raises(DatasetError, match="data must be one of"):
        run_pate(data_name="mnist")
    with pytest.raises(DatasetError, match="fewer than 2 each"):
        run_pate(teachers=900, configs=(), compare_dpsgd=False)


def test_without_scikit_learn_the_study_says_which_extra_to_install(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sys

    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # import now raises ImportError
    with pytest.raises(DatasetError, match=r"ldp-telemetry\[ml\]"):
        run_pate(seed=0, configs=(), compare_dpsgd=False)
