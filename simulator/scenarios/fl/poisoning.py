"""Model poisoning in FL: label flipping, a scaled backdoor and sign flipping against
mean, coordinate median, trimmed mean, Krum and FLTrust.

Scenario-level, not through the real job: FLTrust needs the server to hold a trusted
root dataset and train on it every round, and the job (estimator/fl/job.py) holds no
data of its own. Here the server's root update is local training, with the clients'
procedure, on ``root_examples`` clean examples from the task distribution (Cao et al.,
NDSS 2021, use 100), started from the same global model as the clients.

Data: ``classes`` Gaussian classes in ``features`` dimensions (class means N(0, σ²I) on
all but the last ``trigger_dims`` features, unit noise everywhere), softmax regression,
``clients`` clients with ``examples`` IID examples each, a fraction of them malicious:

* ``label_flip``: malicious clients train honestly on labels y → k − 1 − y.
  Attack success: share of clean test examples predicted as their flipped label.
* ``backdoor``: malicious clients add a trigger (the last ``trigger_dims`` features set to
  ``trigger_value``) to half their examples, relabel those ``target``, and boost their
  update by ``boost`` (model replacement, Bagdasaryan et al. AISTATS 2020). Attack
  success: share of triggered test examples of other classes predicted ``target``.
* ``sign_flip``: malicious clients send −``boost`` × their honest update. Untargeted:
  accuracy is the measure, attack success is reported as null.

The robust rules get f = the number of malicious clients (the most favourable setting
for them); FLTrust gets no f. ``fltrust_dp`` is DP-FLTrust (:class:`estimator.fl.dp.DPFLTrust`,
the job's ``"divisor": "expected_clients"``): the root update clipped to ``dp_clip``, the trust-
weighted sum plus N(0, (``dp_noise_multiplier``·C)²) over the expected cohort (every client,
every round); its rows carry the mean step scale Σ TSᵢ/m̄ and the result the task's client-level ε
(:class:`estimator.fl.dp.ClientLevelAccountant`, all clients sampled, replace-one neighbours).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from estimator.fl.aggregators import Aggregator, RoundContext, WeightedMean
from estimator.fl.dp import ClientLevelAccountant, DPFLTrust
from estimator.fl.robust import CoordinateMedian, FLTrust, Krum, TrimmedMean
from estimator.fl.sampling import FixedCountSampling
from ldp_core.fl import ClientUpdate, SoftmaxRegression

__all__ = [
    "PoisoningConfig",
    "ATTACKS",
    "AGGREGATORS",
    "DP_AGGREGATOR",
    "run_fl_poisoning",
    "run_one",
    "plot_fl_poisoning",
    "dp_privacy",
    "report_lines",
]

ATTACKS = ("label_flip", "backdoor", "sign_flip")
AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "fltrust")
#: DP-FLTrust, run only when asked for (``ldp fl attack --poisoning --dp-fltrust``)
DP_AGGREGATOR = "fltrust_dp"


@dataclasses.dataclass(frozen=True)
class PoisoningConfig:
    clients: int = 20
    examples: int = 100
    root_examples: int = 100
    features: int = 20
    trigger_dims: int = 4
    trigger_value: float = 4.0
    classes: int = 5
    class_sd: float = 1.0
    rounds: int = 40
    local_steps: int = 5
    lr: float = 0.5
    boost: float = 5.0
    target: int = 0
    fractions: tuple[float, ...] = (0.1, 0.2, 0.3)
    test_examples: int = 2000
    seed: int = 0
    dp_clip: float = 0.1
    dp_noise_multiplier: float = 1.0
    delta: float = 1e-5


@dataclasses.dataclass(frozen=True)
class _Data:
    means: np.ndarray

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, self.means.shape[0], size=n)
        return self.means[y] + rng.normal(size=(n, self.means.shape[1])), y


def _trigger(X: np.ndarray, cfg: PoisoningConfig) -> np.ndarray:
    X = X.copy()
    X[:, -cfg.trigger_dims :] = cfg.trigger_value
    return X


def _local(model: SoftmaxRegression, w: np.ndarray, X: np.ndarray, y: np.ndarray, cfg: PoisoningConfig) -> np.ndarray:
    """``local_steps`` full-batch gradient steps from ``w``; returns the update (new − old)."""
    p = w.astype(np.float64).copy()
    for _ in range(cfg.local_steps):
        _, g = model.loss_and_grad(p, X, y)
        p -= cfg.lr * np.asarray(g, dtype=np.float64) / len(y)
    return p - w


def _make_aggregator(
    name: str, f: int, root: Callable[[RoundContext], np.ndarray], cfg: PoisoningConfig = PoisoningConfig()
) -> Aggregator:
    inner = WeightedMean()
    if name == "mean":
        return inner
    if name == "median":
        return CoordinateMedian(inner, f=f)
    if name == "trimmed_mean":
        return TrimmedMean(inner, f=f)
    if name == "krum":
        return Krum(inner, f=f)
    if name == "fltrust":
        return FLTrust(inner, root=root)
    if name == "fltrust_dp":
        return DPFLTrust(root, cfg.dp_clip, cfg.dp_noise_multiplier)
    raise ValueError(f"unknown aggregator {name!r}; one of {(*AGGREGATORS, DP_AGGREGATOR)}")


def _setup(
    cfg: PoisoningConfig,
) -> tuple[_Data, list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng([cfg.seed, 1])
    means = np.zeros((cfg.classes, cfg.features))
    means[:, : cfg.features - cfg.trigger_dims] = cfg.class_sd * rng.normal(
        size=(cfg.classes, cfg.features - cfg.trigger_dims)
    )
    data = _Data(means)
    local = [data.draw(cfg.examples, rng) for _ in range(cfg.clients)]
    return data, local, data.draw(cfg.root_examples, rng), data.draw(cfg.test_examples, rng)


def run_one(
    cfg: PoisoningConfig,
    attack: str | None,
    fraction: float,
    aggregator: str,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Train with ``round(fraction · clients)`` malicious clients (the first ones); final accuracy and attack success.
    ``on_round(r)`` is called after each round (progress display; draws nothing)."""
    if attack is not None and attack not in ATTACKS:
        raise ValueError(f"unknown attack {attack!r}; one of {ATTACKS}")
    _, local, (Xr, yr), (Xt, yt) = _setup(cfg)
    m = 0 if attack is None else int(round(fraction * cfg.clients))
    k = cfg.classes
    model = SoftmaxRegression(cfg.features, k)
    rng = np.random.default_rng([cfg.seed, 2])
    w = np.zeros(model.num_params)
    poisoned = []
    for i, (X, y) in enumerate(local):
        if i < m and attack == "label_flip":
            y = k - 1 - y
        elif i < m and attack == "backdoor":
            half = len(y) // 2
            X = np.concatenate([X, _trigger(X[:half], cfg)])
            y = np.concatenate([y, np.full(half, cfg.target)])
        poisoned.append((X, y))
    state = {"w": w}
    agg = _make_aggregator(aggregator, max(m, 1), lambda ctx: _local(model, state["w"], Xr, yr, cfg), cfg)
    step_scales = []
    for r in range(cfg.rounds):
        ups = []
        for i, (X, y) in enumerate(poisoned):
            d = _local(model, state["w"], X, y, cfg)
            if i < m and attack == "backdoor":
                d = cfg.boost * d
            elif i < m and attack == "sign_flip":
                d = -cfg.boost * d
            ups.append(ClientUpdate(f"c{i}", r, d.astype(np.float32), len(y)))
        res = agg.aggregate(ups, RoundContext(r, model.num_params, rng, float(cfg.clients)))
        if "trust_total" in res.info:
            step_scales.append(res.info["trust_total"] / cfg.clients)
        state["w"] = state["w"] + res.delta
        if on_round is not None:
            on_round(r)
    w = state["w"]
    pred = model.predict(w.astype(np.float32), Xt)
    out: dict[str, Any] = {
        "attack": attack,
        "fraction": fraction if attack is not None else 0.0,
        "malicious_clients": m,
        "aggregator": aggregator,
        "accuracy": float(np.mean(pred == yt)),
        "attack_success_rate": None,
    }
    if step_scales:  # DP-FLTrust: how much shorter than FLTrust's mean its step is (Σ TSᵢ/m̄, per round)
        out["mean_step_scale"] = float(np.mean(step_scales))
    if attack == "label_flip":
        mask = (k - 1 - yt) != yt
        out["attack_success_rate"] = float(np.mean(pred[mask] == (k - 1 - yt[mask])))
    elif attack == "backdoor":
        mask = yt != cfg.target
        out["attack_success_rate"] = float(
            np.mean(model.predict(w.astype(np.float32), _trigger(Xt[mask], cfg)) == cfg.target)
        )
    return out


