"""Non-IID drift: FedAvg's biased fixed point and SCAFFOLD's exact one on quadratics
(closed forms), FedProx with large μ, the scenario's determinism and ``ldp fl drift``."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from estimator.fl.aggregators import WeightedMean
from estimator.fl.sampling import FixedCountSampling
from estimator.fl.strategies import FedAvg, Scaffold
from ldp_cli.main import main
from ldp_core.fl import FLError, LocalTraining, RoundConfig, train_client
from simulator.rounds import FederatedClient, run_rounds
from simulator.scenarios.fl.drift import DriftConfig, ScheduledSampling, run_drift

DIM = 3


@dataclasses.dataclass(frozen=True)
class Quadratic:
    """f_i(w) = ½ (w − a_i)ᵀ A_i (w − a_i); client i's single data row holds (vec A_i, a_i),
    so every local step uses the exact gradient A_i (w − a_i)."""

    dim: int = DIM

    @property
    def num_params(self) -> int:
        return self.dim

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(self.dim, np.float32)

    def predict(self, params, X):  # pragma: no cover - no test set here
        raise NotImplementedError

    def _problem(self, X):
        row = np.asarray(X, np.float64)[0]
        return row[: self.dim**2].reshape(self.dim, self.dim), row[self.dim**2 :]

    def loss(self, params, X, y) -> float:
        return self.loss_and_grad(params, X, y)[0]

    def loss_and_grad(self, params, X, y):
        A, a = self._problem(X)
        r = np.asarray(params, np.float64) - a
        return 0.5 * float(r @ A @ r), (A @ r).astype(np.asarray(params).dtype)


def _problems(n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """n random SPD matrices with eigenvalues in [0.5, 2] and optima a_i ~ N(0, 2²·I)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        Q, _ = np.linalg.qr(rng.normal(size=(DIM, DIM)))
        A = Q @ np.diag(rng.uniform(0.5, 2.0, DIM)) @ Q.T
        out.append((A, rng.normal(scale=2.0, size=DIM)))
    return out


def _clients(problems) -> list[FederatedClient]:
    return [
        FederatedClient(f"q{i}", np.concatenate([A.ravel(), a])[None, :], np.zeros(1, np.int64))
        for i, (A, a) in enumerate(problems)
    ]


ETA, K = 0.1, 10
TRAIN = LocalTraining(epochs=K, batch_size=1, learning_rate=ETA)  # one row: K exact gradient steps


def _M(A: np.ndarray) -> np.ndarray:
    """K local steps w ← w − η A (w − a) map w − a to (I − ηA)^K (w − a)."""
    return np.linalg.matrix_power(np.eye(DIM) - ETA * A, K)


