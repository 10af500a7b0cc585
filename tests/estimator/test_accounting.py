"""(ε, δ) accounting: reference figures, the events dp_accounting lacks, and
composition of mixed events checked against dp_accounting itself."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats

from estimator.accounting.accountant import (
    AccountingError,
    account,
    basic_epsilon,
    delta_pld,
    epsilon_pld,
    exact_gaussian_epsilon,
    gaussian_noise_for_epsilon,
    max_steps_for_epsilon,
    rr_rdp,
    to_dp_event,
)
from ldp_core.errors import SpecError
from ldp_core.mechanisms import make_spec
from ldp_core.privacy_events import (
    ComposedEvent,
    DiscreteGaussianEvent,
    DiscreteLaplaceEvent,
    GaussianEvent,
    LaplaceEvent,
    LocalReportEvent,
    PoissonSampledEvent,
    PureDPEvent,
    SelfComposedEvent,
    event_from_dict,
    local_event,
)

REPLACE = dpa.NeighboringRelation.REPLACE_ONE
ADD_REMOVE = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE


def dpsgd(z: float, q: float, steps: int) -> SelfComposedEvent:
    step = GaussianEvent(z) if q == 1.0 else PoissonSampledEvent(q, GaussianEvent(z))
    return SelfComposedEvent(step, steps)


def balle_wang_delta(mu: float, eps: float) -> float:
    """δ(ε) of a Gaussian pair N(0,1) vs N(μ,1): Φ(μ/2 - ε/μ) - e^ε Φ(-μ/2 - ε/μ)
    (Balle and Wang, ICML 2018, Thm. 8), written independently of dp_accounting."""
    return float(stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps + stats.norm.logcdf(-mu / 2 - eps / mu)))


# -- the reference figures of the issue -----------------------------------------
@pytest.mark.parametrize(
    "z, q, steps, pld_ref, rdp_ref, tol",
    [
        (1.0, 0.01, 100, 0.718, 1.214, 0.001),
        (0.5, 0.01, 100, 6.48, 8.03, 0.01),
    ],
)
def test_reference_figures_subsampled_gaussian(z, q, steps, pld_ref, rdp_ref, tol):
    report = account(dpsgd(z, q, steps), 1e-5)
    assert report.epsilon_pld == pytest.approx(pld_ref, abs=tol)
    assert report.epsilon_rdp == pytest.approx(rdp_ref, abs=tol)
    assert report.rdp_complete
    assert report.epsilon_exact is None
    assert report.epsilon == report.epsilon_pld


def test_reference_figure_full_batch_gaussian_is_exact():
    """q = 1, z = 2, 100 steps: one Gaussian with μ = √100 / 2 = 5; ε ≈ 33.10."""
    report = account(dpsgd(2.0, 1.0, 100), 1e-5, discretization=1e-3)
    assert report.epsilon_exact == pytest.approx(33.10, abs=0.005)
    # the exact figure solves Balle–Wang's equation at δ = 1e-5
    assert balle_wang_delta(5.0, report.epsilon_exact) == pytest.approx(1e-5, rel=1e-6)
    # PLD is pessimistic: never below the exact value, within its discretization
    assert report.epsilon_exact - 1e-9 <= report.epsilon_pld <= report.epsilon_exact + 0.01
    assert report.epsilon_rdp > report.epsilon_pld
    assert report.epsilon == report.epsilon_exact


def test_rdp_non_convergence_is_detected_and_said():
    """q = 0.2 with multiplier 0.5: dp_accounting drops orders 1.1.. (its fractional
    series does not converge); the report must say so, not pass the figure off as tight."""
    report = account(dpsgd(0.5, 0.2, 20), 1e-5, discretization=1e-3)
    assert not report.rdp_complete
    assert 1.1 in report.rdp_dropped_orders
    assert any("did not converge" in n for n in report.notes)
    assert report.to_dict()["rdp_complete"] is False
    # still a valid (looser) bound: never below the tight PLD figure
    assert report.epsilon_rdp >= report.epsilon_pld


# -- events ---------------------------------------------------------------------
def test_local_event_of_a_spec():
    spec = make_spec("grr", epsilon=2.5, domain_size=7)
    assert local_event(spec) == LocalReportEvent(2.5)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: LocalReportEvent(0.0),
        lambda: LocalReportEvent(float("inf")),
        lambda: GaussianEvent(-1.0),
        lambda: LaplaceEvent(True),
        lambda: PoissonSampledEvent(1.5, GaussianEvent(1.0)),
        lambda: PoissonSampledEvent(0.5, "gaussian"),
        lambda: SelfComposedEvent(GaussianEvent(1.0), 0),
        lambda: ComposedEvent(()),
        lambda: DiscreteLaplaceEvent(1.0, sensitivity=1.5),
    ],
)
def test_invalid_events_are_refused(bad):
    with pytest.raises(SpecError):
        bad()


def test_event_dict_round_trip():
    ev = ComposedEvent(
        (
            SelfComposedEvent(PoissonSampledEvent(0.1, GaussianEvent(1.1)), 7),
            LocalReportEvent(1.0),
            DiscreteLaplaceEvent(2.0, 3),
            DiscreteGaussianEvent(4.0),
            LaplaceEvent(0.5),
            PureDPEvent(0.3),
        )
    )
    assert event_from_dict(ev.to_dict()) == ev
    with pytest.raises(SpecError):
        event_from_dict({"kind": "nonsense"})


# -- what dp_accounting lacks, checked against independent equivalents ------------
def test_local_reports_match_randomized_response_in_dp_accounting():
    """An ε-LDP report is accounted as binary randomized response with parameter ε,
    which dp_accounting models as RandomizedResponseDpEvent(p = 2/(e^ε + 1), 2 buckets)
    under replace-one. The events are listed one by one (ComposedDpEvent) because
    dp_accounting 0.6's PLD accountant ignores the count of a self-composed
    randomized-response event."""
    eps, k, delta = 1.0, 10, 1e-5
    rr = dp_event.RandomizedResponseDpEvent(2.0 / (math.exp(eps) + 1.0), 2)
    ref_pld = pld_privacy_accountant.PLDAccountant(REPLACE).compose(dp_event.ComposedDpEvent([rr] * k))
    ref_rdp = rdp_privacy_accountant.RdpAccountant(neighboring_relation=REPLACE).compose(
        dp_event.ComposedDpEvent([rr] * k)
    )
    ours = account(SelfComposedEvent(LocalReportEvent(eps), k), delta, "replace")
    assert ours.epsilon_pld == pytest.approx(ref_pld.get_epsilon(delta), abs=2e-4)
    assert ours.epsilon_rdp == pytest.approx(ref_rdp.get_epsilon(delta), rel=1e-9)
    assert ours.epsilon_basic == pytest.approx(k * eps)
    # The exact answer from the atoms of the k-fold loss: with all k outputs at loss +ε,
    # δ(ε') >= P(L = kε)(1 - e^{ε' - kε}) where P(L = kε) = (e^ε/(1+e^ε))^k.
    p_top = (math.exp(eps) / (1 + math.exp(eps))) ** k
    assert ours.epsilon_pld == pytest.approx(k * eps + math.log(1 - delta / p_top), abs=2e-4)


def test_self_composition_count_is_honoured():
    one = epsilon_pld(ComposedEvent((LocalReportEvent(0.5),) * 6), 1e-6, "replace")
    six = epsilon_pld(SelfComposedEvent(LocalReportEvent(0.5), 6), 1e-6, "replace")
    assert one == pytest.approx(six, abs=1e-9)
    assert six > epsilon_pld(LocalReportEvent(0.5), 1e-6, "replace") * 3


def test_pure_dp_matches_discrete_laplace_with_unit_sensitivity():
    """Discrete Laplace with sensitivity 1 has a two-point privacy loss at ±ε, which is
    exactly the randomized-response pair; dp_accounting has that event natively."""
    ref = pld_privacy_accountant.PLDAccountant(ADD_REMOVE).compose(
        dp_event.ComposedDpEvent([dp_event.DiscreteLaplaceDpEvent(0.7, 1)] * 20)
    )
    ours = epsilon_pld(SelfComposedEvent(PureDPEvent(0.7), 20), 1e-5)
    assert ours == pytest.approx(ref.get_epsilon(1e-5), abs=1e-6)


def test_rr_rdp_curve_against_direct_renyi_divergence():
    """D_α(P||Q) for P = (p, 1-p), Q = (1-p, p), p = e^ε/(1+e^ε), from the definition."""
    eps = 1.3
    p = math.exp(eps) / (1 + math.exp(eps))
    orders = np.array([1.5, 2.0, 3.0, 10.0, 64.0])
    direct = [math.log(p**a * (1 - p) ** (1 - a) + (1 - p) ** a * p ** (1 - a)) / (a - 1) for a in orders]
    np.testing.assert_allclose(rr_rdp(eps, orders), direct, rtol=1e-12)
    assert np.all(rr_rdp(eps, np.array([2.0, 1e4])) <= eps)


def test_replace_doubles_the_sensitivity_in_both_accountants():
    """Under replace-one a Gaussian release with multiplier z is the pair N(0,1) vs N(2/z,1);
    dp_accounting's RDP accountant alone ignores the relation, which is corrected here."""
    z, delta = 3.0, 1e-6
    ours = account(GaussianEvent(z), delta, "replace")
    assert ours.epsilon_exact == pytest.approx(float(dpa.get_epsilon_gaussian(z / 2.0, delta)), rel=1e-9)
    assert balle_wang_delta(2.0 / z, ours.epsilon_exact) == pytest.approx(delta, rel=1e-6)
    assert ours.epsilon_exact <= ours.epsilon_pld <= ours.epsilon_exact + 2e-3
    ref_rdp = rdp_privacy_accountant.RdpAccountant().compose(dp_event.GaussianDpEvent(z / 2.0))
    assert ours.epsilon_rdp == pytest.approx(ref_rdp.get_epsilon(delta), rel=1e-12)
    # Laplace under replace: the pair Lap(0, b) vs Lap(2, b), i.e. Laplace with b/2 under add/remove
    b = 4.0
    replace = epsilon_pld(SelfComposedEvent(LaplaceEvent(b), 5), delta, "replace")
    ref = pld_privacy_accountant.PLDAccountant(ADD_REMOVE).compose(dp_event.LaplaceDpEvent(b / 2.0), 5)
    assert replace == pytest.approx(ref.get_epsilon(delta), abs=1e-6)
    assert basic_epsilon(LaplaceEvent(b), "replace") == pytest.approx(2.0 / b)


