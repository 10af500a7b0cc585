"""Central DP-SGD over a dataset file, with its privacy accounted per epoch.

The mechanism is :mod:`ldp_core.fl.dpsgd` (Abadi et al. 2016: Poisson
batches at rate q, per-example clipping to C, Gaussian noise σC, division by
the expected batch size qN). Here it is run on a ``.npz`` file and
accounted: T steps are the event ``SelfComposed(PoissonSampled(q,
Gaussian(σ)), T)``, whose ε at δ comes from ``dp_accounting``'s PLD
accountant, with its RDP accountant as a second opinion
(:class:`ldp_core.fl.dpsgd_accounting.StepAccountant`, where DP-SGD's
accounting lives). Both are valid upper
bounds; the PLD figure is the tighter one, and the reported ``epsilon`` is
the smaller of the two. (A reported ε is None, JSON null, when it is not
finite: without noise, or when every RDP order diverges.)

What ε protects: one training *example*, under add/remove neighbours (the
data set with or without it), against anyone who sees every intermediate
model, assuming the Poisson batches and the noise stay secret: without a
seed they come from the OS CSPRNG; a seeded run (reproducible, for studies)
says in its result that its ε does not hold against anyone who knows the
seed. It does not cover the
choice of hyper-parameters made by looking at the data, nor the test split.

The file holds ``x`` (n×d, finite numbers) and ``y`` (n integer labels in
[0, K)), and optionally ``x_test`` and ``y_test``; without them a seeded
``test_fraction`` of the rows is held out. One epoch is round(1/q) steps (an
expected pass over the training rows).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import zipfile
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from estimator.errors import DatasetError
from ldp_core.fl.dpsgd import DPSGDConfig, train_dpsgd
from ldp_core.fl.dpsgd_accounting import StepAccountant
from ldp_core.fl.models import MLP, LogisticRegression, Model, SoftmaxRegression, accuracy
from ldp_core.randomness import secure_generator

__all__ = [
    "ModelName",
    "MODEL_NAMES",
    "Dataset",
    "load_dataset",
    "build_model",
    "DPSGDJob",
    "run_dpsgd",
    "plot_accuracy_vs_epsilon",
]

ModelName = Literal["logistic", "softmax", "mlp"]
MODEL_NAMES: tuple[str, ...] = ("logistic", "softmax", "mlp")


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Training and test rows (float32 features, int64 labels) and the class count."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    test_split: Literal["given", "held_out"]


def _features(name: str, a: np.ndarray) -> np.ndarray:
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise DatasetError(f"array {name!r} must be 2-D (rows × features) and non-empty, got shape {a.shape}")
    if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_) or np.iscomplexobj(a):
        raise DatasetError(f"array {name!r} must hold real numbers, got dtype {a.dtype}")
    x = a.astype(np.float32)
    if not np.isfinite(x).all():
        raise DatasetError(f"array {name!r} holds NaN or infinite values (or values beyond float32)")
    return x


def _labels(name: str, a: np.ndarray, rows: int, xname: str) -> np.ndarray:
    if a.shape != (rows,):
        raise DatasetError(f"array {name!r} must be 1-D with one label per row of {xname!r} ({rows}), got {a.shape}")
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating) or a.dtype == np.bool_):
        raise DatasetError(f"array {name!r} must hold integer class labels, got dtype {a.dtype}")
    if np.issubdtype(a.dtype, np.floating) and not (np.isfinite(a).all() and (a == np.round(a)).all()):
        raise DatasetError(f"array {name!r} must hold integer class labels, got non-integer values")
    y = a.astype(np.int64)
    if y.min() < 0:
        raise DatasetError(f"array {name!r} has a negative label ({y.min()}); labels must be 0, 1, ..., K-1")
    return y


def load_dataset(
    path: str,
    model: ModelName,
    rng: np.random.Generator,
    test_fraction: float = 0.2,
    n_classes: int | None = None,
) -> Dataset:
    """Read and check ``path`` (see the module docstring). Labels must lie in [0, K)
    with K = ``n_classes`` if given, else the largest label + 1 (2 for
    ``logistic``, which takes only 0/1). Raises :class:`DatasetError` (a
    :class:`ValueError`) naming what is wrong; a missing file is a
    :class:`FileNotFoundError`."""
    if model not in MODEL_NAMES:
        raise DatasetError(f"model must be one of {', '.join(MODEL_NAMES)}, got {model!r}")
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"test fraction must be in (0, 1), got {test_fraction}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as f:
            if not hasattr(f, "files"):
                raise DatasetError(f"{path!r} is a single .npy array, not an .npz archive with arrays x and y")
            arrays = {k: np.asarray(f[k]) for k in f.files}
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        if isinstance(exc, DatasetError):
            raise
        raise DatasetError(f"{path!r} is not a readable .npz archive ({exc})") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise DatasetError(f"{path!r} lacks array(s) {', '.join(missing)}; it holds {sorted(arrays) or 'nothing'}")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise DatasetError(f"{path!r} holds only one of x_test and y_test; give both or neither")
    x = _features("x", arrays["x"])
    y = _labels("y", arrays["y"], x.shape[0], "x")
    if "x_test" in arrays:
        xt = _features("x_test", arrays["x_test"])
        if xt.shape[1] != x.shape[1]:
            raise DatasetError(f"x_test has {xt.shape[1]} features, x has {x.shape[1]}")
        yt = _labels("y_test", arrays["y_test"], xt.shape[0], "x_test")
        split: Literal["given", "held_out"] = "given"
    else:
        n_test = int(round(test_fraction * x.shape[0]))
        if n_test < 1 or n_test >= x.shape[0]:
            raise DatasetError(
                f"cannot hold out a test fraction of {test_fraction} from {x.shape[0]} rows; give x_test and y_test"
            )
        order = rng.permutation(x.shape[0])
        xt, yt = x[order[:n_test]], y[order[:n_test]]
        x, y = x[order[n_test:]], y[order[n_test:]]
        split = "held_out"
    top = int(max(y.max(), yt.max()))
    if model == "logistic":
        if n_classes not in (None, 2):
            raise DatasetError(f"logistic regression has 2 classes, got --classes {n_classes}")
        k = 2
    else:
        k = top + 1 if n_classes is None else n_classes
        if k < 2:
            raise DatasetError(f"a classifier needs at least 2 classes, got {k}")
    if top >= k:
        which = "y" if y.max() >= k else "y_test"
        raise DatasetError(
            f"labels out of range: {which} has label {top}, the {model} model takes labels in [0, {k})"
            + (" (0/1 only)" if model == "logistic" else "")
        )
    return Dataset(x, y, xt, yt, k, split)


def build_model(name: ModelName, n_features: int, n_classes: int, hidden: int = 32, l2: float = 0.0) -> Model:
    """The numpy model ``name`` for this data shape."""
    if name == "logistic":
        return LogisticRegression(n_features, l2=l2)
    if name == "softmax":
        return SoftmaxRegression(n_features, n_classes, l2=l2)
    if name == "mlp":
        return MLP(n_features, hidden, n_classes, l2=l2)
    raise DatasetError(f"model must be one of {', '.join(MODEL_NAMES)}, got {name!r}")


#: What a seeded run's result says about its ε.
SEED_WARNING = (
    "seeded run: the Poisson batches and the noise follow from the seed, so the printed ε does not hold "
    "against anyone who knows the seed (they can subtract the noise); omit --seed for a release"
)


@dataclasses.dataclass(frozen=True)
class DPSGDJob:
    """One central DP-SGD run: model, mechanism, epochs, δ, seed."""

    model: ModelName
    config: DPSGDConfig
    epochs: int
    delta: float
    seed: int | None = None
    hidden: int = 32
    l2: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise DatasetError(f"epochs must be a positive integer, got {self.epochs!r}")
        if not 0.0 < self.delta < 1.0:
            raise DatasetError(f"delta must be in (0, 1), got {self.delta!r}; a typical choice is below 1/n")

    def generators(self) -> tuple[np.random.Generator, ...]:
        """(split, init, sample, noise) generators: all four from ``seed`` when one is given (a
        reproducible run whose ε does not hold against anyone who knows the seed); without one, the
        batches and the noise from the OS CSPRNG and the split and initialization from fresh OS entropy."""
        if self.seed is None:
            return (np.random.default_rng(), np.random.default_rng(), secure_generator(), secure_generator())
        return tuple(np.random.default_rng(s) for s in np.random.SeedSequence(self.seed).spawn(4))

    def randomness(self) -> dict[str, Any]:
        """Where the batches and the noise came from, for the result (``randomness``, ``seed_warning``)."""
        if self.seed is None:
            return {"seeded": False, "randomness": "os_csprng", "seed_warning": None}
        return {"seeded": True, "randomness": "seeded", "seed_warning": SEED_WARNING}


def _finite_or_none(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def run_dpsgd(
    job: DPSGDJob,
    data: Dataset,
    init_rng: np.random.Generator,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    progress: Callable[[dict[str, Any]], None] | None = None,
    validation: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Train with DP-SGD for ``job.epochs`` epochs; ``progress(row)`` after each
    epoch. Returns the result object of ``ldp dpsgd --json`` (``epsilon`` is None,
    JSON null, without noise: no finite ε holds). With ``validation`` (x, y), the result also holds
    ``validation_correct``: how many of those rows the final model classifies correctly, a private count
    for :mod:`estimator.selection.dpsgd` to select with (never printed)."""
    t0 = time.perf_counter()
    model = build_model(job.model, data.x_train.shape[1], data.n_classes, job.hidden, job.l2)
    cfg = job.config
    spe = cfg.steps_per_epoch()
    w = model.init_params(init_rng)
    accountant = None if cfg.noise_multiplier == 0 else StepAccountant(cfg)
    rows: list[dict[str, Any]] = []
    for epoch in range(1, job.epochs + 1):
        w = train_dpsgd(model, w, data.x_train, data.y_train, cfg, spe, sample_rng, noise_rng)
        steps = epoch * spe
        row: dict[str, Any] = {"epoch": epoch, "steps": steps, "epsilon": None, "epsilon_pld": None}
        row["epsilon_rdp"] = row["rdp_order"] = None
        if accountant is not None:
            row["epsilon_pld"] = _finite_or_none(accountant.epsilon_pld(steps, job.delta))
            eps_rdp, order = accountant.epsilon_rdp(steps, job.delta)
            row["epsilon_rdp"], row["rdp_order"] = _finite_or_none(eps_rdp), order
            finite = [e for e in (row["epsilon_pld"], row["epsilon_rdp"]) if e is not None]
            row["epsilon"] = min(finite) if finite else None
        row["accuracy"] = accuracy(model, w, data.x_test, data.y_test)
        rows.append(row)
        if progress is not None:
            progress(row)
    last = rows[-1]
    train_loss = model.loss(w, data.x_train, data.y_train)
    extra: dict[str, Any] = {}
    if validation is not None:
        x_val, y_val = validation
        extra["validation_correct"] = int(np.sum(model.predict(w, x_val) == np.asarray(y_val)))
    return {
        "epsilon": last["epsilon"],
        "accuracy": last["accuracy"],
        "steps": last["steps"],
        "seconds": time.perf_counter() - t0,
        "epsilon_pld": last["epsilon_pld"],
        "epsilon_rdp": last["epsilon_rdp"],
        "rdp_order": last["rdp_order"],
        "delta": job.delta,
        "neighbors": "add_or_remove",
        "protects": "one training example (its presence in the training set), against anyone who sees every "
        "intermediate model but not the Poisson batches",
        "model": job.model,
        "num_params": model.num_params,
        "noise_multiplier": cfg.noise_multiplier,
        "clip_norm": cfg.clip_norm,
        "sample_rate": cfg.sample_rate,
        "learning_rate": cfg.learning_rate,
        "epochs": job.epochs,
        "steps_per_epoch": spe,
        "expected_batch_size": cfg.sample_rate * len(data.x_train),
        "train_examples": len(data.x_train),
        "test_examples": len(data.x_test),
        "test_split": data.test_split,
        "classes": data.n_classes,
        "seed": job.seed,
        **job.randomness(),
        "train_loss": train_loss,
        "per_epoch": rows,
        **extra,
    }


def plot_accuracy_vs_epsilon(result: dict[str, Any], path: str) -> None:
    """Test accuracy after each epoch against the ε spent by then (matplotlib, server extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["per_epoch"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    if rows[0]["epsilon"] is None:
        ax.plot([r["epoch"] for r in rows], [r["accuracy"] for r in rows], marker="o")
        ax.set_xlabel("epoch (no noise: ε is infinite)")
    else:
        ax.plot([r["epsilon"] for r in rows], [r["accuracy"] for r in rows], marker="o", label="PLD ε")
        if all(r["epsilon_rdp"] is not None for r in rows):
            ax.plot(
                [r["epsilon_rdp"] for r in rows],
                [r["accuracy"] for r in rows],
                marker=".",
                ls="--",
                alpha=0.6,
                label="RDP ε (looser)",
            )
        ax.set_xlabel(f"ε spent (δ = {result['delta']:g}, per example)")
        ax.legend(fontsize=8)
    ax.set_ylabel("test accuracy")
    ax.set_title(
        f"DP-SGD {result['model']}: σ = {result['noise_multiplier']:g}, C = {result['clip_norm']:g}, "
        f"q = {result['sample_rate']:g}"
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
