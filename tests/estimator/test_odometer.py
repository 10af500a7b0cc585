"""Privacy filters: the budget is never crossed, whatever the sequence of releases,
refusals are atomic, and the zCDP budget converts to the promised (ε, δ)."""

from __future__ import annotations

import math
import threading
from fractions import Fraction

import dp_accounting as dpa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estimator.accounting.accountant import AccountingError, epsilon_pld
from estimator.accounting.odometer import BasicFilter, ZCDPFilter, zcdp_budget, zcdp_epsilon, zcdp_rho
from ldp_core.errors import BudgetError
from ldp_core.privacy_events import (
    ComposedEvent,
    DiscreteGaussianEvent,
    DiscreteLaplaceEvent,
    GaussianEvent,
    LaplaceEvent,
    LocalReportEvent,
    PoissonSampledEvent,
    PrivacyEvent,
    PureDPEvent,
    SelfComposedEvent,
)

# -- an adversary's choice of releases --------------------------------------------
pure_leaf = st.one_of(
    st.builds(PureDPEvent, st.floats(1e-4, 3.0)),
    st.builds(LaplaceEvent, st.floats(0.2, 200.0)),
    st.builds(DiscreteLaplaceEvent, st.floats(0.2, 200.0), st.integers(1, 4)),
)
any_leaf = st.one_of(
    pure_leaf,
    st.builds(GaussianEvent, st.floats(0.3, 100.0)),
    st.builds(DiscreteGaussianEvent, st.floats(0.5, 100.0), st.integers(1, 3)),
    st.builds(PoissonSampledEvent, st.floats(0.001, 1.0), st.builds(GaussianEvent, st.floats(0.3, 100.0))),
)


def _events(leaf: st.SearchStrategy[PrivacyEvent]) -> st.SearchStrategy[PrivacyEvent]:
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.builds(SelfComposedEvent, inner, st.integers(1, 30)),
            st.builds(lambda es: ComposedEvent(tuple(es)), st.lists(inner, min_size=1, max_size=3)),
        ),
        max_leaves=4,
    )


def _exact_total(f, i: int) -> Fraction:
    return sum((Fraction(r.cost[i]) for r in f.releases), Fraction(0))


def _drive(f, events, probe_remaining: bool) -> None:
    """Play the adversary: every event, and (optionally) a probe costing exactly what
    is left and one costing a hair more. Check the invariants after each step."""
    for ev in events:
        before_spent, before_n = f.spent, len(f.releases)
        would = f.can_spend(ev)
        ok = f.try_spend(ev, label="adversary")
        assert ok == would
        if not ok:  # a refusal spends nothing
            assert f.spent == before_spent and len(f.releases) == before_n
        for i, b in enumerate(f.budget):
            assert float(_exact_total(f, i)) <= b
            assert f.spent[i] == float(_exact_total(f, i))
        if probe_remaining and isinstance(f, BasicFilter):
            left = f.remaining[0]
            factor = 2.0 if f.neighbors == "replace" else 1.0  # pure ε costs 2ε under replace
            if left > 1e-9:
                assert not f.try_spend(PureDPEvent(left * (1 + 1e-9) / factor))
                assert f.try_spend(PureDPEvent(left / factor))
                assert f.remaining[0] <= 1e-12


@settings(max_examples=120, deadline=None)
@given(
    eps=st.floats(0.05, 10.0),
    events=st.lists(_events(pure_leaf), min_size=1, max_size=25),
    probe=st.booleans(),
    neighbors=st.sampled_from(["add_or_remove", "replace"]),
)
def test_basic_filter_never_exceeds_its_budget(eps, events, probe, neighbors):
    f = BasicFilter(eps, neighbors=neighbors)
    _drive(f, events, probe)
    assert math.fsum(r.cost[0] for r in f.releases) <= eps


@settings(max_examples=120, deadline=None)
@given(
    eps=st.floats(0.05, 10.0),
    delta=st.sampled_from([1e-9, 1e-6, 1e-3]),
    events=st.lists(_events(any_leaf), min_size=1, max_size=25),
    neighbors=st.sampled_from(["add_or_remove", "replace"]),
)
def test_zcdp_filter_never_exceeds_its_budget(eps, delta, events, neighbors):
    f = ZCDPFilter(eps, delta, neighbors=neighbors)
    _drive(f, events, probe_remaining=False)
    rho = float(_exact_total(f, 0))
    assert rho <= f.rho_budget
    # whatever was admitted, the whole interaction stays within the promised (ε, δ)
    assert zcdp_epsilon(rho, delta) <= eps


