"""Membership inference: shadow models (Shokri et al. 2017), LiRA (Carlini et al. 2022), and the
empirical ε lower bound an attack proves.

The game. A pool of N labelled rows is known to the attacker. Each of M + 1 models is trained on a
random half of the pool (every row kept independently with probability 1/2); model 0 is the
*target*, models 1..M the attacker's *shadows*, trained by the same training function (the attacker
knows the algorithm and its hyper-parameters, not the target's coin flips). The attacker sees the
target's predicted probabilities on every pool row and scores each row: a higher score means
"member". Three scores:

* ``loss``: minus the target's cross-entropy on the row (Yeom et al. 2018), no shadow needed;
* ``shadow``: Shokri et al.'s attack model, a logistic regression trained on the shadows' outputs
  (their sorted log-probabilities and the true label's log-probability) labelled in/out, applied to
  the target's outputs (one attack model for all classes rather than one per class);
* ``lira_online`` / ``lira_offline``: per row, the confidence logit φ = log(p_y / (1 − p_y)) of each
  shadow is split by whether the shadow trained on the row; Gaussians are fitted to the "in" and
  "out" values, and the score is the log-likelihood ratio log N(φ₀; μ_in, σ_in) − log N(φ₀; μ_out,
  σ_out) (online), or (φ₀ − μ_out)/σ_out (offline: only "out" models needed). With few shadows the
  variance is the global one over all rows, as the paper advises.

The ε lower bound. A threshold t turns a score into a test "member iff score ≥ t" with true- and
false-positive rates TPR, FPR. An (ε, δ)-DP training algorithm forces TPR ≤ e^ε·FPR + δ and
(1 − FPR) ≤ e^ε·(1 − TPR) + δ, so any test proves ε ≥ ln((TPR − δ)/FPR) and ln((1 − FPR − δ)/(1 −
TPR)). With finite counts, TPR is replaced by its one-sided Clopper-Pearson lower bound and FPR by its
upper bound (each at level α/2, so that the bound holds with probability ≥ 1 − α for a fixed t). The
threshold is chosen on a random half of the rows and the bound is evaluated on the other half, so the
choice does not bias it. Caveat: one target model gives one draw of many rows' inclusion coins; this is
the usual "empirical ε" of membership attacks, not a full audit over many training runs of one
neighbouring pair (Jagielski et al. 2020; Steinke et al. 2023 give a one-run audit with its own bound).

The hook. :func:`attack_training` takes any ``train_fn(X, y, rng) -> predict_proba`` and runs the game
on it: a DP-SGD model (:func:`dpsgd_trainer`), or any other learner whose output can be queried for
class probabilities (a PATE student, a classifier trained on synthetic data: wrap the whole pipeline,
from the sensitive rows to the released model, in one ``train_fn``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from estimator.errors import DatasetError
from ldp_core.fl.dpsgd import DPSGDConfig, train_dpsgd
from ldp_core.fl.models import LogisticRegression, Model

__all__ = [
    "ProbaFn",
    "TrainFn",
    "confidence_logits",
    "clopper_pearson",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "roc_auc",
    "tpr_at_fpr",
    "dpsgd_trainer",
    "attack_training",
    "SCORES",
]

#: a trained model's class probabilities for the rows of X (n × K, rows summing to 1)
ProbaFn = Callable[[np.ndarray], np.ndarray]
#: trains on (X, y) with the randomness of rng and returns the model's ProbaFn
TrainFn = Callable[[np.ndarray, np.ndarray, np.random.Generator], ProbaFn]

SCORES: tuple[str, ...] = ("loss", "shadow", "lira_offline", "lira_online")

_TINY = 1e-300


def _true_and_rest(probs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, dtype=np.float64)
    idx = np.arange(len(y))
    py = p[idx, y]
    rest = p.sum(axis=1) - py  # the others' sum, not 1 − p_y: no cancellation when p_y is near 1
    return np.maximum(py, _TINY), np.maximum(rest, _TINY)


def confidence_logits(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """φ = log p_y − log Σ_{j≠y} p_j per row: LiRA's confidence logit, roughly Gaussian across models."""
    py, rest = _true_and_rest(probs, y)
    return np.log(py) - np.log(rest)


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """One-sided Clopper-Pearson bounds (lower, upper), each holding with probability ≥ 1 − α."""
    from scipy.stats import beta

    if trials <= 0:
        return 0.0, 1.0
    lo = 0.0 if successes == 0 else float(beta.ppf(alpha, successes, trials - successes + 1))
    hi = 1.0 if successes == trials else float(beta.ppf(1 - alpha, successes + 1, trials - successes))
    return lo, hi


