"""DP-FTRL's ε (estimator/fl/ftrl.py) against computations written here from the papers, and an
empirical audit of the tree's privacy loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from estimator.fl.ftrl import FtrlAccountant, TreeNoise, ftrl_epsilon, ftrl_epsilon_rdp, tree_depth, tree_sizes
from ldp_core.fl.errors import FLError


def _gaussian_epsilon_by_hand(mu: float, delta: float) -> float:
    """ε of a μ-GDP mechanism at δ: the root of δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)
    (Balle and Wang 2018, Thm. 8), by bisection (δ(ε) decreases in ε)."""

    def d(eps: float) -> float:
        return float(norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu))

    lo, hi = 0.0, 500.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


def _nodes_touched_by_a_leaf(steps: int) -> int:
    """The most tree nodes one round's value enters, counted on the mechanism itself: run the tree and
    record the dyadic interval of every node it creates."""
    tree = TreeNoise(1, 0.0)
    intervals = []
    for _ in range(steps):
        tree.advance(np.random.default_rng(0))
        level = tree.nodes[-1][0]
        intervals.append((tree.step - 2**level + 1, tree.step))
    return max(sum(a <= i <= b for a, b in intervals) for i in range(1, steps + 1))


@pytest.mark.parametrize(
    ("z", "rounds", "restart_every", "neighbors"),
    [
        (1.0, 100, None, "add_or_remove"),
        (2.3, 100, 2, "replace"),
        (0.8, 37, 8, "add_or_remove"),
        (5.0, 1, None, "replace"),
    ],
)
def test_epsilon_is_the_composed_gaussian_of_sqrt_levels(z, rounds, restart_every, neighbors) -> None:
    # each tree of s rounds: a client in one leaf moves at most ⌈log2(s + 1)⌉ nodes by C (2C when
    # replaced), so it is a Gaussian mechanism with sensitivity C√levels; trees compose: μ² = Σ levels / z_eff²
    sizes = (
        [restart_every] * (rounds // restart_every) + ([rounds % restart_every] if rounds % restart_every else [])
        if restart_every
        else [rounds]
    )
    levels = sum(_nodes_touched_by_a_leaf(s) for s in sizes)
    factor = 2.0 if neighbors == "replace" else 1.0
    mu = factor * math.sqrt(levels) / z
    assert ftrl_epsilon(z, rounds, 1e-5, restart_every, neighbors) == pytest.approx(
        _gaussian_epsilon_by_hand(mu, 1e-5), rel=1e-6
    )


@pytest.mark.parametrize(("z", "rounds", "restart_every"), [(1.0, 100, None), (1.1, 100, 2), (0.7, 50, 16)])
def test_dp_accounting_rdp_agrees_with_rdp_by_hand(z, rounds, restart_every) -> None:
    levels = sum(tree_depth(s) for s in tree_sizes(rounds, restart_every))
    delta = 1e-5
    # RDP of a Gaussian of sensitivity √levels at noise z: α·levels/(2z²); to (ε, δ) by Canonne, Kamath,
    # Steinke 2020 Prop. 12: ε = min_α rdp(α) + log(1 − 1/α) − (log δ + log α)/(α − 1), over a fine grid
    # (dp_accounting minimizes over a fixed list of orders, so its figure can only be a little higher)
    alphas = np.exp(np.linspace(math.log(1.001), math.log(1e4), 200_000))
    by_hand = float(
        np.min(alphas * levels / (2 * z**2) + np.log1p(-1 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1))
    )
    got = ftrl_epsilon_rdp(z, rounds, delta, restart_every)
    assert by_hand <= got <= by_hand * 1.02
    assert ftrl_epsilon(z, rounds, delta, restart_every) <= got  # the exact figure is the tighter bound


def test_accountant_matches_the_function_and_refuses_a_changing_multiplier() -> None:
    acc = FtrlAccountant(restart_every=4, delta=1e-5)
    assert acc.epsilon() == 0.0
    for _ in range(10):
        acc.record(1.3)
    assert acc.epsilon() == ftrl_epsilon(1.3, 10, 1e-5, 4) == acc.epsilon_known_sample()
    with pytest.raises(FLError, match="fixed"):
        acc.record(2.0)
    with pytest.raises(FLError, match="> 0"):
        acc.record(0.0)


def test_audit_the_tree_leaks_exactly_sqrt_levels_over_z() -> None:
    """The adversary sees the 8 prefix sums of one tree and must tell whether round 1 held a clipped
    update C or nothing. Its best test sums the four nodes holding round 1 ([1], [1,2], [1..4], [1..8]
    = the prefixes at t = 1, 2, 4, 8): a Gaussian shift of 4C at noise 2σC, μ = 2/σ = √levels/σ. The
    measured separation must match the accountant's μ (so ε is neither violated nor loose), and it
    exceeds 1/σ, the figure of a mechanism that forgets round 1 enters several nodes."""
    z, C, trials = 1.5, 1.0, 20_000
    rng = np.random.default_rng(2026)
    stats = {0: np.empty(trials), 1: np.empty(trials)}
    for world in (0, 1):
        for k in range(trials):
            tree = TreeNoise(1, z * C)
            released, prefix, x = [], 0.0, [C * world] + [0.0] * 7
            noise = 0.0
            for t in range(8):
                noise += float(tree.advance(rng)[0])
                prefix += x[t]
                released.append(prefix + noise)
            stats[world][k] = released[0] + released[1] + released[3] + released[7]
    sd = math.sqrt((stats[0].var(ddof=1) + stats[1].var(ddof=1)) / 2)
    mu_hat = (stats[1].mean() - stats[0].mean()) / sd
    mu_claimed = math.sqrt(tree_depth(8)) / z
    # μ̂ is a difference of two means of n unit-variance draws: standard deviation √(2/n); 5 of them
    assert abs(mu_hat - mu_claimed) < 5 * math.sqrt(2 / trials)
    assert mu_hat > 1 / z + 10 * math.sqrt(2 / trials)
