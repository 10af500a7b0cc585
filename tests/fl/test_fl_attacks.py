"""Attack checks: analytic gradient inversion (exact in the clear, a mixture under secure
aggregation, noise from a masked upload), loss-threshold membership inference against
its DP bounds, the statistics behind them, and ``ldp fl attack``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ldp_cli.main import main
from ldp_core.fl import LocalTraining, RoundConfig, SoftmaxRegression, clip_to_norm, train_client
from simulator.scenarios.fl.attacks import (
    MembershipConfig,
    advantage_bound,
    advantage_with_ci,
    best_threshold,
    clopper_pearson,
    cosine,
    invert_single_example,
    leading_direction,
    run_membership,
    secagg_views,
)


def _update(model, params, x, y, lr, rng, cid="c"):
    cfg = RoundConfig(0, params, "fedavg", LocalTraining(epochs=1, batch_size=1, learning_rate=lr))
    return train_client(model, cfg, x[None, :].astype(np.float32), np.array([y]), rng, cid).delta


@pytest.mark.parametrize("d, k, seed", [(16, 2, 0), (64, 10, 1), (300, 5, 2)])
def test_analytic_inversion_recovers_the_input_of_an_unprotected_update(d: int, k: int, seed: int) -> None:
    """One SGD step on one example: ΔW = −η x gᵀ, Δb = −η g, so ΔW Δb/‖Δb‖² = x, up to float32.

    Tolerance: Δ = fl(θ − ηg) − θ carries an absolute error e ≤ 2u·max|θ| per coordinate
    (u = 2⁻²⁴; cancellation), besides relative errors of a few u. With ΔW = x Δbᵀ,
    x̂ − x ≈ (E_W Δb − x (Δb·e_b))/‖Δb‖², so |x̂_i − x_i| ≤ e·√K·(1 + |x_i|)/‖Δb‖; the test
    allows twice that plus 1e-5 relative (a model that is confident and right has small ‖Δb‖,
    hence the data-dependent bound). Clipping scales Δ and changes nothing."""
    model = SoftmaxRegression(d, k)
    rng = np.random.default_rng(seed)
    params = rng.normal(scale=0.3, size=model.num_params).astype(np.float32)
    u = 2.0**-24
    for _ in range(5):
        x = rng.normal(size=d).astype(np.float32)
        delta = _update(model, params, x, int(rng.integers(k)), 0.1, rng)
        nb = float(np.linalg.norm(delta[d * k :].astype(np.float64)))
        tol = 2 * (2 * u * float(np.abs(params).max())) * math.sqrt(k) * (1 + np.abs(x)) / nb + 1e-5 * np.abs(x)
        assert np.all(np.abs(invert_single_example(delta, d, k) - x) <= tol)
        half = 0.5 * float(np.linalg.norm(delta.astype(np.float64)))
        clipped, _ = clip_to_norm(delta.astype(np.float64), half)
        assert np.linalg.norm(clipped) == pytest.approx(half)
        assert np.all(np.abs(invert_single_example(clipped, d, k) - x) <= tol)
        assert abs(cosine(leading_direction(delta, d, k), x)) == pytest.approx(1.0, abs=1e-6)


def test_secure_aggregation_leaves_a_mixture_and_a_masked_upload_leaves_noise() -> None:
    """Three clients, one example each, clipped to C, summed through SecAgg+.

    Sum: with b_j the clipped bias parts and B = Σ b_j, ΔW_sum Δb_sum/‖B‖² = Σ a_j x_j with
    a_j = b_j·B/‖B‖² (Σ a_j = 1). The decoded sum differs from the float sum by quantization,
    at most n/s per coordinate (s ≈ 7e8 here), far below the 1e-6 tolerance. Inputs are
    independent N(0, I_256), nearly orthogonal (|cos| ~ 1/16), so the mixture sits far from each:
    cos(x̂, x_j) ≈ a_j‖x_j‖/‖x̂‖ < 0.9 and ‖x̂ − x_j‖ ≥ (1 − a_j)·‖x_j‖-ish, checked as > 0.3‖x_j‖.

    Masked upload: uniform in Z_{2^32} and independent of the inputs, so x̂ has i.i.d. symmetric
    coordinates given the bias part and cos(x̂, x_j) is approximately N(0, 1/d): |cos| ≤ 4/√d = 0.25
    fails with probability about 6e-5 per input."""
    d, k, n, C = 256, 10, 3, 0.5
    model = SoftmaxRegression(d, k)
    rng = np.random.default_rng(7)
    params = rng.normal(scale=0.01, size=model.num_params).astype(np.float32)
    X = rng.normal(size=(n, d))
    ups = [clip_to_norm(_update(model, params, X[j], j, 0.1, rng, f"c{j}").astype(np.float64), C)[0] for j in range(n)]
    masked, total = secagg_views(ups, C, rng)
    np.testing.assert_allclose(total, np.sum(ups, axis=0), atol=1e-6)
    bs = [u[d * k :] for u in ups]
    B = np.sum(bs, axis=0)
    a = np.array([b @ B for b in bs]) / (B @ B)
    xh = invert_single_example(total, d, k)
    np.testing.assert_allclose(xh, a @ X, rtol=1e-4, atol=1e-6)
    assert a.sum() == pytest.approx(1.0)
    for j in range(n):
        assert cosine(xh, X[j]) < 0.9
        assert np.linalg.norm(xh - X[j]) > 0.3 * np.linalg.norm(X[j])
        assert abs(cosine(invert_single_example(masked, d, k), X[j])) <= 4 / math.sqrt(d)
        assert abs(cosine(leading_direction(masked, d, k), X[j])) <= 4 / math.sqrt(d)


def test_randomized_response_attains_the_epsilon_delta_advantage_bound() -> None:
    """ε-DP randomized response (report the true bit with probability e^ε/(1 + e^ε)): the test
    "say member iff the report is 1" has TPR − FPR = (e^ε − 1)/(e^ε + 1), the bound at δ = 0;
    adding δ mass of "reveal the bit" raises both to (e^ε − 1 + 2δ)/(e^ε + 1)."""
    for eps in (0.1, 1.0, 3.0):
        p = math.exp(eps) / (1 + math.exp(eps))
        assert advantage_bound(eps, 0.0) == pytest.approx(p - (1 - p), rel=1e-12)
        dlt = 1e-3  # with prob δ reveal, else RR: TPR − FPR = δ + (1 − δ)(2p − 1)
        assert advantage_bound(eps, dlt) >= dlt + (1 - dlt) * (2 * p - 1) - 1e-12
    assert advantage_bound(math.inf, 1e-5) == 1.0 and advantage_bound(50.0, 1e-5) == pytest.approx(1.0)


def test_clopper_pearson_and_threshold() -> None:
    """k = 0: the upper end solves (1 − p)^n = α/2, i.e. 1 − (α/2)^(1/n); k = n mirrors it."""
    lo, hi = clopper_pearson(0, 10, 0.05)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025**0.1, rel=1e-9)
    lo, hi = clopper_pearson(10, 10, 0.05)
    assert hi == 1.0 and lo == pytest.approx(0.025**0.1, rel=1e-9)
    lo, hi = clopper_pearson(30, 100, 0.05)
    assert lo < 0.3 < hi and hi - lo == pytest.approx(2 * 1.96 * math.sqrt(0.3 * 0.7 / 100), rel=0.1)
    members, non = np.array([0.1, 0.2, 0.3, 2.0]), np.array([0.5, 1.0, 3.0, 4.0])
    tau = best_threshold(members, non)
    assert tau == 0.3  # TPR 3/4, FPR 0; τ = 2.0 gives 1 − 1/2, τ = 0.2 gives 1/2
    assert best_threshold(members, np.array([0.25, 1.0, 3.0, 4.0])) == 0.2  # a tie (1/2) goes to the smaller τ
    r = advantage_with_ci(members, non, tau, 0.05)
    assert r["advantage"] == pytest.approx(0.75) and r["ci_low"] < 0.75 < r["ci_high"]


SMALL = MembershipConfig(candidate_clients=200, rounds=12, noise_multipliers=(8.0,))


def test_membership_advantage_without_dp_and_within_the_bound_under_dp() -> None:
    """Without DP the model overfits (4 examples per client, 200 features): the lower end of the
    advantage's interval is above 0. With σ = 8 (ε about 0.5 at q = 0.5 over 12 rounds), the
    interval's lower end cannot exceed the true advantage (with probability ≥ 95 %), which DP
    bounds by the total variation δ(0) and by (e^ε − 1 + 2δ)/(e^ε + 1) ≥ δ(0)."""
    r = run_membership(SMALL)
    plain, dp = r["settings"]
    assert plain["epsilon"] is None and plain["ci"][0] > 0.0
    assert plain["train_accuracy"] > plain["nonmember_accuracy"] + 0.2
    assert plain["member_loss_mean"] < plain["nonmember_loss_mean"]
    assert 0 < dp["epsilon"] < 1.0
    assert dp["bound_total_variation"] <= dp["bound_epsilon_delta"] <= 1.0
    half = dp["calibrated_threshold"]["half_width"]
    assert dp["advantage"] - half <= dp["bound_total_variation"]
    assert dp["advantage"] - half <= dp["bound_epsilon_delta"]
    assert dp["yeom_threshold"]["advantage"] - dp["yeom_threshold"]["half_width"] <= dp["bound_total_variation"]
    assert 0 < r["joining_clients"] < 200 and plain["calibrated_threshold"]["members"] > 50


def test_cli_json_and_plot(tmp_path, capsys) -> None:
    png = tmp_path / "attack.png"
    assert main(["fl", "attack", "--rounds", "1", "--trials", "2", "--seed", "4", "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"scenario", "seed", "membership_inference", "gradient_inversion", "plot"} <= set(out)
    mi, inv = out["membership_inference"], out["gradient_inversion"]
    assert out["seed"] == 4 and mi["rounds"] == 1 and inv["trials"] == 2
    for s in mi["settings"]:
        assert {
            "name",
            "epsilon",
            "advantage",
            "ci",
            "bound_epsilon_delta",
            "bound_total_variation",
            "bound_yeom",
            "yeom_threshold",
            "calibrated_threshold",
            "train_accuracy",
            "nonmember_accuracy",
        } <= set(s)
    names = [s["name"] for s in inv["settings"]]
    assert names[0] == "individual_update" and "secagg_masked_update" in names and "secagg_sum_of_10" in names
    for s in inv["settings"]:
        assert {
            "cosine_mean",
            "svd_abs_cosine_mean",
            "relative_error_median",
            "success_rate",
            "epsilon_one_round",
        } <= set(s)
    assert inv["settings"][0]["success_rate"] == 1.0
    assert png.read_bytes()[:4] == b"\x89PNG"