def run_fl_poisoning(
    cfg: PoisoningConfig = PoisoningConfig(),
    attacks: Sequence[str] = ATTACKS,
    aggregators: Sequence[str] = AGGREGATORS,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Every attack × fraction × aggregator, plus each aggregator without attackers. ``on_round`` is called after
    every round of every run, ``(1 + len(attacks) · len(cfg.fractions)) · len(aggregators) · cfg.rounds`` times."""
    clean = {a: run_one(cfg, None, 0.0, a, on_round)["accuracy"] for a in aggregators}
    results = [run_one(cfg, att, fr, a, on_round) for att in attacks for fr in cfg.fractions for a in aggregators]
    return {
        "scenario": "poisoning",
        "model": f"softmax regression, {cfg.features} features, {cfg.classes} classes",
        "clients": cfg.clients,
        "examples_per_client": cfg.examples,
        "root_examples": cfg.root_examples,
        "rounds": cfg.rounds,
        "boost": cfg.boost,
        "target": cfg.target,
        "seed": cfg.seed,
        "clean_accuracy": clean,
        "results": results,
        **({DP_AGGREGATOR: dp_privacy(cfg)} if DP_AGGREGATOR in aggregators else {}),
    }


def dp_privacy(cfg: PoisoningConfig) -> dict[str, Any]:
    """The client-level (ε, δ) of the ``fltrust_dp`` runs: ``rounds`` Gaussian rounds of multiplier σ with every
    client sampled (no amplification), replace-one neighbours (the job's accountant for this sampling)."""
    acc = ClientLevelAccountant(FixedCountSampling(cfg.clients), cfg.clients, cfg.delta)
    for _ in range(cfg.rounds):
        acc.record(cfg.dp_noise_multiplier)
    return {
        "clip_norm": cfg.dp_clip,
        "noise_multiplier": cfg.dp_noise_multiplier,
        "delta": cfg.delta,
        "epsilon": acc.epsilon(),
    }


def plot_fl_poisoning(result: dict[str, Any], path: str) -> None:
    """Top: final accuracy per attack and malicious fraction, one bar per aggregator; bottom: attack success."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    attacks = list(dict.fromkeys(r["attack"] for r in rows))
    aggs = list(dict.fromkeys(r["aggregator"] for r in rows))
    fig, axes = plt.subplots(2, len(attacks), figsize=(4 * len(attacks), 6.5), squeeze=False)
    width = 0.8 / len(aggs)
    for j, att in enumerate(attacks):
        fracs = sorted({r["fraction"] for r in rows if r["attack"] == att})
        xs = np.arange(len(fracs))
        for a_i, agg in enumerate(aggs):
            sel = {r["fraction"]: r for r in rows if r["attack"] == att and r["aggregator"] == agg}
            acc = [sel[f]["accuracy"] for f in fracs]
            asr = [sel[f]["attack_success_rate"] or 0.0 for f in fracs]
            axes[0][j].bar(xs + a_i * width - 0.4 + width / 2, acc, width, label=agg, color=f"C{a_i}")
            axes[1][j].bar(xs + a_i * width - 0.4 + width / 2, asr, width, label=agg, color=f"C{a_i}")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xticks(xs, [f"{f:.0%}" for f in fracs])
            ax.set_ylim(0, 1.05)
        axes[0][j].set_title(att, fontsize=10)
        axes[1][j].set_xlabel("malicious clients")
        if att == "sign_flip":
            axes[1][j].text(
                0.5, 0.5, "untargeted:\naccuracy is the measure", ha="center", transform=axes[1][j].transAxes
            )
    axes[0][0].set_ylabel("final test accuracy")
    axes[1][0].set_ylabel("attack success rate")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report_lines(result: dict[str, Any]) -> list[str]:
    """The table ``ldp study attack --poisoning`` prints for :func:`run_fl_poisoning`'s ``result``: each
    attack, malicious fraction and aggregator's accuracy and attack success (and DP-FLTrust's ε if run)."""
    lines = [
        f"poisoning: {result['model']}, {result['clients']} clients, {result['root_examples']} root examples, "
        f"{result['rounds']} rounds, boost {result['boost']:g}",
        "clean accuracy: " + ", ".join(f"{k} {v:.3f}" for k, v in result["clean_accuracy"].items()),
        f"{'attack':<11} {'malicious':>9} {'aggregator':<13} {'accuracy':>8} {'attack success':>14}",
    ]
    for r in result["results"]:
        asr = "—" if r["attack_success_rate"] is None else f"{r['attack_success_rate']:.3f}"
        step = f"  step scale {r['mean_step_scale']:.3f}" if "mean_step_scale" in r else ""
        lines.append(
            f"{r['attack']:<11} {r['fraction']:>9.0%} {r['aggregator']:<13} {r['accuracy']:>8.3f} {asr:>14}{step}"
        )
    dp = result.get(DP_AGGREGATOR)
    if dp is not None:
        lines.append(
            f"{DP_AGGREGATOR}: C {dp['clip_norm']:g}, noise multiplier {dp['noise_multiplier']:g}, client-level "
            f"epsilon {dp['epsilon']:.1f} at delta {dp['delta']:g} (every client every round: no amplification)"
        )
    return lines
