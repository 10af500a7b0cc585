"""Model inversion (Fredrikson, Jha, Ristenpart 2015): a class representative from a softmax
classifier's confidences alone.

The attacker holds the trained model (white box: its parameters, so its input gradients) and a class
c, and looks for the input the model is most confident belongs to c: gradient ascent on

    log p_c(x) − (λ/2)·‖x‖²

from x = 0 (the penalty is a Gaussian prior on inputs; without it the logit grows without bound
along the class direction). For softmax regression ∇_x log p_c = W_c − Σ_j p_j W_j; for the MLP by
backpropagation through the hidden layer. Fredrikson et al. minimise 1 − p_c with a denoising step;
log p_c has the same maximisers and does not flatten once p_c is near 1.

What is measured: the cosine similarity of the reconstruction to the mean of class c's *training*
rows, and whether that class mean is the nearest (by cosine) of all K class means ("identified").
A model trained with DP-SGD releases a noisier W, so its inversion moves away from the class mean as
σ grows. Note what DP does and does not promise here: a class mean over many rows is a population
statistic, which DP allows a model to learn; DP bounds what the model reveals about one row. With few
rows per class the representative is close to those few rows, and DP's noise is what hides them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from estimator.errors import DatasetError
from ldp_core.fl.models import MLP, Model, SoftmaxRegression

__all__ = ["log_confidence_grad", "invert_class", "inversion_similarity"]


def log_confidence_grad(model: Model, params: np.ndarray, x: np.ndarray, c: int) -> tuple[float, np.ndarray]:
    """(log p_c(x), ∇_x log p_c(x)) for one input ``x`` of a softmax regression or MLP."""
    p = np.asarray(params, dtype=np.float64)
    xv = np.asarray(x, dtype=np.float64)
    if isinstance(model, SoftmaxRegression):
        d, k = model.n_features, model.n_classes
        W, b = p[: d * k].reshape(d, k), p[d * k :]
        z = xv @ W + b
        z = z - z.max()
        probs = np.exp(z) / np.exp(z).sum()
        return float(np.log(probs[c])), W[:, c] - W @ probs
    if isinstance(model, MLP):
        d, h, k = model.n_features, model.hidden, model.n_classes
        W1, b1 = p[: d * h].reshape(d, h), p[d * h : d * h + h]
        W2, b2 = p[d * h + h : d * h + h + h * k].reshape(h, k), p[d * h + h + h * k :]
        pre = xv @ W1 + b1
        hid = np.tanh(pre) if model.activation == "tanh" else np.maximum(pre, 0)
        z = hid @ W2 + b2
        z = z - z.max()
        probs = np.exp(z) / np.exp(z).sum()
        gz = -probs
        gz[c] += 1.0
        gh = W2 @ gz
        gpre = gh * (1.0 - hid * hid) if model.activation == "tanh" else gh * (pre > 0)
        return float(np.log(probs[c])), W1 @ gpre
    raise DatasetError(f"model inversion takes a SoftmaxRegression or MLP, got {type(model).__name__}")


def invert_class(
    model: Model,
    params: np.ndarray,
    c: int,
    n_features: int,
    steps: int = 300,
    learning_rate: float = 0.1,
    prior: float = 0.1,
) -> np.ndarray:
    """Gradient ascent on log p_c(x) − (prior/2)·‖x‖² from x = 0 for ``steps`` steps."""
    x = np.zeros(n_features)
    for _ in range(steps):
        _, g = log_confidence_grad(model, params, x, c)
        x += learning_rate * (g - prior * x)
    return x


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb))


def inversion_similarity(
    model: Model, params: np.ndarray, X_train: np.ndarray, y_train: np.ndarray, **kwargs: Any
) -> dict[str, Any]:
    """Invert every class; per class the cosine to its training mean, the best cosine to another class's
    mean, and whether its own mean is the nearest. Returns the means over classes and the rows."""
    k = int(getattr(model, "n_classes", 0))
    X = np.asarray(X_train, dtype=np.float64)
    means = np.stack([X[y_train == c].mean(axis=0) if (y_train == c).any() else np.zeros(X.shape[1]) for c in range(k)])
    rows = []
    for c in range(k):
        x = invert_class(model, params, c, X.shape[1], **kwargs)
        sims = np.array([_cos(x, m) for m in means])
        others = np.delete(sims, c)
        rows.append(
            {
                "class": c,
                "cosine_to_class_mean": float(sims[c]),
                "best_cosine_to_other_mean": float(others.max()),
                "identified": bool(sims[c] > others.max()),
                "confidence": float(np.exp(log_confidence_grad(model, params, x, c)[0])),
            }
        )
    return {
        "mean_cosine_to_class_mean": float(np.mean([r["cosine_to_class_mean"] for r in rows])),
        "identified_fraction": float(np.mean([r["identified"] for r in rows])),
        "per_class": rows,
    }
