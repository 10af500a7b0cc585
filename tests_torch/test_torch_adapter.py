"""The PyTorch adapter (client_sdk.fl.torch_adapter) against the numpy models.

Run with ``scripts/test-torch`` (its own venv with the ``torch`` extra). On the same
flat parameters, ``TorchModel(nn.Linear(d, 1), "binary")`` must give the loss and the
gradient of ``LogisticRegression(d)`` (same layout: w then b); a linear softmax and a
one-hidden-layer tanh network must match ``SoftmaxRegression`` and ``MLP`` after the
documented transposition of their weight matrices (torch stores out × in, the numpy
models in × out). In float64 the two implementations agree to rounding (rtol 1e-10:
both compute the same closed forms in a different order); in float32 to rtol 1e-5
(a few ulps of sums over 200 rows). A short FedAvg run with the adapter follows the
numpy model's run step for step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from client_sdk.fl.torch_adapter import TorchModel
from estimator.fl.aggregators import WeightedMean
from estimator.fl.sampling import FixedCountSampling
from estimator.fl.strategies import FedAvg
from ldp_core.fl import MLP, LocalTraining, LogisticRegression, ModelError, SoftmaxRegression, accuracy
from simulator.rounds import FederatedClient, run_rounds

torch.set_num_threads(1)


def _binary_data(rng, n, d, dtype=np.float64):
    X = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    y = (X @ w + 0.5 * rng.normal(size=n) > 0).astype(np.int64)
    return X.astype(dtype), y


@pytest.mark.parametrize("l2", [0.0, 0.3])
def test_linear_module_equals_logistic_regression_in_float64(l2: float) -> None:
    rng = np.random.default_rng(1)
    d = 7
    X, y = _binary_data(rng, 200, d)
    ours, theirs = LogisticRegression(d, l2=l2), TorchModel(nn.Linear(d, 1), "binary", l2=l2)
    assert theirs.num_params == ours.num_params == d + 1
    for _ in range(3):
        p = rng.normal(size=d + 1)
        lo, go = ours.loss_and_grad(p, X, y)
        lt, gt = theirs.loss_and_grad(p, X, y)
        assert gt.dtype == np.float64 and gt.shape == (d + 1,)
        assert lt == pytest.approx(lo, rel=1e-10)
        np.testing.assert_allclose(gt, go, rtol=1e-10, atol=1e-13)
        assert theirs.loss(p, X, y) == pytest.approx(lo, rel=1e-10)
        np.testing.assert_array_equal(theirs.predict(p, X), ours.predict(p, X))


def test_linear_module_equals_logistic_regression_in_float32() -> None:
    rng = np.random.default_rng(2)
    d = 5
    X, y = _binary_data(rng, 200, d, np.float32)
    p = rng.normal(size=d + 1).astype(np.float32)
    lo, go = LogisticRegression(d, l2=0.1).loss_and_grad(p, X, y)
    lt, gt = TorchModel(nn.Linear(d, 1), "binary", l2=0.1).loss_and_grad(p, X, y)
    assert gt.dtype == np.float32
    assert lt == pytest.approx(lo, rel=1e-5)
    np.testing.assert_allclose(gt, go, rtol=1e-5, atol=1e-6)


def _to_torch_layout(blocks):
    """Concatenate (array, transpose?) blocks: numpy models keep W as in × out, torch as out × in."""
    return np.concatenate([(b.T if t else b).ravel() for b, t in blocks])


def test_softmax_and_mlp_match_after_transposing_weights() -> None:
    rng = np.random.default_rng(3)
    d, h, k, n = 6, 5, 4, 150
    X = rng.normal(size=(n, d))
    y = rng.integers(0, k, size=n)
    sm = SoftmaxRegression(d, k, l2=0.2)
    p = rng.normal(size=sm.num_params)
    W, b = p[: d * k].reshape(d, k), p[d * k :]
    tm = TorchModel(nn.Linear(d, k), "multiclass", l2=0.2)
    lt, gt = tm.loss_and_grad(_to_torch_layout([(W, True), (b, False)]), X, y)
    lo, go = sm.loss_and_grad(p, X, y)
    assert lt == pytest.approx(lo, rel=1e-10)
    gW, gb = go[: d * k].reshape(d, k), go[d * k :]
    np.testing.assert_allclose(gt, _to_torch_layout([(gW, True), (gb, False)]), rtol=1e-10, atol=1e-13)

    mlp = MLP(d, h, k, "tanh", l2=0.1)
    q = mlp.init_params(rng).astype(np.float64) + 0.1 * rng.normal(size=mlp.num_params)
    W1, b1, W2, b2 = mlp._split(q)
    tq = _to_torch_layout([(W1, True), (b1, False), (W2, True), (b2, False)])
    net = TorchModel(nn.Sequential(nn.Linear(d, h), nn.Tanh(), nn.Linear(h, k)), "multiclass", l2=0.1)
    lt, gt = net.loss_and_grad(tq, X, y)
    lo, go = mlp.loss_and_grad(q, X, y)
    assert lt == pytest.approx(lo, rel=1e-10)
    g1, gb1, g2, gb2 = mlp._split(go)
    np.testing.assert_allclose(
        gt, _to_torch_layout([(g1, True), (gb1, False), (g2, True), (gb2, False)]), rtol=1e-9, atol=1e-12
    )
    np.testing.assert_array_equal(net.predict(tq, X), mlp.predict(q, X))


def test_gradient_of_a_convolution_matches_finite_differences() -> None:
    """A module with no numpy counterpart: central differences with step 1e-6 in float64
    have error O(h²·f''') + O(ε/h) ≈ 1e-10; tolerance 1e-6."""
    rng = np.random.default_rng(4)
    net = nn.Sequential(nn.Unflatten(1, (1, 8)), nn.Conv1d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(12, 3))
    m = TorchModel(net, "multiclass", l2=0.05)
    X, y = rng.normal(size=(40, 8)), rng.integers(0, 3, size=40)
    p = m.init_params(rng).astype(np.float64) + 0.1 * rng.normal(size=m.num_params)
    _, g = m.loss_and_grad(p, X, y)
    eps = 1e-6
    for i in rng.choice(m.num_params, size=12, replace=False):
        e = np.zeros_like(p)
        e[i] = eps
        fd = (m.loss(p + e, X, y) - m.loss(p - e, X, y)) / (2 * eps)
        assert fd == pytest.approx(g[i], abs=1e-6)


def test_parameter_round_trip_and_module_left_untouched() -> None:
    lin = nn.Linear(3, 1)
    m = TorchModel(lin, "binary")
    before = m.current_params()
    p = np.arange(4, dtype=np.float32)
    m.loss_and_grad(p, np.ones((2, 3), np.float32), np.array([0, 1]))
    np.testing.assert_array_equal(m.current_params(), before)  # evaluated functionally
    m.load_into(p)
    np.testing.assert_array_equal(lin.weight.detach().numpy(), [[0, 1, 2]])
    np.testing.assert_array_equal(m.current_params(), p)


def test_init_params_draws_from_the_generator_only() -> None:
    """Glorot-uniform weights in ±√(6/(fan_in+fan_out)), zero biases, reproducible from the seed."""
    net = nn.Sequential(nn.Linear(10, 6), nn.Tanh(), nn.Linear(6, 2))
    m = TorchModel(net, "multiclass")
    a, b = m.init_params(np.random.default_rng(5)), m.init_params(np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    W1, b1 = a[:60], a[60:66]
    assert np.all(b1 == 0) and np.max(np.abs(W1)) <= np.sqrt(6 / 16) and np.std(W1) > 0.2


def test_refusals() -> None:
    with pytest.raises(ModelError, match="buffers"):
        TorchModel(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)), "multiclass")
    with pytest.raises(ModelError, match="task"):
        TorchModel(nn.Linear(3, 1), "regression")
    with pytest.raises(ModelError, match="torch.nn.Module"):
        TorchModel(LogisticRegression(3), "binary")
    m = TorchModel(nn.Linear(3, 2), "binary")
    with pytest.raises(ModelError, match="one logit"):
        m.loss(np.zeros(8), np.zeros((4, 3)), np.zeros(4, int))
    m = TorchModel(nn.Linear(3, 1), "binary")
    with pytest.raises(ModelError, match="length 4"):
        m.loss(np.zeros(5), np.zeros((4, 3)), np.zeros(4, int))
    with pytest.raises(ModelError, match="labels"):
        m.loss(np.zeros(4), np.zeros((4, 3)), np.array([0, 1, 2, 0]))


def test_fedavg_with_the_adapter_follows_the_numpy_model() -> None:
    """Same clients, same seeds, same start (zeros: the two init_params differ): 15 rounds of
    FedAvg with TorchModel(nn.Linear) and with LogisticRegression draw the same samples and
    batches, so the final parameters agree
    to float32 rounding accumulated over the steps (atol 1e-5; measured 2.4e-7), and both learn (> 0.85)."""
    rng = np.random.default_rng(6)
    d = 4
    clients = []
    for i, s in enumerate(np.linspace(-1, 1, 8)):
        X = rng.normal(loc=s, size=(40, d)).astype(np.float32)
        y = (X @ np.array([1.0, -1.0, 0.5, 0.0]) + 0.3 * rng.normal(size=40) > 0).astype(np.int64)
        clients.append(FederatedClient(f"c{i}", X, y))
    Xt = rng.normal(size=(400, d)).astype(np.float32)
    yt = (Xt @ np.array([1.0, -1.0, 0.5, 0.0]) > 0).astype(np.int64)
    tr = LocalTraining(epochs=2, batch_size=10, learning_rate=0.3)
    runs = {}
    for name, model in (("numpy", LogisticRegression(d)), ("torch", TorchModel(nn.Linear(d, 1), "binary"))):
        x, hist = run_rounds(
            model,
            FedAvg(tr),
            WeightedMean(),
            [FederatedClient(c.client_id, c.X, c.y) for c in clients],
            FixedCountSampling(4),
            15,
            np.random.default_rng(7),
            params=np.zeros(d + 1, np.float32),
            test=(Xt, yt),
        )
        runs[name] = (x, hist)
    (xn, hn), (xt, ht) = runs["numpy"], runs["torch"]
    np.testing.assert_allclose(xt, xn, atol=1e-5)
    assert [h.sampled for h in ht] == [h.sampled for h in hn]
    assert ht[-1].test_accuracy > 0.85 and accuracy(TorchModel(nn.Linear(d, 1), "binary"), xt, Xt, yt) > 0.85
