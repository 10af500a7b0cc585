"""A seeded classification task for the HE studies: a mixture of Gaussians, one per class."""

from __future__ import annotations

import numpy as np


def gaussian_classes(
    n: int, n_features: int, n_classes: int, rng: np.random.Generator, separation: float = 1.2
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows: class means drawn once from N(0, separation²·I), rows N(mean_y, I), features then
    scaled to [−1, 1] by the largest absolute value (so that polynomial activations stay bounded)."""
    means = rng.normal(scale=separation, size=(n_classes, n_features))
    y = rng.integers(0, n_classes, size=n)
    X = means[y] + rng.normal(size=(n, n_features))
    X /= np.abs(X).max()
    return X.astype(np.float64), y.astype(np.int64)
