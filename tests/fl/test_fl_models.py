"""Models as flat parameter vectors: gradients against central finite differences,
shapes, and that plain gradient descent learns a separable problem."""

from __future__ import annotations

import numpy as np
import pytest

from ldp_core.fl import MLP, LogisticRegression, ModelError, SoftmaxRegression, accuracy

MODELS = [
    LogisticRegression(5, l2=0.1),
    SoftmaxRegression(5, 3, l2=0.1),
    MLP(5, 7, 3, activation="tanh", l2=0.1),
    MLP(5, 7, 3, activation="relu", l2=0.0),
]


def _data(model, rng, n=40):
    X = rng.normal(size=(n, model.n_features))
    k = 2 if isinstance(model, LogisticRegression) else model.n_classes
    return X, rng.integers(0, k, size=n)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{type(m).__name__}-{getattr(m, 'activation', '')}")
def test_gradient_matches_central_finite_differences(model) -> None:
    """Central differences (L(θ+he) − L(θ−he))/2h have error O(h²) ≈ 1e-10 at h = 1e-5
    in float64 (plus rounding ≈ 1e-16/h ≈ 1e-11), so every coordinate must agree
    with the analytic gradient to 1e-7 absolute."""
    rng = np.random.default_rng(1)
    X, y = _data(model, rng)
    theta = rng.normal(scale=0.5, size=model.num_params)
    _, g = model.loss_and_grad(theta, X, y)
    assert g.shape == theta.shape and g.dtype == np.float64
    h = 1e-5
    fd = np.empty_like(theta)
    for i in range(theta.size):
        e = np.zeros_like(theta)
        e[i] = h
        fd[i] = (model.loss(theta + e, X, y) - model.loss(theta - e, X, y)) / (2 * h)
    np.testing.assert_allclose(g, fd, atol=1e-7, rtol=0)


def test_logistic_loss_matches_formula_at_a_point() -> None:
    """At θ = 0 every p = ½, so the loss is log 2 and ∇_b = mean(½ − y)."""
    m = LogisticRegression(3)
    X = np.array([[1.0, 2, 3], [0, -1, 2]])
    y = np.array([1, 0])
    loss, g = m.loss_and_grad(np.zeros(4), X, y)
    assert loss == pytest.approx(np.log(2.0))
    expected_w = X.T @ (0.5 - y) / 2
    np.testing.assert_allclose(g[:3], expected_w)
    assert g[3] == pytest.approx(0.0)


@pytest.mark.parametrize(
    "model", [LogisticRegression(5), SoftmaxRegression(5, 3), MLP(5, 16, 3)], ids=lambda m: type(m).__name__
)
def test_float32_in_float32_out_and_descent_learns(model) -> None:
    rng = np.random.default_rng(2)
    n = 400
    X = rng.normal(size=(n, model.n_features)).astype(np.float32)
    k = 2 if isinstance(model, LogisticRegression) else model.n_classes
    W = rng.normal(size=(model.n_features, k))
    y = np.argmax(X @ W, axis=1) if k > 2 else (X @ W[:, 0] > 0).astype(int)
    theta = model.init_params(rng)
    assert theta.dtype == np.float32 and theta.shape == (model.num_params,)
    for _ in range(300):
        _, g = model.loss_and_grad(theta, X, y)
        assert g.dtype == np.float32
        theta -= 0.5 * g
    assert accuracy(model, theta, X, y) > 0.9


def test_bad_shapes_and_specs_refused() -> None:
    m = SoftmaxRegression(4, 3)
    with pytest.raises(ModelError, match="length 15"):
        m.loss_and_grad(np.zeros(14), np.zeros((2, 4)), np.zeros(2, int))
    with pytest.raises(ModelError, match="labels"):
        m.loss_and_grad(np.zeros(15), np.zeros((2, 4)), np.array([0, 3]))
    with pytest.raises(ModelError):
        MLP(4, 0, 3)
    with pytest.raises(ModelError):
        MLP(4, 3, 3, activation="sigmoid")
    with pytest.raises(ModelError):
        LogisticRegression(3, l2=-1.0)
