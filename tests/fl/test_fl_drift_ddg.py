"""The drift scenario with the distributed discrete Gaussian at central DP-FedAvg's ε
(compare_drift_ddg_to_central, DDGMean; issue 13)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from estimator.fl.aggregators import RoundContext
from estimator.fl.ddg_accounting import noise_for_epsilon
from estimator.fl.dp import ClientLevelAccountant
from estimator.fl.sampling import FixedCountSampling
from ldp_cli.main import main
from ldp_core.fl.ddg import discrete_gaussian_variance
from ldp_core.fl.models import SoftmaxRegression
from ldp_core.fl.training import ClientUpdate, LocalTraining
from simulator.scenarios.fl.drift import (
    DDGMean,
    DriftConfig,
    DriftDPConfig,
    compare_drift_ddg_to_central,
    plot_drift_ddg,
)

CFG = DriftConfig(
    clients=20,
    clients_per_round=10,
    features=6,
    classes=4,
    mean_examples=40,
    rounds=15,
    class_separation=1.0,
    training=LocalTraining(epochs=2, batch_size=10, learning_rate=0.2),
)


def test_ddg_mean_error_variance_matches_the_spec_and_central_at_16_bits() -> None:
    m, C, z, dim = 10, 1.0, 1.0, SoftmaxRegression(6, 4).num_params
    central = ClientLevelAccountant(FixedCountSampling(m), 20, 1e-5)
    for _ in range(15):
        central.record(z)
    spec = noise_for_epsilon(central.epsilon_known_sample(), 1e-5, 15, clip_norm=C, clients=m, dim=dim, bits=16)
    rng = np.random.default_rng(5)
    U = rng.normal(size=(m, dim))
    U *= 0.5 * C / np.linalg.norm(U, axis=1, keepdims=True)  # inside the clip: no clipping bias
    U = U.astype(np.float32).astype(np.float64)
    ups = [ClientUpdate(f"c{i}", 0, U[i].astype(np.float32), 1) for i in range(m)]
    agg, trials = DDGMean(spec), 120
    err2 = np.empty(trials)
    for t in range(trials):
        ctx = RoundContext(t, dim, np.random.default_rng([7, t]), float(m))
        err2[t] = float(np.sum((agg.aggregate(ups, ctx).delta - U.mean(axis=0)) ** 2))
    # E‖e‖² = dim·γ²·m·Var N_Z(0, σ_ℓ²)/m² (the summed shares; the rotation is orthogonal) + R, with the
    # rounding part 0 ≤ R ≤ γ²·m·D/4 / m² (each of m·D rotated coordinates moves by Bernoulli(f), Var ≤ 1/4).
    v_noise = dim * spec.gamma**2 * m * discrete_gaussian_variance(spec.local_sigma2) / m**2
    r_max = spec.gamma**2 * m * spec.padded_dim / 4 / m**2
    # ‖e‖² is close to a scaled χ²_dim: sd ≈ v·sqrt(2/dim) per trial; 5 standard errors of the mean of 120
    # (about 12 % at dim = 28: a wrong γ, 1/m or share σ moves it by a factor, not by percent)
    se = v_noise * math.sqrt(2 / dim) / math.sqrt(trials)
    assert v_noise - 5 * se <= err2.mean() <= v_noise + r_max + 5 * se
    # at 16 bits the distributed noise is within 5 % of central's (σC)² per coordinate at this ε
    v_central = dim * (z * C) ** 2 / m**2
    z_ddg = spec.noise_stddev / C
    assert v_noise == pytest.approx(dim * (z_ddg * C) ** 2 / m**2, rel=1e-3)
    # a wrong scale (γ, the 1/m, or the shares' σ) would move this by far more than the tolerance
    assert err2.mean() == pytest.approx(v_noise, rel=5 * se / v_noise + r_max / v_noise)
    assert v_central < v_noise <= 1.05**2 * v_central


def test_ddg_at_16_bits_matches_central_accuracy_at_equal_epsilon() -> None:
    seeds = tuple(range(8))
    out = compare_drift_ddg_to_central(CFG, DriftDPConfig(1.0, 1.0), bits=(16,), seeds=seeds)
    central, ddg = out["rows"]
    assert central["noise"] == "central" and ddg["bits"] == 16 and not ddg["infeasible"]
    # the DDG's ε against the operator is at most central's against whoever knows the sample, within 0.1 %
    assert ddg["epsilon_server_operator"] <= out["target_epsilon"] * (1 + 1e-9)
    assert ddg["epsilon_server_operator"] >= 0.97 * out["target_epsilon"]
    assert 1.0 < ddg["noise_multiplier"] < 1.1
    # paired by seed (same data, schedule and training seed): under equal accuracy the mean difference is
    # ~ N(0, s²/S), s the sample sd of the S = 8 differences; |t| ≤ 4.79 is t_7's two-sided 0.1 % bound.
    d = np.array(ddg["final_accuracy"]) - np.array(central["final_accuracy"])
    se = float(np.std(d, ddof=1)) / math.sqrt(len(d))
    assert se > 0
    assert abs(float(d.mean())) <= 4.79 * se
    # and the runs are not degenerate: both learn well above chance (1/4) on this partition
    assert central["final_accuracy_mean"] > 0.5 and ddg["final_accuracy_mean"] > 0.5


def test_compare_is_seeded_and_marks_infeasible_bits(tmp_path: Path) -> None:
    small = DriftConfig(
        clients=8,
        clients_per_round=4,
        features=3,
        classes=2,
        mean_examples=20,
        rounds=3,
        training=LocalTraining(epochs=1, batch_size=10, learning_rate=0.2),
    )
    a = compare_drift_ddg_to_central(small, DriftDPConfig(1.0, 1.0), bits=(3, 12))
    b = compare_drift_ddg_to_central(small, DriftDPConfig(1.0, 1.0), bits=(3, 12))
    assert a == b
    assert a["rows"][1] == {"noise": "distributed_discrete_gaussian", "bits": 3, "infeasible": True}
    assert a["rows"][2]["infeasible"] is False
    plot_drift_ddg(a, str(tmp_path / "ddg.png"))
    assert (tmp_path / "ddg.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_drift_cli_ddg_key(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["fl", "drift", "--rounds", "2", "--dp", "--noise-multiplier", "2", "--ddg", "--ddg-bits", "16"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"strategies", "final_accuracy", "dp", "ddg"} <= set(out)
    assert out["dp"]["scenario"] == "drift-dp"
    assert out["ddg"]["scenario"] == "drift-ddg" and [r["bits"] for r in out["ddg"]["rows"]] == [None, 16]
    assert out["ddg"]["target_epsilon"] == out["dp"]["runs"][0]["epsilon_known_sample"]
