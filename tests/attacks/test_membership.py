"""Membership inference (estimator.attacks.membership): the shadow-model attack and LiRA against a
model trained without DP (overfit) and with DP-SGD, the ε lower bound beside the printed ε, and the
generic hook on learners that are not DP-SGD.

Thresholds. Under the null hypothesis (the scores of members and non-members exchangeable) the ROC
AUC is a Mann-Whitney statistic with mean 1/2 and variance (n_in + n_out + 1)/(12·n_in·n_out); an
AUC above 1/2 + 4.9 standard deviations has a false-alarm rate below 1e-6 (one-sided normal tail).
The ε lower bounds of these tests are computed at confidence 1 − 2.5e-7 (Clopper-Pearson), so a DP
model's bound for one attack exceeds its true ε with probability below 2.5e-7 (for the threshold
chosen on the other half), below 1e-6 for the four attacks together (union bound), and a non-DP
model's positive bound is a leak proven at that level."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from estimator.attacks.data import GaussianTask
from estimator.attacks.membership import (
    SCORES,
    attack_training,
    clopper_pearson,
    dpsgd_trainer,
    epsilon_from_rates,
    roc_auc,
    tpr_at_fpr,
)
from estimator.errors import DatasetError
from ldp_core.fl.dpsgd import DPSGDConfig
from ldp_core.fl.dpsgd_accounting import StepAccountant
from ldp_core.fl.models import SoftmaxRegression

CONF = 1 - 2.5e-7
STEPS = 100


def _pool(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    task = GaussianTask.make(50, 10, 2.0, rng)
    return task.sample(400, rng, label_noise=0.2)


def _null_auc_bar(result: dict) -> float:
    n_in = result["target_members"]
    n_out = result["pool"] - n_in
    return 0.5 + 4.9 * math.sqrt((n_in + n_out + 1) / (12 * n_in * n_out))


def test_the_overfit_model_without_dp_is_attacked_well_above_chance() -> None:
    X, y = _pool()
    model = SoftmaxRegression(50, 10)
    train = dpsgd_trainer(model, DPSGDConfig(0.0, 1e9, 0.1, 0.5), STEPS)  # plain SGD: no clipping, no noise
    r = attack_training(train, X, y, np.random.default_rng(1), shadows=8, confidence=CONF)
    bar = _null_auc_bar(r)
    for name in ("shadow", "lira_online", "lira_offline"):
        assert r["attacks"][name]["auc"] > bar, (name, r["attacks"][name]["auc"], bar)
    assert r["printed_epsilon"] is None
    assert r["epsilon_lower_bound"] > 0  # a leak proven at confidence 1 − 2.5e-7 per attack
    assert r["mean_confidence_logit_members"] > r["mean_confidence_logit_non_members"]


def test_the_dp_models_lower_bound_stays_at_or_below_its_printed_epsilon() -> None:
    X, y = _pool()
    model = SoftmaxRegression(50, 10)
    cfg = DPSGDConfig(2.0, 1.0, 0.1, 0.5)
    eps = StepAccountant(cfg).epsilon_pld(STEPS, 1e-5)
    r = attack_training(
        dpsgd_trainer(model, cfg, STEPS),
        X,
        y,
        np.random.default_rng(1),
        shadows=8,
        confidence=CONF,
        printed_epsilon=eps,
    )
    assert r["printed_epsilon"] == eps
    for name in SCORES:
        assert r["attacks"][name]["epsilon_lower_bound"] <= eps, (name, r["attacks"][name])
    # and the attack gains less than on the same training without DP (the previous test's bar holds there)
    plain = attack_training(
        dpsgd_trainer(model, DPSGDConfig(0.0, 1e9, 0.1, 0.5), STEPS), X, y, np.random.default_rng(1), shadows=8
    )
    assert r["attacks"]["lira_online"]["auc"] < plain["attacks"]["lira_online"]["auc"]


def test_the_hook_takes_any_learner_a_memoriser_is_caught_and_a_constant_model_is_not() -> None:
    X, y = _pool(3)
    k = 10

    def memoriser(Xt: np.ndarray, yt: np.ndarray, rng: np.random.Generator):
        seen = {row.tobytes(): int(c) for row, c in zip(Xt, yt)}

        def proba(Xq: np.ndarray) -> np.ndarray:
            out = np.full((len(Xq), k), 1.0 / k)
            for i, row in enumerate(Xq):
                if row.tobytes() in seen:
                    out[i] = 0.01 / (k - 1)
                    out[i, seen[row.tobytes()]] = 0.99
            return out

        return proba

    def constant(Xt: np.ndarray, yt: np.ndarray, rng: np.random.Generator):
        return lambda Xq: np.full((len(Xq), k), 1.0 / k)

    caught = attack_training(memoriser, X, y, np.random.default_rng(2), shadows=4, confidence=CONF)
    assert caught["attacks"]["loss"]["auc"] == 1.0
    assert caught["attacks"]["lira_online"]["auc"] == 1.0
    # every member found, no non-member: TPR_low = (α/2)^(1/n_in) and FPR_high = 1 − (α/2)^(1/n_out)
    # (Clopper-Pearson with n or 0 successes) on the evaluation half, and the bound is the larger of
    # ln((TPR_low − δ)/FPR_high) and ln((1 − FPR_high − δ)/(1 − TPR_low))
    lb = caught["attacks"]["loss"]
    a = (1 - CONF) / 2
    tpr_lo, fpr_hi = a ** (1 / lb["members"]), 1 - a ** (1 / lb["non_members"])
    want = max(math.log((tpr_lo - 1e-5) / fpr_hi), math.log((1 - fpr_hi - 1e-5) / (1 - tpr_lo)))
    assert lb["epsilon_lower_bound"] == pytest.approx(want, rel=1e-9)
    blind = attack_training(constant, X, y, np.random.default_rng(2), shadows=4, confidence=CONF)
    assert blind["attacks"]["loss"]["auc"] == 0.5
    assert blind["epsilon_lower_bound"] == 0.0


def test_clopper_pearson_matches_scipys_exact_interval() -> None:
    for k, n in [(0, 50), (3, 50), (25, 50), (50, 50), (117, 200)]:
        lo, hi = clopper_pearson(k, n, 0.025)  # one-sided at 2.5% each = the two-sided 95% exact interval
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert lo == pytest.approx(ci.low, abs=1e-12)
        assert hi == pytest.approx(ci.high, abs=1e-12)


def test_epsilon_from_rates_and_the_roc_helpers() -> None:
    assert epsilon_from_rates(0.5, 0.05, 0.0) == pytest.approx(math.log(10))
    assert epsilon_from_rates(0.9, 0.6, 0.0) == pytest.approx(math.log(0.4 / 0.1))  # the complementary test
    assert epsilon_from_rates(0.3, 0.3, 0.0) == 0.0
    rng = np.random.default_rng(4)
    s, m = rng.normal(size=300), rng.random(300) < 0.4
    s[m] += 1.0
    pairs = np.mean([[1.0 if a > b else 0.5 if a == b else 0.0 for b in s[~m]] for a in s[m]])
    assert roc_auc(s, m) == pytest.approx(pairs, abs=1e-12)
    t = tpr_at_fpr(s, m, 0.1)
    thr = np.sort(s[~m])[::-1][int(0.1 * (~m).sum())]
    assert np.mean(s[~m] > thr) <= 0.1 and t == np.mean(s[m] > thr)


def test_bad_arguments_are_refused() -> None:
    X, y = _pool()
    train = dpsgd_trainer(SoftmaxRegression(50, 10), DPSGDConfig(0.0, 1e9, 0.1, 0.5), 5)
    with pytest.raises(DatasetError, match="shadows"):
        attack_training(train, X, y, np.random.default_rng(0), shadows=1)
    with pytest.raises(DatasetError, match="pool"):
        attack_training(train, X[:5], y[:5], np.random.default_rng(0))

    def one_column(Xt: np.ndarray, yt: np.ndarray, rng: np.random.Generator):
        return lambda Xq: np.ones((len(Xq), 1))

    with pytest.raises(DatasetError, match="one row of class probabilities"):
        attack_training(one_column, X, y, np.random.default_rng(0), shadows=2)
