"""The clinics scenario: federated logistic regression across 20 clinics with
client-level DP, and the ε each setting really gives.

Set-up (after the widely circulated "clinics" example of DP federated
learning): 20 clinics whose patients' features are shifted per clinic,
logistic regression, 100 rounds, about 10 clinics per round, updates clipped
to L2 norm 0.5, noise multipliers 0, 0.5 and 2.0, δ = 1e-5. We do not have
that example's seed data, so the clinics here are *synthetic and seeded*:
clinic k draws n_k ∈ [80, 400] patients with features x ~ N(μ_k, I_8),
μ_k ~ N(0, 1.5²·I_8) (the shift), and a shared outcome model
y ~ Bernoulli(σ(15(w*·x + b*))). Accuracies are therefore comparable in
shape, not in digits, to the example's (FedAvg 0.985, clipped + σ 2.0
about 0.938 there).

Clinics are sampled by Poisson sampling with q = 0.5 (10 clinics per round
in expectation): that is the scheme whose client-level ε the PLD accountant
computes tightly (add/remove one clinic, δ = 1e-5): about 137 for σ = 0.5
and 14.3 for σ = 2.0 over 100 rounds — much weaker protection than the
noise suggests. ``noise_for_epsilon`` gives the multiplier each target ε
needs at the same q and number of rounds, and ``accuracy_at_target_epsilon``
the test accuracy training reaches with it.

Each noised setting states its ε per adversary (issue 13): ``epsilon_observers``
(= ``epsilon``, amplified, against observers who do not know the sample),
``epsilon_known_sample`` (unamplified, against anyone who knows the sample and
sees only the models) and ``epsilon_server_operator`` = None (the noise is
central: the server adds it after clipping and summing every update, so no DP
holds against the operator), and the labelled ``epsilon_by_adversary`` list of
:func:`estimator.fl.dp.epsilon_by_adversary`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from estimator.accounting.accountant import gaussian_noise_for_epsilon
from estimator.fl.aggregators import ValidatingAggregator, WeightedMean
from estimator.fl.checkpoint import json_float
from estimator.fl.ddg_accounting import (
    DEFAULT_ASSUMED_HONEST_FRACTION,
    DDGAccountant,
    assumed_honest_shares,
    ddg_epsilon_by_adversary,
    noise_for_epsilon,
)
from estimator.fl.dp import ClientLevelAccountant, FixedClippingDP, epsilon_by_adversary
from estimator.fl.ftrl import FtrlAccountant, TreeNoise, ftrl_epsilon_rdp, ftrl_noise_for_epsilon
from estimator.fl.sampling import FixedCountSampling, PoissonSampling
from estimator.fl.strategies import FedAvg
from ldp_core.fl.ddg import DDGSpec
from ldp_core.fl.models import LogisticRegression
from ldp_core.fl.training import LocalTraining
from simulator.rounds import FederatedClient, RoundRecord, run_rounds

__all__ = [
    "ClinicsConfig",
    "make_clinics",
    "run_clinics",
    "run_example",
    "EXAMPLE_SETTINGS",
    "DATA_NOTE",
    "compare_ddg_to_central",
    "report_lines",
    "example_report_lines",
]

DATA_NOTE = (
    "synthetic seeded clinics (the original example's seed data is not available): "
    "per-clinic feature shifts, a shared logistic outcome model"
)


@dataclasses.dataclass(frozen=True)
class ClinicsConfig:
    clinics: int = 20
    features: int = 8
    rounds: int = 100
    sample_rate: float = 0.5
    clip_norm: float = 0.5
    noise_multipliers: tuple[float, ...] = (0.0, 0.5, 2.0)
    delta: float = 1e-5
    target_epsilons: tuple[float, ...] = (1.0, 3.0, 8.0)
    training: LocalTraining = LocalTraining(epochs=1, batch_size=32, learning_rate=0.5)
    shift: float = 1.5
    seed: int = 0


def make_clinics(
    cfg: ClinicsConfig, rng: np.random.Generator
) -> tuple[list[FederatedClient], tuple[np.ndarray, np.ndarray]]:
    """The clinics' training data and a pooled test set (20 % of every clinic's patients)."""
    d = cfg.features
    w = rng.normal(size=d)
    w /= np.linalg.norm(w)
    b = 0.2
    clients, tests_X, tests_y = [], [], []
    for k in range(cfg.clinics):
        n = int(rng.integers(80, 401))
        mu = rng.normal(scale=cfg.shift, size=d)
        X = (mu + rng.normal(size=(n, d))).astype(np.float32)
        z = 15.0 * (X @ w + b)
        y = (rng.random(n) < 0.5 * (1 + np.tanh(0.5 * z))).astype(np.int64)
        cut = int(0.8 * n)
        clients.append(FederatedClient(f"clinic{k:02d}", X[:cut], y[:cut]))
        tests_X.append(X[cut:])
        tests_y.append(y[cut:])
    return clients, (np.concatenate(tests_X), np.concatenate(tests_y))


def _setting(
    name: str,
    cfg: ClinicsConfig,
    clients: list[FederatedClient],
    test: Any,
    noise: float | None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    model = LogisticRegression(cfg.features)
    sampling = PoissonSampling(cfg.sample_rate)
    rng = np.random.default_rng([cfg.seed, 1])
    acc = None
    if noise is None:
        agg: Any = ValidatingAggregator(WeightedMean())
    else:
        acc = ClientLevelAccountant(sampling, len(clients), cfg.delta)
        agg = ValidatingAggregator(
            FixedClippingDP(WeightedMean(), cfg.clip_norm, noise, accountant=acc, report_every=cfg.rounds)
        )
    _, hist = run_rounds(
        model, FedAvg(cfg.training), agg, clients, sampling, cfg.rounds, rng, test=test, on_round=on_round
    )
    eps = None if acc is None else acc.epsilon()
    # the simulation adds central noise on the server without SecAgg: the operator sees every clipped update
    by_adversary = None if acc is None else epsilon_by_adversary(acc, secagg=False, observer=eps)
    if by_adversary is not None:
        for a in by_adversary:
            a["epsilon"] = json_float(a["epsilon"])
    known = None if by_adversary is None else by_adversary[1]["epsilon"]
    return {
        "name": name,
        "clip_norm": None if noise is None else cfg.clip_norm,
        "noise_multiplier": noise,
        "test_accuracy": hist[-1].test_accuracy,
        "accuracy_per_round": [h.test_accuracy for h in hist],
        "clients_per_round_mean": float(np.mean([h.sampled for h in hist])),
        "epsilon": None if eps is None else (eps if math.isfinite(eps) else "inf"),
        "epsilon_observers": None if eps is None else json_float(eps),
        "epsilon_known_sample": known,
        "epsilon_server_operator": None,
        "epsilon_by_adversary": by_adversary,
    }


def run_clinics(
    cfg: ClinicsConfig = ClinicsConfig(),
    noise_for_targets: bool = True,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """Run every setting; return a JSON-ready result. ``on_round`` is called after every federated round of
    every setting (``(1 + len(cfg.noise_multipliers)) * cfg.rounds`` calls), for progress display."""
    clients, test = make_clinics(cfg, np.random.default_rng([cfg.seed, 0]))
    settings = [_setting("fedavg", cfg, clients, test, None, on_round)]
    for z in cfg.noise_multipliers:
        settings.append(_setting(f"clip{cfg.clip_norm:g}_sigma{z:g}", cfg, clients, test, z, on_round))
    out: dict[str, Any] = {
        "scenario": "clinics",
        "data": DATA_NOTE,
        "seed": cfg.seed,
        "clinics": cfg.clinics,
        "rounds": cfg.rounds,
        "sampling": {
            "kind": "poisson",
            "rate": cfg.sample_rate,
            "expected_clients_per_round": cfg.sample_rate * cfg.clinics,
        },
        "delta": cfg.delta,
        "neighbors": "add or remove one clinic (all its patients)",
        "test_examples": int(len(test[1])),
        "settings": settings,
    }
    if noise_for_targets:
        out["noise_for_epsilon"] = {
            f"{e:g}": gaussian_noise_for_epsilon(e, cfg.delta, cfg.sample_rate, cfg.rounds, discretization=1e-3)
            for e in cfg.target_epsilons
        }
        out["accuracy_at_target_epsilon"] = {
            e: _setting(f"clip{cfg.clip_norm:g}_eps{e}", cfg, clients, test, z)["test_accuracy"]
            for e, z in out["noise_for_epsilon"].items()
        }
    return out


def plot_accuracy(result: dict[str, Any], path: str) -> None:
    """Test accuracy per round, one line per setting (matplotlib, server extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for s in result["settings"]:
        eps = s["epsilon"]
        label = s["name"] if eps is None else f"{s['name']} (ε = {eps if isinstance(eps, str) else f'{eps:.3g}'})"
        ax.plot(range(1, len(s["accuracy_per_round"]) + 1), s["accuracy_per_round"], label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(
        f"clinics: {result['clinics']} clinics, q = {result['sampling']['rate']}, "
        f"δ = {result['delta']:g} (synthetic data)"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the user's own example (issue 13) -----------------------------------------------------------
#: The example's four settings, in its order: (name, clip norm or None, noise multiplier).
EXAMPLE_SETTINGS: tuple[tuple[str, float | None, float], ...] = (
    ("no clipping", None, 0.0),
    ("clip 0.5", 0.5, 0.0),
    ("σ 0.5", 0.5, 0.5),
    ("σ 2.0", 0.5, 2.0),
)
EXAMPLE_W_TRUE = (1.5, -2.0, 1.0, 0.5, -0.3)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1.0 / (1.0 + np.exp(-z))
    return out


def _example_data(
    rng: np.random.Generator, clinics: int = 20
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """The example's data, drawn from ``rng`` in its order: per clinic m, shift, x, y; then the test set."""
    w_true = np.array(EXAMPLE_W_TRUE)
    d = w_true.size
    data = []
    for _ in range(clinics):
        m = int(rng.integers(100, 400))
        shift = rng.normal(0, 0.5, d)
        x = rng.normal(0, 1, (m, d)) + shift
        y = (rng.random(m) < _sigmoid(x @ w_true)).astype(float)
        data.append((x, y))
    x_test = rng.normal(0, 1, (5000, d))
    y_test = x_test @ w_true > 0
    return data, x_test, y_test


def _local_update(w: np.ndarray, x: np.ndarray, y: np.ndarray, epochs: int = 5, lr: float = 0.1) -> np.ndarray:
    """``epochs`` steps of full-batch gradient descent on the mean logistic loss; the change of w."""
    local = w.copy()
    for _ in range(epochs):
        local -= lr * (x.T @ (_sigmoid(x @ local) - y)) / len(y)
    out: np.ndarray = local - w
    return out


#: The bits per coordinate of the example's distributed-DG row (the SecAgg ring Z_{2^16}).
EXAMPLE_DDG_BITS = 16
#: Its own generator (sample, rounding, noise shares), so that its figures do not depend on how many rows
#: run before it on the example's generator.
EXAMPLE_DDG_SEED = (9, 16)


def _train_ddg(
    data: list[tuple[np.ndarray, np.ndarray]],
    spec: DDGSpec,
    rounds: int,
    per_round: int,
    rng: np.random.Generator,
    sample_rng: np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The example's training with distributed discrete Gaussian noise instead of central noise: each
    round's ``per_round`` clinics encode their update (:meth:`DDGSpec.encode`: clip, rotate, round, add
    their noise share, mod 2^bits); SecAgg's unmasked sum is Σ words mod 2^bits (exact, so the masking
    itself is not re-run here: tests/fl/test_fl_ddg.py checks it); the server decodes and averages.
    ``sample_rng`` (default ``rng``) picks the clinics. Returns (w, per-clinic participation counts)."""
    sample_rng = rng if sample_rng is None else sample_rng
    n = len(data)
    w = np.zeros(spec.dim)
    participation = np.zeros(n, dtype=np.int64)
    for _ in range(rounds):
        idx = sample_rng.choice(n, per_round, replace=False)
        participation[idx] += 1
        updates = np.stack([_local_update(w, *data[i]) for i in idx])
        seed = int(rng.integers(2**62))  # the round's public rotation
        words = spec.encode(updates, rng, seed)
        total = words.astype(np.int64).sum(axis=0) % spec.modulus
        w = w + spec.decode_sum(total, seed) / per_round
    return w, participation


def _ddg_example_row(
    data: list[tuple[np.ndarray, np.ndarray]],
    x_test: np.ndarray,
    y_test: np.ndarray,
    target: float,
    delta: float,
    rounds: int,
    per_round: int,
    bits: int = EXAMPLE_DDG_BITS,
) -> dict[str, Any]:
    """The "distributed DG" row: the noise whose ε against the server operator (KLS21's bound, no
    amplification, :mod:`estimator.fl.ddg_accounting`) equals ``target`` (the σ 2.0 row's
    ``epsilon_known_sample``) at ``bits`` bits per coordinate."""
    clip = 0.5
    d = len(EXAMPLE_W_TRUE)
    spec = noise_for_epsilon(target, delta, rounds, clip_norm=clip, clients=per_round, dim=d, bits=bits)
    w, participation = _train_ddg(data, spec, rounds, per_round, np.random.default_rng(EXAMPLE_DDG_SEED))
    acc = DDGAccountant(delta)
    realized = DDGAccountant(delta)
    for _ in range(rounds):
        acc.record(spec)
    for _ in range(int(participation.max())):
        realized.record(spec)
    eps = acc.epsilon()
    honest = assumed_honest_shares(per_round, DEFAULT_ASSUMED_HONEST_FRACTION)
    by = ddg_epsilon_by_adversary(acc, None, honest, DEFAULT_ASSUMED_HONEST_FRACTION)
    u_true = np.array(EXAMPLE_W_TRUE) / np.linalg.norm(EXAMPLE_W_TRUE)
    return {
        "setting": "distributed DG",
        "accuracy": float(np.mean((x_test @ w > 0) == y_test)),
        "weight_error": float(np.linalg.norm(w / np.linalg.norm(w) - u_true)),
        "epsilon": eps,
        "clip_norm": clip,
        "noise_multiplier": spec.noise_stddev / clip,
        "rounds_participated_max": int(participation.max()),
        "bits": spec.bits,
        "gamma": spec.gamma,
        "modular_clipping_bound": acc.modular_clipping_bound(),
        "epsilon_amplified_rdp": None,
        "epsilon_known_sample": eps,
        "epsilon_known_sample_realized": realized.epsilon(),
        "epsilon_by_adversary": by,
        "epsilon_server_operator": eps,
        # the operator enrolls the devices and draws the sample: the figure if only the assumed honest share of
        # each round's devices adds noise it does not know (DEFAULT_ASSUMED_HONEST_FRACTION of the sample)
        "epsilon_server_operator_assumed_honest": acc.epsilon(shares=honest),
        "assumed_honest_shares": honest,
        "assumed_honest_fraction": DEFAULT_ASSUMED_HONEST_FRACTION,
    }


def compare_ddg_to_central(
    bits: tuple[int, ...] = (8, 10, 12, 16),
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
    sigma: float = 2.0,
    delta: float = 1e-5,
    rounds: int = 100,
    per_round: int = 10,
) -> list[dict[str, Any]]:
    """Accuracy at equal ε: the example's data, central noise σ (clip 0.5) against the distributed DG
    calibrated to the same ε against whoever knows the sample (for central noise that ε does not hold
    against the server operator; for the DDG it does), at each bit width; mean (and standard deviation)
    of test accuracy and weight error over ``seeds``. Each seed fixes the sequence of samples (the same
    for every variant: a paired comparison) and, separately, the noise."""
    data, x_test, y_test = _example_data(np.random.default_rng(9))
    clip, d = 0.5, len(EXAMPLE_W_TRUE)
    u_true = np.array(EXAMPLE_W_TRUE) / np.linalg.norm(EXAMPLE_W_TRUE)
    known = ClientLevelAccountant(FixedCountSampling(per_round), len(data), delta)
    for _ in range(rounds):
        known.record(sigma)
    target = known.epsilon_known_sample()

    def scores(ws: list[np.ndarray]) -> dict[str, float]:
        acc = [float(np.mean((x_test @ w > 0) == y_test)) for w in ws]
        err = [float(np.linalg.norm(w / np.linalg.norm(w) - u_true)) for w in ws]
        return {
            "accuracy": float(np.mean(acc)),
            "accuracy_sd": float(np.std(acc)),
            "weight_error": float(np.mean(err)),
            "weight_error_sd": float(np.std(err)),
        }

    central = []
    for seed in seeds:
        sample_rng, rng = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2])
        w = np.zeros(d)
        for _ in range(rounds):
            idx = sample_rng.choice(len(data), per_round, replace=False)
            ups = [_local_update(w, *data[i]) for i in idx]
            ups = [u * min(1.0, clip / float(np.linalg.norm(u))) for u in ups]
            w = w + np.mean(ups, axis=0) + rng.normal(0, sigma * clip / per_round, d)
        central.append(w)
    out = [{"noise": "central", "bits": None, "noise_multiplier": sigma, "epsilon_known_sample": target}]
    out[0].update(scores(central))
    for b in bits:
        spec = noise_for_epsilon(target, delta, rounds, clip_norm=clip, clients=per_round, dim=d, bits=b)
        ws = [
            _train_ddg(
                data, spec, rounds, per_round, np.random.default_rng([seed, 2]), np.random.default_rng([seed, 1])
            )[0]
            for seed in seeds
        ]
        honest_acc = DDGAccountant(delta)
        for _ in range(rounds):
            honest_acc.record(spec)
        honest = assumed_honest_shares(per_round, DEFAULT_ASSUMED_HONEST_FRACTION)
        row: dict[str, Any] = {
            "noise": "distributed_discrete_gaussian",
            "bits": b,
            "noise_multiplier": spec.noise_stddev / clip,
            "epsilon_known_sample": target,
            "epsilon_server_operator": honest_acc.epsilon(),
            "epsilon_server_operator_assumed_honest": honest_acc.epsilon(shares=honest),
            "assumed_honest_shares": honest,
        }
        row.update(scores(ws))
        out.append(row)
    return out


def run_example(delta: float = 1e-5, rounds: int = 100, per_round: int = 10) -> dict[str, Any]:
    """The user's example exactly (issue 13, "The user's own example").

    Everything is drawn from one ``numpy.random.default_rng(9)`` in the example's order:
    the data of 20 clinics (m = integers(100, 400), shift = normal(0, 0.5, 5), x =
    normal(0, 1, (m, 5)) + shift, y = random(m) < sigmoid(x·w_true)), the test set
    (x_test = normal(0, 1, (5000, 5)), y_test = x_test·w_true > 0), then the four
    settings one after another on the same generator. A setting starts from w = 0; each
    of ``rounds`` rounds picks ``per_round`` clinics with ``choice(20, 10,
    replace=False)``, each computes 5 epochs of full-batch gradient descent (lr 0.1) from
    w, the updates are clipped to 0.5 (not in "no clipping"), averaged (unweighted), and
    noise ``normal(0, σ·clip/10, 5)`` is drawn and added only when σ > 0. Accuracy is on
    the test set (sign of x·w), weight error ‖w/‖w‖ − w_true/‖w_true‖‖.

    ε (client level, δ = ``delta``): noise σ·clip/10 on the average of 10 is σ·clip on the
    sum. Sampling is a fixed-size subset without replacement, so clinics are neighbours
    by *replacement* (one clinic's data swapped for another's: the population and the
    batch size are public and fixed, so add/remove is not the natural relation); one
    replacement moves the clipped sum by up to 2·clip. ``epsilon`` (observers who do not
    know the sample) is the smaller of two valid bounds: dp_accounting's RDP for
    ``SampledWithoutReplacementDpEvent`` (Wang, Balle, Kasiviswanathan 2019; the only
    fixed-size-without-replacement event dp_accounting has, and only for RDP and
    replace-one; PLD has none) and the exact unamplified Gaussian figure.
    ``epsilon_known_sample``: an adversary who knows the sample gets no amplification and
    a clinic may be sampled every round, so it is the exact ε of ``rounds`` unsampled
    Gaussian releases at sensitivity 2·clip. ``epsilon_known_sample_realized``: the same
    for this run's sample, whose most-sampled clinic took part in
    ``rounds_participated_max`` rounds (valid given the sample, which does not depend
    on the data). ``epsilon_server_operator`` is None: the noise is central (added after the
    server averaged the clipped updates), so nothing holds against the operator;
    ``epsilon_by_adversary`` labels the figures (:func:`estimator.fl.dp.epsilon_by_adversary`).

    After the four rows, on the same generator, a fifth: ``"DP-FTRL"`` (:func:`_ftrl_row`), at the
    noise whose ε equals the "σ 2.0" row's ``epsilon_known_sample`` (DP-FTRL's figure holds against
    everyone who sees only the models, so that is the figure to match)."""
    rng = np.random.default_rng(9)
    data, x_test, y_test = _example_data(rng)
    w_true = np.array(EXAMPLE_W_TRUE)
    u_true = w_true / np.linalg.norm(w_true)
    n = len(data)
    rows = []
    for name, clip, sigma in EXAMPLE_SETTINGS:
        w = np.zeros(w_true.size)
        participation = np.zeros(n, dtype=np.int64)
        for _ in range(rounds):
            idx = rng.choice(n, per_round, replace=False)
            participation[idx] += 1
            updates = []
            for i in idx:
                u = _local_update(w, *data[i])
                if clip is not None:
                    u = u * min(1.0, clip / float(np.linalg.norm(u)))
                updates.append(u)
            avg = np.mean(updates, axis=0)
            if sigma > 0:
                assert clip is not None
                avg = avg + rng.normal(0, sigma * clip / per_round, w.size)
            w = w + avg
        row: dict[str, Any] = {
            "setting": name,
            "accuracy": float(np.mean((x_test @ w > 0) == y_test)),
            "weight_error": float(np.linalg.norm(w / np.linalg.norm(w) - u_true)),
            "epsilon": None,
            "clip_norm": clip,
            "noise_multiplier": sigma,
            "rounds_participated_max": int(participation.max()),
        }
        if sigma > 0:
            acc = ClientLevelAccountant(FixedCountSampling(per_round), n, delta)
            realized = ClientLevelAccountant(FixedCountSampling(per_round), n, delta)
            for _ in range(rounds):
                acc.record(sigma)
            for _ in range(int(participation.max())):
                realized.record(sigma)
            row["epsilon"] = acc.epsilon()
            row["epsilon_amplified_rdp"] = acc.epsilon_amplified()
            row["epsilon_known_sample"] = acc.epsilon_known_sample()
            row["epsilon_known_sample_realized"] = realized.epsilon_known_sample()
            # central noise, added after the (simulated) server averaged the clipped updates: none for the operator
            row["epsilon_by_adversary"] = epsilon_by_adversary(
                acc, secagg=False, observer=row["epsilon"], known_sample=row["epsilon_known_sample"]
            )
        else:
            row["epsilon_amplified_rdp"] = row["epsilon_known_sample"] = row["epsilon_known_sample_realized"] = None
            row["epsilon_by_adversary"] = None
        row["epsilon_server_operator"] = None
        rows.append(row)
    matched = next(r for r in rows if r["setting"] == "σ 2.0")
    rows.append(_ftrl_row(rng, data, x_test, y_test, matched["epsilon_known_sample"], delta, rounds, per_round))
    rows.append(_ddg_example_row(data, x_test, y_test, matched["epsilon_known_sample"], delta, rounds, per_round))
    return {
        "scenario": "clinics-example",
        "seed": 9,
        "clinics": n,
        "rounds": rounds,
        "sampling": {"kind": "fixed_without_replacement", "count": per_round, "population": n},
        "delta": delta,
        "neighbors": "replace one clinic's data (sensitivity 2·clip on the sum)",
        "test_examples": int(len(y_test)),
        "rows": rows,
    }


def _ftrl_row(
    rng: np.random.Generator,
    data: list[tuple[np.ndarray, np.ndarray]],
    x_test: np.ndarray,
    y_test: np.ndarray,
    target_epsilon: float,
    delta: float,
    rounds: int,
    per_round: int,
    clip: float = 0.5,
) -> dict[str, Any]:
    """DP-FTRL (:mod:`estimator.fl.ftrl`) on the example, at ε = ``target_epsilon``.

    No secret sample: the rounds pass over the clinics in epochs, each epoch a permutation of the 20
    (``rng.permutation``) cut into ``per_round``-clinic rounds, so every clinic takes part exactly once
    per epoch; the tree restarts every epoch (R = 20 // 10 = 2 rounds; Kairouz et al. 2021, Sec. 4).
    The same local updates, clipping and unweighted average as the other rows; the model is the FTRL
    iterate w_t = Σ_{s≤t} avg_s + n_t / 10 with n_t the tree noise (per node N(0, (z·clip)²) on the sum).
    ε: replace-one clinic, each tree a Gaussian of sensitivity 2·clip·√⌈log2(R + 1)⌉, composed
    (:func:`estimator.fl.ftrl.ftrl_epsilon`), the same against observers, whoever knows the schedule
    and a coalition of clinics; None against the operator (central noise)."""
    n = len(data)
    every = max(1, n // per_round)
    z = ftrl_noise_for_epsilon(target_epsilon, rounds, delta, every, "replace")
    tree = TreeNoise(data[0][0].shape[1], z * clip / per_round, restart_every=every)
    w = np.zeros(data[0][0].shape[1])
    participation = np.zeros(n, dtype=np.int64)
    order = np.zeros(0, dtype=np.int64)
    for r in range(rounds):
        if r % every == 0:
            order = rng.permutation(n)
        idx = order[(r % every) * per_round : (r % every + 1) * per_round]
        participation[idx] += 1
        updates = []
        for i in idx:
            u = _local_update(w, *data[i])
            updates.append(u * min(1.0, clip / float(np.linalg.norm(u))))
        w = w + np.mean(updates, axis=0) + tree.advance(rng)
    acc = FtrlAccountant(every, delta, "replace")
    for _ in range(rounds):
        acc.record(z)
    eps = acc.epsilon()
    u_true = np.array(EXAMPLE_W_TRUE) / np.linalg.norm(EXAMPLE_W_TRUE)
    return {
        "setting": "DP-FTRL",
        "accuracy": float(np.mean((x_test @ w > 0) == y_test)),
        "weight_error": float(np.linalg.norm(w / np.linalg.norm(w) - u_true)),
        "epsilon": eps,
        "clip_norm": clip,
        "noise_multiplier": z,
        "rounds_participated_max": int(participation.max()),
        "epsilon_amplified_rdp": None,
        "epsilon_known_sample": eps,
        "epsilon_known_sample_realized": eps,
        "epsilon_rdp": ftrl_epsilon_rdp(z, rounds, delta, every, "replace"),
        "epsilon_by_adversary": epsilon_by_adversary(acc, secagg=False, observer=eps, known_sample=eps),
        "epsilon_server_operator": None,
        "restart_every": every,
        "trees": tree.trees,
        "matched_to": "the σ 2.0 row's epsilon_known_sample",
        "schedule": "epochs: a permutation of the clinics per epoch, each clinic once per tree",
    }


def _fmt_eps(e: float | None) -> str:
    return "—" if e is None else f"{e:.4g}"


def _eps_text(e: Any) -> str:
    """An ε for the tables: a number, a reason (text), or — for none."""
    return "—" if e is None else e if isinstance(e, str) else f"{e:.4g}"


def report_lines(result: dict[str, Any], cfg: ClinicsConfig) -> list[str]:
    """The table ``ldp study clinics`` prints for :func:`run_clinics`'s ``result`` under ``cfg``: each
    setting's accuracy and ε by adversary, the noise found for the target ε, and what ε protects."""
    lines = [
        f"clinics: {result['clinics']} clinics, {result['rounds']} rounds, Poisson q = {cfg.sample_rate} "
        f"(mean {cfg.sample_rate * cfg.clinics:g} per round), δ = {cfg.delta:g}; {result['data']}",
        f"{'setting':<22} {'clip':>6} {'σ':>6} {'accuracy':>9} {'client-level ε':>15} {'ε knows sample':>15} "
        f"{'ε server operator':>18}",
    ]
    for s in result["settings"]:
        clip = "—" if s["clip_norm"] is None else f"{s['clip_norm']:g}"
        sig = "—" if s["noise_multiplier"] is None else f"{s['noise_multiplier']:g}"
        operator = "—" if s["epsilon_by_adversary"] is None else "none"
        lines.append(
            f"{s['name']:<22} {clip:>6} {sig:>6} {s['test_accuracy']:>9.4f} {_eps_text(s['epsilon_observers']):>15} "
            f"{_eps_text(s['epsilon_known_sample']):>15} {operator:>18}"
        )
    for e, z in result.get("noise_for_epsilon", {}).items():
        lines.append(
            f"noise multiplier for ε = {e} over {result['rounds']} rounds at q = {cfg.sample_rate}: {z:.3f} "
            f"(test accuracy {result['accuracy_at_target_epsilon'][e]:.4f})"
        )
    lines.append(
        "ε protects whether one clinic took part (all its patients). client-level ε: against observers who "
        "see every model but not the Poisson sample (amplification by sampling credited). ε knows sample: "
        "against anyone who knows the sample and sees only the models (no amplification). ε server "
        "operator: none, the server adds the noise (central DP) after seeing every clipped update. "
        "—: no clipping, no DP accounting."
    )
    return lines


def example_report_lines(result: dict[str, Any]) -> list[str]:
    """The table ``ldp study clinics --example`` prints for :func:`run_example`'s ``result``: each setting's
    accuracy, weight error and ε by adversary, with what each ε protects against."""
    lines = [
        f"the user's example: default_rng(9), {result['clinics']} clinics, {result['rounds']} rounds, "
        f"{result['sampling']['count']} of {result['clinics']} per round without replacement, "
        f"δ = {result['delta']:g}, neighbours: {result['neighbors']}",
        f"{'setting':<14} {'accuracy':>9} {'weight err':>11} {'ε observers':>12} {'ε knows sample':>15} "
        f"{'ε this sample':>14} {'ε server operator':>18}",
    ]
    for r in result["rows"]:
        operator = r.get("epsilon_server_operator")
        op = "none" if operator is None and r["epsilon"] is not None else _fmt_eps(operator)
        if r.get("epsilon_server_operator_assumed_honest") is not None:
            op += (
                f" ({_fmt_eps(r['epsilon_server_operator_assumed_honest'])} if {r['assumed_honest_shares']} of "
                f"{result['sampling']['count']} honest)"
            )
        lines.append(
            f"{r['setting']:<14} {r['accuracy']:>9.3f} {r['weight_error']:>11.3f} {_fmt_eps(r['epsilon']):>12} "
            f"{_fmt_eps(r['epsilon_known_sample']):>15} {_fmt_eps(r['epsilon_known_sample_realized']):>14} "
            f"{op:>18}"
        )
    lines.append(
        "ε observers: against anyone who sees the models but not the sample (the smaller of dp_accounting's "
        "RDP bound for sampling without replacement and the unamplified exact bound"
        + (
            "; here RDP's bound is the larger, so amplification is not credited"
            if all(r["epsilon"] is None or r["epsilon"] >= r["epsilon_known_sample"] for r in result["rows"])
            else ""
        )
        + "). ε knows sample: against anyone who knows the sample and sees only the models (no "
        "amplification, a clinic may be in every round). ε this sample: the same for this run's sample (its "
        "most-sampled clinic's rounds). The server operator: none, the noise is central (added after the "
        "server averaged the clipped updates), except for distributed DG, whose devices add discrete Gaussian "
        "shares before secure aggregation (Kairouz, Liu, Steinke 2021; its bits per coordinate in the JSON): "
        "one figure for every adversary, no amplification credited, if every sampled device is genuine and honest; "
        "in brackets the operator's figure if only the assumed share of each round's devices is (the operator "
        "enrolls the devices and draws the sample: the rest may be its own, whose noise it knows). No noise: ε is infinite (— in the table, "
        "null in JSON)."
    )
    ftrl = next((r for r in result["rows"] if r["setting"] == "DP-FTRL"), None)
    if ftrl is not None:
        lines.append(
            f"DP-FTRL: tree-aggregated noise (z = {ftrl['noise_multiplier']:.3g} per node, a tree every "
            f"{ftrl['restart_every']} rounds, each clinic once per tree), no sampling assumed: its ε is the same "
            "for observers and for whoever knows the sample, matched to σ 2.0's ε knows sample."
        )
    return lines
