"""``ldp graph``: node- or edge-level DP training of a graph network (:mod:`estimator.graph`).

Trains a simplified graph convolution (K hops of mean aggregation, softmax classifier) on a seeded
stochastic block model whose degree is bounded by D, with full-batch DP-SGD whose noise is σ times the
level's sensitivity (node: C·(2·N(D, K) − 1), edge: 4C·N(D, K−1), N(D, K) = 1 + D + ... + D^K), σ
calibrated to ``--epsilon``. With ``--json``: one object with ``level``, ``epsilon`` (the accountant's),
``accuracy``, ``sensitivity``, ``trees`` (N(D, K)), ``noise_multiplier`` and ``comparison`` (the other
level, node-level DP without the graph and the non-private model, same ε, same graph). ``--plot FILE``
also sweeps ε for both levels (``gap`` in the JSON) and draws accuracy against ε.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ldp_cli.commands.argtypes import nonnegative_int, positive, positive_int, seed
from ldp_cli.commands.argtypes import open_unit as _unit

__all__ = ["register", "run_graph_cmd"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "graph",
        help="train a graph network with node- or edge-level DP and compare the two at equal ε",
        description="Node- and edge-level DP for a simplified graph convolution on a seeded stochastic block "
        "model (docs/GRAPH.md).",
    )
    p.add_argument("--level", choices=["node", "edge"], required=True, help="what one neighbouring graph differs by")
    p.add_argument("--epsilon", type=positive, required=True, help="target ε (δ from --delta)")
    p.add_argument("--delta", type=_unit, default=1e-5, help="δ (default 1e-5)")
    p.add_argument(
        "--nodes",
        type=positive_int,
        default=5000,
        help="nodes of the block model (default 5000; the edge probabilities 20/n inside a block and 2.5/n "
        "across keep the expected degree about 6.9 before the degree bound)",
    )
    p.add_argument("--max-degree", type=positive_int, default=5, help="degree bound D (default 5)")
    p.add_argument("--hops", type=nonnegative_int, default=2, help="aggregation hops K (default 2)")
    p.add_argument("--clip", type=positive, default=1.0, help="per-node clipping norm C (default 1)")
    p.add_argument("--steps", type=positive_int, default=100, help="full-batch DP-SGD steps (default 100)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the graph, split and noise (default 0)")
    p.add_argument("--plot", default=None, help="sweep ε for both levels and write accuracy against ε to this PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_graph_cmd)


def run_graph_cmd(args: argparse.Namespace) -> int:
    import numpy as np

    from estimator.graph.sensitivity import Level
    from estimator.graph.train import GraphDPConfig, make_graph, plot_gap, train_graph_dp, utility_gap

    if args.nodes < 8:
        raise ValueError(f"--nodes must be at least 8, got {args.nodes}")
    cfg = GraphDPConfig(
        nodes=args.nodes,
        p_in=min(1.0, 20.0 / args.nodes),
        p_out=min(1.0, 2.5 / args.nodes),
        max_degree=args.max_degree,
        hops=args.hops,
        clip=args.clip,
        steps=args.steps,
        delta=args.delta,
    )
    graph, train = make_graph(cfg, np.random.default_rng([args.seed, 1]))
    noise = np.random.default_rng([args.seed, 2])
    out: dict[str, Any] = train_graph_dp(cfg, graph, train, args.level, args.epsilon, noise)
    other: Level = "edge" if args.level == "node" else "node"
    out["comparison"] = {
        other: train_graph_dp(cfg, graph, train, other, args.epsilon, np.random.default_rng([args.seed, 2])),
        "node_no_graph": train_graph_dp(
            cfg, graph, train, "node", args.epsilon, np.random.default_rng([args.seed, 2]), hops=0
        ),
        "non_private": train_graph_dp(cfg, graph, train, None, None, np.random.default_rng([args.seed, 2])),
    }
    out["graph"] = {
        "nodes": graph.n,
        "edges": len(graph.edges),
        "max_degree": cfg.max_degree,
        "p_in": cfg.p_in,
        "p_out": cfg.p_out,
    }
    if args.plot:
        grid = sorted({0.5, 1.0, 2.0, 4.0, 8.0, 16.0, float(args.epsilon)})
        out["gap"] = utility_gap(cfg, grid, [args.seed])["table"]
        plot_gap({"config": {"delta": cfg.delta}, "table": out["gap"]}, args.plot)
        out["plot"] = args.plot
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"{args.level}-level DP, ε = {out['epsilon']:.4g} (δ = {cfg.delta:g}), D = {cfg.max_degree}, K = {cfg.hops}: "
        f"sensitivity {out['sensitivity']:g} (N(D, K) = {out['trees']}), σ = {out['noise_multiplier']:.3g}"
    )
    print(f"  test accuracy {out['accuracy']:.4f}")
    for name, row in out["comparison"].items():
        print(f"  {name:>14}: accuracy {row['accuracy']:.4f} (sensitivity {row['sensitivity']:g})")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
