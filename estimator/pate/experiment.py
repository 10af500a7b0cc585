"""``ldp pate``: PATE end to end on scikit-learn's ``load_digits`` (shipped with the package, offline).

The 1,797 8×8 digits are split, by a random permutation, into the *sensitive* part (teachers' training
data), the *public* part (unlabeled inputs the student may ask about) and a *test* part. Every sensitive
record is assigned to one teacher by its own independent draw (so adding or removing a record moves no
other record between teachers), each teacher is a softmax regression (:mod:`ldp_core.fl.models`)
trained on its partition, and the student, the same model, is trained on the public inputs the
aggregator labelled. The semi-private path (public inputs, private labels only) is measured against
DP-SGD training of the same model on the sensitive data at the same (ε, δ).

Randomness: without a seed the aggregators' noise and DP-SGD's batches and noise come from the OS CSPRNG
(:func:`ldp_core.randomness.secure_generator`) and the split, teachers and student from fresh OS entropy;
with a seed everything is reproducible and the result says the ε does not hold against anyone who knows
the seed (they can subtract the noise).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from estimator.errors import DatasetError
from estimator.pate.accounting import PROTECTS, data_dependent, data_independent
from estimator.pate.aggregators import confident_gnmax, gnmax, lnmax, vote_histograms
from ldp_core.fl.models import SoftmaxRegression, accuracy

__all__ = ["Digits", "load_digits_split", "train_softmax", "Teachers", "train_teachers", "Config", "DEFAULT_CONFIGS"]
__all__ += [
    "make_synthetic_split",
    "DATASETS",
    "SYNTHETIC_CONFIGS",
    "CONFIGS",
    "run_config",
    "run_pate",
    "plot_tradeoff",
]


@dataclasses.dataclass(frozen=True)
class Digits:
    x_sensitive: np.ndarray
    y_sensitive: np.ndarray
    x_public: np.ndarray
    y_public: np.ndarray  # never given to the student: used to measure the labels' accuracy only
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int = 10


def _sklearn_datasets() -> Any:
    """scikit-learn's data sets module, or a clear error naming the extra that brings it."""
    try:
        import sklearn.datasets
    except ImportError:
        raise DatasetError(
            "PATE's study needs scikit-learn (its bundled load_digits): pip install 'ldp-telemetry[ml]'"
        ) from None
    return sklearn.datasets


def load_digits_split(rng: np.random.Generator, public: int = 400, test: int = 397) -> Digits:
    """``load_digits`` scaled to [0, 1], split by ``rng`` into sensitive, public and test parts."""
    load_digits = _sklearn_datasets().load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    order = rng.permutation(len(x))
    te, pu, se = order[:test], order[test : test + public], order[test + public :]
    return Digits(x[se], y[se], x[pu], y[pu], x[te], y[te])


def make_synthetic_split(
    rng: np.random.Generator, sensitive: int = 25_000, public: int = 2000, test: int = 2000
) -> Digits:
    """A larger, generated task for PATE at the papers' scale (250 teachers): scikit-learn's
    ``make_classification`` (20 features, 12 informative, 10 classes, one cluster each, class_sep 1.5),
    its seed drawn from ``rng``, split into sensitive, public and test parts."""
    make_classification = _sklearn_datasets().make_classification

    n = sensitive + public + test
    x, y = make_classification(
        n_samples=n,
        n_features=20,
        n_informative=12,
        n_redundant=4,
        n_classes=10,
        n_clusters_per_class=1,
        class_sep=1.5,
        random_state=int(rng.integers(2**31 - 1)),
    )
    x = x.astype(np.float32)
    y = y.astype(np.int64)
    te, pu, se = np.split(rng.permutation(n), [test, test + public])
    return Digits(x[se], y[se], x[pu], y[pu], x[te], y[te])


#: The data sets ``ldp pate --data`` takes: the loader and the default number of teachers.
DATASETS: dict[str, tuple[Callable[[np.random.Generator], Digits], int]] = {
    "digits": (load_digits_split, 25),
    "synthetic": (make_synthetic_split, 250),
}


