"""Personalization: MOON's loss against its definition and finite differences, Ditto's limits
λ = 0 (local training) and λ → ∞ (the global model) and its stationary point, Per-FedAvg's
first-order meta-gradient against a closed form, the seeded scenario and ``ldp fl personalize``."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from estimator.fl.personalization import Ditto, Moon, PerFedAvg
from ldp_cli.main import main
from ldp_core.fl import MLP, ClientState, LocalTraining, ModelError, RoundConfig, SoftmaxRegression, train_client
from ldp_core.fl.personalization import DittoSpec, MoonSpec, PerFedAvgSpec
from ldp_core.fl.personalized_training import (
    ditto_personal_sgd,
    first_order_meta_gradient,
    moon_local,
    moon_loss_and_grad,
    perfedavg_local,
    representation,
)
from ldp_core.fl.training import local_sgd
from simulator.scenarios.fl.drift import DriftConfig
from simulator.scenarios.fl.personalize import PersonalizeConfig, run_personalize, summarize


def _tiny(activation: str = "tanh") -> tuple[MLP, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    m = MLP(3, 4, 3, activation=activation, l2=0.01)  # type: ignore[arg-type]
    p = rng.normal(scale=0.7, size=m.num_params)
    X = rng.normal(size=(6, 3))
    y = rng.integers(0, 3, size=6)
    return m, p, X, y


def _moon_reference(m: MLP, p: np.ndarray, X, y, zg, zp, mu: float, tau: float) -> float:
    """MOON's Eq. 3-4 written out per example: CE + μ·(−log(e^{a/τ}/(e^{a/τ} + e^{b/τ})))."""
    W1, b1, W2, b2 = p[:12].reshape(3, 4), p[12:16], p[16:28].reshape(4, 3), p[28:]
    total = 0.0
    for i in range(len(X)):
        pre = X[i] @ W1 + b1
        z = np.tanh(pre) if m.activation == "tanh" else np.maximum(pre, 0)
        logits = z @ W2 + b2
        ce = np.log(np.sum(np.exp(logits))) - logits[y[i]]
        a = z @ zg[i] / (np.linalg.norm(z) * np.linalg.norm(zg[i]))
        b = z @ zp[i] / (np.linalg.norm(z) * np.linalg.norm(zp[i]))
        con = -np.log(np.exp(a / tau) / (np.exp(a / tau) + np.exp(b / tau)))
        total += ce + mu * con
    return total / len(X) + 0.5 * m.l2 * (np.sum(W1 * W1) + np.sum(W2 * W2))


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_moon_loss_matches_its_definition_and_gradient_matches_finite_differences(activation: str) -> None:
    m, p, X, y = _tiny(activation)
    rng = np.random.default_rng(8)
    zg = representation(m, rng.normal(scale=0.7, size=m.num_params), X)
    zp = representation(m, rng.normal(scale=0.7, size=m.num_params), X)
    if activation == "relu":  # keep every representation away from 0, where cos is undefined
        zg, zp = zg + 0.1, zp + 0.1
    mu, tau = 2.0, 0.3
    loss, g = moon_loss_and_grad(m, p, X, y, zg, zp, mu, tau)
    assert loss == pytest.approx(_moon_reference(m, p, X, y, zg, zp, mu, tau), rel=1e-12)
    # central differences: error O(h²·f''') ≈ 1e-10 with h = 1e-5 (plus 1e-16/h rounding);
    # ReLU kinks are not crossed for this seed at this h
    h = 1e-5
    fd = np.empty_like(p)
    for j in range(p.size):
        e = np.zeros_like(p)
        e[j] = h
        fd[j] = (
            moon_loss_and_grad(m, p + e, X, y, zg, zp, mu, tau)[0]
            - moon_loss_and_grad(m, p - e, X, y, zg, zp, mu, tau)[0]
        ) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    # the contrastive part is not zero here (it would hide a missing term)
    assert np.linalg.norm(g - m.loss_and_grad(p, X, y)[1]) > 1e-3


def test_moon_with_mu_zero_or_previous_equal_to_global_is_plain_cross_entropy() -> None:
    m, p, X, y = _tiny()
    z = representation(m, p, X)
    ce, g_ce = m.loss_and_grad(p, X, y)
    loss0, g0 = moon_loss_and_grad(m, p, X, y, z * 2.0, z, 0.0, 0.5)
    assert loss0 == ce and np.array_equal(g0, g_ce)
    # z_prev = z_glob: ℓ_con = log 2 for every example and its gradient vanishes
    zq = representation(m, p + 0.3, X)
    loss, g = moon_loss_and_grad(m, p, X, y, zq, zq, 1.5, 0.5)
    assert loss == pytest.approx(ce + 1.5 * np.log(2.0), rel=1e-12)
    np.testing.assert_allclose(g, g_ce, atol=1e-14)


