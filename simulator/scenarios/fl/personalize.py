"""Personalization on the label-skewed drift partition: per-client accuracy.

The data are :mod:`simulator.scenarios.fl.drift`'s (Dirichlet(α) label skew and a
per-client feature offset), but each client is scored on *its own* held-out
20 %: a model that serves the pooled test set well can still fail the clients
whose class mix is far from the average. Expectation (Li et al., Ditto, ICML
2021, §5, Table 1 and Fig. 3; Fallah et al., Per-FedAvg, NeurIPS 2020, §6):
under strong label skew a personalized model beats the single global model
on the typical client and most on the worst-served clients; MOON (Li, He, Song,
CVPR 2021) and SCAFFOLD improve the *global* model, which helps the pooled
accuracy more than the tail. What this scenario measures is printed; nothing
is forced to agree.

Model: a one-hidden-layer tanh MLP (MOON's contrastive term needs a
representation). Every strategy sees the same client schedule and training
seed. Evaluated after the last round: FedAvg, SCAFFOLD and MOON use the global
model on every client; Ditto its personal v_k; Per-FedAvg, and FedAvg as a
fine-tuned reference (``fedavg_finetune``), the global model after the same few
SGD steps of size α on the client's training data.

Summary per strategy: median and 10th percentile of per-client accuracy and the
mean over the worst decile (the ⌈N/10⌉ lowest clients), and the pooled accuracy
(all clients' test examples together).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from estimator.fl.aggregators import WeightedMean
from estimator.fl.personalization import Ditto, Moon, PerFedAvg
from estimator.fl.strategies import FedAvg, Scaffold
from ldp_core.fl.errors import FLError
from ldp_core.fl.models import MLP, accuracy
from ldp_core.fl.personalization import DittoSpec, MoonSpec, PerFedAvgSpec, Personalization
from ldp_core.fl.personalized_training import personalized_params
from ldp_core.fl.training import LocalTraining
from simulator.rounds import FederatedClient, RoundRecord, run_rounds
from simulator.scenarios.fl.drift import DriftConfig, ScheduledSampling, make_drift_clients

__all__ = [
    "METHODS",
    "PersonalizeConfig",
    "run_personalize",
    "summarize",
    "plot_personalize",
    "EXPECTATION",
    "report_lines",
]

EXPECTATION = (
    "Li et al., ICML 2021 (Ditto), §5, and Fallah et al., NeurIPS 2020 (Per-FedAvg), §6: under label skew "
    "personalized models beat the global one on the median client and most on the worst-served clients"
)


METHODS = ("fedavg", "fedavg_finetune", "scaffold", "ditto", "perfedavg", "moon")


@dataclasses.dataclass(frozen=True)
class PersonalizeConfig:
    """The drift partition and schedule (``drift``), the MLP width, and each method's parameters."""

    drift: DriftConfig = DriftConfig(
        rounds=60, iid_reference=False, training=LocalTraining(epochs=5, batch_size=10, learning_rate=0.1)
    )
    hidden: int = 32
    ditto: DittoSpec = DittoSpec(lam=0.1)
    perfedavg: PerFedAvgSpec = PerFedAvgSpec(inner_learning_rate=0.05, eval_steps=10)
    moon: MoonSpec = MoonSpec(mu=1.0, tau=0.5)
    methods: tuple[str, ...] = METHODS

    def __post_init__(self) -> None:
        unknown = sorted(set(self.methods) - set(METHODS))
        if unknown or not self.methods:
            raise FLError(f"PersonalizeConfig.methods must be a non-empty subset of {METHODS}, got {self.methods!r}")
        if isinstance(self.hidden, bool) or not isinstance(self.hidden, int) or self.hidden < 1:
            raise FLError(f"PersonalizeConfig.hidden must be a positive integer, got {self.hidden!r}")


def summarize(per_client: np.ndarray) -> dict[str, float]:
    """Median, 10th percentile and worst-decile mean (the ⌈N/10⌉ lowest) of per-client accuracies."""
    a = np.sort(np.asarray(per_client, dtype=np.float64))
    k = max(1, math.ceil(len(a) / 10))
    return {
        "median": float(np.median(a)),
        "p10": float(np.quantile(a, 0.1)),
        "worst_decile_mean": float(a[:k].mean()),
        "mean": float(a.mean()),
    }


def _evaluate(
    name: str,
    model: MLP,
    params: np.ndarray,
    spec: Personalization | None,
    clients: list[FederatedClient],
    tests: list[tuple[np.ndarray, np.ndarray]],
    training: LocalTraining,
    seed: int,
) -> dict[str, Any]:
    per, right, total = [], 0, 0
    for k, (c, (tX, ty)) in enumerate(zip(clients, tests, strict=True)):
        rng = np.random.default_rng([seed, 4, k])
        p = personalized_params(model, spec, params, c.state, c.X, c.y, training, rng)
        acc = accuracy(model, p, tX, ty)
        per.append(acc)
        right += int(round(acc * len(ty)))
        total += len(ty)
    arr = np.asarray(per)
    return {"name": name, "per_client_accuracy": arr.tolist(), **summarize(arr), "pooled_accuracy": right / total}