def train_softmax(
    x: np.ndarray, y: np.ndarray, n_classes: int, rng: np.random.Generator, steps: int = 400, lr: float = 0.5
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


#: The trade-off table for ``--data synthetic`` (250 teachers, 2,000 public inputs), the settings of
#: Papernot et al. 2018's MNIST/SVHN runs in spirit: T = 200 of 250 votes, σ₁ = 150, σ₂ = 40.
SYNTHETIC_CONFIGS: tuple[Config, ...] = (
    Config("gnmax", 20.0, 500),
    Config("gnmax", 20.0, 1000),
    Config("gnmax", 40.0, 500),
    Config("gnmax", 40.0, 1000),
    Config("gnmax", 40.0, 2000),
    Config("lnmax", 20.0, 200),
    Config("confident", 20.0, 2000, threshold=200.0, sigma1=150.0),
    Config("confident", 40.0, 2000, threshold=200.0, sigma1=150.0),
    Config("confident", 40.0, 2000, threshold=175.0, sigma1=100.0),
)

CONFIGS: dict[str, tuple[Config, ...]] = {"digits": DEFAULT_CONFIGS, "synthetic": SYNTHETIC_CONFIGS}


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


SEED_WARNING = (
    "seeded run: the aggregators' noise follows from the seed, so the printed ε does not hold against anyone "
    "who knows the seed (they can subtract the noise); omit --seed for a release"
)


def _generators(seed: int | None) -> list[np.random.Generator]:
    """(split, teachers, aggregator noise, student, DP-SGD init, batches, noise, SecAgg graph and the
    distributed student): all from ``seed`` when given; else the noise and the batches from the OS CSPRNG
    and the rest from fresh OS entropy. Each part has its own generator, so ``--federated`` or
    ``--no-dpsgd`` leave the trade-off table of a seed unchanged."""
    if seed is not None:
        return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(8)]
    from ldp_core.randomness import secure_generator

    fresh = np.random.default_rng
    return [fresh(), fresh(), secure_generator(), fresh(), fresh(), secure_generator(), secure_generator(), fresh()]


def _distributed(
    predictions: np.ndarray,
    data: Digits,
    delta: float,
    rng: np.random.Generator,
    noise: list[np.random.Generator] | None,
) -> dict[str, Any]:
    """GNMax with the noise added by the teachers inside SecAgg: σ = n/6 in total (4.2 for 25 teachers),
    every public query answered; the labels' and the student's accuracy and the ε against the server."""
    from estimator.pate.federated import distributed_gnmax_epsilon, secagg_noisy_histograms

    n, q = predictions.shape
    sigma = max(n / 6.0, 0.5 * math.sqrt(n))
    # ``noise``: one generator per teacher, None for the OS CSPRNG on each (each device draws its own share)
    noisy = secagg_noisy_histograms(list(predictions), data.n_classes, sigma, rng, noise)
    labels = np.argmax(noisy.histograms, axis=1)
    w = train_softmax(data.x_public[:q], labels, data.n_classes, rng)
    model = SoftmaxRegression(data.x_test.shape[1], data.n_classes, l2=1e-3)
    eps = distributed_gnmax_epsilon(sigma, n, q, delta, data.n_classes)
    return {
        "sigma": sigma,
        "queries": q,
        "label_accuracy": float(np.mean(labels == data.y_public[:q])),
        "student_accuracy": accuracy(model, w, data.x_test, data.y_test),
        "epsilon": eps["epsilon"],
        "epsilon_central_noise": data_independent(sigma, q, delta)["epsilon"],
        "protects": "as epsilon, and against the server too: it unmasks only the noised histograms",
    }


