"""DP-SGD's accuracy per group: does the minority lose more? (Bagdasaryan, Poursaeed, Shmatikov 2019)

A generated task (:class:`~estimator.attacks.data.GaussianTask`) with K classes, one of them rare in
the training data (``minority_share`` of the rows, the others sharing the rest equally), is learnt
three times from the same rows: by minibatch SGD without clipping or noise, by SGD with DP-SGD's clipping and
sampling but no noise, and by DP-SGD. Each class's accuracy is
measured on a large balanced test sample drawn from the same task. Clipping bounds how much the rare
class's few gradients can pull the model, and the noise drowns what is left of them: the minority's
accuracy drops more than the majority's. ``drop`` = accuracy without DP − accuracy with DP, per group.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from estimator.attacks.data import GaussianTask
from estimator.errors import DatasetError
from ldp_core.fl.dpsgd import DPSGDConfig, train_dpsgd
from ldp_core.fl.dpsgd_accounting import StepAccountant
from ldp_core.fl.models import Model

__all__ = ["group_accuracy", "per_group_accuracy"]


def group_accuracy(model: Model, params: np.ndarray, X: np.ndarray, y: np.ndarray, k: int) -> list[float]:
    """Accuracy on the rows of each class 0..k-1 (NaN for a class without rows)."""
    pred = model.predict(params, X)
    return [float(np.mean(pred[y == c] == c)) if (y == c).any() else float("nan") for c in range(k)]


def per_group_accuracy(
    task: GaussianTask,
    model: Model,
    dp: DPSGDConfig,
    steps: int,
    rng: np.random.Generator,
    n_train: int = 2000,
    minority_share: float = 0.02,
    test_per_class: int = 5000,
    delta: float = 1e-5,
    plain_learning_rate: float | None = None,
) -> dict[str, Any]:
    """Train without DP (σ = 0, no clipping; the same Poisson batches' rate and steps), with ``dp``'s clipping and sampling but no
    noise (``clip_only``), and with ``dp``, for ``steps`` steps each on the same ``n_train`` rows (the
    last class the minority); the accuracy of each class and of the two groups (majority: the mean over
    the other classes; minority: the last class), with the drop of each (``drop``: DP against no DP;
    ``drop_clip_only``: what clipping alone costs)."""
    k = task.n_classes
    if not 0.0 < minority_share < 1.0 / k:
        raise DatasetError(f"minority_share must be in (0, 1/K) = (0, {1 / k:.3g}), got {minority_share}")
    weights = np.full(k, (1.0 - minority_share) / (k - 1))
    weights[-1] = minority_share
    data_rng, test_rng, init_rng, s1, n1, s2, n2, s3, n3 = rng.spawn(9)
    X, y = task.sample(n_train, data_rng, weights)
    # a balanced test sample: test_per_class rows of each class
    Xt = np.concatenate([task.means[c] + test_rng.normal(size=(test_per_class, task.n_features)) for c in range(k)])
    yt = np.repeat(np.arange(k), test_per_class)
    w0 = model.init_params(init_rng)
    plain = DPSGDConfig(0.0, 1e9, dp.sample_rate, plain_learning_rate or dp.learning_rate)
    clip_only = DPSGDConfig(0.0, dp.clip_norm, dp.sample_rate, dp.learning_rate)
    runs = {"no_dp": (plain, s1, n1), "clip_only": (clip_only, s3, n3), "dp": (dp, s2, n2)}
    out: dict[str, Any] = {"classes": k, "minority_class": k - 1, "minority_share": minority_share, "steps": steps}
    out["train_rows_per_class"] = [int((y == c).sum()) for c in range(k)]
    for name, (cfg, srng, nrng) in runs.items():
        w = train_dpsgd(model, w0, X, y, cfg, steps, srng, nrng)
        acc = group_accuracy(model, w, Xt.astype(np.float32), yt, k)
        out[name] = {
            "per_class": acc,
            "majority": float(np.mean(acc[:-1])),
            "minority": acc[-1],
            "overall": float(np.mean(acc)),
        }
    out["epsilon"] = StepAccountant(dp).epsilon_pld(steps, delta) if dp.noise_multiplier > 0 else None
    out["delta"] = delta
    out["noise_multiplier"], out["clip_norm"], out["sample_rate"] = dp.noise_multiplier, dp.clip_norm, dp.sample_rate
    out["drop"] = {g: out["no_dp"][g] - out["dp"][g] for g in ("majority", "minority", "overall")}
    out["drop_clip_only"] = {g: out["no_dp"][g] - out["clip_only"][g] for g in ("majority", "minority", "overall")}
    return out
