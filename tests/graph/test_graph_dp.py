"""Graph DP: the sensitivity bounds audited on every node and edge of a seeded degree-bounded graph
(and shown to fail without the degree bound), the ε against an independent computation, training and
``ldp graph --json``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from estimator.graph.data import Graph, GraphError, bound_degree, max_degree, stochastic_block_model
from estimator.graph.sensitivity import aggregate, clipped_gradient_sum, per_node_gradients, sensitivity, trees
from estimator.graph.train import (
    GraphDPConfig,
    accountant_epsilon,
    calibrate_noise,
    make_graph,
    train_graph_dp,
    utility_gap,
)
from ldp_cli.main import main

CLIP = 1.0


def _clipped_sum(g: Graph, train: np.ndarray, hops: int, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    h = aggregate(g.x, g.edges, hops)
    gW, gb = clipped_gradient_sum(h[train], g.y[train], W, b, CLIP)
    return np.concatenate([gW.ravel(), gb])


def _terms(g: Graph, train: np.ndarray, hops: int, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each training node's clipped gradient (zeros elsewhere), to count the terms a change touches."""
    h = aggregate(g.x, g.edges, hops)
    G = per_node_gradients(h, g.y, W, b)
    norms = np.linalg.norm(G, axis=1)
    G = G * np.minimum(1.0, CLIP / np.maximum(norms, 1e-300))[:, None]
    return G * train[:, None]


def _setup(seed: int, n: int = 150, max_deg: int = 4) -> tuple[Graph, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    g = stochastic_block_model(n, 3, 0.08, 0.02, 5, 1.0, rng)
    g = g.with_edges(bound_degree(g.n, g.edges, max_deg, rng))
    train = rng.random(g.n) < 0.7
    # parameters large enough that some gradients are clipped and some are not
    W, b = rng.normal(scale=2.0, size=(5, 3)), rng.normal(size=3)
    return g, train, W, b


def _remove_node(g: Graph, v: int) -> Graph:
    return g.with_edges(g.edges[(g.edges[:, 0] != v) & (g.edges[:, 1] != v)])


@pytest.mark.parametrize("hops", [1, 2])
def test_node_level_bound_holds_for_every_node(hops: int) -> None:
    g, train, W, b = _setup(1)
    D = max_degree(g.n, g.edges)
    assert D <= 4
    full, terms = _clipped_sum(g, train, hops, W, b), _terms(g, train, hops, W, b)
    bound = sensitivity("node", 4, hops, CLIP)
    worst = 0.0
    for v in range(g.n):
        keep = train.copy()
        keep[v] = False  # v's own loss term goes with it
        gv = _remove_node(g, v)
        diff = float(np.linalg.norm(full - _clipped_sum(gv, keep, hops, W, b)))
        changed = int(np.sum(np.any(np.abs(terms - _terms(gv, keep, hops, W, b)) > 1e-12, axis=1)))
        assert changed <= trees(4, hops)
        assert diff <= bound + 1e-9
        worst = max(worst, diff)
    assert worst > CLIP  # the neighbours' terms do move: the bound is not vacuous


@pytest.mark.parametrize("hops", [1, 2])
def test_edge_level_bound_holds_for_every_edge(hops: int) -> None:
    g, train, W, b = _setup(2)
    full, terms = _clipped_sum(g, train, hops, W, b), _terms(g, train, hops, W, b)
    bound = sensitivity("edge", 4, hops, CLIP)
    for i in range(len(g.edges)):
        ge = g.with_edges(np.delete(g.edges, i, axis=0))
        diff = float(np.linalg.norm(full - _clipped_sum(ge, train, hops, W, b)))
        changed = int(np.sum(np.any(np.abs(terms - _terms(ge, train, hops, W, b)) > 1e-12, axis=1)))
        assert changed <= 2 * trees(4, hops - 1)
        assert diff <= bound + 1e-9


def test_without_the_degree_bound_a_hub_breaks_the_claimed_sensitivity() -> None:
    # A star: hub 0 with 40 leaves, all training nodes. The hub's features are large, so every leaf's
    # aggregated features (and clipped gradient) turn when the hub goes. Claimed for D = 4, K = 1: 9C.
    n = 41
    x = np.zeros((n, 2))
    x[0] = [50.0, 0.0]
    g = Graph(x=x, y=np.ones(n, dtype=np.int64), edges=np.array([[0, j] for j in range(1, n)], dtype=np.int64))
    train = np.ones(n, dtype=bool)
    W, b = np.array([[1.0, -1.0], [0.0, 0.0]]), np.zeros(2)
    keep = train.copy()
    keep[0] = False
    diff = float(np.linalg.norm(_clipped_sum(g, train, 1, W, b) - _clipped_sum(_remove_node(g, 0), keep, 1, W, b)))
    assert diff > sensitivity("node", 4, 1, CLIP)
    with pytest.raises(GraphError, match="exceeds the bound"):
        train_graph_dp(GraphDPConfig(max_degree=4, hops=1), g, train, "node", 1.0, np.random.default_rng(0))
    bounded = bound_degree(n, g.edges, 4, np.random.default_rng(0))
    assert max_degree(n, bounded) <= 4


def _independent_epsilon(sigma: float, steps: int, delta: float) -> float:
    """ε of T Gaussian steps by the exact Gaussian curve, written here with math.erf (not scipy, not
    dp_accounting): δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), μ = √T/σ, solved for ε by bisection."""

    def phi(t: float) -> float:
        return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))

    mu = math.sqrt(steps) / sigma
    lo, hi = 0.0, 100.0
    for _ in range(200):
        e = (lo + hi) / 2
        d = phi(-e / mu + mu / 2) - math.exp(e) * phi(-e / mu - mu / 2)
        lo, hi = (e, hi) if d > delta else (lo, e)
    return hi