def test_fedavg_converges_to_its_biased_fixed_point_scaffold_to_the_optimum() -> None:
    """Equal weights, full participation, exact gradients, K = 10 steps of η = 0.1.

    FedAvg: y_i = a_i + M_i (x − a_i) with M_i = (I − ηA_i)^K, so x⁺ = mean_i y_i and the
    fixed point is x_FA = (Σ(I − M_i))⁻¹ Σ(I − M_i) a_i, reached at rate ‖mean M_i‖ ≤
    (1 − 0.5η)^K ≈ 0.60 per round. The global optimum of mean f_i is
    x* = (Σ A_i)⁻¹ Σ A_i a_i; the two differ when the A_i differ (client drift).
    SCAFFOLD (option II) has x* as its unique fixed point, with c_i = ∇f_i(x*) and c = 0
    (at a fixed point x − y_i = Kη c for every i; averaging gives c = 0, so y_i = x, which
    for the corrected affine local map means c_i = ∇f_i(x), and c = mean c_i = ∇f(x) = 0).

    Tolerance: the iterates are float32 (unit roundoff u = 2⁻²⁴ ≈ 6e-8); a contraction
    with factor ρ perturbed by O(K·u·‖x‖) per round settles within O(K u ‖x‖/(1 − ρ))
    ≈ 10·6e-8·5/0.4 ≈ 1e-5 of its fixed point, so 1e-4·max(1, ‖x*‖) is safe, and the
    drift ‖x_FA − x*‖ is checked to exceed it a hundredfold (else the test could not tell)."""
    probs = _problems(4, seed=11)
    x_star = np.linalg.solve(sum(A for A, _ in probs), sum(A @ a for A, a in probs))
    I_M = [np.eye(DIM) - _M(A) for A, _ in probs]
    x_fa = np.linalg.solve(sum(I_M), sum(m @ a for m, (_, a) in zip(I_M, probs)))
    tol = 1e-4 * max(1.0, float(np.linalg.norm(x_star)))
    assert np.linalg.norm(x_fa - x_star) > 100 * tol

    everyone = FixedCountSampling(4)
    x_avg, _ = run_rounds(
        Quadratic(), FedAvg(TRAIN), WeightedMean(), _clients(probs), everyone, 80, np.random.default_rng(0)
    )
    np.testing.assert_allclose(x_avg, x_fa, atol=tol)

    clients = _clients(probs)
    sca = Scaffold(TRAIN)
    x_sca, _ = run_rounds(Quadratic(), sca, WeightedMean(), clients, everyone, 300, np.random.default_rng(0))
    np.testing.assert_allclose(x_sca, x_star, atol=tol)
    for c, (A, a) in zip(clients, probs):
        np.testing.assert_allclose(c.state.control, A @ (x_star - a), atol=10 * tol)
    np.testing.assert_allclose(sca.control, 0.0, atol=10 * tol)


