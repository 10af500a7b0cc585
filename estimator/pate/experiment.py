"""``ldp pate``: PATE end to end on scikit-learn's ``load_digits`` (shipped with the package, offline).

The 1,797 8×8 digits are split, by a seeded permutation, into the *sensitive* part (teachers' training
data), the *public* part (unlabeled inputs the student may ask about) and a *test* part. Every sensitive
record is assigned to one teacher by its own independent draw (so adding or removing a record moves no
other record between teachers), each teacher is a softmax regression (:mod:`ldp_core.fl.models`)
trained on its partition, and the student, the same model, is trained on the public inputs the
aggregator labelled. The semi-private path (public inputs, private labels only) is measured against
DP-SGD training of the same model on the sensitive data at the same (ε, δ).

Everything here is a seeded study: the printed ε holds only against someone who does not know the seed
(a release would draw the aggregator's noise from :func:`ldp_core.randomness.secure_generator`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from estimator.pate.accounting import PROTECTS, data_dependent, data_independent
from estimator.pate.aggregators import confident_gnmax, gnmax, lnmax, vote_histograms
from ldp_core.fl.models import SoftmaxRegression, accuracy

__all__ = ["Digits", "load_digits_split", "train_softmax", "Teachers", "train_teachers", "Config", "DEFAULT_CONFIGS"]
__all__ += ["run_config", "run_pate", "plot_tradeoff"]


@dataclasses.dataclass(frozen=True)
class Digits:
    x_sensitive: np.ndarray
    y_sensitive: np.ndarray
    x_public: np.ndarray
    y_public: np.ndarray  # never given to the student: used to measure the labels' accuracy only
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int = 10


def load_digits_split(rng: np.random.Generator, public: int = 400, test: int = 397) -> Digits:
    """``load_digits`` scaled to [0, 1], split by ``rng`` into sensitive, public and test parts."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    order = rng.permutation(len(x))
    te, pu, se = order[:test], order[test : test + public], order[test + public :]
    return Digits(x[se], y[se], x[pu], y[pu], x[te], y[te])


def train_softmax(
    x: np.ndarray, y: np.ndarray, n_classes: int, rng: np.random.Generator, steps: int = 300, lr: float = 1.0
) -> np.ndarray:
    """Full-batch gradient descent on a softmax regression (L2 1e-3); the parameters."""
    model = SoftmaxRegression(x.shape[1], n_classes, l2=1e-3)
    w = model.init_params(rng)
    for _ in range(steps):
        _, g = model.loss_and_grad(w, x, y)
        w = w - np.float32(lr) * g
    return w


@dataclasses.dataclass(frozen=True)
class Teachers:
    params: list[np.ndarray]
    sizes: list[int]
    accuracy: list[float]  # each teacher's test accuracy

    def predict(self, x: np.ndarray, n_classes: int) -> np.ndarray:
        """teachers × rows of predicted labels."""
        model = SoftmaxRegression(x.shape[1], n_classes, l2=1e-3)
        return np.stack([model.predict(p, x) for p in self.params])


def train_teachers(data: Digits, n: int, rng: np.random.Generator) -> Teachers:
    """``n`` teachers, each on the sensitive records whose own draw assigned them to it."""
    owner = rng.integers(0, n, size=len(data.x_sensitive))
    model = SoftmaxRegression(data.x_sensitive.shape[1], data.n_classes, l2=1e-3)
    params, sizes, accs = [], [], []
    for t in range(n):
        rows = owner == t
        w = train_softmax(data.x_sensitive[rows], data.y_sensitive[rows], data.n_classes, rng)
        params.append(w)
        sizes.append(int(rows.sum()))
        accs.append(accuracy(model, w, data.x_test, data.y_test))
    return Teachers(params, sizes, accs)


@dataclasses.dataclass(frozen=True)
class Config:
    """One aggregator setting: ``kind`` in lnmax, gnmax, confident; ``sigma`` is GNMax's σ (σ₂ for
    Confident-GNMax) or LNMax's Laplace scale; ``queries`` how many public inputs the student asks about."""

    kind: str
    sigma: float
    queries: int
    threshold: float | None = None
    sigma1: float | None = None

    def label(self) -> str:
        if self.kind == "confident":
            return f"Confident-GNMax T={self.threshold:g} σ1={self.sigma1:g} σ2={self.sigma:g}"
        return f"{'GNMax σ' if self.kind == 'gnmax' else 'LNMax b'}={self.sigma:g}"


#: The trade-off table of ``ldp pate`` (for 25 teachers and 400 public inputs; T in votes).
DEFAULT_CONFIGS: tuple[Config, ...] = (
    Config("gnmax", 4.0, 100),
    Config("gnmax", 4.0, 200),
    Config("gnmax", 4.0, 400),
    Config("gnmax", 8.0, 200),
    Config("gnmax", 8.0, 400),
    Config("lnmax", 4.0, 100),
    Config("confident", 2.0, 400, threshold=20.0, sigma1=12.5),
    Config("confident", 4.0, 400, threshold=15.0, sigma1=12.5),
    Config("confident", 4.0, 400, threshold=20.0, sigma1=12.5),
)