@pytest.mark.parametrize(("epsilon", "steps"), [(0.5, 10), (2.0, 100), (8.0, 300)])
def test_epsilon_against_an_independent_computation(epsilon: float, steps: int) -> None:
    sigma = calibrate_noise(epsilon, 1e-5, steps)
    # the PLD accountant discretizes (its default interval); it may only overstate ε, by little
    acc = accountant_epsilon(sigma, steps, 1e-5)
    exact = _independent_epsilon(sigma, steps, 1e-5)
    assert exact == pytest.approx(epsilon, rel=1e-6)
    assert exact - 1e-9 <= acc <= exact * 1.01 + 1e-3


def test_training_and_the_gap() -> None:
    cfg = GraphDPConfig(nodes=600, p_in=0.03, p_out=0.004, max_degree=5, hops=1, steps=40)
    g, train = make_graph(cfg, np.random.default_rng(5))
    assert max_degree(g.n, g.edges) <= 5
    clear = train_graph_dp(cfg, g, train, None, None, np.random.default_rng(6))
    node = train_graph_dp(cfg, g, train, "node", 2.0, np.random.default_rng(6))
    edge = train_graph_dp(cfg, g, train, "edge", 2.0, np.random.default_rng(6))
    assert clear["accuracy"] > 0.5  # 4 blocks: chance is 0.25
    assert node["sensitivity"] == 11.0 and edge["sensitivity"] == 4.0 and node["trees"] == 6
    assert node["noise_multiplier"] == edge["noise_multiplier"]  # same ε, same σ; the noise is σ·Δ
    assert node["noise_std_per_step"] / edge["noise_std_per_step"] == pytest.approx(11.0 / 4.0)
    gap = utility_gap(cfg, [1.0], [1])
    assert {r["setting"] for r in gap["table"]} == {
        "edge",
        "node",
        "node_no_graph",
        "non_private",
        "non_private_no_graph",
    }


def test_cli_json_and_plot(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plot = tmp_path / "g.png"
    argv = ["graph", "--level", "edge", "--epsilon", "3", "--nodes", "400", "--steps", "20", "--json"]
    assert main([*argv, "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["level"] == "edge" and out["epsilon"] == pytest.approx(3.0, rel=0.01)
    assert set(out["comparison"]) == {"node", "node_no_graph", "non_private"}
    assert out["comparison"]["node"]["sensitivity"] > out["sensitivity"]
    assert plot.stat().st_size > 1000 and out["gap"]
    with pytest.raises(SystemExit):
        main(["graph", "--level", "vertex", "--epsilon", "1"])
