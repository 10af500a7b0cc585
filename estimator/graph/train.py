"""Node- and edge-level DP training of a simplified graph convolution, its accounting and the utility
gap between the two levels (``ldp graph``; docs/GRAPH.md).

Full-batch DP-SGD: every step sums the clipped per-node gradients of all training nodes
(:func:`~estimator.graph.sensitivity.clipped_gradient_sum`), adds Gaussian noise of standard deviation
σ·Δ (Δ the node- or edge-level sensitivity) and divides by the number of training nodes (public). No
subsampling: with one node in up to N(D, K) trees, Poisson sampling of nodes does not amplify privacy the
way it does for independent examples, so T steps are T Gaussian mechanisms, SelfComposed(Gaussian(σ), T),
accounted by the project's DP-SGD accountant (``dp_accounting``'s PLD,
:func:`ldp_core.fl.dpsgd_accounting.dpsgd_epsilon`). The noise for a target ε is found on the exact
curve of that composition (a Gaussian with multiplier σ/√T: Balle and Wang 2018), then the accountant's
ε is reported beside it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from estimator.graph.data import Graph, GraphError, bound_degree, max_degree, stochastic_block_model
from estimator.graph.sensitivity import Level, aggregate, clipped_gradient_sum, sensitivity, trees

__all__ = [
    "GraphDPConfig",
    "gaussian_delta",
    "calibrate_noise",
    "accountant_epsilon",
    "make_graph",
    "train_graph_dp",
    "utility_gap",
    "plot_gap",
]


@dataclasses.dataclass(frozen=True)
class GraphDPConfig:
    """The graph (a stochastic block model), the model (``hops`` K of aggregation, softmax classifier)
    and DP-SGD's settings (``max_degree`` D, clipping norm, steps, learning rate, δ)."""

    nodes: int = 5000
    blocks: int = 4
    p_in: float = 0.004
    p_out: float = 0.0005
    features: int = 16
    signal: float = 1.0
    max_degree: int = 5
    hops: int = 2
    clip: float = 1.0
    steps: int = 100
    learning_rate: float = 1.0
    delta: float = 1e-5
    train_fraction: float = 0.7

    def __post_init__(self) -> None:
        if self.hops < 0 or self.steps < 1 or self.max_degree < 1:
            raise GraphError("hops must be >= 0, steps >= 1 and max_degree >= 1")
        if not (self.clip > 0 and self.learning_rate > 0 and 0 < self.delta < 1 and 0 < self.train_fraction < 1):
            raise GraphError("clip and learning_rate must be > 0, delta and train_fraction in (0, 1)")


def gaussian_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of a Gaussian mechanism whose sensitivity/σ ratio is ``mu`` (Balle and Wang 2018, Thm. 8)."""
    from scipy.stats import norm

    if mu <= 0:
        return 0.0
    return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2))


def calibrate_noise(epsilon: float, delta: float, steps: int) -> float:
    """The smallest noise multiplier σ whose ``steps``-fold Gaussian composition (μ = √T/σ) is
    (ε, δ)-DP, by bisection on the exact curve."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise GraphError(f"need epsilon > 0 and delta in (0, 1), got {epsilon}, {delta}")
    lo, hi = 1e-3, 1e6
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if gaussian_delta(epsilon, math.sqrt(steps) / mid) > delta:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    return hi


def accountant_epsilon(noise_multiplier: float, steps: int, delta: float) -> float:
    """ε of T full-batch steps by the project's DP-SGD accountant (PLD)."""
    from ldp_core.fl.dpsgd_accounting import dpsgd_epsilon
    from ldp_core.privacy_events import sampled_gaussian_event

    return dpsgd_epsilon(sampled_gaussian_event(noise_multiplier, 1.0, steps), delta)


def make_graph(cfg: GraphDPConfig, rng: np.random.Generator) -> tuple[Graph, np.ndarray]:
    """A stochastic block model bounded to degree ``cfg.max_degree``, and a boolean training mask."""
    g = stochastic_block_model(cfg.nodes, cfg.blocks, cfg.p_in, cfg.p_out, cfg.features, cfg.signal, rng)
    g = g.with_edges(bound_degree(g.n, g.edges, cfg.max_degree, rng))
    train = rng.random(g.n) < cfg.train_fraction
    return g, train