def test_discrete_gaussian_is_close_to_continuous_for_large_sigma():
    """Canonne, Kamath, Steinke (2020): the discrete Gaussian's privacy is nearly that of
    the continuous one; its zCDP ρ = 1/(2σ²) equals the continuous Gaussian's exactly."""
    sigma, delta = 10.0, 1e-6
    d = account(DiscreteGaussianEvent(sigma), delta)
    c = account(GaussianEvent(sigma), delta)
    assert d.epsilon_pld == pytest.approx(c.epsilon_pld, abs=5e-3)
    assert d.epsilon_rdp == pytest.approx(c.epsilon_rdp, rel=1e-12)


# -- mixed compositions against dp_accounting directly ----------------------------
def test_mixed_composition_matches_dp_accounting_add_remove():
    ev = ComposedEvent(
        (
            SelfComposedEvent(PoissonSampledEvent(0.05, GaussianEvent(1.2)), 30),
            GaussianEvent(4.0),
            SelfComposedEvent(LaplaceEvent(5.0), 3),
            PoissonSampledEvent(0.1, LaplaceEvent(2.0)),
        )
    )
    delta = 1e-6
    ref_pld = pld_privacy_accountant.PLDAccountant(ADD_REMOVE, value_discretization_interval=1e-3).compose(
        dp_event.ComposedDpEvent(
            [
                dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(1.2)), 30),
                dp_event.GaussianDpEvent(4.0),
                dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(5.0), 3),
                dp_event.PoissonSampledDpEvent(0.1, dp_event.LaplaceDpEvent(2.0)),
            ]
        )
    )
    assert epsilon_pld(ev, delta, discretization=1e-3) == pytest.approx(ref_pld.get_epsilon(delta), rel=1e-12)
    assert delta_pld(ev, 1.0, discretization=1e-3) == pytest.approx(ref_pld.get_delta(1.0), rel=1e-12)
    # RDP: dp_accounting cannot do a subsampled Laplace; without it the figures agree
    no_lap = ComposedEvent(ev.events[:3])
    ref_rdp = rdp_privacy_accountant.RdpAccountant().compose(to_dp_event(no_lap))
    report = account(no_lap, delta, discretization=1e-3)
    assert report.epsilon_rdp == pytest.approx(ref_rdp.get_epsilon(delta), rel=1e-12)
    assert report.epsilon_pld < report.epsilon_rdp
    full = account(ev, delta, discretization=1e-3)
    assert full.epsilon_rdp is None and any("RDP accountant" in n for n in full.notes)


