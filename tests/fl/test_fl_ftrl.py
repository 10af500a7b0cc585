"""DP-FTRL's tree noise (estimator/fl/ftrl.py): statistics, restarts, state."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from estimator.fl.ftrl import TreeNoise, tree_depth, tree_sizes
from ldp_core.fl.errors import FLError

SIGMA = 1.5
DIM = 50
SEEDS = 400  # n = SEEDS·DIM = 20000 draws per round


def _prefixes(steps: int, restart_every: int | None = None, efficient: bool = False) -> np.ndarray:
    """Cumulative released noise after each step (what the model carries), shape (steps, SEEDS·DIM)."""
    out = np.empty((steps, SEEDS * DIM))
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        tree = TreeNoise(DIM, SIGMA, restart_every, efficient=efficient)
        released = np.zeros(DIM)
        for t in range(steps):
            released = released + tree.advance(rng)
            out[t, seed * DIM : (seed + 1) * DIM] = released
    return out


def _check_variance(samples: np.ndarray, expected: float) -> None:
    # sample variance of n iid N(0, v): Var(s²) = 2v²/(n − 1) (chi-square with n − 1 degrees of freedom);
    # 5 standard deviations is a 5.7e-7 two-sided miss per check
    n = samples.size
    tol = 5 * expected * math.sqrt(2 / (n - 1))
    assert abs(samples.var(ddof=1) - expected) < tol, (samples.var(ddof=1), expected, tol)


def test_prefix_noise_variance_is_sigma2_times_the_nodes_summed() -> None:
    steps = 16
    p = _prefixes(steps)
    for t in range(1, steps + 1):
        # t's binary decomposition has popcount(t) dyadic intervals; popcount(t) != t and != depth(t) for
        # most t here (e.g. t = 4: 1 node, t = 7: 3), so a mechanism summing every leaf or every level fails
        _check_variance(p[t - 1], SIGMA**2 * bin(t).count("1"))


def test_honaker_estimator_variance_per_level() -> None:
    """Honaker's estimate of a level-k node combines its own draw (variance σ²) with its two children's
    estimates (2c_{k−1}σ²) by inverse-variance weights: c_0 = 1, c_k = 1/(1 + 1/(2c_{k−1})), so
    prefix(t) has variance σ²·Σ_{k: bit k of t set} c_k (1, 2/3, 4/7, 8/15 for k = 0..3)."""
    c = [1.0]
    for _ in range(4):
        c.append(1.0 / (1.0 + 1.0 / (2.0 * c[-1])))
    p = _prefixes(16, efficient=True)
    for t in range(1, 17):
        _check_variance(p[t - 1], SIGMA**2 * sum(c[k] for k in range(5) if t >> k & 1))
    # and the estimates of disjoint subtrees stay independent: prefix(4) (node [1..4]) vs leaf [5]
    n = p.shape[1]
    leaf5 = p[4] - p[3]
    assert abs(float(np.mean(leaf5 * p[3]))) < 5 * SIGMA**2 * math.sqrt(c[2] / n)


def test_honaker_state_round_trips() -> None:
    a = TreeNoise(DIM, SIGMA, restart_every=6, efficient=True)
    rng_a = np.random.default_rng(3)
    for _ in range(5):
        a.advance(rng_a)
    b = TreeNoise.from_state(json.loads(json.dumps(a.to_state())))
    assert b.efficient
    rng_b = np.random.default_rng(0)
    rng_b.bit_generator.state = rng_a.bit_generator.state
    for _ in range(8):
        assert np.array_equal(a.advance(rng_a), b.advance(rng_b))


def test_noise_is_independent_across_non_overlapping_nodes() -> None:
    p = _prefixes(8)
    n = p.shape[1]

    def cov(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.mean(a * b))  # mean zero known

    # prefix(3) = [1,2] + [3] and prefix(5) = [1..4] + [5] share no node: covariance 0; the sample
    # covariance of independent N(0, v₁), N(0, v₂) has standard deviation √(v₁v₂/n)
    sd = math.sqrt(2 * SIGMA**2 * 2 * SIGMA**2 / n)
    assert abs(cov(p[2], p[4])) < 5 * sd
    # the leaf [3] (prefix(3) − prefix(2)) is independent of the node [1,2] (= prefix(2))
    leaf3 = p[2] - p[1]
    assert abs(cov(leaf3, p[1])) < 5 * SIGMA**2 / math.sqrt(n)
    # prefix(4) = [1..4] and prefix(6) = [1..4] + [5,6] share one node: covariance σ²
    # (the product of correlated normals has variance v₁v₂ + c²: here σ²·2σ² + σ⁴ = 3σ⁴)
    assert abs(cov(p[3], p[5]) - SIGMA**2) < 5 * math.sqrt(3) * SIGMA**2 / math.sqrt(n)


def test_restarts_keep_the_released_noise_and_start_a_fresh_tree() -> None:
    p = _prefixes(10, restart_every=4)
    # trees of 4, 4 and 2 rounds: the model keeps each finished tree's prefix (popcount(4) = 1 node
    # each) plus the current one's; round 10 carries 1 + 1 + popcount(2) = 3 nodes (without restarts
    # popcount(10) = 2), round 7 carries 1 + popcount(3) = 3
    _check_variance(p[9], 3 * SIGMA**2)
    _check_variance(p[6], 3 * SIGMA**2)
    _check_variance(p[4], 2 * SIGMA**2)


def test_restart_counts_trees() -> None:
    tree = TreeNoise(3, 1.0, restart_every=3)
    rng = np.random.default_rng(0)
    for _ in range(7):
        tree.advance(rng)
    assert (tree.trees, tree.step, [lvl for lvl, _ in tree.nodes]) == (3, 1, [0])
    assert tree_sizes(7, 3) == [3, 3, 1] and tree_sizes(7, None) == [7] and tree_sizes(3, 5) == [3]
    assert [tree_depth(s) for s in (1, 2, 3, 4, 7, 8)] == [1, 2, 2, 3, 3, 4]


def test_state_round_trips_through_json_and_continues_bit_for_bit() -> None:
    a = TreeNoise(DIM, SIGMA, restart_every=5)
    rng_a = np.random.default_rng(11)
    for _ in range(7):
        a.advance(rng_a)
    state = json.loads(json.dumps(a.to_state()))
    b = TreeNoise.from_state(state)
    rng_b = np.random.default_rng(11)
    rng_b.bit_generator.state = rng_a.bit_generator.state
    for _ in range(9):
        assert np.array_equal(a.advance(rng_a), b.advance(rng_b))
    assert len(json.dumps(a.to_state())) < 4 * 8 * DIM * tree_depth(5) + 400  # O(d log R), not O(d T)


def test_bad_state_and_settings_are_refused() -> None:
    a = TreeNoise(4, 1.0)
    a.advance(np.random.default_rng(0))
    a.advance(np.random.default_rng(1))
    st = a.to_state()
    with pytest.raises(FLError, match="decompose"):
        TreeNoise.from_state({**st, "step": 3})
    with pytest.raises(FLError, match="bytes"):
        TreeNoise.from_state({**st, "dim": 5})
    with pytest.raises(FLError, match="v = 1"):
        TreeNoise.from_state({**st, "v": 2})
    with pytest.raises(FLError, match="restart_every"):
        TreeNoise(4, 1.0, restart_every=0)
    with pytest.raises(FLError, match="stddev"):
        TreeNoise(4, -1.0)