def test_scaffold_control_variates_after_two_rounds_match_the_closed_form() -> None:
    """Round 1 (c = c_i = 0): y_i = a_i + M_i(x₀ − a_i), c_i⁺ = (x₀ − y_i)/(Kη), x₁ = x₀ + mean(y_i − x₀),
    c₁ = mean c_i⁺ (participation 1). Round 2: each step is w ← w − η(A_i(w − a_i) + c₁ − c_i⁺),
    i.e. plain steps towards w_i* = a_i − A_i⁻¹(c₁ − c_i⁺): y_i = w_i* + M_i(x₁ − w_i*).
    float64 closed form against float32 training: rtol 1e-5 (a few hundred roundoffs)."""
    probs = _problems(3, seed=12)
    x0 = np.array([0.5, -1.0, 2.0])
    ys = [a + _M(A) @ (x0 - a) for A, a in probs]
    ci = [(x0 - y) / (K * ETA) for y in ys]
    x1 = x0 + np.mean([y - x0 for y in ys], axis=0)
    c1 = np.mean(ci, axis=0)
    ws = [a - np.linalg.solve(A, c1 - c) for (A, a), c in zip(probs, ci)]
    ys2 = [w + _M(A) @ (x1 - w) for (A, _), w in zip(probs, ws)]
    ci2 = [c - c1 + (x1 - y) / (K * ETA) for c, y in zip(ci, ys2)]
    x2 = x1 + np.mean([y - x1 for y in ys2], axis=0)
    c2 = c1 + np.mean([b - a for a, b in zip(ci, ci2)], axis=0)

    clients = _clients(probs)
    sca = Scaffold(TRAIN)
    x, _ = run_rounds(
        Quadratic(),
        sca,
        WeightedMean(),
        clients,
        FixedCountSampling(3),
        2,
        np.random.default_rng(0),
        params=x0.astype(np.float32),
    )
    np.testing.assert_allclose(x, x2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sca.control, c2, rtol=1e-5, atol=1e-6)
    for c, want in zip(clients, ci2):
        np.testing.assert_allclose(c.state.control, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mu", [1.0, 10.0, 100.0, 1000.0])
def test_fedprox_with_large_mu_stays_near_the_global_model(mu: float) -> None:
    """FedProx's step w ← w − η(A(w − a) + μ(w − x)) contracts towards
    w_p = (A + μI)⁻¹(A a + μ x), so y = w_p + (I − η(A + μI))^K (x − w_p). With
    η = 1/(λ_max + μ) every eigenvalue of I − η(A + μI) lies in [0, 1), hence in each
    eigendirection |y − x| ≤ λ/(λ + μ)·|a − x|: ‖y − x‖ ≤ λ_max/(λ_max + μ)·‖a − x‖ → 0 as μ grows."""
    ((A, a),) = _problems(1, seed=13)
    lam = np.linalg.eigvalsh(A)[-1]
    eta = 1.0 / (lam + mu)
    x = np.array([1.0, 0.0, -1.0])
    tr = LocalTraining(epochs=K, batch_size=1, learning_rate=float(eta))
    client = _clients([(A, a)])[0]
    up = train_client(
        Quadratic(),
        RoundConfig(0, x.astype(np.float32), "fedprox", tr, prox_mu=mu),
        client.X,
        client.y,
        np.random.default_rng(0),
        "q0",
    )
    B = A + mu * np.eye(DIM)
    wp = np.linalg.solve(B, A @ a + mu * x)
    y = wp + np.linalg.matrix_power(np.eye(DIM) - eta * B, K) @ (x - wp)
    np.testing.assert_allclose(up.delta, y - x, rtol=1e-4, atol=1e-6)
    assert np.linalg.norm(up.delta) <= lam / (lam + mu) * np.linalg.norm(a - x) * (1 + 1e-5)


SMALL = DriftConfig(
    clients=12,
    clients_per_round=4,
    features=6,
    classes=4,
    mean_examples=30,
    rounds=4,
    training=LocalTraining(epochs=2, batch_size=10, learning_rate=0.2),
)


def test_scenario_is_deterministic_and_every_strategy_sees_the_same_clients() -> None:
    a, b = run_drift(SMALL), run_drift(SMALL)
    assert [s["accuracy_per_round"] for s in a["strategies"]] == [s["accuracy_per_round"] for s in b["strategies"]]
    c = run_drift(dataclasses.replace(SMALL, seed=1))
    assert [s["accuracy_per_round"] for s in c["strategies"]] != [s["accuracy_per_round"] for s in a["strategies"]]
    assert [s["name"] for s in a["strategies"]] == ["fedavg", "fedprox_mu0.1", "scaffold", "fedavg_iid"]
    for s in a["strategies"]:
        assert len(s["accuracy_per_round"]) == 4
        assert s["best_accuracy"] == max(s["accuracy_per_round"]) and s["final_accuracy"] == s["accuracy_per_round"][-1]

    sched = ScheduledSampling.draw(12, 4, 3, np.random.default_rng(5))
    items = list(range(100, 112))
    got = [sched.sample(items, np.random.default_rng(9)) for _ in range(3)]
    assert got == [[100 + i for i in r] for r in sched.schedule] and all(len(set(r)) == 4 for r in got)
    with pytest.raises(FLError):
        sched.sample(items, np.random.default_rng(9))


def test_config_is_validated() -> None:
    with pytest.raises(FLError, match="clients_per_round"):
        DriftConfig(clients=5, clients_per_round=6)
    with pytest.raises(FLError, match="dirichlet_alpha"):
        DriftConfig(dirichlet_alpha=0.0)


def test_cli_json_and_plot(tmp_path, capsys) -> None:
    png = tmp_path / "drift.png"
    assert main(["fl", "drift", "--rounds", "2", "--seed", "3", "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {
        "scenario",
        "rounds",
        "seed",
        "partition",
        "training",
        "strategies",
        "final_accuracy",
        "best_accuracy",
        "expectation",
        "plot",
    } <= set(out)
    assert out["rounds"] == 2 and out["seed"] == 3 and out["scenario"] == "drift"
    assert set(out["final_accuracy"]) == {"fedavg", "fedprox_mu0.1", "scaffold", "fedavg_iid"}
    assert all(len(s["accuracy_per_round"]) == 2 for s in out["strategies"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit):
        main(["fl", "drift", "--rounds", "0"])