def test_moon_local_on_a_first_round_equals_sgd_on_cross_entropy() -> None:
    m = MLP(3, 4, 3)
    rng = np.random.default_rng(1)
    x = m.init_params(rng)
    X, y = rng.normal(size=(20, 3)).astype(np.float32), rng.integers(0, 3, size=20)
    tr = LocalTraining(epochs=2, batch_size=5, learning_rate=0.1)
    w = moon_local(m, x, x, X, y, tr, MoonSpec(1.0, 0.5), np.random.default_rng(3))
    ref, _ = local_sgd(m, x, X, y, tr, np.random.default_rng(3))
    np.testing.assert_allclose(w, ref, atol=1e-6)
    with pytest.raises(ModelError, match="MLP"):
        moon_loss_and_grad(SoftmaxRegression(3, 3), np.zeros(12), X, y, X, X, 1.0, 0.5)


def _problem() -> tuple[SoftmaxRegression, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    m = SoftmaxRegression(4, 3, l2=0.05)
    X = rng.normal(size=(30, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=30)
    w = rng.normal(size=m.num_params).astype(np.float32)
    v0 = rng.normal(size=m.num_params).astype(np.float32)
    return m, X, y, w, v0


def test_ditto_with_lambda_zero_is_local_training() -> None:
    m, X, y, w, v0 = _problem()
    tr = LocalTraining(epochs=3, batch_size=7, learning_rate=0.1)
    v = ditto_personal_sgd(m, v0, w, X, y, tr, 0.0, np.random.default_rng(5))
    ref, _ = local_sgd(m, v0, X, y, tr, np.random.default_rng(5))
    assert np.array_equal(v, ref)


def test_ditto_with_lambda_to_infinity_is_the_global_model() -> None:
    m, X, y, w, v0 = _problem()
    tr = LocalTraining(epochs=2, batch_size=7, learning_rate=0.1)
    gaps = [
        float(np.linalg.norm(ditto_personal_sgd(m, v0, w, X, y, tr, lam, np.random.default_rng(5)) - w))
        for lam in (1.0, 1e2, 1e4, 1e8)
    ]
    # each step leaves v − w shrunk by 1/(1 + ηλ) plus η‖g‖/(1 + ηλ): the gap falls like 1/λ
    assert gaps[0] > gaps[1] > gaps[2] > gaps[3]
    assert gaps[3] < 1e-5 * np.linalg.norm(v0 - w)


def test_ditto_converges_to_the_stationary_point_of_its_objective() -> None:
    """Full-batch proximal steps reach v* with ∇F(v*) + λ (v* − w) = 0 (Ditto's Eq. 2)."""
    m, X, y, w, v0 = _problem()
    lam = 0.5
    tr = LocalTraining(epochs=3000, batch_size=len(X), learning_rate=0.2)
    v = ditto_personal_sgd(m, v0, w, X, y, tr, lam, np.random.default_rng(0))
    _, g = m.loss_and_grad(v.astype(np.float64), X.astype(np.float64), y)
    assert np.linalg.norm(g + lam * (v - w)) < 1e-4
    assert np.linalg.norm(g) > 1e-2  # not the local optimum: the pull toward w is active


def test_ditto_uploads_fedavgs_update_and_keeps_its_personal_model() -> None:
    m, X, y, w, _ = _problem()
    tr = LocalTraining(epochs=2, batch_size=7, learning_rate=0.1)
    state = ClientState()
    ditto = Ditto(tr, spec=DittoSpec(0.3)).configure(4, w)
    up = train_client(m, ditto, X, y, np.random.default_rng(9), "c", state)
    ref = train_client(m, RoundConfig(4, w, "fedavg", tr), X, y, np.random.default_rng(9), "c", ClientState())
    assert np.array_equal(up.delta, ref.delta)
    assert state.personal is not None and not np.allclose(state.personal, w + up.delta)
    first = state.personal.copy()
    train_client(m, ditto, X, y, np.random.default_rng(10), "c", state)
    assert not np.array_equal(state.personal, first)  # continues from v_k, not from w


class MeanQuadratic:
    """f(θ; D) = ½ mean_i ‖θ − x_i‖², so ∇f(θ; D) = θ − mean(D) and the Hessian is I."""

    num_params = 2

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(2, np.float32)

    def predict(self, params, X):  # pragma: no cover - not scored
        raise NotImplementedError

    def loss(self, params, X, y) -> float:
        return self.loss_and_grad(params, X, y)[0]

    def loss_and_grad(self, params, X, y):
        d = np.asarray(params) - np.asarray(X)
        return float(0.5 * np.mean(np.sum(d * d, axis=1))), d.mean(axis=0).astype(np.asarray(params).dtype)


def test_perfedavg_first_order_meta_gradient_matches_the_closed_form() -> None:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(8, 2))
    w, alpha = np.array([0.5, -1.0]), 0.3
    D, Dp = X[:3], X[3:7]
    g = first_order_meta_gradient(MeanQuadratic(), w, (D, None), (Dp, None), alpha)  # type: ignore[arg-type]
    adapted = w - alpha * (w - D.mean(axis=0))
    np.testing.assert_allclose(g, adapted - Dp.mean(axis=0), rtol=1e-15)
    # MAML's exact gradient is (I − α∇²f(w; D)) ∇f(w′; D′) = (1 − α)·FO here: FO drops that factor
    assert not np.allclose(g, (1 - alpha) * g)


def test_perfedavg_local_steps_follow_the_hand_written_loop() -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(9, 2)).astype(np.float32)
    y = np.zeros(9, np.int64)
    x0 = np.array([1.0, 2.0], np.float32)
    tr = LocalTraining(epochs=2, batch_size=2, learning_rate=0.4)
    alpha = 0.25
    w, steps = perfedavg_local(MeanQuadratic(), x0, X, y, tr, alpha, np.random.default_rng(4))  # type: ignore[arg-type]
    ref, r = x0.astype(np.float64), np.random.default_rng(4)
    for _ in range(2):
        order = r.permutation(9)  # 5 batches of ≤ 2: pairs (0,1), (2,3); the fifth waits for the next epoch
        for t in range(2):
            m1, m2 = X[order[4 * t : 4 * t + 2]].mean(0), X[order[4 * t + 2 : 4 * t + 4]].mean(0)
            ref = ref - 0.4 * ((ref - alpha * (ref - m1)) - m2)
    assert steps == 4
    np.testing.assert_allclose(w, ref, rtol=1e-5)


