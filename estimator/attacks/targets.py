"""Membership inference against a PATE student and against a classifier trained on DP synthetic data, through
the hook :func:`estimator.attacks.membership.attack_training` (``ldp attack mia --target pate|synth``).

Each ``train_fn`` wraps the whole pipeline from the sensitive rows it is given to the released model, so the
game's target and shadows are exactly what an analyst would release:

* PATE (:func:`pate_trainer`): ``teachers`` softmax regressions on a disjoint split of the rows (each row's
  teacher drawn independently), their votes on a fixed *public* set (drawn from the same task, known to
  everyone) aggregated by GNMax with σ (σ = 0: the plain argmax, no DP), the student (a softmax regression)
  trained on the public inputs with those labels; the attacked probabilities are the student's. Printed ε:
  the data-independent GNMax bound over every public query (``estimator.pate.accounting.data_independent``).
* synthetic data (:func:`synth_trainer`): the rows (categorical codes; the label a column) go to
  :func:`estimator.synth.runner.generate` (``mst``, ``aim``, ``dpgan`` at (ε, δ), or the memorising
  ``copy``), and an MLP is trained on the synthetic table to predict the label from the other columns; the
  attacked probabilities are that MLP's on the real rows. Printed ε: the generator's.

The pools: generated Gaussian classes (:class:`estimator.attacks.data.GaussianTask`) for PATE, the seeded
population of :func:`estimator.synth.data.population` for synthetic data, each with a fraction of labels
flipped at random (noise a model can only memorise, which membership inference exploits).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from estimator.attacks.data import GaussianTask
from estimator.attacks.membership import ProbaFn, TrainFn, attack_training, predict_proba
from estimator.errors import DatasetError
from ldp_core.fl.models import MLP, Model, SoftmaxRegression

__all__ = ["pate_trainer", "synth_trainer", "PateTargetStudy", "SynthTargetStudy", "run_pate_target"]
__all__ += ["run_synth_target"]

Progress = Callable[[str], None] | None


def _fit(model: Model, x: np.ndarray, y: np.ndarray, rng: np.random.Generator, steps: int, lr: float) -> np.ndarray:
    """Full-batch gradient descent from ``model``'s random initialisation."""
    w = model.init_params(rng)
    for _ in range(steps):
        _, g = model.loss_and_grad(w, x, y)
        w = w - np.float32(lr) * g
    return w


