r"""PEM's candidate ranking by posterior probability (docs/HEAVY_HITTERS.md, *Ranking by posterior*).

PEM's levels are estimated by disjoint groups of devices, so a candidate at level j has j + 1
independent estimates y_0..y_j of its prefixes' counts, with variances σ_0²..σ_j²
(:func:`estimator.mechanisms.heavy_hitters.pem_count_variance` at count 0). Ranking by y_j alone
uses one level's devices; summing the chain lets siblings inherit the mass of a heavy ancestor. Two
Bayesian models of "this candidate is a prefix of a heavy value" use the chain without that flaw, and
a candidate's score is the larger of their two posterior probabilities:

* **One heavy value per root** (level-0 prefix). If the candidate is real with count θ, every level's
  estimate of its prefix is N(θ, σ_i²) (the rest of the root's mass is taken as zero); the Bayes factor
  against "no heavy value here" is

      BF(x) = ∫ p(θ) exp(θ a_x − θ² b_x / 2) dθ,   a_x = Σ_i y_i/σ_i²,   b_x = Σ_i 1/σ_i²,

  with p(θ) log-uniform on [σ_0/2, n] (a grid of 64 points). With prior probability π₀ that a root is
  real and the heavy value uniform over the root's descendants (1/Π b_i for b_i children per node), the
  posterior of x is its share of the root's mass, M_x / (1 − π₀ + Σ_{x' under the root} M_x'),
  M_x = π₀ BF(x) / Π b_i, where pruned candidates keep their last mass in the sum. A heavy ancestor's
  mass goes to the one descendant whose own estimates carry it, not to all its siblings.
* **Independent children**: a child of a real node is real with probability 1/b (b its parent's
  children), judged on its own level's estimate only; the candidate's posterior is the product over
  its chain. This model allows several heavy values under one root (two words sharing their first
  letters), which the first suppresses; an ancestor contributes at most probability 1, never a score.

Both models are approximations (the first ignores other heavy values under a root, the second the
link between a child's count and its parent's); taking the larger posterior keeps what either finds
probable. They rank and prune only: every count, variance and interval is still the last level's
unbiased estimate, so the Bonferroni noise rule stays valid given the candidate list.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

__all__ = ["PRIOR_ROOT", "THETA_POINTS", "theta_grid", "log_bayes_factor", "PosteriorChains"]

#: prior probability that a level-0 prefix holds a heavy value (not tuned: 0.005 and 0.3 gave the same
#: words on seeds 4-9, docs/HEAVY_HITTERS.md)
PRIOR_ROOT = 0.05
#: points of the log-uniform grid over θ
THETA_POINTS = 64


def theta_grid(sigma0: float, n: int) -> np.ndarray:
    """The log-uniform grid of counts θ from σ_0/2 to n."""
    low = max(0.5 * sigma0, 1.0)
    return np.exp(np.linspace(np.log(low), np.log(max(float(n), 2.0 * low)), THETA_POINTS))


def log_bayes_factor(a: np.ndarray, b: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """log ∫ p(θ) exp(θ a − θ² b / 2) dθ for each (a, b), with p uniform over the points ``theta``."""
    expo = theta[None, :] * np.asarray(a, dtype=np.float64)[:, None]
    expo -= (theta[None, :] ** 2) * np.asarray(b, dtype=np.float64)[:, None] / 2.0
    return np.asarray(logsumexp(expo, axis=1) - np.log(theta.size))


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(-np.logaddexp(0.0, -x))


class PosteriorChains:
    """The candidates of one level with both models' state; :meth:`score` ranks them, :meth:`keep` prunes,
    :meth:`extend` moves to the next level's candidates (their parents and own level's estimates)."""

    def __init__(self, est: np.ndarray, var0: float, n: int, prior: float = PRIOR_ROOT) -> None:
        """Level 0's kept candidates (each its own root): estimates ``est`` of variance ``var0`` at count 0."""
        self.theta = theta_grid(float(np.sqrt(var0)), n)
        self.prior = prior
        k = est.size
        self.a = np.asarray(est, dtype=np.float64) / var0
        self.b = np.full(k, 1.0 / var0)
        self.root = np.arange(k)
        self.log_share = np.zeros(k)  # −log Π b_i: the uniform prior over a root's descendants
        self.log_post = self._own_posterior(np.asarray(est, dtype=np.float64), var0, np.full(k, prior))
        self.pruned = np.full(k, -np.inf)  # log of the pruned candidates' mass, per root
        self.roots = k
        self._scored: np.ndarray | None = None  # the mass :meth:`score` computed, until the state changes

    def _own_posterior(self, y: np.ndarray, var: float, prior: np.ndarray) -> np.ndarray:
        lbf = log_bayes_factor(y / var, np.full(y.size, 1.0 / var), self.theta)
        return _log_sigmoid(np.log(prior) - np.log1p(-prior) + lbf)

    def _mass(self) -> np.ndarray:
        return np.log(self.prior) + self.log_share + log_bayes_factor(self.a, self.b, self.theta)

    def _per_root(self, values: np.ndarray, roots: np.ndarray) -> np.ndarray:
        """log Σ exp(values) per root (−inf where a root has none)."""
        top = np.full(self.roots, -np.inf)
        np.maximum.at(top, roots, values)
        shift = np.where(np.isfinite(top), top, 0.0)
        total = np.zeros(self.roots)
        np.add.at(total, roots, np.exp(values - shift[roots]))
        with np.errstate(divide="ignore"):
            return np.where(np.isfinite(top), shift + np.log(total), -np.inf)

    def score(self) -> np.ndarray:
        """log of the larger posterior probability of the two models, per candidate."""
        mass = self._scored = self._mass()
        norm = np.logaddexp(np.logaddexp(np.log1p(-self.prior), self.pruned), self._per_root(mass, self.root))
        return np.asarray(np.maximum(mass - norm[self.root], self.log_post))

    def keep(self, index: np.ndarray) -> None:
        """Keep only the candidates ``index``; the others' mass stays in their root's normalizer."""
        drop = np.ones(self.a.size, dtype=bool)
        drop[index] = False
        if drop.any():
            mass = self._mass() if self._scored is None else self._scored
            self.pruned = np.logaddexp(self.pruned, self._per_root(mass[drop], self.root[drop]))
        for name in ("a", "b", "root", "log_share", "log_post"):
            setattr(self, name, getattr(self, name)[index])
        self._scored = None

    def extend(self, parent: np.ndarray, est: np.ndarray, var: float) -> None:
        """The next level: candidate i extends kept candidate ``parent[i]`` and has estimate ``est[i]``."""
        self._scored = None
        children = np.bincount(parent, minlength=self.a.size).astype(np.float64)
        b_par = children[parent]
        y = np.asarray(est, dtype=np.float64)
        self.a = self.a[parent] + y / var
        self.b = self.b[parent] + 1.0 / var
        self.root = self.root[parent]
        self.log_share = self.log_share[parent] - np.log(b_par)
        self.log_post = self.log_post[parent] + self._own_posterior(y, var, np.minimum(0.5, 1.0 / b_par))
