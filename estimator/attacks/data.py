"""Generated classification data for the attacks: Gaussian classes around fixed means.

Everything here is made by the project from an explicit ``numpy`` generator (no download): a
:class:`GaussianTask` fixes K class means in d dimensions once (``separation`` is the norm of each
mean), and :meth:`GaussianTask.sample` draws labelled rows x = μ_y + N(0, I), with a chosen class
balance and an optional fraction of labels flipped at random (noise a model can only memorise, which
is what membership inference exploits). Rows are float32, labels int64, as the numpy models take.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from estimator.errors import DatasetError

__all__ = ["GaussianTask"]


@dataclasses.dataclass(frozen=True)
class GaussianTask:
    """K Gaussian classes with unit covariance around ``means`` (K × d)."""

    means: np.ndarray

    @classmethod
    def make(cls, n_features: int, n_classes: int, separation: float, rng: np.random.Generator) -> GaussianTask:
        """Class means drawn uniformly on the sphere of radius ``separation``."""
        if n_features < 1 or n_classes < 2:
            raise DatasetError(f"need n_features >= 1 and n_classes >= 2, got {n_features}, {n_classes}")
        if not separation > 0:
            raise DatasetError(f"separation must be > 0, got {separation}")
        m = rng.normal(size=(n_classes, n_features))
        m *= separation / np.linalg.norm(m, axis=1, keepdims=True)
        return cls(m)

    @property
    def n_features(self) -> int:
        return int(self.means.shape[1])

    @property
    def n_classes(self) -> int:
        return int(self.means.shape[0])

    def sample(
        self,
        n: int,
        rng: np.random.Generator,
        weights: np.ndarray | None = None,
        label_noise: float = 0.0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``n`` rows (float32) and labels (int64): classes drawn with probabilities ``weights``
        (default uniform), then each label replaced by a uniform class with probability ``label_noise``."""
        k = self.n_classes
        w = np.full(k, 1.0 / k) if weights is None else np.asarray(weights, dtype=np.float64)
        if w.shape != (k,) or (w < 0).any() or not np.isclose(w.sum(), 1.0):
            raise DatasetError(f"weights must be {k} non-negative numbers summing to 1, got {weights!r}")
        if not 0.0 <= label_noise <= 1.0:
            raise DatasetError(f"label_noise must be in [0, 1], got {label_noise}")
        y = rng.choice(k, size=n, p=w)
        X = self.means[y] + rng.normal(size=(n, self.n_features))
        flip = rng.random(n) < label_noise
        y = np.where(flip, rng.integers(0, k, size=n), y)
        return X.astype(np.float32), y.astype(np.int64)