def test_specs_and_round_configs_are_validated() -> None:
    w = np.zeros(3, np.float32)
    for bad in (lambda: DittoSpec(-1.0), lambda: MoonSpec(tau=0), lambda: PerFedAvgSpec(eval_steps=-1)):
        with pytest.raises(ModelError):
            bad()
    with pytest.raises(ModelError, match="fedavg"):
        RoundConfig(0, w, "scaffold", control=w, personalization=DittoSpec())
    for strat in (PerFedAvg(), Moon()):
        assert strat.configure(0, w).personalization is not None and strat.payload_size(3) == 3


def test_summary_of_per_client_accuracy() -> None:
    acc = np.arange(20) / 20  # the two lowest (⌈20/10⌉) are 0 and 0.05
    s = summarize(acc)
    assert s["worst_decile_mean"] == pytest.approx(0.025)
    assert s["median"] == pytest.approx(0.475)
    assert s["p10"] == pytest.approx(np.quantile(acc, 0.1))


def test_personalization_beats_fedavg_on_the_worst_decile_of_the_skewed_partition() -> None:
    base = PersonalizeConfig()
    cfg = PersonalizeConfig(
        drift=dataclasses.replace(
            base.drift, rounds=15, training=LocalTraining(epochs=2, batch_size=10, learning_rate=0.1)
        ),
        methods=("fedavg", "ditto", "perfedavg"),
    )
    res = {r["name"]: r for r in run_personalize(cfg)["strategies"]}
    fed = res["fedavg"]
    # each client holds 11–30 test examples; the worst decile (5 of 50 clients) pools ~100, so the
    # binomial s.e. of its accuracy is at most √(0.25/100) = 0.05; a 0.15 margin is 3 s.e.
    for name in ("ditto_lam0.1", "perfedavg"):
        assert res[name]["worst_decile_mean"] > fed["worst_decile_mean"] + 0.15, (name, res[name], fed)
        assert res[name]["median"] > fed["median"]


def test_cli_json_and_plot(tmp_path, capsys) -> None:
    png = tmp_path / "p.png"
    assert main(["fl", "personalize", "--rounds", "1", "--seed", "2", "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"] == "personalize" and out["rounds"] == 1 and out["seed"] == 2 and out["plot"] == str(png)
    names = [r["name"] for r in out["strategies"]]
    assert names == ["fedavg", "fedavg_finetune", "scaffold", "ditto_lam0.1", "perfedavg", "moon_mu1"]
    for r in out["strategies"]:
        assert len(r["per_client_accuracy"]) == out["clients"] == 50
        assert {"median", "p10", "worst_decile_mean", "pooled_accuracy"} <= set(r)
    assert set(out["worst_decile"]) == set(names)
    assert png.stat().st_size > 10_000
    with pytest.raises(SystemExit):
        main(["fl", "personalize", "--lam", "-1"])
    assert DriftConfig().rounds == 100  # the drift scenario's own defaults are untouched