def epsilon_from_rates(tpr: float, fpr: float, delta: float) -> float:
    """max(ln((TPR − δ)/FPR), ln((1 − FPR − δ)/(1 − TPR)), 0): the ε any (ε, δ)-DP algorithm must have
    for a test with these rates to exist."""
    best = 0.0
    for num, den in ((tpr - delta, fpr), (1.0 - fpr - delta, 1.0 - tpr)):
        if num > 0 and den > 0:
            best = max(best, math.log(num / den))
        elif num > 0:
            best = math.inf
    return best


def _bound_at(scores: np.ndarray, members: np.ndarray, t: float, delta: float, alpha: float) -> dict[str, Any]:
    guess = scores >= t
    n_in, n_out = int(members.sum()), int((~members).sum())
    tp, fp = int((guess & members).sum()), int((guess & ~members).sum())
    tpr_lo, tpr_hi = clopper_pearson(tp, n_in, alpha / 2)
    fpr_lo, fpr_hi = clopper_pearson(fp, n_out, alpha / 2)
    eps = max(epsilon_from_rates(tpr_lo, fpr_hi, delta), 0.0)
    # the complementary test ("non-member iff score < t") uses TNR_lo = 1 − FPR_hi and FNR_hi = 1 − TPR_lo
    return {
        "threshold": float(t),
        "tpr": tp / max(n_in, 1),
        "fpr": fp / max(n_out, 1),
        "tpr_low": tpr_lo,
        "fpr_high": fpr_hi,
        "epsilon_lower_bound": eps,
        "members": n_in,
        "non_members": n_out,
    }


