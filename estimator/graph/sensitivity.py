"""The sensitivity of a graph network's gradient sum to one node or one edge, and the computations it
bounds: K hops of mean aggregation and the per-node clipped gradient sum.

Aggregation: ``h⁰ = x``, ``h^{k+1}_u = mean of h^k over u and its neighbours`` (the closed
neighbourhood), so ``h^K_u`` depends on the nodes and edges within K hops of u only (mean aggregation,
unlike the symmetric normalization of a GCN, does not let a degree change reach one hop further).

On a graph of maximum degree D:

* a node v is in the K-hop computation tree of at most ``N(D, K) = 1 + D + ... + D^K`` nodes (itself
  included). Removing v removes its own loss term (norm <= C after clipping) and changes the terms of
  the other <= N(D, K) - 1 nodes (each by <= 2C): node-level sensitivity ``C·(2·N(D, K) - 1)``.
* an edge (a, b) is in the trees of the nodes within K-1 hops of a or of b, at most ``2·N(D, K-1)``;
  removing it removes no term and changes each of those by <= 2C: edge-level sensitivity
  ``4C·N(D, K-1)``.

Without graph (K = 0) the node-level sensitivity is C, as in ordinary DP-SGD, and edges do not matter.
The noise of a DP step is σ times the sensitivity: the inflation N(D, K) is the price of the graph.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from estimator.graph.data import GraphError, degrees

__all__ = [
    "Level",
    "trees",
    "sensitivity",
    "aggregate",
    "per_node_gradients",
    "clipped_gradient_sum",
]

Level = Literal["node", "edge"]


def trees(max_deg: int, hops: int) -> int:
    """N(D, K) = 1 + D + ... + D^K: how many K-hop computation trees one node can appear in (0 for K < 0)."""
    if max_deg < 0:
        raise GraphError(f"the degree bound must be >= 0, got {max_deg}")
    return sum(max_deg**k for k in range(hops + 1)) if hops >= 0 else 0


def sensitivity(level: Level, max_deg: int, hops: int, clip: float) -> float:
    """The L2 sensitivity of the clipped per-node gradient sum to one node (added or removed, with its
    edges) or to one edge, on graphs of maximum degree ``max_deg`` with ``hops`` aggregation hops."""
    if hops < 0:
        raise GraphError(f"hops must be >= 0, got {hops}")
    if level == "node":
        return clip * (2 * trees(max_deg, hops) - 1)
    if level == "edge":
        return 4.0 * clip * trees(max_deg, hops - 1)
    raise GraphError(f"level must be 'node' or 'edge', got {level!r}")


def aggregate(x: np.ndarray, edges: np.ndarray, hops: int) -> np.ndarray:
    """``hops`` rounds of mean aggregation of ``x`` over each node's closed neighbourhood."""
    n = x.shape[0]
    deg = degrees(n, edges).astype(np.float64)
    h = np.asarray(x, dtype=np.float64)
    u, v = edges[:, 0], edges[:, 1]
    for _ in range(hops):
        s = h.copy()
        np.add.at(s, u, h[v])
        np.add.at(s, v, h[u])
        h = s / (deg + 1.0)[:, None]
    return h


def _residuals(h: np.ndarray, y: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    z = h @ W + b
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return p


def per_node_gradients(h: np.ndarray, y: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each node's cross-entropy gradient of a softmax classifier (W: d×k, b: k) on its aggregated
    features, flattened (W's d·k entries then b's k): (n, d·k + k). For tests and audits; training uses
    :func:`clipped_gradient_sum`, which never forms this matrix."""
    r = _residuals(h, y, W, b)
    gw = (h[:, :, None] * r[:, None, :]).reshape(len(y), -1)
    return np.concatenate([gw, r], axis=1)


def clipped_gradient_sum(
    h: np.ndarray, y: np.ndarray, W: np.ndarray, b: np.ndarray, clip: float
) -> tuple[np.ndarray, np.ndarray]:
    """Σ_u clip_C(g_u) over the rows given, as (∂W, ∂b). A node's gradient is the outer product
    [h_u, 1] ⊗ r_u (r_u = p_u - e_{y_u}), so its norm is sqrt(‖h_u‖² + 1)·‖r_u‖."""
    r = _residuals(h, y, W, b)
    norms = np.sqrt((np.einsum("ij,ij->i", h, h) + 1.0) * np.einsum("ij,ij->i", r, r))
    f = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    rf = r * f[:, None]
    return h.T @ rf, rf.sum(axis=0)
