"""Non-IID drift: FedAvg, FedProx and SCAFFOLD on a skewed partition.

Expectation (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD:
stochastic controlled averaging for federated learning", ICML 2020, §7,
Table 3, logistic regression on EMNIST with few similar clients): with
heterogeneous clients and many local steps, FedAvg's clients drift towards
their own optima and the average of their models converges more slowly and to
a worse point; SCAFFOLD's control variates c − cᵢ correct each local step and
it matches or beats FedAvg; FedProx (Li et al., MLSys 2020) damps the drift
with (μ/2)‖y − x‖² and lands in between or near FedAvg. What this scenario
measures is printed; nothing is forced to agree.

Data (synthetic and seeded): K classes with means μ_c ~ N(0, s²·I_d) (s the
``class_separation``); client k draws n_k ∈ [n/2, 3n/2) examples with labels
from its own class mix p_k ~ Dirichlet(α·1_K) (α = 0.1: most clients hold one
to three classes; Hsu, Qi, Brown 2019's partition) and features
x = μ_y + o_k + N(0, I_d), where o_k ~ N(0, shift²·I_d) is a per-client
offset (feature shift). 80 % of each client's examples train, 20 % go to a
pooled test set. The IID reference pools the training examples, shuffles
them and deals them back to clients of the same sizes.

Model: softmax regression. Every strategy sees the *same* clients in each
round (a schedule of ``clients_per_round`` of N drawn once, uniformly without
replacement) and the same training seed.

:func:`run_drift_dp` (issue 13) puts client-level DP on FedAvg two ways at equal ε:
DP-FedAvg (:class:`~estimator.fl.dp.FixedClippingDP`, fresh Gaussian noise each round, on
the same schedule) and DP-FTRL (:class:`~estimator.fl.ftrl.DPFTRL`, tree-aggregated noise,
no sampling assumption). DP-FTRL's clients pass in epochs (:func:`epoch_schedule`: each
client once per tree of N // m rounds, the tree restarting every epoch). Its noise is
chosen so that its ε equals DP-FedAvg's ε against an adversary who knows the sample (the
figure DP-FTRL's holds against), and, in a second run, DP-FedAvg's ε against observers
who do not (amplification by a secret sample credited to DP-FedAvg only); a third run is the
first with Honaker's estimator of the tree noise (``efficient``). Neighbours:
replace one client's data (sampling a fixed count, as the FL accountant does).

:func:`compare_drift_ddg_to_central` (issue 13, "measure accuracy against the central-noise
version at equal ε") runs DP-FedAvg with central noise σ and with the distributed discrete
Gaussian (:class:`DDGMean`: each sampled client clips, rotates, rounds and adds its noise share in
Z_{2^bits}; the ring sum is decoded and divided by m) calibrated by
:func:`estimator.fl.ddg_accounting.noise_for_epsilon` to central's ε against whoever knows the
sample (the DDG's figure holds against the operator too), on the same schedule and training seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from estimator.fl.aggregators import (
    AggregateResult,
    Aggregator,
    RoundContext,
    ValidatingAggregator,
    WeightedMean,
)
from estimator.fl.ddg_accounting import (
    DEFAULT_ASSUMED_HONEST_FRACTION,
    DDGAccountant,
    assumed_honest_shares,
    noise_for_epsilon,
)
from estimator.fl.dp import ClientLevelAccountant, FixedClippingDP
from estimator.fl.ftrl import DPFTRL, FtrlAccountant, ftrl_noise_for_epsilon
from estimator.fl.sampling import FixedCountSampling
from estimator.fl.strategies import FedAvg, FedProx, Scaffold
from ldp_core.fl.ddg import DDGSpec
from ldp_core.fl.errors import FLError, SecAggError
from ldp_core.fl.models import SoftmaxRegression
from ldp_core.fl.training import ClientUpdate, LocalTraining
from simulator.plots import finish_axes, save_figure
from simulator.rounds import FederatedClient, RoundRecord, run_rounds

__all__ = [
    "DDGMean",
    "DriftConfig",
    "compare_drift_ddg_to_central",
    "DriftDPConfig",
    "ScheduledSampling",
    "epoch_schedule",
    "make_drift_clients",
    "make_drift_data",
    "run_drift",
    "run_drift_dp",
    "run_drift_study",
    "plot_drift",
    "plot_drift_ddg",
    "DATA_NOTE",
    "EXPECTATION",
    "report_lines",
]

T = TypeVar("T")

DATA_NOTE = (
    "synthetic seeded Gaussian classes; label skew by Dirichlet(α) class mixes per client "
    "and a per-client feature offset"
)
EXPECTATION = (
    "Karimireddy et al., ICML 2020 (SCAFFOLD), §7: under heterogeneity and many local steps "
    "SCAFFOLD >= FedAvg in accuracy per round; FedProx between or near FedAvg"
)


@dataclasses.dataclass(frozen=True)
class DriftConfig:
    clients: int = 50
    clients_per_round: int = 10
    classes: int = 10
    features: int = 20
    dirichlet_alpha: float = 0.1
    class_separation: float = 0.7
    feature_shift: float = 1.0
    mean_examples: int = 100
    rounds: int = 100
    training: LocalTraining = LocalTraining(epochs=10, batch_size=10, learning_rate=0.2)
    prox_mu: float = 0.1
    iid_reference: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("clients", "clients_per_round", "features", "mean_examples", "rounds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise FLError(f"DriftConfig.{name} must be a positive integer, got {v!r}")
        if self.classes < 2:
            raise FLError(f"DriftConfig.classes must be >= 2, got {self.classes}")
        if self.clients_per_round > self.clients:
            raise FLError(f"clients_per_round {self.clients_per_round} exceeds clients {self.clients}; lower it")
        if self.mean_examples < 4:
            raise FLError(f"mean_examples must be >= 4 (each client keeps 80 % for training), got {self.mean_examples}")
        for name in ("dirichlet_alpha", "class_separation", "prox_mu"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise FLError(f"DriftConfig.{name} must be a finite number > 0, got {v!r}")
        if not (math.isfinite(self.feature_shift) and self.feature_shift >= 0):
            raise FLError(f"DriftConfig.feature_shift must be a finite number >= 0, got {self.feature_shift!r}")
        if not 0 <= self.seed < 2**63:
            raise FLError(f"seed must be in [0, 2**63), got {self.seed}")


@dataclasses.dataclass
class ScheduledSampling:
    """Replays a fixed schedule: round r takes the clients at ``schedule[r]``.
    Used so that every strategy trains on the same clients in the same rounds;
    each run needs its own instance (it counts the rounds it has served)."""

    schedule: tuple[tuple[int, ...], ...]
    _next: int = dataclasses.field(default=0, init=False, repr=False)

    @classmethod
    def draw(cls, population: int, per_round: int, rounds: int, rng: np.random.Generator) -> ScheduledSampling:
        """``per_round`` of ``population`` uniformly without replacement, independently per round."""
        return cls(
            tuple(tuple(np.sort(rng.choice(population, per_round, replace=False)).tolist()) for _ in range(rounds))
        )

    def sample(self, clients: Sequence[T], rng: np.random.Generator) -> list[T]:
        if self._next >= len(self.schedule):
            raise FLError(f"the schedule has {len(self.schedule)} rounds; round {self._next} was asked for")
        idx = self.schedule[self._next]
        self._next += 1
        return [clients[i] for i in idx]

    def expected_clients(self, population: int) -> float:
        return float(len(self.schedule[0])) if self.schedule else 0.0


def epoch_schedule(population: int, per_round: int, rounds: int, rng: np.random.Generator) -> ScheduledSampling:
    """Rounds in epochs of ``population // per_round``: each epoch a permutation of the clients cut
    into rounds of ``per_round`` (the rest sit the epoch out), so a client is in at most one round
    of an epoch: DP-FTRL's once-per-tree condition with a tree per epoch."""
    every = population // per_round
    if every < 1:
        raise FLError(f"per_round {per_round} exceeds the population {population}")
    out: list[tuple[int, ...]] = []
    order = np.zeros(0, dtype=np.int64)
    for r in range(rounds):
        if r % every == 0:
            order = rng.permutation(population)
        k = r % every
        out.append(tuple(np.sort(order[k * per_round : (k + 1) * per_round]).tolist()))
    return ScheduledSampling(tuple(out))