def pate_trainer(public: np.ndarray, n_classes: int, teachers: int, sigma: float, steps: int = 200) -> TrainFn:
    """The PATE pipeline as a ``train_fn`` (module docstring); ``sigma`` 0 is the noise-free argmax."""
    if teachers < 2 or sigma < 0:
        raise DatasetError(f"need at least 2 teachers and sigma >= 0, got {teachers}, {sigma}")
    from estimator.pate.aggregators import gnmax, vote_histograms

    def train(X: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> ProbaFn:
        model = SoftmaxRegression(X.shape[1], n_classes, l2=1e-3)
        owner = rng.integers(0, teachers, size=len(X))
        preds = []
        for t in range(teachers):
            rows = owner == t
            w = _fit(model, X[rows], y[rows], rng, steps, 0.5) if rows.any() else model.init_params(rng)
            preds.append(model.predict(w, public))
        votes = vote_histograms(np.stack(preds), n_classes)
        labels = gnmax(votes, sigma, rng) if sigma > 0 else np.argmax(votes, axis=1)
        student = _fit(model, public, labels, rng, steps, 0.5)
        return lambda rows: predict_proba(model, student, rows)

    return train


def synth_trainer(
    columns: tuple[str, ...],
    labels: tuple[tuple[str, ...], ...],
    method: str,
    epsilon: float,
    delta: float,
    hidden: int = 32,
    steps: int = 300,
    gan_steps: int = 300,
) -> TrainFn:
    """The synthetic-data pipeline as a ``train_fn``: X holds the codes of ``columns[:-1]``, y the last
    column's; the downstream MLP's probabilities on one-hot rows (module docstring)."""
    from estimator.synth.data import Table
    from estimator.synth.runner import generate

    sizes = [len(v) for v in labels]

    def one_hot(codes: np.ndarray) -> np.ndarray:
        return np.hstack([np.eye(k, dtype=np.float32)[codes[:, j]] for j, k in enumerate(sizes[:-1])])

    def train(X: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> ProbaFn:
        table = Table(columns, labels, np.column_stack([X, y]).astype(np.int64))
        syn, _ = generate(method, table, epsilon, delta, rng, gan_steps=gan_steps)
        model = MLP(sum(sizes[:-1]), hidden, sizes[-1])
        w = _fit(model, one_hot(syn.codes[:, :-1]), syn.codes[:, -1], rng, steps, 0.5)
        return lambda rows: predict_proba(model, w, one_hot(np.asarray(rows, dtype=np.int64)))

    return train


def _row(setting: str, dp: bool, eps: float | None, r: dict[str, Any]) -> dict[str, Any]:
    return {
        "setting": setting,
        "dp": dp,
        "printed_epsilon": eps,
        "epsilon_lower_bound": r["epsilon_lower_bound"],
        "best_attack": r["best_attack"],
        "target_members": r["target_members"],
        "pool": r["pool"],
        "attacks": r["attacks"],
    }


@dataclasses.dataclass(frozen=True)
class PateTargetStudy:
    """The membership game against PATE students, one row per GNMax σ (0: noise-free), and the same softmax
    trained directly on the pool (no PATE) as the reference the attack must catch."""

    sigmas: tuple[float, ...] = (0.0, 2.0, 8.0)
    pool: int = 200
    public: int = 200
    teachers: int = 10
    features: int = 20
    classes: int = 5
    separation: float = 2.0
    label_noise: float = 0.3
    shadows: int = 8
    delta: float = 1e-5
    confidence: float = 0.95
    seed: int = 0


def run_pate_target(study: PateTargetStudy, progress: Progress = None) -> dict[str, Any]:
    from estimator.pate.accounting import data_independent

    t0 = time.perf_counter()
    task_rng, pool_rng, public_rng, game_rng = np.random.default_rng(study.seed).spawn(4)
    task = GaussianTask.make(study.features, study.classes, study.separation, task_rng)
    X, y = task.sample(study.pool, pool_rng, label_noise=study.label_noise)
    public, _ = task.sample(study.public, public_rng)
    model = SoftmaxRegression(study.features, study.classes, l2=1e-3)

    def direct(Xs: np.ndarray, ys: np.ndarray, rng: np.random.Generator) -> ProbaFn:
        w = _fit(model, Xs, ys, rng, 400, 0.5)
        return lambda rows: predict_proba(model, w, rows)

    cases: list[tuple[str, TrainFn, float | None]] = [("softmax on the pool (no PATE, no DP)", direct, None)]
    for s in study.sigmas:
        eps = data_independent(s, study.public, study.delta)["epsilon"] if s > 0 else None
        name = f"PATE student, GNMax σ={s:g}" if s > 0 else "PATE student, noise-free argmax (no DP)"
        cases.append((name, pate_trainer(public, study.classes, study.teachers, s), eps))
    rows = []
    for name, fn, eps in cases:
        note = None if progress is None else (lambda m, n=name: progress(f"{n}: {m}"))
        r = attack_training(
            fn, X, y, game_rng.spawn(1)[0], shadows=study.shadows, delta=study.delta,
            confidence=study.confidence, printed_epsilon=eps, progress=note,
        )  # fmt: skip
        rows.append(_row(name, eps is not None, eps, r))
    return {"target": "pate", "study": dataclasses.asdict(study), "rows": rows, "seconds": time.perf_counter() - t0}


@dataclasses.dataclass(frozen=True)
class SynthTargetStudy:
    """The membership game against an MLP trained on synthetic tables of ``method`` at each ε, and on the
    ``copy`` baseline (the training rows resampled: no DP) the attack must catch."""

    method: str = "mst"
    epsilons: tuple[float, ...] = (1.0, 4.0)
    pool: int = 300
    columns: tuple[str, ...] = ("platform", "region", "age", "network", "app_version", "tier", "crashes")
    label_noise: float = 0.3
    gan_steps: int = 300
    shadows: int = 8
    delta: float = 1e-5
    confidence: float = 0.95
    seed: int = 0


def run_synth_target(study: SynthTargetStudy, progress: Progress = None) -> dict[str, Any]:
    from estimator.synth.data import population

    t0 = time.perf_counter()
    flip_rng, game_rng = np.random.default_rng(study.seed).spawn(2)
    table = population(study.pool, study.seed).select(list(study.columns))
    codes = table.codes.copy()
    k = table.shape[-1]
    flip = flip_rng.random(len(codes)) < study.label_noise
    codes[:, -1] = np.where(flip, flip_rng.integers(0, k, size=len(codes)), codes[:, -1])
    X, y = codes[:, :-1], codes[:, -1]
    cases: list[tuple[str, str, float | None]] = [("copy", "synthetic = training rows resampled (no DP)", None)]
    cases += [(study.method, f"{study.method} at ε={e:g}", e) for e in study.epsilons]
    rows = []
    for method, name, eps in cases:
        fn = synth_trainer(
            table.columns, table.labels, method, eps if eps is not None else 1.0, study.delta, gan_steps=study.gan_steps
        )
        note = None if progress is None else (lambda m, n=name: progress(f"{n}: {m}"))
        r = attack_training(
            fn, X, y, game_rng.spawn(1)[0], shadows=study.shadows, delta=study.delta,
            confidence=study.confidence, printed_epsilon=eps, progress=note,
        )  # fmt: skip
        rows.append(_row(name, eps is not None, eps, r))
    return {"target": "synth", "study": dataclasses.asdict(study), "rows": rows, "seconds": time.perf_counter() - t0}
