"""Per-example gradients of the numpy models, vectorized, and their norms without
materializing them.

DP-SGD (Abadi et al., "Deep learning with differential privacy", CCS 2016)
clips each example's gradient before summing, so it needs the gradient of
each example's loss ℓ_i, not just their mean. Every model of
:mod:`ldp_core.fl.models` is a stack of dense layers z = a·W + b, and the
gradient of ℓ_i with respect to one layer is an outer product:

    ∂ℓ_i/∂W = a_i ⊗ g_i,   ∂ℓ_i/∂b = g_i,   g_i = ∂ℓ_i/∂z_i,

with a_i the layer's input for example i. One batched backward pass gives
every (a_i, g_i) at once (:func:`layer_activations`); the per-example
gradients are then one ``einsum`` per layer (:func:`per_example_grads`).

The norms need not materialize the (n, num_params) matrix: for a dense layer
‖a_i ⊗ g_i‖²_F = ‖a_i‖²·‖g_i‖², so

    ‖∇ℓ_i‖² = Σ_layers (‖a_i‖² + 1)·‖g_i‖²

(the "+ 1" is the bias). This is the ghost norm of Goodfellow, "Efficient
per-example gradient computations" (2015), used for ghost clipping by Li,
Tramèr, Liang, Hashimoto ("Large language models can be strong differentially
private learners", ICLR 2022). The clipped sum Σ_i s_i ∇ℓ_i with
s_i = min(1, C/‖∇ℓ_i‖) is then, per layer, aᵀ(s ⊙ g) and Σ_i s_i g_i: the
same cost as one ordinary gradient (:func:`clipped_grad_sum`).

Everything here is the gradient of the per-example *data* loss: no L2
penalty (it does not depend on any example, so DP-SGD adds it after the
noise) and no 1/n. Gradients are laid out as the model's flat parameters.
"""

from __future__ import annotations

import numpy as np

from ldp_core.fl.errors import ModelError
from ldp_core.fl.models import MLP, LogisticRegression, Model, SoftmaxRegression

__all__ = [
    "Layer",
    "layer_activations",
    "per_example_grads",
    "per_example_grad_norms",
    "clipped_grad_sum",
    "clip_factors",
    "penalty_grad",
    "NumpyGradients",
]

#: one dense layer's (inputs a, output gradients g), each with one row per example
Layer = tuple[np.ndarray, np.ndarray]


