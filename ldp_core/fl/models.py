"""Models as flat float32 parameter vectors.

Federated learning moves one thing between devices and the server: a flat
vector of parameters (or of parameter changes). A :class:`Model` is a frozen
description of an architecture that knows how many parameters it has and how
to compute, from a flat vector, predictions, the loss and its gradient. Any
framework plugs in by implementing the same five members; the numpy models
here serve tests and scenarios. They need only numpy: devices train with them.

Every loss is the mean cross-entropy over the batch plus ``(l2 / 2)·‖θ‖²``
on the weights (not the biases). Computations run in the floating type of
``params`` and ``X`` combined (float32 in training, float64 where a test
checks gradients by finite differences).

* :class:`LogisticRegression`: θ = (w ∈ R^d, b); p = σ(x·w + b);
  loss = mean[log(1 + e^z) − y z]; ∇_w = Xᵀ(p − y)/n, ∇_b = mean(p − y).
* :class:`SoftmaxRegression`: θ = (W ∈ R^{d×K} row-major, b ∈ R^K);
  loss = mean[logsumexp(z) − z_y]; ∇_W = Xᵀ(P − Y)/n.
* :class:`MLP`: one hidden layer of width h (tanh or ReLU), softmax output;
  θ = (W1 d×h, b1, W2 h×K, b2); the gradient by backpropagation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from ldp_core.fl.errors import ModelError

__all__ = ["Model", "LogisticRegression", "SoftmaxRegression", "MLP", "accuracy"]


@runtime_checkable
class Model(Protocol):
    """What federated learning needs from a model."""

    @property
    def num_params(self) -> int: ...

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """A float32 vector of ``num_params`` initial parameters."""

    def predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Predicted class labels (int64) for the rows of ``X``."""

    def loss(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        """Mean loss over the rows of ``X`` with labels ``y``, plus the L2 penalty."""

    def loss_and_grad(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """The loss and its gradient with respect to ``params`` (same shape and dtype)."""


def accuracy(model: Model, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    """Fraction of rows whose predicted label equals ``y``."""
    return float(np.mean(model.predict(params, X) == np.asarray(y)))


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ModelError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_l2(l2: object) -> None:
    if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not math.isfinite(l2) or l2 < 0:
        raise ModelError(f"l2 must be a finite number >= 0, got {l2!r}")


def _work(params: np.ndarray, X: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(params)
    if p.ndim != 1 or p.shape[0] != n:
        raise ModelError(f"expected a flat parameter vector of length {n}, got shape {p.shape}")
    dt = np.result_type(p.dtype, np.asarray(X).dtype, np.float32)
    return p.astype(dt, copy=False), np.asarray(X, dtype=dt)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def _xent_grad(z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean softmax cross-entropy of logits ``z`` and dL/dz."""
    n = z.shape[0]
    logp = _log_softmax(z)
    idx = np.arange(n)
    loss = -float(np.mean(logp[idx, y]))
    g = np.exp(logp)
    g[idx, y] -= 1.0
    return loss, g / n


def _labels(y: np.ndarray, k: int) -> np.ndarray:
    y = np.asarray(y)
    if y.size and (y.min() < 0 or y.max() >= k):
        raise ModelError(f"labels must be integers in [0, {k}), got range [{y.min()}, {y.max()}]")
    return y.astype(np.int64, copy=False)


@dataclasses.dataclass(frozen=True)
class LogisticRegression:
    """Binary logistic regression on ``n_features`` features (labels 0/1)."""

    n_features: int
    l2: float = 0.0

    def __post_init__(self) -> None:
        _check_int("n_features", self.n_features, 1)
        _check_l2(self.l2)

    @property
    def num_params(self) -> int:
        return self.n_features + 1

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(self.num_params, dtype=np.float32)

    def _logits(self, p: np.ndarray, X: np.ndarray) -> np.ndarray:
        return X @ p[:-1] + p[-1]

    def predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        p, Xw = _work(params, X, self.num_params)
        return (self._logits(p, Xw) > 0).astype(np.int64)

    def loss(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        return self.loss_and_grad(params, X, y)[0]

    def loss_and_grad(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        p, Xw = _work(params, X, self.num_params)
        y = _labels(y, 2).astype(p.dtype)
        z = self._logits(p, Xw)
        loss = float(np.mean(np.logaddexp(0.0, z) - y * z))
        r = (0.5 * (1.0 + np.tanh(0.5 * z)) - y) / z.shape[0]  # σ(z) − y, stable
        g = np.empty_like(p)
        g[:-1] = Xw.T @ r + self.l2 * p[:-1]
        g[-1] = r.sum()
        loss += 0.5 * self.l2 * float(p[:-1] @ p[:-1])
        return loss, g


@dataclasses.dataclass(frozen=True)
class SoftmaxRegression:
    """Multinomial logistic regression: ``n_features`` inputs, ``n_classes`` labels."""

    n_features: int
    n_classes: int
    l2: float = 0.0

    def __post_init__(self) -> None:
        _check_int("n_features", self.n_features, 1)
        _check_int("n_classes", self.n_classes, 2)
        _check_l2(self.l2)

    @property
    def num_params(self) -> int:
        return (self.n_features + 1) * self.n_classes

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(self.num_params, dtype=np.float32)

    def _split(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d, k = self.n_features, self.n_classes
        return p[: d * k].reshape(d, k), p[d * k :]

    def predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        p, Xw = _work(params, X, self.num_params)
        W, b = self._split(p)
        return np.argmax(Xw @ W + b, axis=1).astype(np.int64)

    def loss(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        return self.loss_and_grad(params, X, y)[0]

    def loss_and_grad(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        p, Xw = _work(params, X, self.num_params)
        W, b = self._split(p)
        loss, gz = _xent_grad(Xw @ W + b, _labels(y, self.n_classes))
        g = np.empty_like(p)
        gW, gb = self._split(g)
        gW[...] = Xw.T @ gz + self.l2 * W
        gb[...] = gz.sum(axis=0)
        return loss + 0.5 * self.l2 * float(np.sum(W * W)), g


@dataclasses.dataclass(frozen=True)
class MLP:
    """A one-hidden-layer perceptron with a softmax output."""

    n_features: int
    hidden: int
    n_classes: int
    activation: Literal["tanh", "relu"] = "tanh"
    l2: float = 0.0

    def __post_init__(self) -> None:
        _check_int("n_features", self.n_features, 1)
        _check_int("hidden", self.hidden, 1)
        _check_int("n_classes", self.n_classes, 2)
        if self.activation not in ("tanh", "relu"):
            raise ModelError(f"activation must be 'tanh' or 'relu', got {self.activation!r}")
        _check_l2(self.l2)

    @property
    def num_params(self) -> int:
        d, h, k = self.n_features, self.hidden, self.n_classes
        return d * h + h + h * k + k

    def _split(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        d, h, k = self.n_features, self.hidden, self.n_classes
        i1, i2, i3 = d * h, d * h + h, d * h + h + h * k
        return p[:i1].reshape(d, h), p[i1:i2], p[i2:i3].reshape(h, k), p[i3:]

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """Glorot-uniform weights (Glorot and Bengio 2010), zero biases."""
        p = np.zeros(self.num_params, dtype=np.float32)
        W1, _, W2, _ = self._split(p)
        for W in (W1, W2):
            a = math.sqrt(6.0 / (W.shape[0] + W.shape[1]))
            W[...] = rng.uniform(-a, a, size=W.shape)
        return p

    def _forward(self, p: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        W1, b1, W2, b2 = self._split(p)
        pre = X @ W1 + b1
        hid = np.tanh(pre) if self.activation == "tanh" else np.maximum(pre, 0)
        return pre, hid, hid @ W2 + b2

    def predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        p, Xw = _work(params, X, self.num_params)
        return np.argmax(self._forward(p, Xw)[2], axis=1).astype(np.int64)

    def loss(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        return self.loss_and_grad(params, X, y)[0]

    def loss_and_grad(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        p, Xw = _work(params, X, self.num_params)
        W1, _, W2, _ = self._split(p)
        pre, hid, z = self._forward(p, Xw)
        loss, gz = _xent_grad(z, _labels(y, self.n_classes))
        g = np.empty_like(p)
        gW1, gb1, gW2, gb2 = self._split(g)
        gW2[...] = hid.T @ gz + self.l2 * W2
        gb2[...] = gz.sum(axis=0)
        gh = gz @ W2.T
        gpre = gh * (1.0 - hid * hid) if self.activation == "tanh" else gh * (pre > 0)
        gW1[...] = Xw.T @ gpre + self.l2 * W1
        gb1[...] = gpre.sum(axis=0)
        reg = 0.5 * self.l2 * (float(np.sum(W1 * W1)) + float(np.sum(W2 * W2)))
        return loss + reg, g