def test_mixed_composition_with_local_reports_under_replace():
    """Local reports + central Gaussian + pure-DP selection, under replace-one,
    against dp_accounting's own events for the same pairs."""
    delta, eps0, z, eps_svt = 1e-6, 0.8, 6.0, 0.4
    ours = account(
        ComposedEvent((SelfComposedEvent(LocalReportEvent(eps0), 4), GaussianEvent(z), PureDPEvent(eps_svt))),
        delta,
        "replace",
    )
    rr = lambda e: dp_event.RandomizedResponseDpEvent(2.0 / (math.exp(e) + 1.0), 2)  # noqa: E731
    ref = pld_privacy_accountant.PLDAccountant(REPLACE).compose(
        # pure ε under add/remove costs 2ε under replace (group privacy)
        dp_event.ComposedDpEvent([rr(eps0)] * 4 + [dp_event.GaussianDpEvent(z), rr(2 * eps_svt)])
    )
    assert ours.epsilon_pld == pytest.approx(
        ref.get_epsilon(delta), abs=1e-3
    )  # both pessimistic, by up to one grid step per event


def test_composition_is_monotone_and_accountants_are_ordered():
    delta = 1e-5
    last = 0.0
    for t in (1, 10, 40):
        r = account(
            ComposedEvent((dpsgd(1.5, 0.02, t), SelfComposedEvent(PureDPEvent(0.1), t))), delta, discretization=1e-3
        )
        assert r.epsilon_pld > last
        assert r.epsilon_pld <= r.epsilon_rdp
        last = r.epsilon_pld
    pure = account(SelfComposedEvent(DiscreteLaplaceEvent(10.0), 50), delta)
    assert pure.epsilon_basic == pytest.approx(5.0)
    assert pure.epsilon_pld < pure.epsilon_basic  # advanced composition beats basic here