def test_greedy_adversary_fills_but_never_crosses():
    """An adversary who always asks for what is left, then a little more."""
    f = BasicFilter(1.0, 1e-6, per_release_delta=1e-7)
    assert f.try_spend(GaussianEvent(5.0), "g")  # charged its PLD ε at δ_i = 1e-7
    assert f.releases[0].cost == (pytest.approx(epsilon_pld(GaussianEvent(5.0), 1e-7)), 1e-7)
    for _ in range(20):
        left = f.remaining[0]
        if left <= 0:
            break
        f.try_spend(PureDPEvent(left * 1.5))
        f.try_spend(PureDPEvent(left / 2))
    assert math.fsum(r.cost[0] for r in f.releases) <= 1.0
    assert math.fsum(r.cost[1] for r in f.releases) <= 1e-6
    # each Gaussian release takes 1e-7 of the 1e-6 δ budget: exactly 10 fit
    g = BasicFilter(100.0, 1e-6, per_release_delta=1e-7)
    admitted = sum(g.try_spend(GaussianEvent(50.0)) for _ in range(15))
    assert admitted == 10


def test_ten_tenths_fill_a_unit_budget():
    f = BasicFilter(1.0)
    assert sum(f.try_spend(DiscreteLaplaceEvent(10.0)) for _ in range(11)) == 10
    assert f.remaining == (0.0, 0.0)


def test_refusal_raises_and_spends_nothing():
    f = ZCDPFilter(1.0, 1e-6)
    f.spend(GaussianEvent(6.0), "day 1")
    before = (f.spent, f.releases)
    with pytest.raises(BudgetError, match="nothing was spent"):
        f.spend(GaussianEvent(1.0), "day 2")
    assert (f.spent, f.releases) == before
    assert not f.can_spend(GaussianEvent(1.0))
    s = f.status()
    assert s["releases"] == 1 and s["guarantee"] == {"epsilon": 1.0, "delta": 1e-6}
    assert s["spent"]["rho"] == pytest.approx(1 / 72)
    assert 0 < s["fraction_spent"] < 1


def test_concurrent_spending_is_atomic():
    """Many threads race for a budget that fits exactly 50 releases."""
    f = BasicFilter(50 * 0.125)  # 0.125 is exact in binary
    admitted = []

    def worker() -> None:
        for _ in range(40):
            if f.try_spend(DiscreteLaplaceEvent(8.0)):
                admitted.append(1)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 50 == len(f.releases)
    assert f.spent[0] == 50 * 0.125


def test_zcdp_budget_conversion():
    """The filter's ρ_B is the largest ρ whose conversion meets (ε, δ). The conversion is
    at least the exact ε of a Gaussian mechanism with that ρ (a Gaussian with
    μ = sqrt(2ρ) is ρ-zCDP, so no valid conversion can go below it) and at most
    Bun–Steinke's ρ + 2 sqrt(ρ log(1/δ)) (Bun and Steinke 2016, Prop. 1.3)."""
    for eps, delta in [(0.5, 1e-6), (1.0, 1e-6), (4.0, 1e-9), (10.0, 1e-5)]:
        rho = zcdp_budget(eps, delta)
        assert zcdp_epsilon(rho, delta) <= eps < zcdp_epsilon(rho * 1.001, delta)
        exact = float(dpa.get_epsilon_gaussian(1.0 / math.sqrt(2 * rho), delta))
        assert exact <= eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta))


def test_zcdp_costs():
    assert zcdp_rho(GaussianEvent(2.0)) == pytest.approx(1 / 8)
    assert zcdp_rho(GaussianEvent(2.0), "replace") == pytest.approx(4 / 8)
    assert zcdp_rho(DiscreteGaussianEvent(3.0, 2)) == pytest.approx(4 / 18)
    assert zcdp_rho(PureDPEvent(0.5)) == pytest.approx(0.125)
    assert zcdp_rho(LocalReportEvent(1.0), "replace") == pytest.approx(0.5)
    assert zcdp_rho(SelfComposedEvent(PoissonSampledEvent(0.01, GaussianEvent(1.0)), 10)) == pytest.approx(5.0)
    with pytest.raises(AccountingError, match="replace"):
        zcdp_rho(LocalReportEvent(1.0))


def test_zcdp_beats_basic_for_many_small_releases():
    """Advanced-composition rate under full adaptivity (Whitehouse et al. 2023): with
    ε = 1 and δ = 1e-6 the zCDP filter admits far more ε_i = 0.01 releases than the
    100 that basic composition allows."""
    z = ZCDPFilter(1.0, 1e-6)
    n = 0
    while z.try_spend(PureDPEvent(0.01)):
        n += 1
    assert n > 400
    assert n == math.floor(z.rho_budget / (0.01**2 / 2) + 1e-9)


def test_filters_need_what_they_need():
    with pytest.raises(AccountingError, match="per_release_delta"):
        BasicFilter(1.0, 1e-6).try_spend(GaussianEvent(3.0))
    with pytest.raises(AccountingError):
        BasicFilter(1.0).try_spend(LocalReportEvent(1.0))  # add/remove: a local report cannot be charged
    assert BasicFilter(1.0, neighbors="replace").try_spend(LocalReportEvent(1.0))
    with pytest.raises(AccountingError):
        ZCDPFilter(0.0, 1e-6)
