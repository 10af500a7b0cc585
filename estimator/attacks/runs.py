"""The attack studies behind ``ldp attack`` (:mod:`ldp_cli.commands.attack`), each on generated data from one
seed, each returning the JSON object the command prints. The settings and their defaults are the dataclasses
below; docs/ATTACKS.md has the measured tables and the command behind each."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from estimator.attacks.data import GaussianTask
from estimator.attacks.gradients import dlg_case
from estimator.attacks.groups import per_group_accuracy
from estimator.attacks.inversion import inversion_similarity
from estimator.attacks.membership import attack_training, dpsgd_trainer
from estimator.errors import DatasetError
from ldp_core.fl.dpsgd import DPSGDConfig, train_dpsgd
from ldp_core.fl.dpsgd_accounting import StepAccountant
from ldp_core.fl.models import MLP, Model, SoftmaxRegression

__all__ = ["MembershipStudy", "run_membership", "InversionStudy", "run_inversion", "DLGStudy", "run_dlg"]
__all__ += ["GroupStudy", "run_groups", "NO_CLIP"]

Progress = Callable[[str], None] | None

#: the clipping norm that stands for "no clipping" in the runs without DP (no gradient comes near it)
NO_CLIP = 1e9


def _config(sigma: float, clip: float, q: float, lr: float) -> DPSGDConfig:
    """σ = 0 is plain minibatch SGD (no clipping, no noise), the baseline without DP."""
    return DPSGDConfig(sigma, clip if sigma > 0 else NO_CLIP, q, lr)


def _epsilon(cfg: DPSGDConfig, steps: int, delta: float) -> float | None:
    return None if cfg.noise_multiplier == 0 else StepAccountant(cfg).epsilon_pld(steps, delta)


def _sigmas(sigmas: tuple[float, ...]) -> tuple[float, ...]:
    if not sigmas or any(not s >= 0 for s in sigmas):
        raise DatasetError(f"noise multipliers must be numbers >= 0 (0: no DP), got {sigmas!r}")
    return sigmas


@dataclasses.dataclass(frozen=True)
class MembershipStudy:
    """The membership game on a softmax regression (or an MLP with ``hidden`` > 0) per noise multiplier."""

    noise_multipliers: tuple[float, ...] = (0.0, 1.0, 2.0)
    pool: int = 400
    features: int = 50
    classes: int = 10
    separation: float = 2.0
    label_noise: float = 0.2
    hidden: int = 0
    clip: float = 1.0
    sample_rate: float = 0.1
    steps: int = 100
    learning_rate: float = 0.5
    shadows: int = 16
    delta: float = 1e-5
    confidence: float = 0.95
    seed: int = 0


def _model(features: int, classes: int, hidden: int) -> Model:
    return MLP(features, hidden, classes) if hidden > 0 else SoftmaxRegression(features, classes)


def run_membership(study: MembershipStudy, scores: tuple[str, ...], progress: Progress = None) -> dict[str, Any]:
    """One attack game per noise multiplier, on one pool; each row the printed ε, the chosen ``scores``
    (names of :data:`estimator.attacks.membership.SCORES`) and the largest of their ε lower bounds."""
    t0 = time.perf_counter()
    task_rng, pool_rng, game_rng = np.random.default_rng(study.seed).spawn(3)
    task = GaussianTask.make(study.features, study.classes, study.separation, task_rng)
    X, y = task.sample(study.pool, pool_rng, label_noise=study.label_noise)
    model = _model(study.features, study.classes, study.hidden)
    rows = []
    for sigma in _sigmas(study.noise_multipliers):
        cfg = _config(sigma, study.clip, study.sample_rate, study.learning_rate)
        eps = _epsilon(cfg, study.steps, study.delta)
        note = None if progress is None else (lambda m, s=sigma: progress(f"σ = {s:g}: {m}"))
        r = attack_training(
            dpsgd_trainer(model, cfg, study.steps),
            X,
            y,
            game_rng.spawn(1)[0],
            shadows=study.shadows,
            delta=study.delta,
            confidence=study.confidence,
            printed_epsilon=eps,
            progress=note,
        )
        chosen = {k: r["attacks"][k] for k in scores}
        best = max(chosen, key=lambda k: chosen[k]["epsilon_lower_bound"])
        rows.append(
            {
                "noise_multiplier": sigma,
                "dp": sigma > 0,
                "printed_epsilon": eps,
                "epsilon_lower_bound": chosen[best]["epsilon_lower_bound"],
                "best_attack": best,
                "attacks": chosen,
            }
        )
    return {
        "study": dataclasses.asdict(study),
        "model": type(model).__name__,
        "scores": list(scores),
        "rows": rows,
        "seconds": time.perf_counter() - t0,
    }


@dataclasses.dataclass(frozen=True)
class InversionStudy:
    """Model inversion of a softmax regression trained with each noise multiplier."""

    noise_multipliers: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)
    train_rows: int = 300
    features: int = 64
    classes: int = 10
    separation: float = 4.0
    clip: float = 1.0
    sample_rate: float = 0.1
    steps: int = 200
    learning_rate: float = 0.5
    delta: float = 1e-5
    seed: int = 0


def run_inversion(study: InversionStudy, progress: Progress = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    task_rng, data_rng, init_rng, train_rng = np.random.default_rng(study.seed).spawn(4)
    task = GaussianTask.make(study.features, study.classes, study.separation, task_rng)
    X, y = task.sample(study.train_rows, data_rng)
    model = SoftmaxRegression(study.features, study.classes)
    w0 = model.init_params(init_rng)
    rows = []
    for sigma in _sigmas(study.noise_multipliers):
        cfg = _config(sigma, study.clip, study.sample_rate, study.learning_rate)
        s_rng, n_rng = train_rng.spawn(2)
        w = train_dpsgd(model, w0, X, y, cfg, study.steps, s_rng, n_rng)
        r = inversion_similarity(model, w, X, y)
        r.update(
            noise_multiplier=sigma,
            printed_epsilon=_epsilon(cfg, study.steps, study.delta),
            train_accuracy=float(np.mean(model.predict(w, X) == y)),
        )
        rows.append(r)
        if progress is not None:
            progress(f"σ = {sigma:g}: cosine to the class mean {r['mean_cosine_to_class_mean']:.3f}")
    return {"study": dataclasses.asdict(study), "rows": rows, "seconds": time.perf_counter() - t0}


@dataclasses.dataclass(frozen=True)
class DLGStudy:
    """Gradient inversion of one client's shared gradient under each defence (``trials`` targets each), on
    the numpy MLP (``model`` "mlp": analytic recovery and DLG) or the small PyTorch CNN ("cnn": DLG only,
    8×8 inputs, needs the ``torch`` extra)."""

    model: str = "mlp"
    activation: str = "tanh"
    features: int = 64
    hidden: int = 32
    classes: int = 10
    separation: float = 4.0
    clip: float = 1.0
    noise_multipliers: tuple[float, ...] = (0.001, 0.01, 0.1, 1.0)
    secagg_clients: tuple[int, ...] = (2, 4, 16)
    trials: int = 3
    run_dlg: bool = True
    seed: int = 0


def _dlg_cases(study: DLGStudy) -> list[tuple[str, float, int]]:
    cases: list[tuple[str, float, int]] = [("none", 0.0, 1), ("clip", 0.0, 1)]
    cases += [("noise", s, 1) for s in study.noise_multipliers]
    cases += [("secagg", 0.0, k) for k in study.secagg_clients]
    return cases


def _one_round_epsilon(sigma: float, clip: float, delta: float = 1e-5) -> float | None:
    """ε at δ of one client's noised gradient: one Gaussian mechanism with multiplier σ (no sampling), exact
    by the analytic Gaussian mechanism (Balle and Wang 2018, ``dp_accounting.get_epsilon_gaussian``)."""
    if sigma == 0:
        return None
    from dp_accounting import get_epsilon_gaussian

    return float(get_epsilon_gaussian(sigma, delta))


def _cnn_case(
    X: np.ndarray, y: np.ndarray, defence: str, rng: np.random.Generator, study: DLGStudy, sigma: float
) -> dict[str, Any]:
    try:
        from estimator.attacks.dlg_torch import cnn_dlg_case

        return cnn_dlg_case(X, y, defence, rng, study.classes, study.clip, sigma, seed=study.seed)
    except ImportError:
        raise DatasetError("the CNN attack needs PyTorch: pip install '.[torch]' (docs/fl/TORCH.md)") from None


def run_dlg(study: DLGStudy, progress: Progress = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    if study.model not in ("mlp", "cnn"):
        raise DatasetError(f"model must be mlp or cnn, got {study.model!r}")
    features = 64 if study.model == "cnn" else study.features
    task_rng, init_rng, data_rng, attack_rng = np.random.default_rng(study.seed).spawn(4)
    task = GaussianTask.make(features, study.classes, study.separation, task_rng)
    if study.activation not in ("tanh", "relu"):
        raise DatasetError(f"activation must be tanh or relu, got {study.activation!r}")
    model = MLP(features, study.hidden, study.classes, "relu" if study.activation == "relu" else "tanh")
    params = model.init_params(init_rng)
    bound = float(np.abs(task.means).max() + 5.0)  # the attacker's box: the inputs' range, known to it
    rows = []
    for defence, sigma, k in _dlg_cases(study):
        trials = []
        for _ in range(study.trials):
            X, y = task.sample(max(k, 1), data_rng)
            if study.model == "cnn":
                trials.append(
                    {
                        "analytic_error": None,
                        "clients_exposed": None,
                        **_cnn_case(X, y, defence, attack_rng, study, sigma),
                    }
                )
            else:
                trials.append(
                    dlg_case(model, params, X, y, defence, attack_rng, study.clip, sigma, study.run_dlg, bound=bound)
                )
        analytic = [t["analytic_error"] for t in trials if t["analytic_error"] is not None]
        dlg_errors = [t["dlg_error"] for t in trials if t["dlg_error"] is not None]
        row: dict[str, Any] = {
            "defence": defence,
            "clients": k,
            "noise_multiplier": sigma,
            "epsilon_one_round": _one_round_epsilon(sigma, study.clip) if defence == "noise" else None,
            "label_recovered": float(np.mean([t["label_recovered"] for t in trials])),
            "analytic_error": float(np.median(analytic)) if analytic else None,
            "dlg_error": float(np.median(dlg_errors)) if dlg_errors else None,
            "clients_exposed": None if study.model == "cnn" else float(np.mean([t["clients_exposed"] for t in trials])),
        }
        row["best_error"] = min(e for e in (row["analytic_error"], row["dlg_error"]) if e is not None)
        rows.append(row)
        if progress is not None:
            progress(f"{defence} (σ = {sigma:g}, {k} client(s)): median error {row['best_error']:.3g}")
    name = "CNN(conv 6@3x3, conv 6@3x3/2, dense; sigmoid; 8x8 inputs)" if study.model == "cnn" else "MLP"
    if study.model == "mlp":
        name = f"MLP({features}-{study.hidden}-{study.classes}, {study.activation})"
    return {
        "study": dataclasses.asdict(study),
        "model": name,
        "error": "median over trials of ||x_hat - x|| / ||x||, x the nearest client's input (1.0: no better than zeros)",
        "rows": rows,
        "seconds": time.perf_counter() - t0,
    }


@dataclasses.dataclass(frozen=True)
class GroupStudy:
    """Per-group accuracy of a softmax regression trained with and without DP-SGD."""

    noise_multipliers: tuple[float, ...] = (1.0, 4.0, 16.0)
    features: int = 20
    classes: int = 4
    separation: float = 3.0
    train_rows: int = 2000
    minority_share: float = 0.02
    test_per_class: int = 5000
    clip: float = 0.5
    sample_rate: float = 0.05
    steps: int = 300
    learning_rate: float = 0.5
    delta: float = 1e-5
    seed: int = 0


def run_groups(study: GroupStudy, progress: Progress = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    task_rng, run_rng = np.random.default_rng(study.seed).spawn(2)
    task = GaussianTask.make(study.features, study.classes, study.separation, task_rng)
    model = SoftmaxRegression(study.features, study.classes)
    rows = []
    for sigma in _sigmas(study.noise_multipliers):
        if sigma == 0:
            raise DatasetError("the group study compares each noise multiplier with the run without DP: give σ > 0")
        cfg = DPSGDConfig(sigma, study.clip, study.sample_rate, study.learning_rate)
        r = per_group_accuracy(
            task,
            model,
            cfg,
            study.steps,
            np.random.default_rng(study.seed),
            study.train_rows,
            study.minority_share,
            study.test_per_class,
            study.delta,
        )
        rows.append(r)
        if progress is not None:
            progress(f"σ = {sigma:g}: minority drop {r['drop']['minority']:.3f}, majority {r['drop']['majority']:.3f}")
    del run_rng
    return {"study": dataclasses.asdict(study), "rows": rows, "seconds": time.perf_counter() - t0}
