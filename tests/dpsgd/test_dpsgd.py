"""DP-SGD: the accountant against both opinions and a published figure, the noise's
variance by a chi-square test, the clipping bound attacked by an adversarial example,
and an empirical privacy audit of one step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event

from estimator.accounting.accountant import RdpAccountant, account
from ldp_core.fl import MLP, LogisticRegression, ModelError, SoftmaxRegression
from ldp_core.fl.dpsgd import DPSGDConfig, dpsgd_gradient, poisson_sample, privatize_sum, train_dpsgd
from ldp_core.fl.dpsgd_accounting import StepAccountant
from ldp_core.fl.per_example import clipped_grad_sum, per_example_grads
from tests.support.audit import threshold_epsilon_lower_bound


# -- accounting ------------------------------------------------------------------------------
@pytest.mark.parametrize(("z", "q"), [(1.0, 0.01), (0.8, 0.05), (2.0, 0.2)])
def test_pld_and_rdp_agree_within_rdps_known_slack_and_grow_with_steps(z: float, q: float) -> None:
    """Both accountants give valid upper bounds; PLD is tight (to its 1e-4 discretization),
    RDP loses in the RDP→(ε, δ) conversion an additive term of order log(1/δ)/(α − 1) at the
    optimal order (0.2-1 here) and a few per cent from the order grid (the reference figures
    in estimator/accounting/accountant.py: 0.718 vs 1.214 at z = 1, q = 0.01, 100 steps).
    So PLD ≤ RDP ≤ 1.15·PLD + 1, and ε grows strictly with the steps."""
    acc = StepAccountant(DPSGDConfig(z, 1.0, q))
    prev = 0.0
    for steps in (10, 50, 100, 400):
        pld = acc.epsilon_pld(steps, 1e-5)
        rdp, _ = acc.epsilon_rdp(steps, 1e-5)
        assert pld <= rdp + 1e-9 <= 1.15 * pld + 1.0
        assert pld > prev
        prev = pld


def test_step_accountant_equals_the_projects_accountant() -> None:
    cfg = DPSGDConfig(1.0, 1.0, 0.01)
    acc = StepAccountant(cfg)
    report = account(cfg.event(100), 1e-5)  # type: ignore[arg-type]
    assert acc.epsilon_pld(100, 1e-5) == pytest.approx(report.epsilon_pld, abs=2e-4)
    assert acc.epsilon_rdp(100, 1e-5)[0] == pytest.approx(report.epsilon_rdp, rel=1e-9)
    assert report.epsilon_pld == pytest.approx(0.718, abs=1e-3)  # the accountant module's reference figure


def test_the_published_mnist_figure() -> None:
    """TF Privacy's MNIST tutorial (tensorflow/privacy, tutorials/README.md, the example
    `compute_dp_sgd_privacy.py --N=60000 --batch_size=256 --noise_multiplier=1.1 --epochs=60
    --delta=1e-5`): "satisfies differential privacy with eps = 3.01 and delta = 1e-05", over
    ceil(60·60000/256) = 14063 steps at q = 256/60000. That figure uses the classic RDP
    conversion ε = min_α RDP(α) + log(1/δ)/(α − 1) (Mironov 2017, Prop. 3) on TF Privacy's
    grid of orders (1.1..10.9 by 0.1, then 12..63). The same RDP curve, from dp_accounting,
    gives 3.01 by that conversion; dp_accounting's tighter conversion gives less, and the PLD
    accountant less again (each a valid bound)."""
    q, steps = 256 / 60000, math.ceil(60 * 60000 / 256)
    assert steps == 14063
    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    rdp = RdpAccountant(orders=orders)
    rdp.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(1.1)), steps))
    classic = float(np.min(rdp._rdp + math.log(1e5) / (np.array(orders) - 1.0)))
    assert round(classic, 2) == 3.01
    acc = StepAccountant(DPSGDConfig(1.1, 1.0, q))
    tight_rdp, order = acc.epsilon_rdp(steps, 1e-5)
    pld = acc.epsilon_pld(steps, 1e-5)
    assert pld < tight_rdp < classic
    assert 2.2 < pld  # not a figure off by orders of magnitude: within 25 % of the published one
    assert 5 < order < 12


# -- the mechanism ---------------------------------------------------------------------------
def test_noise_has_variance_sigma2_c2_over_qn_squared() -> None:
    """With a zero clipped sum each coordinate of the update is N(0, σ²C²/(qN)²): over
    M = 50 coordinates × 400 seeds, S = Σ u²/(σC/(qN))² ~ χ²(M), mean M, sd √(2M) = 200.
    Accept |S − M| < 5√(2M) = 1000 (false alarm < 1e-6). Dividing by |B| instead of qN, by
    √(qN), or using σ² for σ moves S by ≥ 20 %, i.e. ≥ 4000."""
    z, C, q, N = 1.3, 0.7, 0.05, 400
    target = (z * C / (q * N)) ** 2
    u = np.stack([privatize_sum(np.zeros(50), C, z, q * N, np.random.default_rng(s)) for s in range(400)])
    M = u.size
    S = float(np.sum(u**2) / target)
    assert abs(S - M) < 5 * math.sqrt(2 * M)
    assert abs(float(u.mean())) < 5 * math.sqrt(target / M)  # centred: the mean has sd √(target/M)


def test_the_step_adds_exactly_that_noise_to_the_clipped_mean() -> None:
    """Through dpsgd_gradient: with the same batch generator, the noisy and the noiseless
    gradient differ by the noise alone, chi-square tested as above (M = 36 × 300)."""
    model = SoftmaxRegression(5, 6)
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(200, 5)), rng.integers(0, 6, 200)
    theta = rng.normal(size=model.num_params)
    z, C, q = 0.9, 0.5, 0.1
    target = (z * C / (q * 200)) ** 2
    diffs = []
    for s in range(300):
        g1, b1 = dpsgd_gradient(
            model, theta, X, y, DPSGDConfig(z, C, q), np.random.default_rng(s), np.random.default_rng(10**6 + s)
        )
        g0, b0 = dpsgd_gradient(
            model, theta, X, y, DPSGDConfig(0.0, C, q), np.random.default_rng(s), np.random.default_rng(0)
        )
        assert b0 == b1
        diffs.append(g1 - g0)
    d = np.stack(diffs)
    M = d.size
    assert abs(float(np.sum(d**2) / target) - M) < 5 * math.sqrt(2 * M)


def test_poisson_batches_have_binomial_sizes() -> None:
    """|B| ~ Binomial(N, q): over 2000 draws the mean is within 5 standard errors
    (sd √(Nq(1−q)/2000)) of Nq, and the variance within 5 of its standard error
    (≈ var·√(2/1999) for near-normal counts)."""
    N, q = 1000, 0.03
    rng = np.random.default_rng(1)
    sizes = np.array([poisson_sample(N, q, rng).size for _ in range(2000)])
    var = N * q * (1 - q)
    assert abs(sizes.mean() - N * q) < 5 * math.sqrt(var / 2000)
    assert abs(sizes.var(ddof=1) - var) < 5 * var * math.sqrt(2 / 1999)


@pytest.mark.parametrize(
    "model", [LogisticRegression(4), SoftmaxRegression(4, 3), MLP(4, 6, 3, activation="relu")], ids=["lr", "sm", "mlp"]
)
def test_an_adversarial_example_moves_the_clipped_sum_by_at_most_c(model) -> None:
    """The adversary adds one example with a gradient 1e2-1e4 times the others' (features
    scaled up, label chosen to be wrong): the clipped sum moves by at most C, while the
    unclipped sum (what the attack aims at) moves by orders of magnitude more."""
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(40, 4)), rng.integers(0, 2, 40)
    theta = rng.normal(scale=0.3, size=model.num_params)
    C = 0.25
    base, _ = clipped_grad_sum(model, theta, X, y, C)
    k = 2 if isinstance(model, LogisticRegression) else model.n_classes
    for _ in range(20):
        xa = rng.normal(size=(1, 4)) * 10.0 ** rng.uniform(2, 4)
        ya = (model.predict(theta, xa) + 1) % k  # confidently wrong: the largest gradient
        Xa, ya_all = np.vstack([X, xa]), np.concatenate([y, ya])
        moved, _ = clipped_grad_sum(model, theta, Xa, ya_all, C)
        assert np.linalg.norm(moved - base) <= C * (1 + 1e-9)
        raw = per_example_grads(model, theta, Xa, ya_all).sum(0) - per_example_grads(model, theta, X, y).sum(0)
        assert np.linalg.norm(raw) > 10 * C  # the attack would work without clipping


def test_config_is_validated() -> None:
    with pytest.raises(ModelError, match="sample_rate"):
        DPSGDConfig(1.0, 1.0, 0.0)
    with pytest.raises(ModelError, match="sample_rate"):
        DPSGDConfig(1.0, 1.0, 1.5)
    with pytest.raises(ModelError, match="clip_norm"):
        DPSGDConfig(1.0, 0.0, 0.5)
    with pytest.raises(ModelError, match="noise_multiplier"):
        DPSGDConfig(-1.0, 1.0, 0.5)
    assert DPSGDConfig(0.0, 1.0, 0.5).event(10) is None
    assert DPSGDConfig(1.0, 1.0, 0.3).steps_per_epoch() == 3


def test_dpsgd_learns_a_separable_problem() -> None:
    rng = np.random.default_rng(3)
    model = SoftmaxRegression(6, 3)
    means = rng.normal(scale=2.0, size=(3, 6))
    y = rng.integers(0, 3, 1000)
    X = means[y] + rng.normal(size=(1000, 6))
    w = train_dpsgd(model, model.init_params(rng), X, y, DPSGDConfig(1.0, 1.0, 0.1, 0.5), 100, rng, rng)
    assert float(np.mean(model.predict(w, X) == y)) > 0.9  # chance is 1/3


# -- empirical privacy audit -----------------------------------------------------------------
def _audit(z_run: float, q: float, trials: int, seed: int) -> float:
    """A lower bound on ε at δ = 1e-5 (95 % confidence) from distinguishing one DP-SGD step on
    D from the step on D' = D + a canary (Jagielski, Ullman, Oprea, NeurIPS 2020; Nasr et al.,
    IEEE S&P 2021): the attacker projects the released gradient on the canary's clipped
    gradient direction u and says "canary" above a threshold τ. τ is chosen on a first half of
    the trials, then on the second half ε ≥ log((1 − δ − FNR_hi)/FPR_hi) with Clopper-Pearson
    upper bounds on both error rates. The divisor qN is the same in both worlds (N public)."""
    rng = np.random.default_rng(seed)
    model = LogisticRegression(3)
    X, y = rng.normal(scale=0.1, size=(10, 3)), rng.integers(0, 2, 10)
    canary_x, canary_y = np.array([[30.0, -20.0, 10.0]]), np.array([0])
    Xc, yc = np.vstack([X, canary_x]), np.concatenate([y, canary_y])
    theta = np.zeros(model.num_params)
    C = 1.0
    u, _ = clipped_grad_sum(model, theta, canary_x, canary_y, C)
    u = u / np.linalg.norm(u)
    cfg = DPSGDConfig(z_run, C, q)
    denom = q * len(X)

    def release(data_x: np.ndarray, data_y: np.ndarray, s: int) -> float:
        g, _ = dpsgd_gradient(
            model,
            theta,
            data_x,
            data_y,
            cfg,
            np.random.default_rng([seed, s, 0]),
            np.random.default_rng([seed, s, 1]),
            denom,
        )
        return float(g @ u)

    out = np.array([release(X, y, s) for s in range(trials)])
    inn = np.array([release(Xc, yc, trials + s) for s in range(trials)])
    return threshold_epsilon_lower_bound(out, inn)


@pytest.mark.parametrize(("z", "q"), [(1.0, 1.0), (0.7, 0.5)])
def test_audit_of_one_step_stays_within_the_accountants_epsilon(z: float, q: float) -> None:
    claimed = account(DPSGDConfig(z, 1.0, q).event(1), 1e-5).epsilon  # type: ignore[arg-type]
    lower = _audit(z, q, trials=6000, seed=11)
    assert lower <= claimed
    assert lower > 0.3 * claimed or lower > 0.5  # the attack is real: it gets a sizeable share of ε


def test_the_audit_catches_a_step_with_a_quarter_of_the_claimed_noise() -> None:
    """If the step added σ/4 of noise while the accountant charged σ, the audit's lower
    bound would exceed the claimed ε: the audit has the power to catch a wrong noise scale."""
    claimed = account(DPSGDConfig(2.0, 1.0, 1.0).event(1), 1e-5).epsilon  # type: ignore[arg-type]
    assert _audit(0.5, 1.0, trials=6000, seed=12) > claimed