def run_personalize(
    cfg: PersonalizeConfig = PersonalizeConfig(), on_round: Callable[[RoundRecord], None] | None = None
) -> dict[str, Any]:
    """FedAvg, SCAFFOLD, Ditto, Per-FedAvg, MOON (and FedAvg fine-tuned) on the skewed partition.
    ``on_round`` is called after every federated round of every trained method, for progress display."""
    d = cfg.drift
    skewed, tests = make_drift_clients(d, np.random.default_rng([d.seed, 0]))
    schedule = ScheduledSampling.draw(d.clients, d.clients_per_round, d.rounds, np.random.default_rng([d.seed, 1]))
    model = MLP(d.features, cfg.hidden, d.classes)
    init = model.init_params(np.random.default_rng([d.seed, 5]))
    pooled = (np.concatenate([t[0] for t in tests]), np.concatenate([t[1] for t in tests]))
    tr = d.training
    want = set(cfg.methods)
    strategies: list[tuple[str, Any, Personalization | None]] = [
        (n, s, p)
        for key, n, s, p in [
            ("fedavg", "fedavg", FedAvg(tr), None),
            ("scaffold", "scaffold", Scaffold(tr), None),
            ("ditto", f"ditto_lam{cfg.ditto.lam:g}", Ditto(tr, spec=cfg.ditto), cfg.ditto),
            ("perfedavg", "perfedavg", PerFedAvg(tr, spec=cfg.perfedavg), cfg.perfedavg),
            ("moon", f"moon_mu{cfg.moon.mu:g}", Moon(tr, spec=cfg.moon), cfg.moon),
        ]
        if key in want or (key == "fedavg" and "fedavg_finetune" in want)
    ]
    runs = []
    for name, strategy, spec in strategies:
        clients = [FederatedClient(c.client_id, c.X, c.y) for c in skewed]
        x, hist = run_rounds(
            model,
            strategy,
            WeightedMean(),
            clients,
            ScheduledSampling(schedule.schedule),
            d.rounds,
            np.random.default_rng([d.seed, 2]),
            params=init,
            test=pooled,
            on_round=on_round,
        )
        run = _evaluate(name, model, x, spec, clients, tests, tr, d.seed)
        run["global_accuracy_per_round"] = [float(h.test_accuracy) for h in hist]  # type: ignore[arg-type]
        if name != "fedavg" or "fedavg" in want:
            runs.append(run)
        if name == "fedavg" and "fedavg_finetune" in want:
            ft = PerFedAvgSpec(cfg.perfedavg.inner_learning_rate, cfg.perfedavg.eval_steps)
            tuned = _evaluate("fedavg_finetune", model, x, ft, clients, tests, tr, d.seed)
            tuned["global_accuracy_per_round"] = run["global_accuracy_per_round"]
            runs.append(tuned)
    participations = np.bincount(np.concatenate([np.asarray(s) for s in schedule.schedule]), minlength=d.clients)
    return {
        "scenario": "personalize",
        "expectation": EXPECTATION,
        "seed": d.seed,
        "rounds": d.rounds,
        "clients": d.clients,
        "clients_per_round": d.clients_per_round,
        "model": f"MLP, {d.features} features, {cfg.hidden} tanh hidden units, {d.classes} classes",
        "partition": {
            "kind": "dirichlet",
            "alpha": d.dirichlet_alpha,
            "feature_shift": d.feature_shift,
            "class_separation": d.class_separation,
        },
        "training": {"epochs": tr.epochs, "batch_size": tr.batch_size, "learning_rate": tr.learning_rate},
        "ditto": {"lam": cfg.ditto.lam},
        "perfedavg": {
            "inner_learning_rate": cfg.perfedavg.inner_learning_rate,
            "eval_steps": cfg.perfedavg.eval_steps,
        },
        "moon": {"mu": cfg.moon.mu, "tau": cfg.moon.tau},
        "participations_min": int(participations.min()),
        "test_examples_per_client_min": int(min(len(t[1]) for t in tests)),
        "strategies": runs,
        "median": {r["name"]: r["median"] for r in runs},
        "worst_decile": {r["name"]: r["worst_decile_mean"] for r in runs},
    }


def plot_personalize(result: dict[str, Any], path: str) -> None:
    """Per-client accuracy: the empirical CDF per strategy, median and worst decile in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in result["strategies"]:
        a = np.sort(r["per_client_accuracy"])
        style: dict[str, Any] = dict(linestyle="--") if r["name"] == "fedavg_finetune" else {}
        ax.step(
            a,
            np.arange(1, len(a) + 1) / len(a),
            where="post",
            label=f"{r['name']} (median {r['median']:.2f}, worst decile {r['worst_decile_mean']:.2f})",
            **style,
        )
    ax.axhline(0.1, color="grey", linewidth=0.8, linestyle=":")
    p = result["partition"]
    ax.set_xlabel("accuracy on the client's own test data")
    ax.set_ylabel("fraction of clients")
    ax.set_title(
        f"per-client accuracy, Dirichlet α = {p['alpha']:g}, feature shift {p['feature_shift']:g}, "
        f"{result['rounds']} rounds, seed {result['seed']}",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report_lines(result: dict[str, Any]) -> list[str]:
    """The table ``ldp study personalize`` prints for :func:`run_personalize`'s ``result``: each strategy's
    per-client accuracy (median, 10th percentile, worst decile, mean) and its pooled accuracy."""
    lines = [
        f"personalize: {result['clients']} clients ({result['clients_per_round']} per round), "
        f"{result['rounds']} rounds, {result['model']}; Dirichlet α = {result['partition']['alpha']:g}, "
        f"feature shift {result['partition']['feature_shift']:g}; each client scored on its own test data "
        f"(at least {result['test_examples_per_client_min']} examples)",
        f"{'strategy':<18} {'median':>7} {'p10':>6} {'worst 10 %':>10} {'mean':>6} {'pooled':>7}",
    ]
    for r in result["strategies"]:
        lines.append(
            f"{r['name']:<18} {r['median']:>7.3f} {r['p10']:>6.3f} {r['worst_decile_mean']:>10.3f} "
            f"{r['mean']:>6.3f} {r['pooled_accuracy']:>7.3f}"
        )
    lines.append(f"expected: {result['expectation']}")
    return lines