def run_pate(
    seed: int | None = None,
    teachers: int | None = None,
    delta: float = 1e-5,
    configs: tuple[Config, ...] | None = None,
    compare_dpsgd: bool = True,
    progress: Callable[[str], None] | None = None,
    federated: bool = False,
    data_name: str = "digits",
    budget_session: str | None = None,
    partner: str | None = None,
) -> dict[str, Any]:
    """The whole study on ``data_name`` (a key of :data:`DATASETS`; ``teachers`` and ``configs`` default to
    its own); the result object of ``ldp pate --json``.

    With ``budget_session`` (a file of :mod:`estimator.accounting.ledger`) the planned queries of every
    configuration (:func:`estimator.pate.budget.planned_event`) are debited to ``partner`` (kind ``pate``)
    before any teacher is trained; a refusal raises :class:`~estimator.accounting.ledger.LedgerRefusal` and
    nothing runs. Such a run leaves out what the debit does not pay for (:data:`estimator.pate.budget.WITHHELD`:
    None in the result) and cannot be ``federated`` (its distributed-noise labelling is another run)."""
    t0 = time.perf_counter()
    say = progress or (lambda _m: None)
    if data_name not in DATASETS:
        raise DatasetError(f"data must be one of {', '.join(DATASETS)}, got {data_name!r}")
    loader, default_teachers = DATASETS[data_name]
    teachers = default_teachers if teachers is None else teachers
    configs = CONFIGS[data_name] if configs is None else configs
    debit = _debit(budget_session, partner, configs, federated, data_name, teachers)
    split, teach, agg, student, *rest = _generators(seed)
    dp, graph = rest[:3], rest[3]
    data = loader(split)
    if len(data.x_sensitive) < 2 * teachers:
        raise DatasetError(f"{teachers} teachers on {len(data.x_sensitive)} sensitive examples: fewer than 2 each")
    say(f"training {teachers} teachers on {len(data.x_sensitive)} sensitive examples")
    ens = train_teachers(data, teachers, teach)
    predictions = ens.predict(data.x_public, data.n_classes)
    votes = vote_histograms(predictions, data.n_classes)
    secagg: dict[str, Any] | None = None
    if federated:
        from estimator.pate.federated import secagg_vote_histograms

        say(f"summing the {teachers} teachers' votes with SecAgg")
        summed = secagg_vote_histograms(list(predictions), data.n_classes, graph)
        n = len(predictions)
        per_teacher = (
            None if seed is None else [np.random.default_rng(c) for c in np.random.SeedSequence([seed, 1]).spawn(n)]
        )
        secagg = {
            "teachers": len(summed.survivors),
            "vector_length": int(predictions.shape[1] * data.n_classes),
            "equal_to_plain_sum": bool(np.array_equal(summed.histograms, votes)),
            "distributed_noise": _distributed(predictions, data, delta, graph, per_teacher),
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
        "data": data_name,
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
        "randomness": "os_csprng" if seed is None else "seeded",
        "seed_warning": None if seed is None else SEED_WARNING,
        "tradeoff": rows,
        "secagg": secagg,
        "budget": None,
    }
    out |= _headline(rows)
    if debit is not None:
        return _withheld(out, debit, t0)
    if compare_dpsgd:
        best = out["semi_private"]
        if best is not None:
            say(f"DP-SGD on the sensitive data at the same ε = {best['epsilon']:.3g}")
            out["dpsgd_same_epsilon"] = _dpsgd_same_epsilon(data, best["epsilon"], delta, dp)
    out["seconds"] = time.perf_counter() - t0
    return out


def _debit(
    session: str | None, partner: str | None, configs: tuple[Config, ...], federated: bool, data: str, teachers: int
) -> dict[str, Any] | None:
    """Debit the planned queries before anything touches the data (``run_pate``'s docstring)."""
    if session is None:
        return None
    if federated:
        raise DatasetError(
            "a run debited to a budget session cannot be --federated: its SecAgg labelling is another run"
        )
    from estimator.accounting.ledger import debit_before_run
    from estimator.pate.budget import BUDGET_KIND, planned_event

    label = f"pate {data}: {teachers} teachers, {len(configs)} settings, {sum(c.queries for c in configs)} queries"
    return debit_before_run(session, partner, BUDGET_KIND, planned_event(configs), label)


