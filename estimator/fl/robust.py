"""Byzantine-robust aggregation as wrappers.

Each wrapper states ``f``, the number of malicious clients it tolerates, and
refuses a round with too few updates for that ``f``. Each reduces the round's
updates to a robust set and hands that set to the ``inner`` aggregator (a
weighted mean, typically), so the inner strategy's server step is unchanged:

* :class:`Krum` (Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine learning
  with adversaries: Byzantine tolerant gradient descent", NeurIPS 2017):
  score each update by the sum of squared distances to its n − f − 2 nearest
  others and keep the lowest; needs n ≥ 2f + 3. ``multi=m`` keeps the m
  best (multi-Krum, ibid. §5) and averages them through ``inner``.
* :class:`CoordinateMedian` (Yin, Chen, Kannan, Bartlett, "Byzantine-robust
  distributed learning: towards optimal statistical rates", ICML 2018):
  the median of each coordinate; needs n ≥ 2f + 1.
* :class:`TrimmedMean` (ibid.): per coordinate, drop the f largest and the f
  smallest values and average the rest; needs n ≥ 2f + 1.
* :class:`FLTrust` (Cao, Fang, Liu, Gong, "FLTrust: Byzantine-robust
  federated learning via trust bootstrapping", NDSS 2021): the server
  computes its own update g₀ on a small trusted root dataset each round;
  client i gets trust TSᵢ = ReLU(cos(gᵢ, g₀)), its update is rescaled to
  g₀'s norm, and the aggregate is Σ TSᵢ·(‖g₀‖/‖gᵢ‖)·gᵢ / Σ TSᵢ (zero when
  every score is zero). It needs no ``f``, but the root update: ``root`` is
  called with the round's context and returns g₀ for the current model.

Median and trimmed mean ignore the clients' example counts (weighting them
would let one client with a large claimed count move the statistic): inner
receives one pseudo-update carrying the statistic. None of them is linear,
so none may sit under a DP wrapper; FLTrust's DP variant, with a clipped root
update and a fixed divisor, is its own mechanism (:class:`estimator.fl.dp.DPFLTrust`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from estimator.fl.aggregators import AggregateResult, Aggregator, RoundContext
from ldp_core.fl.errors import FLError
from ldp_core.fl.training import ClientUpdate

__all__ = ["Krum", "CoordinateMedian", "TrimmedMean", "FLTrust", "fltrust_combine", "krum_scores"]


def _stack(updates: Sequence[ClientUpdate]) -> np.ndarray:
    return np.stack([np.asarray(u.delta, dtype=np.float64) for u in updates])


def _need(updates: Sequence[ClientUpdate], need: int, who: str, f: int) -> None:
    if len(updates) < need:
        raise FLError(
            f"{who} with f = {f} needs at least {need} updates, got {len(updates)}; sample more clients or lower f"
        )


def _check_f(f: int) -> None:
    if isinstance(f, bool) or not isinstance(f, int) or f < 0:
        raise FLError(f"f (tolerated malicious clients) must be an integer >= 0, got {f!r}")


def krum_scores(X: np.ndarray, f: int) -> np.ndarray:
    """Krum score of each row: Σ of its n − f − 2 smallest squared distances to other rows."""
    sq = np.einsum("ij,ij->i", X, X)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (X @ X.T), 0.0)
    np.fill_diagonal(d2, np.inf)
    k = X.shape[0] - f - 2
    return np.sort(d2, axis=1)[:, :k].sum(axis=1)


def _pseudo(vec: np.ndarray, ctx: RoundContext, name: str) -> ClientUpdate:
    return ClientUpdate(name, ctx.round, vec, 1)


@dataclasses.dataclass
class Krum:
    """Krum (``multi=1``) or multi-Krum (``multi=m``), tolerating ``f`` malicious clients."""

    inner: Aggregator
    f: int
    multi: int = 1
    linear: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        _check_f(self.f)
        if isinstance(self.multi, bool) or not isinstance(self.multi, int) or self.multi < 1:
            raise FLError(f"multi must be a positive integer, got {self.multi!r}")

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        _need(updates, 2 * self.f + 3, "Krum", self.f)
        if self.multi > len(updates) - self.f:
            raise FLError(
                f"multi-Krum keeps {self.multi} of {len(updates)} updates with f = {self.f}: "
                f"at most n − f = {len(updates) - self.f}"
            )
        scores = krum_scores(_stack(updates), self.f)
        keep = np.argsort(scores, kind="stable")[: self.multi]
        res = self.inner.aggregate([updates[i] for i in keep], ctx)
        info = dict(res.info)
        info["selected"] = [updates[i].client_id for i in keep]
        return dataclasses.replace(res, num_clients=len(updates), info=info)


@dataclasses.dataclass
class _CoordinateRule:
    """A coordinate-wise rule over the stacked updates (n × d) that tolerates ``f`` < n/2 malicious clients;
    its result goes to ``inner`` as one pseudo-update."""

    inner: Aggregator
    f: int
    linear: bool = dataclasses.field(default=False, init=False)
    name = ""

    def __post_init__(self) -> None:
        _check_f(self.f)

    def combine(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        _need(updates, 2 * self.f + 1, type(self).__name__, self.f)
        res = self.inner.aggregate([_pseudo(self.combine(_stack(updates)), ctx, self.name)], ctx)
        return dataclasses.replace(res, num_clients=len(updates))


@dataclasses.dataclass
class CoordinateMedian(_CoordinateRule):
    """Coordinate-wise median, tolerating ``f`` < n/2 malicious clients."""

    name = "median"

    def combine(self, X: np.ndarray) -> np.ndarray:
        return np.median(X, axis=0)


@dataclasses.dataclass
class TrimmedMean(_CoordinateRule):
    """Coordinate-wise mean after dropping the ``f`` largest and ``f`` smallest values."""

    name = "trimmed_mean"

    def combine(self, X: np.ndarray) -> np.ndarray:
        X = np.sort(X, axis=0)
        return X[self.f : X.shape[0] - self.f].mean(axis=0)


def fltrust_combine(X: np.ndarray, root: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FLTrust's aggregate of the rows of ``X`` given the root update, and the trust scores.

    TSᵢ = max(0, ⟨gᵢ, g₀⟩ / (‖gᵢ‖‖g₀‖)); ḡᵢ = gᵢ·‖g₀‖/‖gᵢ‖; aggregate = Σ TSᵢ ḡᵢ / Σ TSᵢ.
    A zero update (or a zero root) gets trust 0."""
    root = np.asarray(root, dtype=np.float64)
    r = float(np.linalg.norm(root))
    norms = np.linalg.norm(X, axis=1)
    safe = np.where(norms > 0, norms, 1.0)
    cos = (X @ root) / (safe * r) if r > 0 else np.zeros(X.shape[0])
    ts = np.where(norms > 0, np.maximum(cos, 0.0), 0.0)
    total = float(ts.sum())
    if total <= 0:
        return np.zeros(X.shape[1]), ts
    scaled = X * (r / safe)[:, None]
    return (ts[:, None] * scaled).sum(axis=0) / total, ts


@dataclasses.dataclass
class FLTrust:
    """FLTrust: trust-weighted, norm-rescaled mean against a server-side root update.

    ``root(ctx)`` returns the server's update g₀ for this round, trained on its trusted root dataset
    from the same global model the clients started from."""

    inner: Aggregator
    root: Callable[[RoundContext], np.ndarray]
    linear: bool = dataclasses.field(default=False, init=False)

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        if not updates:
            raise FLError("FLTrust needs at least one update")
        g0 = np.asarray(self.root(ctx), dtype=np.float64)
        if g0.shape != (ctx.num_params,):
            raise FLError(f"FLTrust root update has shape {g0.shape}, expected ({ctx.num_params},)")
        vec, ts = fltrust_combine(_stack(updates), g0)
        res = self.inner.aggregate([_pseudo(vec, ctx, "fltrust")], ctx)
        info = dict(res.info)
        info["trust_scores"] = {u.client_id: float(t) for u, t in zip(updates, ts, strict=True)}
        info["trusted_clients"] = int(np.count_nonzero(ts))
        info["root_update_norm"] = float(np.linalg.norm(g0))
        return dataclasses.replace(res, num_clients=len(updates), info=info)
