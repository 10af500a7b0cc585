"""PATE's noisy aggregators of teacher votes (Papernot et al. 2017 and 2018).

A query is one public, unlabeled example; each of the n teachers votes for one of K classes, giving the
histogram n ∈ N^K (:func:`vote_histograms`). The aggregators answer with a class, or ⊥ (:data:`ABSTAIN`,
-1) when Confident-GNMax is not confident:

* LNMax: argmax_j (n_j + Lap(b)), b the Laplace scale (Papernot et al. 2017 write γ = 1/b);
* GNMax: argmax_j (n_j + N(0, σ²));
* Confident-GNMax: if max_j n_j + N(0, σ₁²) ≥ T, answer GNMax with σ₂ (fresh noise), else ⊥. The
  check looks at the noise-free top count, so queries on which the teachers disagree are mostly
  refused, and a refusal costs only the check (see :mod:`estimator.pate.accounting`).

Randomness is always the explicit ``rng`` argument (a numpy Generator; for a release, the OS CSPRNG
generator :func:`ldp_core.randomness.secure_generator`). Ties in the noisy argmax go to the lowest class
(probability zero with continuous noise).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from estimator.pate.accounting import PateAccountingError

__all__ = ["ABSTAIN", "vote_histograms", "lnmax", "gnmax", "confident_gnmax", "Answers"]

#: The label of a refused query (⊥).
ABSTAIN = -1


def vote_histograms(predictions: np.ndarray, n_classes: int) -> np.ndarray:
    """The queries × classes vote counts of a teachers × queries array of predicted labels."""
    p = np.asarray(predictions)
    if p.ndim != 2:
        raise PateAccountingError(f"predictions must be teachers × queries, got shape {p.shape}")
    if p.size and (p.min() < 0 or p.max() >= n_classes):
        raise PateAccountingError(f"predicted labels must lie in [0, {n_classes})")
    out = np.zeros((p.shape[1], n_classes), dtype=np.int64)
    for row in p:
        out[np.arange(p.shape[1]), row] += 1
    return out


def _votes(votes: Any) -> np.ndarray:
    v = np.asarray(votes, dtype=float)
    if v.ndim == 1:
        v = v[None, :]
    if v.ndim != 2 or v.shape[1] < 2:
        raise PateAccountingError(f"votes must be queries × classes (>= 2 classes), got shape {v.shape}")
    return v


def _positive(name: str, v: float) -> float:
    if not v > 0 or v == float("inf"):
        raise PateAccountingError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


def lnmax(votes: Any, scale: float, rng: np.random.Generator) -> np.ndarray:
    """LNMax labels: argmax of the counts plus Laplace(``scale``) noise, one label per query."""
    v = _votes(votes)
    return np.argmax(v + rng.laplace(0.0, _positive("scale", scale), size=v.shape), axis=1)


def gnmax(votes: Any, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """GNMax labels: argmax of the counts plus N(0, σ²) noise, one label per query."""
    v = _votes(votes)
    return np.argmax(v + rng.normal(0.0, _positive("sigma", sigma), size=v.shape), axis=1)


@dataclasses.dataclass(frozen=True)
class Answers:
    """Confident-GNMax's output: ``labels`` (⊥ = :data:`ABSTAIN` where refused) and the ``answered`` mask."""

    labels: np.ndarray
    answered: np.ndarray

    @property
    def count(self) -> int:
        return int(self.answered.sum())


def confident_gnmax(votes: Any, threshold: float, sigma1: float, sigma2: float, rng: np.random.Generator) -> Answers:
    """Confident-GNMax: a threshold check with N(0, σ₁²) on the top count, then GNMax with σ₂ on the
    queries that pass; ⊥ on the others. The check's noise and the answer's noise are independent draws."""
    v = _votes(votes)
    check = v.max(axis=1) + rng.normal(0.0, _positive("sigma1", sigma1), size=len(v))
    answered = check >= threshold
    labels = np.full(len(v), ABSTAIN, dtype=np.int64)
    noisy = gnmax(v, sigma2, rng)  # drawn for every query, so the noise consumed does not depend on the data
    labels[answered] = noisy[answered]
    return Answers(labels, answered)