def _withheld(out: dict[str, Any], debit: dict[str, Any], t0: float) -> dict[str, Any]:
    """A debited run's result: the figures the debit does not pay for set to None (``budget.WITHHELD``)."""
    from estimator.pate.budget import WITHHELD

    for key in WITHHELD:
        out[key] = None
    for row in out["tradeoff"]:
        row["epsilon_data_dependent"] = None
    for pairs in (out["confident_vs_gnmax"], out["confident_vs_lnmax"]):
        for pair in pairs:
            pair["epsilon_dd"], pair["epsilon_dd_ratio"] = [None, None], None
    out["budget"] = debit | {"withheld": list(WITHHELD)}
    out["seconds"] = time.perf_counter() - t0
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _pairs(rows: list[dict[str, Any]], other: str = "gnmax") -> list[dict[str, Any]]:
    """Each Confident-GNMax row beside the ``other`` (gnmax or lnmax) row of the nearest student accuracy
    (ties: lower ε); the ``*_ratio`` keys are Confident-GNMax's figure over the other's."""
    gn = [r for r in rows if r["aggregator"] == other and r["student_accuracy"] is not None]
    out = []
    for c in rows:
        if c["aggregator"] != "confident" or c["student_accuracy"] is None or not gn:
            continue
        g = min(gn, key=lambda r: (abs(r["student_accuracy"] - c["student_accuracy"]), r["epsilon"]))
        out.append(
            {
                other: g["setting"],
                "confident": c["setting"],
                "asked": [g["queries"], c["queries"]],
                "answered": [g["answered"], c["answered"]],
                "student_accuracy": [g["student_accuracy"], c["student_accuracy"]],
                "epsilon": [g["epsilon"], c["epsilon"]],
                "epsilon_dd": [g["epsilon_data_dependent"], c["epsilon_data_dependent"]],
                "answered_ratio": _ratio(c["answered"], g["answered"]),
                "epsilon_ratio": _ratio(c["epsilon"], g["epsilon"]),
                "epsilon_dd_ratio": _ratio(c["epsilon_data_dependent"], g["epsilon_data_dependent"]),
            }
        )
    return out


def _headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary keys: the semi-private student (the Confident-GNMax row of lowest ε among those within a
    point of the best Confident-GNMax accuracy) and every Confident-GNMax row against GNMax."""
    conf = [r for r in rows if r["aggregator"] == "confident" and r["student_accuracy"] is not None]
    head: dict[str, Any] = {"semi_private": None, "confident_vs_gnmax": _pairs(rows)}
    head["confident_vs_lnmax"] = _pairs(rows, "lnmax")
    if conf:
        top = max(r["student_accuracy"] for r in conf)
        best = min((r for r in conf if r["student_accuracy"] >= top - 0.01), key=lambda r: r["epsilon"])
        head["semi_private"] = best
        head |= {
            "queries": best["queries"],
            "answered": best["answered"],
            "student_accuracy": best["student_accuracy"],
            "epsilon": best["epsilon"],
            "epsilon_data_dependent": best["epsilon_data_dependent"],
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
        for r in rs:
            ax.annotate(f"{r['answered']}", (r["epsilon"], r["student_accuracy"]), fontsize=7, alpha=0.7)
        dd = [r for r in rs if r["epsilon_data_dependent"] is not None]
        if not dd:
            continue
        ax.scatter(
            [r["epsilon_data_dependent"] for r in dd],
            [r["student_accuracy"] for r in dd],
            marker=m,
            facecolors="none",
            edgecolors=c,
            label=f"{name} (data-dependent ε)",
        )
    if "dpsgd_same_epsilon" in result:
        d = result["dpsgd_same_epsilon"]
        ax.scatter([d["epsilon"]], [d["accuracy"]], marker="x", color="k", label="DP-SGD, same ε")
    ax.axhline(result["non_private_accuracy"], ls=":", color="grey", label="non-private")
    ax.set_xscale("log")
    ax.set_xlabel(f"ε (δ = {result['delta']:g}); numbers: queries answered")
    ax.set_ylabel("student test accuracy")
    ax.set_title(f"PATE on {result['data']}, {result['teachers']} teachers")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