def run_config(
    cfg: Config,
    votes: np.ndarray,
    data: Digits,
    delta: float,
    rng: np.random.Generator,
    student_rng: np.random.Generator,
) -> dict[str, Any]:
    """Label ``cfg.queries`` public inputs with the aggregator, train the student on the answered ones and
    account; one row of the trade-off table."""
    v = votes[: cfg.queries]
    if cfg.kind == "confident":
        assert cfg.threshold is not None and cfg.sigma1 is not None
        ans = confident_gnmax(v, cfg.threshold, cfg.sigma1, cfg.sigma, rng)
        labels, mask = ans.labels, ans.answered
    else:
        labels = lnmax(v, cfg.sigma, rng) if cfg.kind == "lnmax" else gnmax(v, cfg.sigma, rng)
        mask = np.ones(len(v), dtype=bool)
    answered = int(mask.sum())
    row: dict[str, Any] = {"aggregator": cfg.kind, "setting": cfg.label(), "queries": cfg.queries}
    row |= {"answered": answered, "sigma": cfg.sigma, "threshold": cfg.threshold, "sigma1": cfg.sigma1}
    truth = data.y_public[: cfg.queries]
    row["label_accuracy"] = float(np.mean(labels[mask] == truth[mask])) if answered else None
    if answered:
        w = train_softmax(data.x_public[: cfg.queries][mask], labels[mask], data.n_classes, student_rng)
        model = SoftmaxRegression(data.x_test.shape[1], data.n_classes, l2=1e-3)
        row["student_accuracy"] = accuracy(model, w, data.x_test, data.y_test)
    else:
        row["student_accuracy"] = None
    if cfg.kind == "lnmax":
        from estimator.pate.accounting import rdp_lnmax, rdp_to_epsilon

        row["epsilon"] = rdp_to_epsilon(answered * rdp_lnmax(cfg.sigma), delta)[0]
        row["epsilon_pure"] = answered * 2.0 / cfg.sigma
        row["epsilon_data_dependent"] = None
    else:
        di = data_independent(cfg.sigma, answered, delta, cfg.queries if cfg.kind == "confident" else None, cfg.sigma1)
        dd = data_dependent(v, cfg.sigma, delta, mask, cfg.threshold, cfg.sigma1)
        row["epsilon"], row["epsilon_data_dependent"] = di["epsilon"], dd["epsilon"]
    return row


def _dpsgd_same_epsilon(
    data: Digits, epsilon: float, delta: float, rngs: list[np.random.Generator], epochs: int = 20
) -> dict[str, Any]:
    """The same softmax model trained on the sensitive data with DP-SGD at (ε, δ) (PLD-calibrated noise)."""
    from estimator.accounting.accountant import gaussian_noise_for_epsilon
    from ldp_core.fl.dpsgd import DPSGDConfig, train_dpsgd

    q = 0.1
    steps = epochs * round(1 / q)
    z = gaussian_noise_for_epsilon(epsilon, delta, q, steps, discretization=1e-3)
    model = SoftmaxRegression(data.x_sensitive.shape[1], data.n_classes, l2=1e-3)
    init, sample, noise = rngs
    w = train_dpsgd(
        model,
        model.init_params(init),
        data.x_sensitive,
        data.y_sensitive,
        DPSGDConfig(z, 1.0, q, 1.0),
        steps,
        sample,
        noise,
    )
    head = {"epsilon": epsilon, "noise_multiplier": z, "steps": steps, "sample_rate": q, "clip_norm": 1.0}
    return head | {"accuracy": accuracy(model, w, data.x_test, data.y_test), "neighbors": "add_or_remove"}


