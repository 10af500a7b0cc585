"""The ε of MST, AIM and the DP-GAN, each against an independent computation (dp_accounting)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from estimator.synth import marginal
from estimator.synth.data import population
from estimator.synth.dpgan import GANConfig, dpgan, gan_epsilon, noise_for_epsilon
from estimator.synth.zcdp import epsilon_of_rho, rho_for_epsilon

DELTA = 1e-6


def rdp_epsilon(ledger: marginal.Ledger, delta: float) -> float:
    """dp_accounting's RDP ε of the ledger's steps: a Gaussian measurement with noise σ (sensitivity 1) is
    GaussianDpEvent(σ); an exponential-mechanism step of parameter ε has the RDP curve αε²/8 of a Gaussian
    with noise multiplier 2/ε (the same ρ), so it composes as GaussianDpEvent(2/ε)."""
    acc = rdp_privacy_accountant.RdpAccountant(orders=list(np.linspace(1.01, 200, 20000)))
    for kind, value, _ in ledger.steps:
        acc.compose(dp_event.GaussianDpEvent(value if kind == "gaussian" else 2.0 / value))
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize("rho", [1e-4, 0.01, 0.5, 3.0])
def test_conversion_agrees_with_dp_accounting_and_the_simple_bound(rho: float) -> None:
    mine = epsilon_of_rho(rho, DELTA)
    acc = rdp_privacy_accountant.RdpAccountant(orders=list(np.linspace(1.001, 500, 50000)))
    acc.compose(dp_event.GaussianDpEvent(1.0 / math.sqrt(2.0 * rho)))  # ρ = 1/(2σ²)
    theirs = float(acc.get_epsilon(DELTA))
    assert mine <= theirs + 1e-9  # a continuous minimum is never above a grid's
    assert mine == pytest.approx(theirs, rel=2e-3)
    assert mine <= rho + 2.0 * math.sqrt(rho * math.log(1.0 / DELTA))  # Bun & Steinke's looser conversion


@pytest.mark.parametrize("eps", [0.1, 1.0, 8.0])
def test_rho_for_epsilon_is_the_inverse(eps: float) -> None:
    rho = rho_for_epsilon(eps, DELTA)
    assert epsilon_of_rho(rho, DELTA) == pytest.approx(eps, rel=1e-9)
    assert epsilon_of_rho(rho * 1.001, DELTA) > eps


def test_mst_and_aim_spend_their_budget_and_no_more() -> None:
    table = population(400, 3).select(["platform", "network", "crashes"])
    for run in (
        marginal.mst(table, 1.0, DELTA, np.random.default_rng(1), iters=100),
        marginal.aim(table, 1.0, DELTA, np.random.default_rng(2), degree=2, iters=100),
    ):
        assert run.ledger is not None and run.rho is not None
        budget = rho_for_epsilon(1.0, DELTA)
        assert run.rho <= budget * (1 + 1e-9)
        assert run.rho == pytest.approx(budget, rel=1e-6)  # MST's thirds and AIM's last round use it all
        independent = rdp_epsilon(run.ledger, DELTA)
        assert run.epsilon == pytest.approx(1.0, rel=1e-6)
        assert independent == pytest.approx(1.0, rel=5e-3)
        assert independent >= 1.0 - 1e-9


def test_dpgan_noise_meets_the_target_by_the_projects_accountant() -> None:
    q, steps = 0.05, 300
    sigma = noise_for_epsilon(2.0, DELTA, q, steps)
    assert gan_epsilon(sigma, q, steps, DELTA) <= 2.0
    assert gan_epsilon(sigma / 1.01, q, steps, DELTA) > 2.0  # the smallest σ, to the search's 0.5 %
    # RDP is an upper bound on the (tight) PLD figure
    assert gan_epsilon(sigma, q, steps, DELTA, "rdp") >= gan_epsilon(sigma, q, steps, DELTA)


def test_dpgan_reports_the_epsilon_of_what_it_ran() -> None:
    table = population(300, 4).select(["platform", "network", "crashes"])
    out, info = dpgan(table, 1.5, DELTA, np.random.default_rng(5), rows=50, config=GANConfig(steps=60, batch=30))
    assert out.rows == 50 and out.columns == table.columns
    assert info["epsilon"] is not None and info["epsilon"] <= 1.5
    sigma, q = float(info["noise_multiplier"]), float(info["sample_rate"])  # type: ignore[arg-type]
    assert q == pytest.approx(30 / 300)
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), 60))
    assert info["epsilon"] <= acc.get_epsilon(DELTA)