def make_drift_clients(
    cfg: DriftConfig, rng: np.random.Generator
) -> tuple[list[FederatedClient], list[tuple[np.ndarray, np.ndarray]]]:
    """The skewed clients (their 80 % training split) and each client's own 20 % test split,
    in the same order; :func:`make_drift_data` pools the latter (personalization scores each client)."""
    K, d = cfg.classes, cfg.features
    means = rng.normal(scale=cfg.class_separation, size=(K, d))
    skewed, tests = [], []
    for k in range(cfg.clients):
        n = int(rng.integers(max(2, cfg.mean_examples // 2), max(3, 3 * cfg.mean_examples // 2)))
        mix = rng.dirichlet(np.full(K, cfg.dirichlet_alpha))
        y = rng.choice(K, size=n, p=mix)
        offset = rng.normal(scale=cfg.feature_shift, size=d)
        X = (means[y] + offset + rng.normal(size=(n, d))).astype(np.float32)
        cut = max(1, int(0.8 * n))
        skewed.append(FederatedClient(f"client{k:03d}", X[:cut], y[:cut]))
        tests.append((X[cut:], y[cut:]))
    return skewed, tests


def make_drift_data(
    cfg: DriftConfig, rng: np.random.Generator
) -> tuple[list[FederatedClient], list[FederatedClient], tuple[np.ndarray, np.ndarray]]:
    """(skewed clients, IID clients of the same sizes, pooled test set); see the module docstring."""
    skewed, tests = make_drift_clients(cfg, rng)
    X_all, y_all = np.concatenate([c.X for c in skewed]), np.concatenate([c.y for c in skewed])
    tX, ty = [t[0] for t in tests], [t[1] for t in tests]
    perm = rng.permutation(len(y_all))
    iid, start = [], 0
    for k, c in enumerate(skewed):
        idx = perm[start : start + len(c.y)]
        start += len(c.y)
        iid.append(FederatedClient(f"iid{k:03d}", X_all[idx], y_all[idx]))
    return skewed, iid, (np.concatenate(tX), np.concatenate(ty))


def _skew(clients: list[FederatedClient], K: int) -> dict[str, float]:
    shares = [np.bincount(c.y, minlength=K) / len(c.y) for c in clients]
    return {
        "majority_class_share_mean": float(np.mean([s.max() for s in shares])),
        "classes_per_client_mean": float(np.mean([(s >= 0.05).sum() for s in shares])),
    }


def _run(
    name: str,
    strategy: Any,
    clients: list[FederatedClient],
    cfg: DriftConfig,
    schedule: ScheduledSampling,
    test: tuple[np.ndarray, np.ndarray],
    aggregator: Aggregator | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    model = SoftmaxRegression(cfg.features, cfg.classes)
    fresh = [FederatedClient(c.client_id, c.X, c.y) for c in clients]
    sampling = ScheduledSampling(schedule.schedule)
    agg: Aggregator = WeightedMean() if aggregator is None else aggregator
    _, hist = run_rounds(
        model,
        strategy,
        agg,
        fresh,
        sampling,
        cfg.rounds,
        np.random.default_rng([cfg.seed, 2]),
        test=test,
        on_round=on_round,
    )
    acc = [float(h.test_accuracy) for h in hist]  # type: ignore[arg-type]
    tail = acc[-min(10, len(acc)) :]
    return {
        "name": name,
        "accuracy_per_round": acc,
        "final_accuracy": acc[-1],
        "best_accuracy": max(acc),
        "best_round": int(np.argmax(acc)) + 1,
        "mean_accuracy_last_10": float(np.mean(tail)),
    }


def run_drift(
    cfg: DriftConfig = DriftConfig(), on_round: Callable[[RoundRecord], None] | None = None
) -> dict[str, Any]:
    """Run FedAvg, FedProx(μ), SCAFFOLD (and FedAvg on the IID partition); return a JSON-ready result.
    ``on_round`` is called after every round of every strategy, for progress display."""
    skewed, iid, test = make_drift_data(cfg, np.random.default_rng([cfg.seed, 0]))
    schedule = ScheduledSampling.draw(
        cfg.clients, cfg.clients_per_round, cfg.rounds, np.random.default_rng([cfg.seed, 1])
    )
    tr = cfg.training
    runs = [
        _run("fedavg", FedAvg(tr), skewed, cfg, schedule, test, on_round=on_round),
        _run(f"fedprox_mu{cfg.prox_mu:g}", FedProx(tr, mu=cfg.prox_mu), skewed, cfg, schedule, test, on_round=on_round),
        _run("scaffold", Scaffold(tr), skewed, cfg, schedule, test, on_round=on_round),
    ]
    if cfg.iid_reference:
        runs.append(_run("fedavg_iid", FedAvg(tr), iid, cfg, schedule, test, on_round=on_round))
    steps = [tr.epochs * math.ceil(len(c.y) / tr.batch_size) for c in skewed]
    return {
        "scenario": "drift",
        "data": DATA_NOTE,
        "expectation": EXPECTATION,
        "seed": cfg.seed,
        "rounds": cfg.rounds,
        "clients": cfg.clients,
        "clients_per_round": cfg.clients_per_round,
        "model": f"softmax regression, {cfg.features} features, {cfg.classes} classes",
        "partition": {
            "kind": "dirichlet",
            "alpha": cfg.dirichlet_alpha,
            "feature_shift": cfg.feature_shift,
            "class_separation": cfg.class_separation,
            **_skew(skewed, cfg.classes),
        },
        "training": {
            "epochs": tr.epochs,
            "batch_size": tr.batch_size,
            "learning_rate": tr.learning_rate,
            "local_steps_mean": float(np.mean(steps)),
            "prox_mu": cfg.prox_mu,
        },
        "train_examples": int(sum(len(c.y) for c in skewed)),
        "test_examples": int(len(test[1])),
        "strategies": runs,
        "final_accuracy": {r["name"]: r["final_accuracy"] for r in runs},
        "best_accuracy": {r["name"]: r["best_accuracy"] for r in runs},
    }


@dataclasses.dataclass(frozen=True)
class DriftDPConfig:
    """Client-level DP for :func:`run_drift_dp`: clip norm C, DP-FedAvg's noise multiplier σ, δ."""

    clip_norm: float = 2.0
    noise_multiplier: float = 3.0
    delta: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("clip_norm", "noise_multiplier"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise FLError(f"DriftDPConfig.{name} must be a finite number > 0, got {v!r}")
        if not 0 < self.delta < 1:
            raise FLError(f"DriftDPConfig.delta must be in (0, 1), got {self.delta!r}")


def run_drift_dp(
    cfg: DriftConfig = DriftConfig(),
    dp: DriftDPConfig = DriftDPConfig(),
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """DP-FedAvg and DP-FTRL at equal ε on the skewed partition (see the module docstring). ``on_round`` is
    called after every round of every run (progress display; draws nothing)."""
    skewed, _, test = make_drift_data(cfg, np.random.default_rng([cfg.seed, 0]))
    n, m = cfg.clients, cfg.clients_per_round
    schedule = ScheduledSampling.draw(n, m, cfg.rounds, np.random.default_rng([cfg.seed, 1]))
    epochs = epoch_schedule(n, m, cfg.rounds, np.random.default_rng([cfg.seed, 3]))
    every = n // m
    tr = cfg.training
    C, sigma = float(dp.clip_norm), float(dp.noise_multiplier)
    acc = ClientLevelAccountant(FixedCountSampling(m), n, dp.delta)
    fedavg_agg = ValidatingAggregator(
        FixedClippingDP(WeightedMean(), C, sigma, accountant=acc, report_every=cfg.rounds)
    )
    fedavg = _run("dp_fedavg", FedAvg(tr), skewed, cfg, schedule, test, fedavg_agg, on_round)
    eps_observer, eps_known = acc.epsilon(), acc.epsilon_known_sample()
    fedavg.update(
        noise_multiplier=sigma,
        epsilon_observers=eps_observer,
        epsilon_known_sample=eps_known,
        schedule=f"{m} of {n} uniformly without replacement, independently per round",
    )
    runs = [fedavg]
    known = "DP-FedAvg's epsilon_known_sample"
    targets = [("dp_ftrl_at_known_sample_epsilon", eps_known, known, False)]
    if eps_observer < eps_known:
        targets.append(("dp_ftrl_at_observer_epsilon", eps_observer, "DP-FedAvg's epsilon_observers", False))
    targets.append(("dp_ftrl_honaker_at_known_sample_epsilon", eps_known, known, True))
    for name, target, matched, efficient in targets:
        z = ftrl_noise_for_epsilon(target, cfg.rounds, dp.delta, every, "replace")
        ftrl_acc = FtrlAccountant(every, dp.delta, "replace")
        ftrl = DPFTRL(WeightedMean(), C, z, every, ftrl_acc, efficient=efficient)
        run = _run(name, FedAvg(tr), skewed, cfg, epochs, test, ValidatingAggregator(ftrl), on_round)
        run.update(
            noise_multiplier=z,
            epsilon=ftrl_acc.epsilon(),
            matched_to=matched,
            efficient=efficient,
            restart_every=every,
            trees=ftrl.tree.trees if ftrl.tree is not None else 0,
            schedule=f"epochs of {every} rounds: a permutation of the {n} clients per epoch, each once per tree",
        )
        runs.append(run)
    return {
        "scenario": "drift-dp",
        "seed": cfg.seed,
        "rounds": cfg.rounds,
        "clients": n,
        "clients_per_round": m,
        "clip_norm": C,
        "delta": dp.delta,
        "neighbors": "replace one client's data",
        "server_operator": "none: the noise is central in both (added after the server saw the clipped updates)",
        "runs": runs,
        "final_accuracy": {r["name"]: r["final_accuracy"] for r in runs},
    }


@dataclasses.dataclass
class DDGMean:
    """The uniform mean of the round's updates under the distributed discrete Gaussian: every update
    is encoded as its device would (:meth:`DDGSpec.encode`: clip to C, rotate with the round's public
    seed, round, add the device's noise share, mod 2^bits), the words are summed mod 2^bits (what
    SecAgg unmasks, exactly; the masking itself is tested in tests/fl/test_fl_ddg.py), decoded and
    divided by the expected count m, as :class:`FixedClippingDP` divides its noisy sum. ``ctx.rng``
    draws the rotation seed, the rounding and the noise shares (a simulation: devices use a CSPRNG)."""

    spec: DDGSpec
    accountant: DDGAccountant | None = None
    linear: bool = dataclasses.field(default=False, init=False)

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        if len(updates) != self.spec.clients:
            raise FLError(f"the DDG spec expects {self.spec.clients} noise shares, the round has {len(updates)}")
        stack = np.stack([np.asarray(u.delta, dtype=np.float64) for u in updates])
        seed = int(ctx.rng.integers(2**62))
        words = self.spec.encode(stack, ctx.rng, seed)
        total = words.astype(np.int64).sum(axis=0) % self.spec.modulus
        if self.accountant is not None:
            self.accountant.record(self.spec)
        info = {"clip_norm": self.spec.clip_norm, "noise_stddev": self.spec.noise_stddev, "bits": self.spec.bits}
        mean = self.spec.decode_sum(total, seed) / ctx.expected_clients
        return AggregateResult(mean, ctx.expected_clients, len(updates), info)


def compare_drift_ddg_to_central(
    cfg: DriftConfig = DriftConfig(),
    dp: DriftDPConfig = DriftDPConfig(),
    bits: Sequence[int] = (8, 10, 12, 16),
    seeds: Sequence[int] = (0,),
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """Accuracy at equal ε on the skewed partition: DP-FedAvg with central noise σ (clip C) against
    FedAvg with the distributed DG at each bit width, its noise the smallest whose ε against the server
    (KLS21's bound, no amplification) is at most central's ε against whoever knows the sample. Per seed
    s (``cfg.seed`` replaced by s) every variant has the same data, schedule and training seed; only
    the noise differs. A bit width whose rounding floor cannot reach the ε gets ``"infeasible"``."""
    n, m, C, sigma = cfg.clients, cfg.clients_per_round, float(dp.clip_norm), float(dp.noise_multiplier)
    central_acc = ClientLevelAccountant(FixedCountSampling(m), n, dp.delta)
    for _ in range(cfg.rounds):
        central_acc.record(sigma)
    target = central_acc.epsilon_known_sample()
    dim = SoftmaxRegression(cfg.features, cfg.classes).num_params
    specs: dict[int, DDGSpec | None] = {}
    for b in bits:
        try:
            specs[b] = noise_for_epsilon(target, dp.delta, cfg.rounds, clip_norm=C, clients=m, dim=dim, bits=b)
        except (FLError, SecAggError):  # the rounding floor (or too few bits for m clients)
            specs[b] = None
    central: list[dict[str, Any]] = []
    by_bits: dict[int, list[dict[str, Any]]] = {b: [] for b in bits}
    eps_ddg: dict[int, float] = {}
    eps_honest: dict[int, float] = {}  # the operator's figure if only the assumed honest share adds noise
    honest = assumed_honest_shares(m, DEFAULT_ASSUMED_HONEST_FRACTION)
    for s in seeds:
        c = dataclasses.replace(cfg, seed=int(s))
        skewed, _, test = make_drift_data(c, np.random.default_rng([c.seed, 0]))
        schedule = ScheduledSampling.draw(n, m, c.rounds, np.random.default_rng([c.seed, 1]))
        agg = ValidatingAggregator(FixedClippingDP(WeightedMean(), C, sigma))
        central.append(_run("dp_fedavg", FedAvg(c.training), skewed, c, schedule, test, agg, on_round))
        for b in bits:
            spec = specs[b]
            if spec is None:
                continue
            acc = DDGAccountant(dp.delta)
            ddg = ValidatingAggregator(DDGMean(spec, acc))
            run = _run(f"ddg_{b}", FedAvg(c.training), skewed, c, schedule, test, ddg, on_round)
            eps_ddg[b] = acc.epsilon()
            eps_honest[b] = acc.epsilon(shares=honest)
            by_bits[b].append(run)

    def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
        final = [r["final_accuracy"] for r in runs]
        last = [r["mean_accuracy_last_10"] for r in runs]
        return {
            "final_accuracy": final,
            "final_accuracy_mean": float(np.mean(final)),
            "final_accuracy_sd": float(np.std(final)),
            "mean_accuracy_last_10": last,
            "mean_accuracy_last_10_mean": float(np.mean(last)),
        }

    rows: list[dict[str, Any]] = [
        {
            "noise": "central",
            "bits": None,
            "noise_multiplier": sigma,
            "epsilon_known_sample": target,
            "holds_against_operator": False,
            **summary(central),
        }
    ]
    for b in bits:
        spec = specs[b]
        if spec is None:
            rows.append({"noise": "distributed_discrete_gaussian", "bits": b, "infeasible": True})
            continue
        rows.append(
            {
                "noise": "distributed_discrete_gaussian",
                "bits": b,
                "noise_multiplier": spec.noise_stddev / C,
                "epsilon_server_operator": eps_ddg[b],
                "epsilon_server_operator_assumed_honest": eps_honest[b],
                "assumed_honest_shares": honest,
                "holds_against_operator": True,
                "gamma": spec.gamma,
                "modular_clipping_bound_per_round": spec.modular_clipping_bound(),
                "infeasible": False,
                **summary(by_bits[b]),
            }
        )
    return {
        "scenario": "drift-ddg",
        "seeds": [int(s) for s in seeds],
        "rounds": cfg.rounds,
        "clients": n,
        "clients_per_round": m,
        "clip_norm": C,
        "delta": dp.delta,
        "dim": dim,
        "target_epsilon": target,
        "matched_to": "central DP-FedAvg's epsilon_known_sample",
        "rows": rows,
    }


def plot_drift(result: dict[str, Any], path: str) -> None:
    """Test accuracy per round, one line per strategy (matplotlib, server extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in result["strategies"]:
        style: dict[str, Any] = dict(linestyle="--", color="grey") if r["name"].endswith("_iid") else {}
        acc = r["accuracy_per_round"]
        ax.plot(range(1, len(acc) + 1), acc, label=f"{r['name']} (final {r['final_accuracy']:.3f})", **style)
    p = result["partition"]
    title = (
        f"non-IID drift: Dirichlet α = {p['alpha']:g}, feature shift {p['feature_shift']:g}, "
        f"{result['clients_per_round']} of {result['clients']} clients per round"
    )
    finish_axes(ax, "round", "test accuracy", title)
    save_figure(fig, path)


def plot_drift_ddg(result: dict[str, Any], path: str) -> None:
    """Final test accuracy (mean over the seeds, each seed a dot) and the noise multiplier per bit
    width, central noise as the reference line (:func:`compare_drift_ddg_to_central`'s result)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    central = rows[0]
    ddg = [r for r in rows[1:] if not r["infeasible"]]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.6))
    xs = [str(r["bits"]) for r in ddg]
    ax.bar(xs, [r["final_accuracy_mean"] for r in ddg], color="tab:blue", alpha=0.6, label="distributed DG")
    for i, r in enumerate(ddg):
        ax.plot([i] * len(r["final_accuracy"]), r["final_accuracy"], "k.", ms=4)
    ax.axhline(central["final_accuracy_mean"], color="tab:red", ls="--", label="central (σ, not vs operator)")
    ax.set_xlabel("bits per coordinate")
    ax.set_ylabel("final test accuracy")
    ax.legend(fontsize=8)
    bx.bar(xs, [r["noise_multiplier"] for r in ddg], color="tab:blue", alpha=0.6)
    bx.axhline(central["noise_multiplier"], color="tab:red", ls="--")
    bx.set_xlabel("bits per coordinate")
    bx.set_ylabel("noise multiplier at equal ε")
    fig.suptitle(
        f"drift, ε = {result['target_epsilon']:.2f} (central's vs whoever knows the sample), seeds {result['seeds']}",
        fontsize=9,
    )
    save_figure(fig, path)


def report_lines(result: dict[str, Any]) -> list[str]:
    """The tables ``ldp study drift`` prints for :func:`run_drift`'s ``result`` (with its ``dp`` entry from
    :func:`run_drift_dp` and ``ddg`` from :func:`compare_drift_ddg_to_central` when present)."""
    p, t = result["partition"], result["training"]
    lines = [
        f"drift: {result['clients']} clients ({result['clients_per_round']} per round), {result['rounds']} rounds, "
        f"{result['model']}; Dirichlet α = {p['alpha']:g} (majority class share {p['majority_class_share_mean']:.2f}), "
        f"feature shift {p['feature_shift']:g}; {t['local_steps_mean']:.0f} local steps on average; {result['data']}",
        f"{'strategy':<16} {'final':>7} {'best':>7} {'round':>6} {'mean last 10':>13}",
    ]
    for r in result["strategies"]:
        lines.append(
            f"{r['name']:<16} {r['final_accuracy']:>7.4f} {r['best_accuracy']:>7.4f} {r['best_round']:>6} "
            f"{r['mean_accuracy_last_10']:>13.4f}"
        )
    lines.append(f"expected: {result['expectation']}")
    if "dp" in result:
        lines += _dp_lines(result["dp"])
    if "ddg" in result:
        lines += _ddg_lines(result["ddg"])
    return lines


def _dp_lines(dp: dict[str, Any]) -> list[str]:
    lines = [
        f"client-level DP (clip {dp['clip_norm']:g}, δ = {dp['delta']:g}, {dp['neighbors']}); "
        f"server operator: {dp['server_operator']}",
        f"{'run':<32} {'z':>6} {'ε':>8} {'final':>7} {'mean last 10':>13}",
    ]
    for r in dp["runs"]:
        eps = r.get("epsilon", r.get("epsilon_known_sample"))
        lines.append(
            f"{r['name']:<32} {r['noise_multiplier']:>6.3f} {eps:>8.2f} {r['final_accuracy']:>7.4f} "
            f"{r['mean_accuracy_last_10']:>13.4f}"
        )
    lines.append(
        f"dp_fedavg's ε: {dp['runs'][0]['epsilon_known_sample']:.2f} against whoever knows the sample, "
        f"{dp['runs'][0]['epsilon_observers']:.2f} against observers who do not; DP-FTRL's holds for both."
    )
    return lines


def _ddg_lines(ddg: dict[str, Any]) -> list[str]:
    lines = [f"distributed DG at ε = {ddg['target_epsilon']:.2f} (central's, against whoever knows the sample):"]
    for r in ddg["rows"]:
        if r.get("infeasible"):
            lines.append(
                f"  {r['bits']:>2} bits: infeasible (the rounding floor exceeds the ε, or too few bits for m clients)"
            )
            continue
        label = "central" if r["bits"] is None else f"{r['bits']:>2} bits"
        lines.append(
            f"  {label:<8} z {r['noise_multiplier']:.3f}  operator: {'yes' if r['holds_against_operator'] else 'no'}"
            + (
                f" (ε {r['epsilon_server_operator']:.2f} if all honest, "
                f"{r['epsilon_server_operator_assumed_honest']:.2f} if {r['assumed_honest_shares']} of each round's "
                "devices are)"
                if r.get("epsilon_server_operator_assumed_honest") is not None
                else ""
            )
            + f"  final {r['final_accuracy_mean']:.4f}  mean last 10 {r['mean_accuracy_last_10_mean']:.4f}"
        )
    return lines


def run_drift_study(
    cfg: DriftConfig = DriftConfig(),
    dp: DriftDPConfig | None = None,
    ddg_bits: Sequence[int] | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """:func:`run_drift`; with ``dp`` also :func:`run_drift_dp` (key ``dp``), and with ``ddg_bits`` too the
    distributed discrete Gaussian at DP-FedAvg's ε per bit width (key ``ddg``,
    :func:`compare_drift_ddg_to_central` on ``cfg.seed``)."""
    if ddg_bits is not None and dp is None:
        raise ValueError("the distributed DG is matched to DP-FedAvg's ε: give dp with ddg_bits")
    result = run_drift(cfg, on_round)
    if dp is not None:
        result["dp"] = run_drift_dp(cfg, dp, on_round)
        if ddg_bits is not None:
            result["ddg"] = compare_drift_ddg_to_central(cfg, dp, ddg_bits, (cfg.seed,), on_round)
    return result
