"""The generators' pieces do what they claim: the exponential mechanism's law, measured marginals within
their noise, the DP-GAN's per-example gradient norms, and the evaluation's measures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.synth import marginal
from estimator.synth.data import SynthError, Table, plant_rare, population
from estimator.synth.dpgan import GANConfig, _Nets, _sigmoid, per_example_norms
from estimator.synth.evaluate import dcr, marginal_errors, planted_found
from estimator.synth.mbi_model import model_marginal, sample
from estimator.synth.runner import generate


def test_exponential_mechanism_draws_from_its_law() -> None:
    scores, eps, n = np.array([0.0, 1.0, 2.0, 4.0]), 1.5, 40_000
    rng = np.random.default_rng(11)
    draws = np.bincount([marginal.exponential_mechanism(scores, eps, 1.0, rng) for _ in range(n)], minlength=4)
    p = np.exp(eps * scores / 2.0)
    p /= p.sum()
    # each count is Binomial(n, p_i): 5.5 standard deviations is a < 1e-7 two-sided false alarm per cell
    assert np.all(np.abs(draws - n * p) <= 5.5 * np.sqrt(n * p * (1 - p)))


def test_mst_model_reproduces_the_measured_marginals_within_their_noise() -> None:
    table = population(2000, 8).select(["platform", "region", "network", "crashes"])
    run = marginal.mst(table, 20.0, 1e-6, np.random.default_rng(3), iters=500)
    sigma2 = run.extra["sigma_2way"]
    for clique in run.cliques:
        idx = tuple(table.columns.index(c) for c in clique)
        err = np.abs(model_marginal(run.model, clique) - marginal.marginal(table, idx))
        # the fit projects the noisy measurements onto one distribution: its error per cell stays within
        # the noise (σ of the measurement); 6σ is a < 1e-8 false alarm per cell
        assert err.max() <= 6.0 * sigma2, clique
    assert run.table.rows == table.rows
    assert marginal_errors(table, run.table, (2,))["tv_2way"] < 0.1


def test_sampling_draws_only_from_the_given_generator() -> None:
    """Records come from the caller's Generator alone: one seed gives one table, numpy's global generator is
    neither read nor moved, and every column's counts are the model's marginal rounded (within 1 per cell for
    a column sampled from its marginal alone)."""
    table = population(1500, 5).select(["platform", "region", "network"])
    run = marginal.mst(table, 20.0, 1e-6, np.random.default_rng(4), iters=300)
    np.random.seed(12345)
    before = np.random.get_state()
    a = sample(run.model, table, 1000, np.random.default_rng(9))
    after = np.random.get_state()
    assert np.array_equal(before[1], after[1]) and before[2] == after[2]  # the global generator did not move
    b = sample(run.model, table, 1000, np.random.default_rng(9))
    assert np.array_equal(a.codes, b.codes)
    assert not np.array_equal(a.codes, sample(run.model, table, 1000, np.random.default_rng(10)).codes)
    roundings = []
    for j, col in enumerate(table.columns):
        model = model_marginal(run.model, (col,))
        got = np.bincount(a.codes[:, j], minlength=model.size)
        roundings.append(np.abs(got - model * 1000 / model.sum()).max())
    assert min(roundings) < 1.0  # the first column filled is its marginal, rounded
    assert max(roundings) < 0.05 * 1000  # later ones follow it through the conditionals


def test_dpgan_per_example_norms_are_the_gradients_norms() -> None:
    rng = np.random.default_rng(2)
    table = population(20, 1).select(["platform", "age", "tier"])
    x = table.one_hot()
    nets = _Nets(x.shape[1], [(0, 3), (3, 8), (8, 11)], GANConfig(hidden=7), rng)
    s, h, a = nets.discriminate(x)
    da, ds, _ = nets.d_backward(x, _sigmoid(s) - 1.0, h, a)
    fast = per_example_norms(x, da, ds, h)
    for i in range(len(x)):  # each example's gradient built in full, one at a time
        g = nets.d_grad(x[i : i + 1], da[i : i + 1], ds[i : i + 1], h[i : i + 1], np.ones(1))
        assert fast[i] == pytest.approx(math.sqrt(sum(float(np.sum(v * v)) for v in g.values())), rel=1e-10)


def test_dcr_and_planted_records() -> None:
    t = Table(("a", "b"), (("x", "y"), ("u", "v", "w")), np.array([[0, 0], [1, 2]]))
    s = t.with_codes(np.array([[0, 0], [0, 2], [1, 1], [0, 1]]))
    assert dcr(s, t).tolist() == [0, 1, 1, 1]
    assert planted_found(s, np.array([[0, 2], [1, 0]])) == 1
    assert marginal_errors(t, t) == {"tv_1way": 0.0, "tv_2way": 0.0, "tv_3way": 0.0}


def test_the_memorising_reference_is_caught() -> None:
    rng = np.random.default_rng(4)
    train, planted = plant_rare(population(300, 6), 5, rng)
    assert planted_found(train, planted) == 5
    assert planted_found(population(300, 6), planted) == 0  # combinations found nowhere else
    # 30 draws per record: each planted record is missed with probability (1 − 1/n)^(30n) < e^−30
    copied, _ = generate("copy", train, 1.0, 1e-6, rng, rows=30 * train.rows)
    assert planted_found(copied, planted) == 5


def test_bad_requests_are_refused() -> None:
    table = population(50, 1).select(["platform", "network"])
    with pytest.raises(SynthError, match="unknown method"):
        generate("nope", table, 1.0, 1e-6, np.random.default_rng(0))
    with pytest.raises(SynthError, match="delta"):
        marginal.mst(table, 1.0, 1.5, np.random.default_rng(0))
    with pytest.raises(SynthError, match="epsilon"):
        marginal.aim(table, -1.0, 1e-6, np.random.default_rng(0))


def test_the_comparison_measures_each_generator_and_plots(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from estimator.synth.evaluate import plot
    from simulator.synth_study import compare

    result = compare(300, 1.0, 1e-6, 5, methods=("copy", "dpgan"), gan_steps=30)
    rows = {r["generator"]: r for r in result["generators"]}
    assert rows["copy"]["exact_copy_share"] == 1.0 and rows["copy"]["dcr_mean"] == 0.0
    assert rows["copy"]["privacy"] == "none" and rows["dpgan"]["privacy"] == "central"
    assert 0 < rows["dpgan"]["epsilon"] <= 1.0
    ref = result["reference"]
    assert 0 < ref["tv_2way"] < 1 and 0 <= ref["holdout_exact_copy_share"] <= 1
    plot(result["generators"], ref, str(tmp_path / "synth.png"))
    assert (tmp_path / "synth.png").stat().st_size > 10_000
