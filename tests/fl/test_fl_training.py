"""FedAvg, FedProx and SCAFFOLD: client updates, server steps, sampling and its accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.accounting.accountant import account, epsilon_pld, exact_gaussian_epsilon
from estimator.fl.aggregators import RoundContext, WeightedMean
from estimator.fl.dp import ClientLevelAccountant
from estimator.fl.sampling import FixedCountSampling, PoissonSampling
from estimator.fl.strategies import FedAvg, FedProx, Scaffold
from ldp_core.fl import (
    ClientState,
    ClientUpdate,
    LocalTraining,
    LogisticRegression,
    ModelError,
    RoundConfig,
    train_client,
)
from ldp_core.privacy_events import GaussianEvent, SelfComposedEvent, sampled_gaussian_event
from simulator.rounds import FederatedClient, run_rounds

MODEL = LogisticRegression(4)


def _client_data(rng, n, shift):
    X = rng.normal(loc=shift, size=(n, 4))
    y = (X @ np.array([1.0, -1.0, 0.5, 0.0]) + 0.3 * rng.normal(size=n) > 0).astype(int)
    return X.astype(np.float32), y


def _ctx(n, rng=None, expected=1.0, round=0):
    return RoundContext(round, n, rng or np.random.default_rng(0), expected)


def test_weighted_mean_weights_by_examples() -> None:
    ups = [
        ClientUpdate("a", 0, np.array([1.0, 0.0], np.float32), 1),
        ClientUpdate("b", 0, np.array([0.0, 4.0], np.float32), 3),
    ]
    res = WeightedMean().aggregate(ups, _ctx(2))
    np.testing.assert_allclose(res.delta, [1 / 4, 12 / 4])
    assert res.total_weight == 4 and res.num_clients == 2
    np.testing.assert_allclose(WeightedMean("uniform").aggregate(ups, _ctx(2)).delta, [0.5, 2.0])


def test_one_full_batch_step_is_one_gradient_step() -> None:
    rng = np.random.default_rng(3)
    X, y = _client_data(rng, 50, 0.0)
    x0 = rng.normal(size=5).astype(np.float32)
    cfg = RoundConfig(0, x0, training=LocalTraining(epochs=1, batch_size=50, learning_rate=0.3))
    up = train_client(MODEL, cfg, X, y, rng, "c")
    _, g = MODEL.loss_and_grad(x0, X, y)
    np.testing.assert_allclose(up.delta, -0.3 * g, rtol=1e-5, atol=1e-7)
    assert up.num_examples == 50 and up.delta.dtype == np.float32


def test_fedprox_term_pulls_towards_global_params() -> None:
    """With K full-batch steps, FedProx's step adds μ(y − x): with large μ the local
    model stays near x, so ‖Δ‖ shrinks; each step is a contraction towards x."""
    rng = np.random.default_rng(4)
    X, y = _client_data(rng, 60, 1.0)
    tr = LocalTraining(epochs=30, batch_size=60, learning_rate=0.2)
    x0 = np.zeros(5, np.float32)
    plain = train_client(MODEL, RoundConfig(0, x0, "fedavg", tr), X, y, rng, "c").delta
    prox = train_client(MODEL, RoundConfig(0, x0, "fedprox", tr, prox_mu=3.0), X, y, rng, "c").delta
    assert np.linalg.norm(prox) < 0.5 * np.linalg.norm(plain)
    # a stationary point of L + (μ/2)‖y − x‖² after many steps: ∇L(y) = −μ(y − x)
    long = LocalTraining(epochs=2000, batch_size=60, learning_rate=0.2)
    d = train_client(MODEL, RoundConfig(0, x0, "fedprox", long, prox_mu=3.0), X, y, rng, "c").delta
    _, g = MODEL.loss_and_grad(x0 + d, X, y)
    np.testing.assert_allclose(g, -3.0 * d, atol=1e-4)


def test_scaffold_client_control_is_mean_gradient_along_the_path() -> None:
    """With c = c_i = 0, c_i⁺ = (x − y)/(Kη) is the mean of the K gradients taken."""
    rng = np.random.default_rng(5)
    X, y = _client_data(rng, 30, 0.5)
    tr = LocalTraining(epochs=4, batch_size=30, learning_rate=0.1)
    x0 = np.zeros(5, np.float32)
    state = ClientState()
    up = train_client(MODEL, RoundConfig(0, x0, "scaffold", tr, control=np.zeros(5, np.float32)), X, y, rng, "c", state)
    assert up.delta.shape == (10,)
    w, grads = x0.astype(np.float64), []
    for _ in range(4):
        _, g = MODEL.loss_and_grad(w, X, y)
        grads.append(g)
        w = w - 0.1 * g
    np.testing.assert_allclose(up.delta[:5], w - x0, atol=1e-5)
    np.testing.assert_allclose(state.control, np.mean(grads, axis=0), atol=1e-5)
    np.testing.assert_allclose(up.delta[5:], state.control, atol=1e-7)


def test_scaffold_removes_client_drift_fedavg_does_not() -> None:
    """Heterogeneous clients (shifted features, different sizes), an L2-regularized
    (strongly convex) loss, full participation, many full-batch local steps: FedAvg
    converges to a point that is not a stationary point of the global loss (the mean of
    the client losses: client drift); SCAFFOLD's corrected steps converge to it
    (Karimireddy et al. 2020, Thm. III). Deterministic: full batches, no sampling."""
    model = LogisticRegression(4, l2=0.1)
    rng = np.random.default_rng(6)
    shifts = [-2.0, -1.0, 1.0, 2.5]
    clients = [
        FederatedClient(f"c{i}", *_client_data(rng, n, s)) for i, (n, s) in enumerate(zip([20, 80, 40, 60], shifts))
    ]
    tr = LocalTraining(epochs=20, batch_size=100, learning_rate=0.2)
    everyone = FixedCountSampling(4)
    x_avg, _ = run_rounds(model, FedAvg(tr), WeightedMean("uniform"), clients, everyone, 60, np.random.default_rng(0))
    x_sca, _ = run_rounds(model, Scaffold(tr), WeightedMean("uniform"), clients, everyone, 60, np.random.default_rng(0))

    def mix_grad(x):
        return np.linalg.norm(
            np.mean([model.loss_and_grad(x.astype(np.float64), c.X, c.y)[1] for c in clients], axis=0)
        )

    assert mix_grad(x_sca) < 1e-4
    assert mix_grad(x_avg) > 100 * mix_grad(x_sca)


def test_fedprox_and_fedavg_learn_with_poisson_sampling() -> None:
    rng = np.random.default_rng(7)
    clients = [FederatedClient(f"c{i}", *_client_data(rng, 50, s)) for i, s in enumerate(np.linspace(-1, 1, 10))]
    Xt, yt = _client_data(rng, 500, 0.0)
    tr = LocalTraining(epochs=2, batch_size=10, learning_rate=0.1)
    for strat in (FedAvg(tr), FedProx(tr, mu=0.1)):
        _, hist = run_rounds(
            MODEL, strat, WeightedMean(), clients, PoissonSampling(0.5), 15, np.random.default_rng(1), test=(Xt, yt)
        )
        assert hist[-1].test_accuracy > 0.85
        assert all(h.round == i for i, h in enumerate(hist))


def test_poisson_sample_size_has_binomial_mean() -> None:
    """Sample sizes are Binomial(N=20, q=0.3): mean 6, sd of the mean over 4000 rounds
    sqrt(20·0.3·0.7/4000) ≈ 0.0102; tolerance 5 sd."""
    rng = np.random.default_rng(8)
    s = PoissonSampling(0.3)
    sizes = [len(s.sample(list(range(20)), rng)) for _ in range(4000)]
    assert abs(np.mean(sizes) - 6.0) < 5 * math.sqrt(20 * 0.21 / 4000)
    assert np.var(sizes) == pytest.approx(20 * 0.21, rel=0.1)
    f = FixedCountSampling(7)
    picks = [f.sample(list(range(20)), rng) for _ in range(200)]
    assert all(len(p) == 7 == len(set(p)) for p in picks)
    assert f.expected_clients(20) == 7 and s.expected_clients(20) == 6.0


def test_accountant_is_told_the_sampling_scheme() -> None:
    """Poisson: the PLD figure of the accounting module for the same event. Fixed
    count: RDP without replacement, a different (replace-one) figure that is finite
    and falls as the noise grows."""
    acc = ClientLevelAccountant(PoissonSampling(0.1), 100, 1e-5)
    for _ in range(20):
        acc.record(1.5)
    assert acc.rounds == 20
    assert acc.epsilon() == pytest.approx(epsilon_pld(sampled_gaussian_event(1.5, 0.1, 20), 1e-5, discretization=1e-3))
    fixed = []
    for z in (1.0, 2.0):
        a = ClientLevelAccountant(FixedCountSampling(10), 100, 1e-5)
        for _ in range(20):
            a.record(z)
        fixed.append(a.epsilon())
    assert math.isfinite(fixed[0]) and fixed[1] < fixed[0]
    # everyone sampled: the amplified figure is the RDP figure of unsampled Gaussian rounds
    # under replace-one (sensitivity 2C), as the accounting module computes it; it is looser
    # than the exact unamplified figure, which is what epsilon() then reports (both are valid)
    everyone = ClientLevelAccountant(FixedCountSampling(10), 10, 1e-5)
    for _ in range(20):
        everyone.record(2.0)
    unsampled = SelfComposedEvent(GaussianEvent(2.0), 20)
    exact = exact_gaussian_epsilon(unsampled, 1e-5, "replace")
    assert everyone.epsilon_amplified() == pytest.approx(account(unsampled, 1e-5, "replace").epsilon_rdp, rel=1e-9)
    assert everyone.epsilon_amplified() > exact
    assert everyone.epsilon() == everyone.epsilon_known_sample() == pytest.approx(exact, rel=1e-12)
    # Poisson: the known-sample figure drops amplification (every round, add/remove)
    assert acc.epsilon_known_sample() == pytest.approx(
        exact_gaussian_epsilon(SelfComposedEvent(GaussianEvent(1.5), 20), 1e-5)
    )
    assert acc.epsilon_known_sample() > acc.epsilon()
    nonoise = ClientLevelAccountant(PoissonSampling(0.1), 100, 1e-5)
    nonoise.record(0.0)
    assert nonoise.epsilon() == math.inf


def test_round_config_validation() -> None:
    with pytest.raises(ModelError, match="prox_mu"):
        RoundConfig(0, np.zeros(3), "fedprox")
    with pytest.raises(ModelError, match="control"):
        RoundConfig(0, np.zeros(3), "scaffold")
    with pytest.raises(ModelError):
        LocalTraining(batch_size=0)
