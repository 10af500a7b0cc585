"""Attack checks on federated learning: membership inference by loss threshold and
gradient inversion of one client's update, without and with DP and secure aggregation.

**Membership inference** (Yeom, Giacomelli, Fredrikson, Jha, "Privacy risk in
machine learning: analyzing the connection to overfitting", CSF 2018): the
attacker flags an example as a member when the trained model's loss on it is at
most a threshold τ. Its *advantage* is TPR − FPR = P(flag | member) −
P(flag | non-member).

The game matches client-level DP's neighbouring relation (add or remove one
client): each of the ``candidate_clients`` (all drawn from one distribution,
a few examples each) joins training independently with probability ½. For a
target client c, fixing everyone else's coin, its coin switches between the
neighbouring datasets D ∪ {c} and D, so any decision computed from the
released models (and from other clients' data) has
P(flag | c in) − P(flag | c out) ≤ TV(M(D ∪ {c}), M(D)) — and averaging over
the other coins keeps the bound. Members are the examples of joining clients,
non-members those of the others. Training is DP-FedAvg
(:class:`estimator.fl.dp.FixedClippingDP`) over Poisson-sampled rounds; its
denominator is the *public* constant q·N/2 (the expected number of joining
clients sampled), never the realized count, which depends on the coins.

Bounds on the advantage under client-level DP, each reported:

* (ε, δ)-DP ⇒ advantage ≤ (e^ε − 1 + 2δ)/(e^ε + 1). From the hypothesis-testing
  region of (ε, δ)-DP (Kairouz, Oh, Viswanath, "The composition theorem for
  differential privacy", ICML 2015, Thm. 2.1): FPR + e^ε·FNR ≥ 1 − δ and
  FNR + e^ε·FPR ≥ 1 − δ; adding them, FPR + FNR ≥ 2(1 − δ)/(1 + e^ε), and
  TPR − FPR = 1 − FNR − FPR. Humphries et al. ("Investigating membership
  inference attacks under data dependencies", CSF 2023) give this bound for
  the membership experiment with independent samples and show that
  dependent samples break it; here the unit of the game is the client, whose
  examples join together, which is what client-level DP covers. Yeom et al.'s
  Thm. 1 gives the looser e^ε − 1 for ε-DP (also reported).
* The tight figure for the mechanism actually run: the largest TPR − FPR of any
  test between two distributions is their total variation distance, the privacy
  profile's δ at ε = 0, which the PLD accountant computes for the composition
  of Poisson-subsampled Gaussian rounds (an upper bound, pessimistic
  discretization).

The threshold is chosen on a *calibration* half of the candidates (the
attacker knows their membership: the τ that maximizes TPR − FPR there) and the
advantage is measured on the other half. Yeom et al.'s threshold (the mean
training loss, taken over the calibration members) is reported too.

*Confidence interval* (derivation): given the trained model and τ, evaluation
members are treated as m independent draws, so the number flagged is
Binomial(m, TPR), and independently Binomial(n, FPR) for the n non-members
(examples of one client share a model and a client; the usual simplification
of empirical audits, e.g. Jagielski, Ullman, Oprea, NeurIPS 2020). Clopper–
Pearson intervals [TPR_lo, TPR_hi] and [FPR_lo, FPR_hi] (Clopper and Pearson,
Biometrika 1934), each at level 1 − α/2, hold together with probability
≥ 1 − α (Bonferroni), and then TPR − FPR ∈ [TPR_lo − FPR_hi, TPR_hi − FPR_lo].
The half-width is half that interval's length.

**Gradient inversion** of one client's update for softmax regression
(θ = (W ∈ R^{d×K}, b ∈ R^K)) after one local SGD step of size η on one example
(x, y): with z = Wᵀx + b and g = softmax(z) − e_y, ∇_W = x gᵀ and ∇_b = g, so the
update Δ = −η∇ has ΔW = −η x gᵀ — column k is −η g_k·x, a multiple of x — and
Δb = −η g gives the multiples:
    x̂ = ΔW Δb / ‖Δb‖²  =  x  exactly
(the observation of Phong, Aono, Hayashi, Wang, Moriai, "Privacy-preserving
deep learning via additively homomorphic encryption", IEEE TIFS 2018, §3).
The formula is invariant to scaling Δ, so clipping does not stop it. A second,
scale-free attack takes the leading left singular vector of ΔW (rank one in
x): it recovers x's direction up to sign and is the more robust to noise.
On a *sum* of n single-example updates, ΔW Δb/‖Δb‖² = Σⱼ aⱼ xⱼ with
aⱼ = gⱼ·G/‖G‖², G = Σ gⱼ, Σ aⱼ = 1: an affine mixture of the inputs, not any
one of them. Under central DP the server sees Σ clip(Δⱼ) + N(0, σ²C²·I), and
under secure aggregation a single masked update is uniform in Z_{2^32}^p
whatever the input (:mod:`ldp_core.fl.secagg`), so decoding it and
inverting yields noise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from estimator.fl.aggregators import ValidatingAggregator, WeightedMean
from estimator.fl.dp import ClientLevelAccountant, FixedClippingDP
from estimator.fl.sampling import PoissonSampling
from estimator.fl.strategies import FedAvg
from ldp_core.fl.client_round import train_client
from ldp_core.fl.errors import FLError
from ldp_core.fl.models import SoftmaxRegression, accuracy
from ldp_core.fl.training import LocalTraining, RoundConfig, clip_to_norm
from ldp_core.privacy_events import GaussianEvent
from simulator.rounds import FederatedClient, RoundRecord, run_rounds

__all__ = [
    "MembershipConfig",
    "InversionConfig",
    "PublicDenominatorPoisson",
    "softmax_losses",
    "best_threshold",
    "clopper_pearson",
    "advantage_with_ci",
    "advantage_bound",
    "yeom_bound",
    "invert_single_example",
    "leading_direction",
    "cosine",
    "secagg_views",
    "run_membership",
    "run_inversion",
    "run_attacks",
    "plot_attacks",
    "report_lines",
]

T = TypeVar("T")


def _seed_ok(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise FLError(f"seed must be an integer in [0, 2**63), got {seed!r}")


@dataclasses.dataclass(frozen=True)
class MembershipConfig:
    """The membership-inference game (module docstring). ``noise_multipliers``
    lists the DP-FedAvg settings besides plain FedAvg (0 = clipping only)."""

    candidate_clients: int = 400
    examples_per_client: int = 4
    features: int = 200
    classes: int = 10
    class_separation: float = 0.15
    sample_rate: float = 0.5
    rounds: int = 40
    training: LocalTraining = LocalTraining(epochs=5, batch_size=4, learning_rate=0.5)
    clip_norm: float = 1.0
    noise_multipliers: tuple[float, ...] = (0.0, 1.0, 4.0, 8.0)
    delta: float = 1e-5
    alpha: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.candidate_clients < 8:
            raise FLError(
                f"candidate_clients must be >= 8 (members and non-members in two halves), got {self.candidate_clients}"
            )
        if self.examples_per_client < 1 or self.rounds < 1 or self.features < 1 or self.classes < 2:
            raise FLError("examples_per_client, rounds and features must be >= 1 and classes >= 2")
        if not 0.0 < self.sample_rate <= 1.0:
            raise FLError(f"sample_rate must be in (0, 1], got {self.sample_rate}")
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise FLError(f"clip_norm must be a finite number > 0, got {self.clip_norm}")
        if any(not (math.isfinite(z) and z >= 0) for z in self.noise_multipliers):
            raise FLError(f"noise multipliers must be finite and >= 0, got {self.noise_multipliers}")
        if not 0.0 < self.delta < 1.0 or not 0.0 < self.alpha < 1.0:
            raise FLError(f"delta and alpha must be in (0, 1), got {self.delta}, {self.alpha}")
        _seed_ok(self.seed)


@dataclasses.dataclass(frozen=True)
class InversionConfig:
    """The gradient-inversion check: ``trials`` target clients with one example
    each, one local step of ``learning_rate`` from a small random global model."""

    features: int = 64
    classes: int = 10
    learning_rate: float = 0.1
    clip_norm: float = 0.5
    noise_multipliers: tuple[float, ...] = (0.01, 0.03, 0.1, 1.0)
    clients_in_sum: int = 10
    trials: int = 50
    delta: float = 1e-5
    success_cosine: float = 0.9
    seed: int = 0

    def __post_init__(self) -> None:
        if self.features < 2 or self.classes < 2 or self.trials < 1:
            raise FLError("features and classes must be >= 2 and trials >= 1")
        if self.clients_in_sum < 3:
            raise FLError(
                f"clients_in_sum must be >= 3 (secure aggregation needs 3 clients), got {self.clients_in_sum}"
            )
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0 and self.learning_rate > 0):
            raise FLError("clip_norm and learning_rate must be finite and > 0")
        if any(not (math.isfinite(z) and z > 0) for z in self.noise_multipliers):
            raise FLError(f"noise multipliers must be finite and > 0, got {self.noise_multipliers}")
        if not 0.0 < self.delta < 1.0 or not -1.0 < self.success_cosine < 1.0:
            raise FLError("delta must be in (0, 1) and success_cosine in (-1, 1)")
        _seed_ok(self.seed)


@dataclasses.dataclass(frozen=True)
class PublicDenominatorPoisson:
    """Poisson sampling at ``rate`` whose expected client count is the public
    constant ``rate·public_population`` whatever the realized population, so
    that adding or removing a client changes nothing but its own contribution
    (the accountant is given :class:`PoissonSampling` at the same rate)."""

    rate: float
    public_population: float

    def sample(self, clients: Sequence[T], rng: np.random.Generator) -> list[T]:
        keep = rng.random(len(clients)) < self.rate
        return [c for c, k in zip(clients, keep) if k]

    def expected_clients(self, population: int) -> float:
        return self.rate * self.public_population


# -- membership inference ------------------------------------------------------------
def softmax_losses(model: SoftmaxRegression, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-example cross-entropy −log softmax(Wᵀx + b)_y (float64), W row-major d×K then b."""
    d, k = model.n_features, model.n_classes
    p = np.asarray(params, np.float64)
    z = np.asarray(X, np.float64) @ p[: d * k].reshape(d, k) + p[d * k :]
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(y)), np.asarray(y)]