def run_pate(
    seed: int = 0,
    teachers: int = 25,
    delta: float = 1e-5,
    configs: tuple[Config, ...] = DEFAULT_CONFIGS,
    compare_dpsgd: bool = True,
    progress: Callable[[str], None] | None = None,
    federated: bool = False,
) -> dict[str, Any]:
    """The whole study; the result object of ``ldp pate --json``."""
    t0 = time.perf_counter()
    say = progress or (lambda _m: None)
    split, teach, agg, student, *dp = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(7))
    data = load_digits_split(split)
    say(f"training {teachers} teachers on {len(data.x_sensitive)} sensitive digits")
    ens = train_teachers(data, teachers, teach)
    predictions = ens.predict(data.x_public, data.n_classes)
    votes = vote_histograms(predictions, data.n_classes)
    secagg = None
    if federated:
        from estimator.pate.federated import secagg_vote_histograms

        say(f"summing the {teachers} teachers' votes with SecAgg")
        summed = secagg_vote_histograms(list(predictions), data.n_classes, np.random.default_rng(seed))
        secagg = {
            "teachers": len(summed.survivors),
            "vector_length": int(predictions.shape[1] * data.n_classes),
            "equal_to_plain_sum": bool(np.array_equal(summed.histograms, votes)),
        }
        votes = summed.histograms
    test_votes = vote_histograms(ens.predict(data.x_test, data.n_classes), data.n_classes)
    model = SoftmaxRegression(data.x_test.shape[1], data.n_classes, l2=1e-3)
    w_all = train_softmax(data.x_sensitive, data.y_sensitive, data.n_classes, student)
    rows = []
    for i, cfg in enumerate(configs, 1):
        say(f"configuration {i}/{len(configs)}: {cfg.label()}, {cfg.queries} queries")
        rows.append(run_config(cfg, votes, data, delta, agg, student))
    out: dict[str, Any] = {
        "teachers": teachers,
        "teacher_sizes": {"min": min(ens.sizes), "max": max(ens.sizes), "mean": float(np.mean(ens.sizes))},
        "teacher_accuracy_mean": float(np.mean(ens.accuracy)),
        "ensemble_accuracy": float(np.mean(np.argmax(test_votes, axis=1) == data.y_test)),
        "non_private_accuracy": accuracy(model, w_all, data.x_test, data.y_test),
        "sensitive_examples": len(data.x_sensitive),
        "public_examples": len(data.x_public),
        "test_examples": len(data.x_test),
        "delta": delta,
        "neighbors": "add_remove_or_replace_one_record",
        "protects": PROTECTS,
        "seed": seed,
        "seed_warning": "seeded study: the ε holds only against someone who does not know the seed",
        "tradeoff": rows,
        "secagg": secagg,
    }
    out |= _headline(rows)
    if compare_dpsgd:
        best = out["semi_private"]
        if best is not None:
            say(f"DP-SGD on the sensitive data at the same ε = {best['epsilon']:.3g}")
            out["dpsgd_same_epsilon"] = _dpsgd_same_epsilon(data, best["epsilon"], delta, dp)
    out["seconds"] = time.perf_counter() - t0
    return out


def _headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary keys: the semi-private student (best accuracy per ε among Confident-GNMax rows) and the
    comparison of Confident-GNMax with the GNMax row of the nearest student accuracy."""
    conf = [r for r in rows if r["aggregator"] == "confident" and r["student_accuracy"] is not None]
    gn = [r for r in rows if r["aggregator"] == "gnmax" and r["student_accuracy"] is not None]
    best = max(conf, key=lambda r: (r["student_accuracy"], -r["epsilon"])) if conf else None
    head: dict[str, Any] = {"semi_private": best}
    if best is not None:
        head |= {
            "queries": best["queries"],
            "answered": best["answered"],
            "student_accuracy": best["student_accuracy"],
            "epsilon": best["epsilon"],
            "epsilon_data_dependent": best["epsilon_data_dependent"],
        }
    if best is not None and gn:
        match = min(gn, key=lambda r: (abs(r["student_accuracy"] - best["student_accuracy"]), r["epsilon"]))
        head["confident_vs_gnmax"] = {
            "gnmax": match["setting"],
            "confident": best["setting"],
            "answered": [match["answered"], best["answered"]],
            "student_accuracy": [match["student_accuracy"], best["student_accuracy"]],
            "epsilon": [match["epsilon"], best["epsilon"]],
            "epsilon_dd": [match["epsilon_data_dependent"], best["epsilon_data_dependent"]],
            "answered_ratio": best["answered"] / match["answered"] if match["answered"] else math.inf,
            "epsilon_ratio": best["epsilon"] / match["epsilon"] if match["epsilon"] else math.inf,
        }
    return head


def plot_tradeoff(result: dict[str, Any], path: str) -> None:
    """Student accuracy against ε (data-independent, and data-dependent as hollow markers) per aggregator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"gnmax": ("o", "C0", "GNMax"), "confident": ("s", "C1", "Confident-GNMax"), "lnmax": ("^", "C2", "LNMax")}
    for kind, (m, c, name) in styles.items():
        rs = [r for r in result["tradeoff"] if r["aggregator"] == kind and r["student_accuracy"] is not None]
        if not rs:
            continue
        ax.scatter([r["epsilon"] for r in rs], [r["student_accuracy"] for r in rs], marker=m, color=c, label=name)
        dd = [r for r in rs if r["epsilon_data_dependent"] is not None]
        ax.scatter(
            [r["epsilon_data_dependent"] for r in dd],
            [r["student_accuracy"] for r in dd],
            marker=m,
            facecolors="none",
            edgecolors=c,
            label=f"{name} (data-dependent ε)",
        )
        for r in rs:
            ax.annotate(f"{r['answered']}", (r["epsilon"], r["student_accuracy"]), fontsize=7, alpha=0.7)
    if "dpsgd_same_epsilon" in result:
        d = result["dpsgd_same_epsilon"]
        ax.scatter([d["epsilon"]], [d["accuracy"]], marker="x", color="k", label="DP-SGD, same ε")
    ax.axhline(result["non_private_accuracy"], ls=":", color="grey", label="non-private")
    ax.set_xscale("log")
    ax.set_xlabel(f"ε (δ = {result['delta']:g}); numbers: queries answered")
    ax.set_ylabel("student test accuracy")
    ax.set_title(f"PATE on load_digits, {result['teachers']} teachers")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