def train_graph_dp(
    cfg: GraphDPConfig,
    graph: Graph,
    train: np.ndarray,
    level: Level | None,
    epsilon: float | None,
    rng: np.random.Generator,
    hops: int | None = None,
) -> dict[str, Any]:
    """Train at ``level`` and target ``epsilon`` (``level`` None or ``epsilon`` None: no noise), return
    accuracy on the non-training nodes, σ, Δ, N(D, K) and the accountant's ε."""
    K = cfg.hops if hops is None else hops
    if max_degree(graph.n, graph.edges) > cfg.max_degree:
        raise GraphError(f"the graph's degree exceeds the bound {cfg.max_degree}: bound it first (bound_degree)")
    h = aggregate(graph.x, graph.edges, K)
    k = int(graph.y.max()) + 1
    W = np.zeros((h.shape[1], k))
    b = np.zeros(k)
    ht, yt = h[train], graph.y[train]
    n_train = max(1, int(train.sum()))
    delta_s = sensitivity(level, cfg.max_degree, K, cfg.clip) if level is not None else 0.0
    private = level is not None and epsilon is not None
    sigma = calibrate_noise(epsilon, cfg.delta, cfg.steps) if level is not None and epsilon is not None else 0.0
    std = sigma * delta_s
    for _ in range(cfg.steps):
        gW, gb = clipped_gradient_sum(ht, yt, W, b, cfg.clip)
        if std > 0:
            gW = gW + rng.normal(0.0, std, gW.shape)
            gb = gb + rng.normal(0.0, std, gb.shape)
        W -= cfg.learning_rate * gW / n_train
        b -= cfg.learning_rate * gb / n_train
    test = ~train
    acc = float(np.mean(np.argmax(h[test] @ W + b, axis=1) == graph.y[test]))
    return {
        "level": level,
        "hops": K,
        "epsilon_target": epsilon,
        "epsilon": accountant_epsilon(sigma, cfg.steps, cfg.delta) if private and delta_s > 0 else None,
        "delta": cfg.delta,
        "noise_multiplier": sigma,
        "sensitivity": delta_s,
        "trees": trees(cfg.max_degree, K),
        "noise_std_per_step": std / n_train,
        "accuracy": acc,
    }


def _mean_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(rows[0])
    accs = [r["accuracy"] for r in rows]
    out["accuracy"] = float(np.mean(accs))
    out["accuracy_sd"] = float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0
    out["runs"] = len(accs)
    return out


def utility_gap(cfg: GraphDPConfig, epsilons: list[float], seeds: list[int]) -> dict[str, Any]:
    """Test accuracy at each ε for node-level and edge-level DP with K hops, for node-level DP without
    the graph (K = 0, where one node is one term), and without DP; averaged over ``seeds`` (each seed a
    new graph, split and noise)."""
    setups: list[tuple[str, Level | None, int, bool]] = [
        ("edge", "edge", cfg.hops, True),
        ("node", "node", cfg.hops, True),
        ("node_no_graph", "node", 0, True),
    ]
    table: list[dict[str, Any]] = []
    graphs = [make_graph(cfg, np.random.default_rng([s, 1])) for s in seeds]
    for name, level, K, _ in setups:
        for eps in epsilons:
            rows = [
                train_graph_dp(cfg, g, t, level, eps, np.random.default_rng([s, 2]), hops=K)
                for s, (g, t) in zip(seeds, graphs, strict=True)
            ]
            table.append({"setting": name, **_mean_rows(rows)})
    for name, K in (("non_private", cfg.hops), ("non_private_no_graph", 0)):
        rows = [
            train_graph_dp(cfg, g, t, None, None, np.random.default_rng([s, 2]), hops=K)
            for s, (g, t) in zip(seeds, graphs, strict=True)
        ]
        table.append({"setting": name, **_mean_rows(rows)})
    return {"config": dataclasses.asdict(cfg), "seeds": seeds, "table": table}


def plot_gap(gap: dict[str, Any], path: str) -> None:
    """Test accuracy against ε for each setting (lines), the non-private ones as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = {
        "edge": "edge-level DP",
        "node": "node-level DP",
        "node_no_graph": "node-level DP, no graph (K=0)",
        "non_private": "no DP",
        "non_private_no_graph": "no DP, no graph",
    }
    for name, label in labels.items():
        rows = [r for r in gap["table"] if r["setting"] == name]
        if not rows:
            continue
        if rows[0]["epsilon_target"] is None:
            ax.axhline(
                rows[0]["accuracy"],
                linestyle="--",
                linewidth=1,
                label=label,
                color="grey" if "no_graph" in name else "k",
            )
        else:
            ax.plot([r["epsilon_target"] for r in rows], [r["accuracy"] for r in rows], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel(f"ε (δ = {gap['config']['delta']:g})")
    ax.set_ylabel("test accuracy")
    ax.set_title("SGC on a stochastic block model: node- vs edge-level DP")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