def _prepare(model: Model, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(params)
    if p.ndim != 1 or p.shape[0] != model.num_params:
        raise ModelError(f"expected a flat parameter vector of length {model.num_params}, got shape {p.shape}")
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != getattr(model, "n_features", -1):
        raise ModelError(f"X must have shape (n, {getattr(model, 'n_features', '?')}), got {X.shape}")
    if np.asarray(y).shape != (X.shape[0],):
        raise ModelError(f"y must have shape ({X.shape[0]},), got {np.asarray(y).shape}")
    dt = np.result_type(p.dtype, X.dtype, np.float32)
    return p.astype(dt, copy=False), X.astype(dt, copy=False)


def _labels(y: np.ndarray, k: int) -> np.ndarray:
    y = np.asarray(y)
    if y.size and (y.min() < 0 or y.max() >= k):
        raise ModelError(f"labels must be integers in [0, {k}), got range [{y.min()}, {y.max()}]")
    return y.astype(np.int64, copy=False)


def _softmax_minus_onehot(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """∂/∂z of −log softmax(z)_y, per row: softmax(z) − e_y."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    g = e / e.sum(axis=1, keepdims=True)
    g[np.arange(z.shape[0]), y] -= 1.0
    return g


def layer_activations(model: Model, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> list[Layer]:
    """(a, g) of every dense layer, in the order of the model's parameters, from one
    batched forward and backward pass (no loop over examples). Supports
    :class:`LogisticRegression`, :class:`SoftmaxRegression` and :class:`MLP`."""
    p, Xw = _prepare(model, params, X, y)
    if isinstance(model, LogisticRegression):
        z = Xw @ p[:-1] + p[-1]
        r = 0.5 * (1.0 + np.tanh(0.5 * z)) - _labels(y, 2).astype(p.dtype)  # σ(z) − y
        return [(Xw, r[:, None])]
    if isinstance(model, SoftmaxRegression):
        d, k = model.n_features, model.n_classes
        W, b = p[: d * k].reshape(d, k), p[d * k :]
        return [(Xw, _softmax_minus_onehot(Xw @ W + b, _labels(y, k)))]
    if isinstance(model, MLP):
        d, h, k = model.n_features, model.hidden, model.n_classes
        i1, i2, i3 = d * h, d * h + h, d * h + h + h * k
        W1, b1, W2, b2 = p[:i1].reshape(d, h), p[i1:i2], p[i2:i3].reshape(h, k), p[i3:]
        pre = Xw @ W1 + b1
        hid = np.tanh(pre) if model.activation == "tanh" else np.maximum(pre, 0)
        gz = _softmax_minus_onehot(hid @ W2 + b2, _labels(y, k))
        gh = gz @ W2.T
        gpre = gh * (1.0 - hid * hid) if model.activation == "tanh" else gh * (pre > 0)
        return [(Xw, gpre), (hid, gz)]
    raise ModelError(
        f"per-example gradients are implemented for LogisticRegression, SoftmaxRegression and MLP, "
        f"not {type(model).__name__}"
    )


def per_example_grads(model: Model, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The (n, num_params) matrix whose row i is ∇ℓ_i (see the module docstring)."""
    parts: list[np.ndarray] = []
    for a, g in layer_activations(model, params, X, y):
        parts.append(np.einsum("ni,nj->nij", a, g).reshape(a.shape[0], -1))
        parts.append(g)
    return np.concatenate(parts, axis=1)


def per_example_grad_norms(model: Model, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """‖∇ℓ_i‖₂ for each example, by the ghost norm Σ_layers (‖a_i‖² + 1)·‖g_i‖²,
    without forming the per-example gradients."""
    return np.sqrt(_ghost_sq_norms(layer_activations(model, params, X, y)))


def _ghost_sq_norms(layers: list[Layer]) -> np.ndarray:
    sq = np.zeros(layers[0][0].shape[0], dtype=np.float64)
    for a, g in layers:
        sq += (np.einsum("ni,ni->n", a, a) + 1.0) * np.einsum("nj,nj->n", g, g)
    return sq


def clip_factors(norms: np.ndarray, clip_norm: float) -> np.ndarray:
    """s_i = min(1, C/‖g_i‖) (1 for a zero gradient)."""
    n = np.asarray(norms, dtype=np.float64)
    return np.minimum(1.0, clip_norm / np.maximum(n, np.finfo(np.float64).tiny))


def clipped_grad_sum(
    model: Model, params: np.ndarray, X: np.ndarray, y: np.ndarray, clip_norm: float
) -> tuple[np.ndarray, np.ndarray]:
    """Σ_i min(1, C/‖∇ℓ_i‖)·∇ℓ_i (flat, the dtype of ``params`` and ``X``) and the
    per-example norms, by ghost clipping: never more than one layer's
    ordinary gradient in memory."""
    if not (isinstance(clip_norm, (int, float)) and clip_norm > 0 and np.isfinite(clip_norm)):
        raise ModelError(f"clip_norm must be a finite number > 0, got {clip_norm!r}")
    layers = layer_activations(model, params, X, y)
    norms = np.sqrt(_ghost_sq_norms(layers))
    s = clip_factors(norms, clip_norm)
    parts: list[np.ndarray] = []
    for a, g in layers:
        sg = g * s[:, None].astype(g.dtype)
        parts.append((a.T @ sg).ravel())
        parts.append(sg.sum(axis=0))
    return np.concatenate(parts), norms


def penalty_grad(model: Model, params: np.ndarray) -> np.ndarray:
    """∇ of the model's L2 penalty (l2/2)·‖weights‖² (biases not penalized): l2·θ on
    the weights, 0 on the biases. It depends on no example."""
    p = np.asarray(params)
    l2 = float(getattr(model, "l2", 0.0))
    out = np.zeros_like(p)
    if not l2:
        return out
    if isinstance(model, LogisticRegression):
        out[:-1] = l2 * p[:-1]
    elif isinstance(model, SoftmaxRegression):
        w = model.n_features * model.n_classes
        out[:w] = l2 * p[:w]
    elif isinstance(model, MLP):
        d, h, k = model.n_features, model.hidden, model.n_classes
        i1, i2, i3 = d * h, d * h + h, d * h + h + h * k
        out[:i1] = l2 * p[:i1]
        out[i2:i3] = l2 * p[i2:i3]
    else:
        raise ModelError(f"no L2 layout known for {type(model).__name__}")
    return out


class NumpyGradients:
    """The numpy ``model``'s per-example side of DP-SGD (:class:`ldp_core.fl.dpsgd.PerExampleGradients`):
    :func:`clipped_grad_sum` by ghost clipping and :func:`penalty_grad`."""

    def __init__(self, model: Model) -> None:
        self.model = model

    @property
    def num_params(self) -> int:
        return self.model.num_params

    def clipped_grad_sum(
        self, params: np.ndarray, X: np.ndarray, y: np.ndarray, clip_norm: float
    ) -> tuple[np.ndarray, np.ndarray]:
        return clipped_grad_sum(self.model, params, X, y, clip_norm)

    def penalty_grad(self, params: np.ndarray) -> np.ndarray:
        return penalty_grad(self.model, params)