def epsilon_lower_bound(
    scores: np.ndarray,
    members: np.ndarray,
    delta: float,
    confidence: float,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The ε lower bound of the best threshold test (see the module docstring): the threshold chosen on
    a random half of the rows, the bound (at ``confidence``) evaluated on the other half."""
    s, m = np.asarray(scores, dtype=np.float64), np.asarray(members, dtype=bool)
    if not 0.0 < confidence < 1.0:
        raise DatasetError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 1.0 - confidence
    half = rng.random(len(s)) < 0.5
    cal_s, cal_m = s[half], m[half]
    candidates = np.unique(np.quantile(cal_s, np.linspace(0.0, 1.0, 201)))
    best_t, best_e = float(candidates[-1]), -1.0
    for t in candidates:
        e = _bound_at(cal_s, cal_m, float(t), delta, alpha)["epsilon_lower_bound"]
        if e > best_e:
            best_t, best_e = float(t), e
    out = _bound_at(s[~half], m[~half], best_t, delta, alpha)
    out["confidence"] = confidence
    out["delta"] = delta
    return out


def roc_auc(scores: np.ndarray, members: np.ndarray) -> float:
    """Area under the ROC curve (the Mann-Whitney U statistic over n_in·n_out pairs, ties counted ½)."""
    from scipy.stats import rankdata

    s, m = np.asarray(scores, dtype=np.float64), np.asarray(members, dtype=bool)
    n_in, n_out = int(m.sum()), int((~m).sum())
    if n_in == 0 or n_out == 0:
        return math.nan
    r = rankdata(s)
    return float((r[m].sum() - n_in * (n_in + 1) / 2) / (n_in * n_out))


def tpr_at_fpr(scores: np.ndarray, members: np.ndarray, fpr: float) -> float:
    """The largest TPR among thresholds whose empirical FPR is ≤ ``fpr``."""
    s, m = np.asarray(scores, dtype=np.float64), np.asarray(members, dtype=bool)
    out_sorted = np.sort(s[~m])[::-1]
    k = int(math.floor(fpr * len(out_sorted)))  # at most k non-members may score at or above t
    t = out_sorted[k] if k < len(out_sorted) else -np.inf
    return float(np.mean(s[m] > t))


def dpsgd_trainer(model: Model, config: DPSGDConfig, steps: int) -> TrainFn:
    """A ``train_fn`` that trains ``model`` with DP-SGD (:func:`ldp_core.fl.dpsgd.train_dpsgd`) for
    ``steps`` steps; with ``config.noise_multiplier`` 0 and a large ``clip_norm`` it is plain SGD."""

    def train(X: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> ProbaFn:
        init, sample, noise = rng.spawn(3)
        w = train_dpsgd(model, model.init_params(init), X, y, config, steps, sample, noise)
        return lambda Xq: predict_proba(model, w, Xq)

    return train


def predict_proba(model: Model, params: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Class probabilities of a numpy model (softmax of its logits; σ for logistic regression)."""
    from ldp_core.fl.models import MLP, SoftmaxRegression

    p = np.asarray(params, dtype=np.float64)
    Xd = np.asarray(X, dtype=np.float64)
    if isinstance(model, SoftmaxRegression):
        d, k = model.n_features, model.n_classes
        z = Xd @ p[: d * k].reshape(d, k) + p[d * k :]
    elif isinstance(model, MLP):
        d, h, k = model.n_features, model.hidden, model.n_classes
        W1, b1 = p[: d * h].reshape(d, h), p[d * h : d * h + h]
        W2, b2 = p[d * h + h : d * h + h + h * k].reshape(h, k), p[d * h + h + h * k :]
        pre = Xd @ W1 + b1
        z = (np.tanh(pre) if model.activation == "tanh" else np.maximum(pre, 0)) @ W2 + b2
    elif isinstance(model, LogisticRegression):
        s = Xd @ p[:-1] + p[-1]
        z = np.stack([np.zeros_like(s), s], axis=1)
    else:
        raise DatasetError(f"no probabilities for model {type(model).__name__}")
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _shadow_features(probs: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Shokri et al.'s attack features: the sorted log-probabilities (top 3) and log p_y."""
    lp = np.log(np.maximum(np.asarray(probs, dtype=np.float64), _TINY))
    top = -np.sort(-lp, axis=1)[:, : min(3, lp.shape[1])]
    return np.column_stack([top, lp[np.arange(len(y)), y]])


def _shadow_attack_scores(feats: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Train the attack model on the shadows' features (in/out labels), return its logit on the target's."""
    from scipy.optimize import minimize

    train_x = feats[1:].reshape(-1, feats.shape[2])
    train_y = masks[1:].reshape(-1).astype(np.int64)
    mu, sd = train_x.mean(axis=0), train_x.std(axis=0) + 1e-9
    attack = LogisticRegression(feats.shape[2], l2=1e-3)
    zx = (train_x - mu) / sd
    res = minimize(lambda w: attack.loss_and_grad(w, zx, train_y), np.zeros(attack.num_params), jac=True)
    w = res.x
    return ((feats[0] - mu) / sd) @ w[:-1] + w[-1]


def _lira_scores(phi: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(online, offline) LiRA scores of the target (row 0) from the shadows' confidence logits."""
    sh, inn = phi[1:], masks[1:]
    n_in, n_out = inn.sum(axis=0), (~inn).sum(axis=0)
    mu_in = np.where(n_in > 0, (sh * inn).sum(axis=0) / np.maximum(n_in, 1), np.nan)
    mu_out = np.where(n_out > 0, (sh * ~inn).sum(axis=0) / np.maximum(n_out, 1), np.nan)
    # global variances (Carlini et al. §VI-A: a per-example variance needs many shadows)
    sd_in = float(np.sqrt(np.nanmean(np.where(inn, (sh - mu_in) ** 2, np.nan)))) + 1e-6
    sd_out = float(np.sqrt(np.nanmean(np.where(~inn, (sh - mu_out) ** 2, np.nan)))) + 1e-6
    global_in, global_out = float(np.nanmean(mu_in)), float(np.nanmean(mu_out))
    mu_in = np.where(np.isnan(mu_in), global_in, mu_in)
    mu_out = np.where(np.isnan(mu_out), global_out, mu_out)
    x = phi[0]
    online = (-0.5 * ((x - mu_in) / sd_in) ** 2 - math.log(sd_in)) - (
        -0.5 * ((x - mu_out) / sd_out) ** 2 - math.log(sd_out)
    )
    offline = (x - mu_out) / sd_out
    return online, offline


@dataclasses.dataclass(frozen=True)
class _Outputs:
    phi: np.ndarray  # (M+1) × N confidence logits
    loss: np.ndarray  # (M+1) × N cross-entropies
    feats: np.ndarray  # (M+1) × N × F shadow-attack features


def _run_models(
    train_fn: TrainFn,
    X: np.ndarray,
    y: np.ndarray,
    masks: np.ndarray,
    rng: np.random.Generator,
    progress: Callable[[str], None] | None,
) -> _Outputs:
    phis, losses, feats = [], [], []
    for m, mask in enumerate(masks):
        proba = train_fn(X[mask], y[mask], rng.spawn(1)[0])
        p = np.asarray(proba(X), dtype=np.float64)
        if p.ndim != 2 or p.shape[0] != len(X) or p.shape[1] <= int(y.max()):
            raise DatasetError(
                f"train_fn's model returned probabilities of shape {p.shape} for {len(X)} rows with labels up to "
                f"{int(y.max())}; it must return one row of class probabilities per input row"
            )
        phis.append(confidence_logits(p, y))
        losses.append(-np.log(_true_and_rest(p, y)[0]))
        feats.append(_shadow_features(p, y))
        if progress is not None:
            progress(f"{'target' if m == 0 else f'shadow {m}/{len(masks) - 1}'} model trained ({int(mask.sum())} rows)")
    return _Outputs(np.array(phis), np.array(losses), np.array(feats))


def attack_training(
    train_fn: TrainFn,
    X: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator,
    *,
    shadows: int = 16,
    delta: float = 1e-5,
    confidence: float = 0.95,
    printed_epsilon: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the membership game of the module docstring against ``train_fn`` on the pool (X, y).

    Trains ``shadows`` + 1 models on random halves of the pool (model 0 the target). Returns, per score
    in :data:`SCORES`, the ROC AUC, the TPR at FPR 1% and 0.1%, and the ε lower bound (``epsilon_lower_bound``
    at ``delta`` and ``confidence``, with the rates behind it), beside ``printed_epsilon`` (the accountant's
    ε of the target's training, None if it has none) and ``epsilon_lower_bound``, the largest over the
    scores (the threshold of each is chosen on half the rows, so taking the largest of four is a union over
    four tests: the confidence is then at least 1 − 4α)."""
    X = np.asarray(X)
    y = np.asarray(y, dtype=np.int64)
    if X.ndim != 2 or len(X) != len(y) or len(X) < 20:
        raise DatasetError(f"need a pool of at least 20 rows with one label each, got X {X.shape}, y {y.shape}")
    if isinstance(shadows, bool) or not isinstance(shadows, int) or shadows < 2:
        raise DatasetError(f"shadows must be an integer >= 2, got {shadows!r}")
    if not 0.0 <= delta < 1.0:
        raise DatasetError(f"delta must be in [0, 1), got {delta}")
    masks = rng.random((shadows + 1, len(X))) < 0.5
    out = _run_models(train_fn, X, y, masks, rng, progress)
    online, offline = _lira_scores(out.phi, masks)
    scores = {
        "loss": -out.loss[0],
        "shadow": _shadow_attack_scores(out.feats, masks),
        "lira_offline": offline,
        "lira_online": online,
    }
    members = masks[0]
    results: dict[str, Any] = {}
    for name in SCORES:
        s = scores[name]
        results[name] = {
            "auc": roc_auc(s, members),
            "tpr_at_fpr_1pct": tpr_at_fpr(s, members, 0.01),
            "tpr_at_fpr_0.1pct": tpr_at_fpr(s, members, 0.001),
            **epsilon_lower_bound(s, members, delta, confidence, rng.spawn(1)[0]),
        }
    best = max(SCORES, key=lambda k: results[k]["epsilon_lower_bound"])
    p0 = out.phi[0]
    return {
        "pool": len(X),
        "shadows": shadows,
        "target_members": int(members.sum()),
        "printed_epsilon": printed_epsilon,
        "epsilon_lower_bound": results[best]["epsilon_lower_bound"],
        "best_attack": best,
        "delta": delta,
        "confidence": confidence,
        "mean_confidence_logit_members": float(p0[members].mean()),
        "mean_confidence_logit_non_members": float(p0[~members].mean()),
        "attacks": results,
    }