def test_local_report_refused_under_add_remove():
    with pytest.raises(AccountingError, match="neighbors='replace'"):
        account(LocalReportEvent(1.0), 1e-5)
    with pytest.raises(AccountingError, match="delta"):
        account(GaussianEvent(1.0), 0.0)
    with pytest.raises(AccountingError, match="neighbors"):
        account(GaussianEvent(1.0), 1e-5, "swap")  # type: ignore[arg-type]


def test_exact_gaussian_only_for_unsampled_gaussians():
    assert exact_gaussian_epsilon(dpsgd(1.0, 0.5, 3), 1e-5) is None
    both = ComposedEvent((SelfComposedEvent(GaussianEvent(2.0), 3), GaussianEvent(1.0)))
    mu = math.sqrt(3 / 4 + 1)
    assert balle_wang_delta(mu, exact_gaussian_epsilon(both, 1e-5)) == pytest.approx(1e-5, rel=1e-6)


# -- calibration -------------------------------------------------------------------
def test_noise_for_target_epsilon_meets_it_and_is_not_wasteful():
    target, delta = 1.0, 1e-5
    z = gaussian_noise_for_epsilon(target, delta, sample_rate=1.0, steps=10)
    assert epsilon_pld(dpsgd(z, 1.0, 10), delta) <= target
    assert epsilon_pld(dpsgd(z * 0.995, 1.0, 10), delta) > target
    # cross-check with dp_accounting's exact Gaussian calibration: 10 steps of z = one of z/√10
    assert z / math.sqrt(10) == pytest.approx(dpa.get_sigma_gaussian(target, delta), rel=3e-3)


def test_max_steps_for_target_epsilon():
    z, delta, target = 4.0, 1e-5, 2.0
    t = max_steps_for_epsilon(z, 1.0, target, delta)
    assert t > 1
    assert epsilon_pld(dpsgd(z, 1.0, t), delta) <= target
    assert epsilon_pld(dpsgd(z, 1.0, t + max(1, t // 500) + 1), delta) > target
    # the same answer from the closed form: the largest t with exact ε(μ = √t / z) <= target
    exact_t = max(k for k in range(1, 4 * t) if exact_gaussian_epsilon(dpsgd(z, 1.0, k), delta) <= target)
    assert exact_t - max(1, t // 500) - 1 <= t <= exact_t
    assert max_steps_for_epsilon(1.0, 1.0, 0.01, delta, discretization=1e-3) == 0
