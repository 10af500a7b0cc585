"""Per-example gradients of the numpy models: against finite differences, against a
loop over examples (the loop lives only here), against the models' own mean
gradient, and ghost norms and ghost clipping against the materialized gradients."""

from __future__ import annotations

import numpy as np
import pytest

from ldp_core.fl import MLP, LogisticRegression, ModelError, SoftmaxRegression
from ldp_core.fl.per_example import (
    clip_factors,
    clipped_grad_sum,
    penalty_grad,
    per_example_grad_norms,
    per_example_grads,
)

MODELS = [
    LogisticRegression(5, l2=0.1),
    SoftmaxRegression(5, 3, l2=0.1),
    MLP(5, 7, 3, activation="tanh", l2=0.1),
    MLP(5, 7, 3, activation="relu", l2=0.0),
]
IDS = ["logistic", "softmax", "mlp-tanh", "mlp-relu"]


def _data(model, rng, n=30):
    X = rng.normal(size=(n, model.n_features))
    k = 2 if isinstance(model, LogisticRegression) else model.n_classes
    return X, rng.integers(0, k, size=n)


def _unpenalized(model):
    return type(model)(**{**model.__dict__, "l2": 0.0})


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_each_row_matches_finite_differences_of_that_example(model) -> None:
    """Central differences in float64 with h = 1e-5 have error O(h²) + O(1e-16/h) ≈ 1e-10,
    so each coordinate of ∇ℓ_i must agree to 1e-7."""
    rng = np.random.default_rng(3)
    X, y = _data(model, rng, n=4)
    theta = rng.normal(scale=0.5, size=model.num_params)
    G = per_example_grads(model, theta, X, y)
    assert G.shape == (4, model.num_params) and G.dtype == np.float64
    plain = _unpenalized(model)
    h = 1e-5
    eye = np.eye(model.num_params) * h
    for i in range(4):
        xi, yi = X[i : i + 1], y[i : i + 1]
        fd = np.array([(plain.loss(theta + e, xi, yi) - plain.loss(theta - e, xi, yi)) / (2 * h) for e in eye])
        np.testing.assert_allclose(G[i], fd, atol=1e-7)


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_rows_equal_a_loop_of_single_example_gradients(model) -> None:
    rng = np.random.default_rng(4)
    X, y = _data(model, rng)
    theta = rng.normal(scale=0.5, size=model.num_params)
    plain = _unpenalized(model)
    loop = np.stack([plain.loss_and_grad(theta, X[i : i + 1], y[i : i + 1])[1] for i in range(len(X))])
    np.testing.assert_allclose(per_example_grads(model, theta, X, y), loop, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_mean_plus_penalty_is_the_models_gradient(model) -> None:
    rng = np.random.default_rng(5)
    X, y = _data(model, rng)
    theta = rng.normal(scale=0.5, size=model.num_params)
    _, g = model.loss_and_grad(theta, X, y)
    mean = per_example_grads(model, theta, X, y).mean(axis=0) + penalty_grad(model, theta)
    np.testing.assert_allclose(mean, g, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_ghost_norms_equal_materialized_norms(model) -> None:
    rng = np.random.default_rng(6)
    X, y = _data(model, rng, n=50)
    theta = rng.normal(scale=0.5, size=model.num_params)
    G = per_example_grads(model, theta, X, y)
    np.testing.assert_allclose(per_example_grad_norms(model, theta, X, y), np.linalg.norm(G, axis=1), rtol=1e-12)


@pytest.mark.parametrize("model", MODELS, ids=IDS)
def test_ghost_clipping_equals_clipping_the_materialized_gradients(model) -> None:
    rng = np.random.default_rng(7)
    X, y = _data(model, rng, n=50)
    X[:5] *= 100.0  # some examples far above the clip norm, some below
    theta = rng.normal(scale=0.5, size=model.num_params)
    G = per_example_grads(model, theta, X, y)
    norms = np.linalg.norm(G, axis=1)
    C = float(np.median(norms))
    ref = (G * np.minimum(1.0, C / np.maximum(norms, 1e-300))[:, None]).sum(axis=0)
    total, ghost = clipped_grad_sum(model, theta, X, y, C)
    np.testing.assert_allclose(ghost, norms, rtol=1e-12)
    np.testing.assert_allclose(total, ref, rtol=1e-10, atol=1e-10)


def test_float32_inputs_stay_float32() -> None:
    model = MLP(5, 7, 3)
    rng = np.random.default_rng(8)
    X, y = _data(model, rng)
    theta = model.init_params(rng)
    assert per_example_grads(model, theta, X.astype(np.float32), y).dtype == np.float32
    assert clipped_grad_sum(model, theta, X.astype(np.float32), y, 1.0)[0].dtype == np.float32


def test_clip_factors_leave_small_and_zero_gradients_alone() -> None:
    np.testing.assert_array_equal(clip_factors(np.array([0.0, 0.5, 1.0, 4.0]), 1.0), [1.0, 1.0, 1.0, 0.25])


def test_bad_inputs_are_refused() -> None:
    model = SoftmaxRegression(3, 2)
    theta = np.zeros(model.num_params)
    with pytest.raises(ModelError, match="length"):
        per_example_grads(model, np.zeros(3), np.zeros((2, 3)), np.zeros(2, int))
    with pytest.raises(ModelError, match="shape"):
        per_example_grads(model, theta, np.zeros((2, 4)), np.zeros(2, int))
    with pytest.raises(ModelError, match="labels"):
        per_example_grads(model, theta, np.zeros((2, 3)), np.array([0, 2]))
    with pytest.raises(ModelError, match="clip_norm"):
        clipped_grad_sum(model, theta, np.zeros((2, 3)), np.zeros(2, int), 0.0)