def best_threshold(member_losses: np.ndarray, nonmember_losses: np.ndarray) -> float:
    """The τ maximizing TPR − FPR for the rule "member iff loss ≤ τ" on these samples
    (candidates: every observed loss; ties favour the smaller τ)."""
    m = np.sort(np.asarray(member_losses, np.float64))
    n = np.sort(np.asarray(nonmember_losses, np.float64))
    if not len(m) or not len(n):
        raise FLError("best_threshold needs at least one member and one non-member loss")
    cand = np.concatenate([m, n])
    adv = np.searchsorted(m, cand, "right") / len(m) - np.searchsorted(n, cand, "right") / len(n)
    return float(cand[int(np.argmax(adv))])


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """The exact two-sided 1 − α interval for a binomial proportion k/n (Clopper and Pearson 1934)."""
    from scipy.stats import beta

    if n < 1 or not 0 <= k <= n:
        raise FLError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def advantage_with_ci(
    member_losses: np.ndarray, nonmember_losses: np.ndarray, tau: float, alpha: float
) -> dict[str, float]:
    """TPR, FPR and TPR − FPR of "member iff loss ≤ τ", with the 1 − α interval of the
    module docstring (Clopper–Pearson at 1 − α/2 on each rate)."""
    m, n = len(member_losses), len(nonmember_losses)
    km = int(np.sum(np.asarray(member_losses) <= tau))
    kn = int(np.sum(np.asarray(nonmember_losses) <= tau))
    tl, th = clopper_pearson(km, m, alpha / 2)
    fl, fh = clopper_pearson(kn, n, alpha / 2)
    return {
        "threshold": float(tau),
        "tpr": km / m,
        "fpr": kn / n,
        "advantage": km / m - kn / n,
        "ci_low": tl - fh,
        "ci_high": th - fl,
        "half_width": 0.5 * ((th - fl) - (tl - fh)),
        "members": m,
        "nonmembers": n,
    }


