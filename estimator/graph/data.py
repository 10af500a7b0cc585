"""Graphs for graph DP: a seeded stochastic block model with block-correlated node features, and the
degree bound every DP run applies first.

A graph here is ``(n, edges)``: ``edges`` an (m, 2) int64 array of undirected edges ``u < v``, no
self-loops, no duplicates. :class:`Graph` adds the node features ``x`` and labels ``y`` (the block).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from estimator.errors import EstimatorError

__all__ = ["Graph", "GraphError", "stochastic_block_model", "bound_degree", "max_degree", "degrees"]


class GraphError(EstimatorError, ValueError):
    """A graph or a graph-DP setting that cannot be used (bad sizes, a degree over the bound, ...)."""


@dataclasses.dataclass(frozen=True)
class Graph:
    """``n`` nodes, undirected ``edges`` ((m, 2), u < v), features ``x`` ((n, d)) and labels ``y`` ((n,))."""

    x: np.ndarray
    y: np.ndarray
    edges: np.ndarray

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    def with_edges(self, edges: np.ndarray) -> Graph:
        return dataclasses.replace(self, edges=np.asarray(edges, dtype=np.int64).reshape(-1, 2))


def degrees(n: int, edges: np.ndarray) -> np.ndarray:
    return np.bincount(edges.reshape(-1), minlength=n).astype(np.int64)


def max_degree(n: int, edges: np.ndarray) -> int:
    return int(degrees(n, edges).max(initial=0))


def stochastic_block_model(
    n: int,
    blocks: int,
    p_in: float,
    p_out: float,
    features: int,
    signal: float,
    rng: np.random.Generator,
) -> Graph:
    """A stochastic block model: ``n`` nodes in ``blocks`` equal blocks (labels), an edge between two
    nodes of one block with probability ``p_in``, of two blocks with ``p_out``; each node's features are
    its block's mean (a random unit direction times ``signal``) plus standard normal noise, so the
    features alone classify poorly and averaging over same-block neighbours helps."""
    if n < 2 or blocks < 2 or features < 1:
        raise GraphError(f"need n >= 2, blocks >= 2, features >= 1; got {n}, {blocks}, {features}")
    for name, p in (("p_in", p_in), ("p_out", p_out)):
        if not 0.0 <= p <= 1.0:
            raise GraphError(f"{name} must be in [0, 1], got {p}")
    y = np.arange(n, dtype=np.int64) % blocks
    rng.shuffle(y)
    rows = []
    for i in range(n - 1):  # row by row: O(n) memory, not the n²/2 pairs at once
        prob = np.where(y[i + 1 :] == y[i], p_in, p_out)
        j = np.flatnonzero(rng.random(n - 1 - i) < prob) + i + 1
        rows.append(np.stack([np.full(j.size, i), j], axis=1))
    edges = np.concatenate(rows).astype(np.int64)
    means = rng.normal(size=(blocks, features))
    means *= signal / np.linalg.norm(means, axis=1, keepdims=True)
    x = means[y] + rng.normal(size=(n, features))
    return Graph(x=x.astype(np.float64), y=y, edges=edges)


def bound_degree(n: int, edges: np.ndarray, max_deg: int, rng: np.random.Generator) -> np.ndarray:
    """The edges kept when they are visited in a random order and one is kept while both its ends have
    fewer than ``max_deg`` kept edges (the sampler of Daigavane et al. 2021): every node of the result has
    degree <= ``max_deg``. The DP guarantee is stated on the bounded graph (docs/GRAPH.md says what that
    means for a graph whose degree exceeds the bound)."""
    if max_deg < 1:
        raise GraphError(f"the degree bound must be >= 1, got {max_deg}")
    order = rng.permutation(len(edges))
    count = np.zeros(n, dtype=np.int64)
    kept = []
    for i in order:
        u, v = edges[i]
        if count[u] < max_deg and count[v] < max_deg:
            count[u] += 1
            count[v] += 1
            kept.append(i)
    return edges[np.sort(np.array(kept, dtype=np.int64))] if kept else edges[:0]
