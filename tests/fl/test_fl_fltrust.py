"""FLTrust (Cao et al. NDSS 2021): trust scores and rescaling against a hand computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.fl.aggregators import RoundContext, WeightedMean
from estimator.fl.robust import FLTrust
from ldp_core.fl import ClientUpdate, FLError


def test_fltrust_matches_hand_computation() -> None:
    # root g0 = (3, 4), ‖g0‖ = 5.
    # a = (6, 8): cos 1, rescaled (3, 4), TS 1.
    # b = (0, 2): cos 4/5 = 0.8, rescaled (0, 5), TS 0.8.
    # c = (-3, -4): cos −1 → TS 0 (dropped).
    # d = (1, 0): cos 3/5 = 0.6, rescaled (5, 0), TS 0.6.
    # aggregate = (1·(3,4) + 0.8·(0,5) + 0.6·(5,0)) / 2.4 = (6, 8) / 2.4 = (2.5, 3.333…)
    vecs = [(6.0, 8.0), (0.0, 2.0), (-3.0, -4.0), (1.0, 0.0)]
    ups = [ClientUpdate(f"c{i}", 0, np.array(v, dtype=np.float32), 1 + 100 * i) for i, v in enumerate(vecs)]
    agg = FLTrust(WeightedMean(), root=lambda ctx: np.array([3.0, 4.0]))
    res = agg.aggregate(ups, RoundContext(0, 2, np.random.default_rng(0), 4.0))
    np.testing.assert_allclose(res.delta, [2.5, 10.0 / 3.0], rtol=1e-12)
    ts = res.info["trust_scores"]
    assert ts == pytest.approx({"c0": 1.0, "c1": 0.8, "c2": 0.0, "c3": 0.6})
    assert res.info["trusted_clients"] == 3 and res.num_clients == 4
    # every kept update has the root's norm, so the aggregate's norm is at most ‖g0‖ (convex combination)
    assert math.hypot(*res.delta) <= 5.0 + 1e-12


def test_fltrust_all_distrusted_is_zero_and_bad_root_refused() -> None:
    ups = [ClientUpdate("a", 0, np.array([-1.0, 0.0], dtype=np.float32), 5)]
    ctx = RoundContext(0, 2, np.random.default_rng(0), 1.0)
    res = FLTrust(WeightedMean(), root=lambda c: np.array([1.0, 0.0])).aggregate(ups, ctx)
    np.testing.assert_array_equal(res.delta, [0.0, 0.0])
    with pytest.raises(FLError):
        FLTrust(WeightedMean(), root=lambda c: np.zeros(3)).aggregate(ups, ctx)


def test_sign_flip_30_percent_mean_collapses_fltrust_keeps_clean_accuracy() -> None:
    """Seeded; 2000 test examples, so one accuracy's sd ≤ √(0.25/2000) ≈ 0.011: a 0.05 margin is
    > 4 sd. Mean under 6 of 20 clients sending −5 × their update steps along −0.7·g·(5·0.3/0.7 − 1) < 0 and diverges."""
    from simulator.scenarios.fl.poisoning import PoisoningConfig, run_one

    cfg = PoisoningConfig(rounds=25, seed=3)
    clean = run_one(cfg, None, 0.0, "fltrust")["accuracy"]
    assert clean > 0.9
    fl = run_one(cfg, "sign_flip", 0.3, "fltrust")
    mean = run_one(cfg, "sign_flip", 0.3, "mean")
    assert fl["malicious_clients"] == 6
    assert fl["accuracy"] >= clean - 0.05
    assert mean["accuracy"] < 0.5


def test_backdoor_success_lower_with_fltrust_than_mean() -> None:
    """~1600 triggered non-target test examples: ASR sd ≤ √(0.25/1600) = 0.0125; require a gap of 0.5 (≫ noise)."""
    from simulator.scenarios.fl.poisoning import PoisoningConfig, run_one

    cfg = PoisoningConfig(rounds=25, seed=4)
    fl = run_one(cfg, "backdoor", 0.2, "fltrust")["attack_success_rate"]
    mean = run_one(cfg, "backdoor", 0.2, "mean")["attack_success_rate"]
    assert mean > 0.8
    assert fl < mean - 0.5


def test_cli_poisoning_json_and_plot(tmp_path, capsys) -> None:
    import json

    from ldp_cli.main import main

    png = tmp_path / "p.png"
    assert main(["fl", "attack", "--poisoning", "--rounds", "1", "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"] == "poisoning" and out["plot"] == str(png) and png.stat().st_size > 0
    assert set(out["clean_accuracy"]) == {"mean", "median", "trimmed_mean", "krum", "fltrust"}
    assert len(out["results"]) == 3 * 3 * 5
    keys = {"attack", "fraction", "aggregator", "accuracy", "attack_success_rate", "malicious_clients"}
    assert all(keys <= set(r) for r in out["results"])
    assert {r["malicious_clients"] for r in out["results"]} == {2, 4, 6}
    # the membership/inversion default is unchanged without the flag
    assert "membership_inference" not in out