def advantage_bound(epsilon: float, delta: float) -> float:
    """(e^ε − 1 + 2δ)/(e^ε + 1), capped at 1: the largest TPR − FPR under (ε, δ)-DP (see the module docstring)."""
    if math.isinf(epsilon) or epsilon > 700:
        return 1.0
    e = math.exp(epsilon)
    return min(1.0, (e - 1.0 + 2.0 * delta) / (e + 1.0))


def yeom_bound(epsilon: float) -> float:
    """e^ε − 1, capped at 1 (Yeom et al. 2018, Thm. 1, for ε-DP)."""
    return 1.0 if epsilon > 1.0 else min(1.0, math.expm1(epsilon))


def _membership_data(
    cfg: MembershipConfig, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]:
    K, d = cfg.classes, cfg.features
    means = rng.normal(scale=cfg.class_separation, size=(K, d))
    Xs, ys = [], []
    for _ in range(cfg.candidate_clients):
        y = rng.integers(0, K, size=cfg.examples_per_client)
        Xs.append((means[y] + rng.normal(size=(len(y), d))).astype(np.float32))
        ys.append(y)
    joins = rng.random(cfg.candidate_clients) < 0.5
    calibration = np.zeros(cfg.candidate_clients, bool)
    calibration[rng.permutation(cfg.candidate_clients)[: cfg.candidate_clients // 2]] = True
    return Xs, ys, joins, calibration


def _membership_setting(
    cfg: MembershipConfig,
    name: str,
    noise: float | None,
    Xs: list[np.ndarray],
    ys: list[np.ndarray],
    joins: np.ndarray,
    calibration: np.ndarray,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    from estimator.accounting.accountant import delta_pld

    model = SoftmaxRegression(cfg.features, cfg.classes)
    clients = [FederatedClient(f"cand{i:04d}", Xs[i], ys[i]) for i in np.flatnonzero(joins)]
    sampling = PublicDenominatorPoisson(cfg.sample_rate, cfg.candidate_clients / 2)
    accountant = None
    if noise is None:
        agg: Any = ValidatingAggregator(WeightedMean())
    else:
        accountant = ClientLevelAccountant(PoissonSampling(cfg.sample_rate), cfg.candidate_clients, cfg.delta)
        agg = ValidatingAggregator(
            FixedClippingDP(WeightedMean(), cfg.clip_norm, noise, accountant=accountant, report_every=cfg.rounds)
        )
    rng = np.random.default_rng([cfg.seed, 1])
    params, _ = run_rounds(model, FedAvg(cfg.training), agg, clients, sampling, cfg.rounds, rng, on_round=on_round)
    losses = [softmax_losses(model, params, X, y) for X, y in zip(Xs, ys)]

    def pool(mask: np.ndarray) -> np.ndarray:
        return np.concatenate([losses[i] for i in np.flatnonzero(mask)]) if mask.any() else np.zeros(0)

    cal_m, cal_n = pool(calibration & joins), pool(calibration & ~joins)
    ev_m, ev_n = pool(~calibration & joins), pool(~calibration & ~joins)
    calibrated = advantage_with_ci(ev_m, ev_n, best_threshold(cal_m, cal_n), cfg.alpha)
    yeom = advantage_with_ci(ev_m, ev_n, float(cal_m.mean()), cfg.alpha)
    X_in = np.concatenate([Xs[i] for i in np.flatnonzero(joins)])
    y_in = np.concatenate([ys[i] for i in np.flatnonzero(joins)])
    X_out = np.concatenate([Xs[i] for i in np.flatnonzero(~joins)])
    y_out = np.concatenate([ys[i] for i in np.flatnonzero(~joins)])
    eps = None if accountant is None else accountant.epsilon()
    if eps is None or math.isinf(eps):
        tight = 1.0
    else:
        tight = min(1.0, float(delta_pld(accountant.event(), 0.0, "add_or_remove", accountant.discretization)))  # type: ignore[union-attr]
    return {
        "name": name,
        "clip_norm": None if noise is None else cfg.clip_norm,
        "noise_multiplier": noise,
        "epsilon": None if eps is None else (eps if math.isfinite(eps) else "inf"),
        "delta": cfg.delta,
        "train_accuracy": accuracy(model, params, X_in, y_in),
        "nonmember_accuracy": accuracy(model, params, X_out, y_out),
        "member_loss_mean": float(np.concatenate([ev_m, cal_m]).mean()),
        "nonmember_loss_mean": float(np.concatenate([ev_n, cal_n]).mean()),
        "calibrated_threshold": calibrated,
        "yeom_threshold": yeom,
        "advantage": calibrated["advantage"],
        "ci": [calibrated["ci_low"], calibrated["ci_high"]],
        "bound_epsilon_delta": 1.0 if eps is None else advantage_bound(eps, cfg.delta),
        "bound_yeom": 1.0 if eps is None else yeom_bound(eps),
        "bound_total_variation": tight,
    }


def run_membership(
    cfg: MembershipConfig = MembershipConfig(), on_round: Callable[[RoundRecord], None] | None = None
) -> dict[str, Any]:
    """Plain FedAvg and DP-FedAvg at each noise multiplier; the loss-threshold attack on each. ``on_round`` is
    called after every training round of every setting (progress display; draws nothing)."""
    Xs, ys, joins, calibration = _membership_data(cfg, np.random.default_rng([cfg.seed, 0]))
    settings = [_membership_setting(cfg, "fedavg", None, Xs, ys, joins, calibration, on_round)]
    for z in cfg.noise_multipliers:
        name = f"clip{cfg.clip_norm:g}_sigma{z:g}"
        settings.append(_membership_setting(cfg, name, z, Xs, ys, joins, calibration, on_round))
    tr = cfg.training
    return {
        "game": "each candidate client joins with probability 1/2; members = examples of joining clients",
        "candidate_clients": cfg.candidate_clients,
        "joining_clients": int(joins.sum()),
        "examples_per_client": cfg.examples_per_client,
        "model": f"softmax regression, {cfg.features} features, {cfg.classes} classes",
        "rounds": cfg.rounds,
        "sampling": {
            "kind": "poisson",
            "rate": cfg.sample_rate,
            "public_denominator": cfg.sample_rate * cfg.candidate_clients / 2,
        },
        "training": {"epochs": tr.epochs, "batch_size": tr.batch_size, "learning_rate": tr.learning_rate},
        "alpha": cfg.alpha,
        "neighbors": "add or remove one client (client-level DP)",
        "settings": settings,
    }


# -- gradient inversion ---------------------------------------------------------------
def _split(delta: np.ndarray, d: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(delta, np.float64)
    if v.shape != ((d + 1) * k,):
        raise FLError(
            f"a softmax-regression update of {d} features and {k} classes has {(d + 1) * k} values, got {v.shape}"
        )
    return v[: d * k].reshape(d, k), v[d * k :]


def invert_single_example(delta: np.ndarray, d: int, k: int) -> np.ndarray:
    """x̂ = ΔW Δb / ‖Δb‖² (module docstring): the input of a one-example, one-step update."""
    W, b = _split(delta, d, k)
    nb = float(b @ b)
    return W @ b / nb if nb > 0 else np.zeros(d)


def leading_direction(delta: np.ndarray, d: int, k: int) -> np.ndarray:
    """The leading left singular vector of ΔW (unit norm, sign arbitrary)."""
    W, _ = _split(delta, d, k)
    u, _, _ = np.linalg.svd(W, full_matrices=False)
    return u[:, 0]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else 0.0


def _one_step(
    model: SoftmaxRegression, params: np.ndarray, x: np.ndarray, y: int, lr: float, rng: np.random.Generator, cid: str
) -> np.ndarray:
    cfg = RoundConfig(0, params, "fedavg", LocalTraining(epochs=1, batch_size=1, learning_rate=lr))
    return train_client(model, cfg, x[None, :].astype(np.float32), np.array([y]), rng, cid).delta


def secagg_views(
    updates: list[np.ndarray], clip_range: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(client 1's masked upload decoded as if it were a sum, the unmasked decoded sum) of one SecAgg+ round."""
    from estimator.fl.secagg_server import SecAggServer, honest_unmask, make_config
    from ldp_core.fl.secagg import Quantizer, SecAggClient

    n, p = len(updates), len(updates[0])
    q = Quantizer.for_clients(n, clip_range)
    cfg = make_config(0, n, p, rng)
    clients = {u: SecAggClient(u, cfg, rng.bytes) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items()})
    masked = {}
    for u, c in clients.items():
        masked[u] = c.masked_input(q.quantize(updates[u - 1], rng), inbox.get(u, {}))
        server.receive_masked(u, masked[u])
    surv, dropped = server.unmask_request()
    total = server.finish(honest_unmask(clients, surv, dropped))
    return q.decode_sum(masked[1]), q.decode_sum(total)


def _gaussian_epsilon(z: float, delta: float) -> float | str:
    from estimator.accounting.accountant import exact_gaussian_epsilon

    eps = exact_gaussian_epsilon(GaussianEvent(z), delta)
    return "inf" if eps is None or not math.isfinite(eps) else float(eps)


def run_inversion(cfg: InversionConfig = InversionConfig()) -> dict[str, Any]:
    """The analytic and the singular-vector attack on what the server sees in each setting."""
    d, K, C, n = cfg.features, cfg.classes, cfg.clip_norm, cfg.clients_in_sum
    model = SoftmaxRegression(d, K)
    rng = np.random.default_rng([cfg.seed, 3])
    names = ["individual_update", "individual_update_clipped"]
    names += [f"noisy_sum_alone_sigma{z:g}" for z in cfg.noise_multipliers]
    names += [
        f"sum_of_{n}",
        f"noisy_sum_of_{n}_sigma{max(cfg.noise_multipliers):g}",
        "secagg_masked_update",
        f"secagg_sum_of_{n}",
    ]
    rows: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in names}
    for _ in range(cfg.trials):
        params = rng.normal(scale=0.01, size=model.num_params).astype(np.float32)
        X = rng.normal(size=(n, d))
        y = rng.integers(0, K, size=n)
        ups = [_one_step(model, params, X[j], int(y[j]), cfg.learning_rate, rng, f"c{j}") for j in range(n)]
        clipped = [clip_to_norm(u.astype(np.float64), C)[0] for u in ups]
        views = {"individual_update": ups[0], "individual_update_clipped": clipped[0]}
        for z in cfg.noise_multipliers:
            views[f"noisy_sum_alone_sigma{z:g}"] = clipped[0] + rng.normal(0.0, z * C, size=clipped[0].shape)
        total = np.sum(clipped, axis=0)
        views[f"sum_of_{n}"] = total
        zmax = max(cfg.noise_multipliers)
        views[f"noisy_sum_of_{n}_sigma{zmax:g}"] = total + rng.normal(0.0, zmax * C, size=total.shape)
        views["secagg_masked_update"], views[f"secagg_sum_of_{n}"] = secagg_views(clipped, C, rng)
        for name, v in views.items():
            xh = invert_single_example(v, d, K)
            c_svd = abs(cosine(leading_direction(v, d, K), X[0]))
            best_other = max(cosine(xh, X[j]) for j in range(n))
            rows[name].append(
                (cosine(xh, X[0]), c_svd, float(np.linalg.norm(xh - X[0]) / np.linalg.norm(X[0])), best_other)
            )
    settings = []
    for name in names:
        a = np.array(rows[name])
        noisy = name.startswith("noisy_sum")
        sigma = float(name.rsplit("sigma", 1)[1]) if noisy else None
        k = n if (f"of_{n}" in name) else 1
        settings.append(
            {
                "name": name,
                "server_sees": _SEES[name.split("_sigma")[0].replace(f"_{n}", "_n")],
                "clients_in_sum": k,
                "noise_multiplier": sigma,
                "epsilon_one_round": None if sigma is None else _gaussian_epsilon(sigma, cfg.delta),
                "neighbors": "add or remove one client (sensitivity the clip norm)",
                "cosine_mean": float(a[:, 0].mean()),
                "svd_abs_cosine_mean": float(a[:, 1].mean()),
                "relative_error_median": float(np.median(a[:, 2])),
                "best_participant_cosine_mean": float(a[:, 3].mean()),
                "success_rate": float(np.mean(np.maximum(a[:, 0], a[:, 1]) >= cfg.success_cosine)),
            }
        )
    return {
        "model": f"softmax regression, {d} features, {K} classes; "
        f"one local SGD step (η = {cfg.learning_rate:g}) on one example",
        "inputs": "x ~ N(0, I_d), labels uniform; global model ~ N(0, 0.01²) per trial",
        "clip_norm": C,
        "delta": cfg.delta,
        "trials": cfg.trials,
        "success_cosine": cfg.success_cosine,
        "success": f"cosine(x̂, x) >= {cfg.success_cosine:g} for the analytic x̂ "
        "or |cosine| for the singular-vector direction",
        "settings": settings,
    }


_SEES = {
    "individual_update": "the target's own update (no protection)",
    "individual_update_clipped": "the target's update clipped to norm C",
    "noisy_sum_alone": "central DP: clip(Δ) + N(0, σ²C²), the target alone in the round",
    "sum_of_n": "the plain sum of n clipped updates (what SecAgg reveals)",
    "noisy_sum_of_n": "central DP: Σ clip(Δ_j) + N(0, σ²C²) over n clients",
    "secagg_masked_update": "SecAgg+: the target's masked upload, decoded",
    "secagg_sum_of_n": "SecAgg+: the unmasked sum of n clipped updates, decoded",
}


def run_attacks(
    membership: MembershipConfig = MembershipConfig(),
    inversion: InversionConfig = InversionConfig(),
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """Both checks; a JSON-ready result. ``on_round``: the membership game's rounds (:func:`run_membership`)."""
    return {
        "scenario": "attacks",
        "data": "synthetic seeded (Gaussian classes); see simulator/scenarios/fl/attacks.py",
        "seed": membership.seed,
        "membership_inference": run_membership(membership, on_round),
        "gradient_inversion": run_inversion(inversion),
    }


def plot_attacks(result: dict[str, Any], path: str) -> None:
    """Left: membership advantage with its interval and the DP bounds per setting;
    right: the inversion's success rate per setting (matplotlib, server extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    ms = result["membership_inference"]["settings"]
    xs = np.arange(len(ms))
    adv = np.array([s["advantage"] for s in ms])
    lo = np.array([s["ci"][0] for s in ms])
    hi = np.array([s["ci"][1] for s in ms])
    a1.errorbar(xs, adv, yerr=[adv - lo, hi - adv], fmt="o", capsize=4, label="advantage (95 % CI)")
    a1.plot(xs, [s["bound_total_variation"] for s in ms], "v", color="C3", label="bound: TV (PLD, ε = 0)")
    a1.plot(
        xs, [s["bound_epsilon_delta"] for s in ms], "_", markersize=14, color="C2", label="bound: (e^ε−1+2δ)/(e^ε+1)"
    )
    labels = []
    for s in ms:
        e = s["epsilon"]
        labels.append(s["name"] + ("" if e is None else f"\nε = {e}" if isinstance(e, str) else f"\nε = {e:.3g}"))
    a1.set_xticks(xs, labels, fontsize=7)
    a1.axhline(0, color="grey", lw=0.5)
    a1.set_ylabel("TPR − FPR")
    a1.set_title("membership inference (loss threshold)", fontsize=9)
    a1.legend(fontsize=7)
    inv = result["gradient_inversion"]["settings"]
    ys = np.arange(len(inv))
    a2.barh(ys - 0.2, [s["cosine_mean"] for s in inv], height=0.4, color="C0", label="analytic x̂: mean cos(x̂, x)")
    a2.barh(
        ys + 0.2, [s["svd_abs_cosine_mean"] for s in inv], height=0.4, color="C1", label="singular vector: mean |cos|"
    )
    for y, s in zip(ys, inv):
        a2.text(1.01, y, f"{s['success_rate']:.0%}", va="center", fontsize=7)
    a2.axvline(result["gradient_inversion"].get("success_cosine", 0.9), color="grey", ls=":", lw=1)
    a2.set_yticks(ys, [s["name"] for s in inv], fontsize=7)
    a2.invert_yaxis()
    a2.set_xlim(-0.1, 1.12)
    a2.set_xlabel("cosine with the target's input; right margin: share recovered")
    a2.legend(fontsize=7, loc="lower right")
    a2.set_title("gradient inversion of one client's update", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _eps_text(e: Any, spec: str) -> str:
    """An ε for the tables: a number (formatted by ``spec``), a reason (text), or — for none."""
    return "—" if e is None else e if isinstance(e, str) else format(e, spec)


def report_lines(result: dict[str, Any]) -> list[str]:
    """The tables ``ldp study attack`` prints for :func:`run_attacks`'s ``result``: the membership
    inference advantage per setting with its interval and DP bounds, and the gradient inversion's success."""
    mi, inv = result["membership_inference"], result["gradient_inversion"]
    lines = [
        f"membership inference: {mi['candidate_clients']} candidate clients ({mi['joining_clients']} joined), "
        f"{mi['examples_per_client']} examples each, {mi['model']}, {mi['rounds']} rounds, Poisson q = {mi['sampling']['rate']}"
        f"; ε: {mi.get('neighbors', 'add or remove one client (client-level DP)')}",
        f"{'setting':<18} {'ε':>8} {'train acc':>9} {'test acc':>8} {'advantage':>9} {'95 % CI':>16} "
        f"{'Yeom τ':>7} {'TV bound':>8} {'ε,δ bound':>9}",
    ]
    for s in mi["settings"]:
        lines.append(
            f"{s['name']:<18} {_eps_text(s['epsilon'], '.3g'):>8} {s['train_accuracy']:>9.3f} "
            f"{s['nonmember_accuracy']:>8.3f} {s['advantage']:>9.3f} "
            f"{'[' + format(s['ci'][0], '.3f') + ', ' + format(s['ci'][1], '.3f') + ']':>16} "
            f"{s['yeom_threshold']['advantage']:>7.3f} {s['bound_total_variation']:>8.3f} {s['bound_epsilon_delta']:>9.3f}"
        )
    lines.append(
        f"gradient inversion: {inv['model']}; {inv['trials']} targets per setting; clip {inv['clip_norm']:g}; "
        "ε (1 round): add or remove one client"
    )
    lines.append(f"{'setting':<28} {'ε (1 round)':>11} {'cos':>6} {'|cos| svd':>9} {'rel. err':>8} {'success':>7}")
    for s in inv["settings"]:
        lines.append(
            f"{s['name']:<28} {_eps_text(s['epsilon_one_round'], '.4g'):>11} {s['cosine_mean']:>6.3f} "
            f"{s['svd_abs_cosine_mean']:>9.3f} {s['relative_error_median']:>8.3f} {s['success_rate']:>7.2f}"
        )
    return lines
