"""Model inversion, gradient inversion (numpy MLP) and DP-SGD's accuracy per group, each on seeded
generated data. Each threshold is stated with its derivation beside it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.attacks.data import GaussianTask
from estimator.attacks.gradients import (
    analytic_recovery,
    client_gradient,
    dlg_case,
    per_unit_recovery,
    recover_label,
    shared_gradient,
)
from estimator.attacks.groups import per_group_accuracy
from estimator.attacks.inversion import inversion_similarity, log_confidence_grad
from estimator.errors import DatasetError
from ldp_core.fl.dpsgd import DPSGDConfig, train_dpsgd
from ldp_core.fl.models import MLP, SoftmaxRegression

# --- model inversion -------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [SoftmaxRegression(6, 3), MLP(6, 5, 3)])
def test_the_input_gradient_matches_finite_differences(model) -> None:
    rng = np.random.default_rng(0)
    params = rng.normal(size=model.num_params)
    x = rng.normal(size=6)
    f0, g = log_confidence_grad(model, params, x, 1)
    h = 1e-6
    fd = np.array([(log_confidence_grad(model, params, x + h * e, 1)[0] - f0) / h for e in np.eye(6)])
    np.testing.assert_allclose(g, fd, atol=1e-5)  # forward differences: error O(h·‖Hessian‖) ≈ 1e-6


def _inversion(sigma: float) -> dict:
    rng = np.random.default_rng(7)
    task = GaussianTask.make(64, 10, 4.0, rng)
    X, y = task.sample(300, rng)
    model = SoftmaxRegression(64, 10)
    cfg = DPSGDConfig(sigma, 1.0 if sigma else 1e9, 0.1, 0.5)
    w = train_dpsgd(model, model.init_params(rng), X, y, cfg, 200, np.random.default_rng(1), np.random.default_rng(2))
    return inversion_similarity(model, w, X, y)


def test_model_inversion_recovers_the_class_means_and_dp_noise_blurs_them() -> None:
    plain, noisy = _inversion(0.0), _inversion(4.0)
    # a direction independent of a class mean in d = 64 has cosine ~ N(0, 1/d): 4.9/√64 = 0.61 is the
    # 1e-6 one-sided bar of chance
    assert plain["mean_cosine_to_class_mean"] > 4.9 / math.sqrt(64)
    assert plain["identified_fraction"] == 1.0
    # over 8 noise seeds (batches and noise) the σ = 4 cosine was 0.37 with sd 0.02 and the plain one 0.90:
    # a bar 0.2 below the plain figure sits more than 15 sd above the noisy mean
    assert noisy["mean_cosine_to_class_mean"] < plain["mean_cosine_to_class_mean"] - 0.2


# --- gradient inversion (numpy MLP) ----------------------------------------------------------------


def _clients(k: int, seed: int = 0) -> tuple[MLP, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    task = GaussianTask.make(16, 4, 3.0, rng)
    model = MLP(16, 8, 4)
    X, y = task.sample(k, rng)
    return model, model.init_params(rng), X, y


def test_one_clients_gradient_gives_its_input_away_exactly_clipped_or_not() -> None:
    model, params, X, y = _clients(1)
    for defence in ("none", "clip"):
        g = shared_gradient(model, params, X, y, defence, np.random.default_rng(0), clip_norm=0.1)
        assert recover_label(model, g) == y[0]
        # exact up to float64 rounding: x = ∂L/∂W1·g_b/‖g_b‖² holds identically for one example
        np.testing.assert_allclose(analytic_recovery(model, g), X[0], rtol=1e-9, atol=1e-9)
    assert np.linalg.norm(shared_gradient(model, params, X, y, "clip", np.random.default_rng(0), 0.1)) <= 0.1 + 1e-12


def test_dlg_optimisation_finds_the_input_without_the_closed_form() -> None:
    model, params, X, y = _clients(1, seed=3)
    r = dlg_case(model, params, X, y, "none", np.random.default_rng(0), bound=8.0)
    assert r["label_recovered"]
    assert r["dlg_error"] < 0.01  # measured 5e-5; 1% of ‖x‖ is a recognisable input


def test_noise_and_secagg_defeat_the_analytic_recovery() -> None:
    errs = []
    for seed in range(3):
        model, params, X, y = _clients(1, seed)
        errs.append(
            dlg_case(model, params, X, y, "noise", np.random.default_rng(seed), 1.0, 1.0, False)["analytic_error"]
        )
    # σ = 1, C = 1: the noise on ∂L/∂W1 (norm ≈ σC·√(d·h) = 11) swamps the clipped signal (norm ≤ 1), so
    # x̂ is noise/‖g_b‖² nearly orthogonal to x: the error is ≈ √(1 + small), no better than guessing zeros
    assert min(errs) > 0.9
    model, params, X, y = _clients(4)
    r = dlg_case(model, params, X, y, "secagg", np.random.default_rng(0), run_dlg=False)
    # the sum of 4 clipped gradients gives a weighted mix of the 4 inputs: far from each of them
    assert r["analytic_error"] > 0.3
    single = client_gradient(model, params, X[0], int(y[0]))
    assert not np.allclose(shared_gradient(model, params, X, y, "secagg", np.random.default_rng(0)), single)
    with pytest.raises(DatasetError, match="defence"):
        shared_gradient(model, params, X, y, "magic", np.random.default_rng(0))


# --- accuracy per group ----------------------------------------------------------------------------


def test_dp_sgd_costs_the_minority_class_more_than_the_majority() -> None:
    task = GaussianTask.make(20, 4, 3.0, np.random.default_rng(0))
    r = per_group_accuracy(
        task,
        SoftmaxRegression(20, 4),
        DPSGDConfig(1.0, 0.5, 0.05, 0.5),
        200,
        np.random.default_rng(0),
        test_per_class=5000,
    )
    assert r["train_rows_per_class"][-1] < 0.05 * sum(r["train_rows_per_class"])
    # each group accuracy is a mean over ≥ 5,000 test rows: sd ≤ 0.5/√5000 = 0.0071; the difference of
    # the two drops adds four such terms, sd ≤ 4·0.0071 = 0.028 (triangle inequality, whatever their
    # correlation): a margin of 4.9·0.028 = 0.14 keeps the false alarm below 1e-6
    assert r["drop"]["minority"] > r["drop"]["majority"] + 0.14
    assert r["epsilon"] is not None and r["epsilon"] > 0
    with pytest.raises(DatasetError, match="minority_share"):
        per_group_accuracy(
            task,
            SoftmaxRegression(20, 4),
            DPSGDConfig(1.0, 0.5, 0.05, 0.5),
            5,
            np.random.default_rng(0),
            minority_share=0.5,
        )


def _exposed_per_sum(activation: str) -> list[int]:
    rng = np.random.default_rng(0)
    task = GaussianTask.make(16, 4, 3.0, rng)
    model = MLP(16, 32, 4, activation)
    params = model.init_params(rng)
    exposed = []
    for seed in range(5):
        X, y = task.sample(2, np.random.default_rng(seed))
        g = shared_gradient(model, params, X, y, "secagg", np.random.default_rng(0))
        cands = per_unit_recovery(model, g)
        err = np.linalg.norm(cands[:, None, :] - X[None], axis=2) / np.linalg.norm(X, axis=1)
        exposed.append(int((err.min(axis=0) < 1e-6).sum()))
        # the least-squares mix over all units is far from both inputs either way
        assert dlg_case(model, params, X, y, "secagg", np.random.default_rng(0), run_dlg=False)["analytic_error"] > 0.3
    return exposed


def test_with_relu_a_secagg_sum_still_gives_single_clients_inputs_unit_by_unit() -> None:
    # a ReLU unit that fired for one client only has ratio ∂L/∂W1[:, j]/∂L/∂b1[j] = that client's x exactly
    # (to float64 rounding, hence 1e-6); with 32 units and 2 clients, a sum in which no unit fires for
    # exactly one client needs every active unit shared, which these seeds never show
    relu = _exposed_per_sum("relu")
    assert all(e >= 1 for e in relu), relu
    # tanh's derivative is never 0: every unit mixes both clients, and no candidate is exact
    assert _exposed_per_sum("tanh") == [0] * 5
