"""PATE's privacy accounting: data-independent RDP, the data-dependent analysis of Papernot et al. 2018,
and the smooth-sensitivity release of the data-dependent ε itself.

Neighbouring data sets and sensitivity
--------------------------------------
The sensitive data are split into disjoint partitions, one per teacher, by a rule that places each
record independently of the others (its index, or a hash of its id), so that adding, removing or
replacing one record changes one partition only. Changing one record can change the vote of that
one teacher on every query and nothing else: a query's vote histogram n ∈ N^K moves by −1 in one
coordinate and +1 in another (or stays). So n − n' has L2 norm √2 (L1 norm 2), and the top count
max_j n_j moves by at most 1. The bounds below hold for add/remove *and* replace-one-record neighbours,
over all queries together (the same teacher changes on every query).

Data-independent bounds (RDP of order λ > 1, per query)
-------------------------------------------------------
* GNMax, argmax_j(n_j + N(0, σ²)): the Gaussian mechanism on the histogram with L2 sensitivity √2 is
  (λ, λ·(√2)²/(2σ²)) = (λ, λ/σ²)-RDP; the argmax is post-processing. This is Papernot et al. 2018's
  λ/σ² (their Proposition 8). dp_accounting's ``GaussianDpEvent(σ/√2)`` (sensitivity 1) is the same
  mechanism, which the tests use as the independent computation.
* Confident-GNMax's threshold check, max_j n_j + N(0, σ₁²) ≥ T: the top count has sensitivity 1, so
  (λ, λ/(2σ₁²))-RDP, paid on *every* query; the GNMax answer (σ₂) is paid on answered queries only.
* LNMax, argmax_j(n_j + Lap(b)): report-noisy-max with per-count sensitivity 1 in both directions is
  (2/b)-DP per query (Dwork and Roth, Claim 3.9 with each count moving by at most 1); a pure ε-DP
  mechanism is (λ, min(ε, λε²/2))-RDP (Bun and Steinke 2016).

(ε, δ) from RDP: ε = min_λ [RDP(λ) + log((λ−1)/λ) − (log δ + log λ)/(λ − 1)] (Canonne, Kamath and
Steinke 2020, Proposition 12; the conversion dp_accounting's RDP accountant uses), over :data:`ORDERS`.

Data-dependent bounds (Papernot et al. 2018, "Scalable private learning with PATE", ICLR)
----------------------------------------------------------------------------------------
* q̃ (their Proposition 7): for GNMax on n with top class i*, Pr[output ≠ i*] ≤ Σ_{i≠i*} Pr[n_i + Z_i ≥
  n_i* + Z_i*] = Σ_{i≠i*} Φ̄((n_i* − n_i)/(σ√2)), and never more than 1 − 1/K (the top class is the
  likeliest output). Large vote gaps give a tiny q̃.
* Theorem 6: if M is (μ₁, ε₁)- and (μ₂, ε₂)-RDP, q ≥ Pr[M(D) ≠ i*], λ ≤ μ₁ and q ≤ e^{(μ₂−1)ε₂} /
  (μ₁/(μ₁−1) · μ₂/(μ₂−1))^{μ₂}, then for every neighbour D' the order-λ divergence is at most
  (1/(λ−1))·log((1−q)·A^{λ−1} + q·B^{λ−1}), A = (1−q)/(1 − (e^{ε₂}q)^{(μ₂−1)/μ₂}), B = e^{ε₁}/q^{1/(μ₁−1)}.
* Proposition 10 (GNMax): μ₂ = σ√(log(1/q)), μ₁ = μ₂ + 1, ε_i = μ_i/σ²; the bound applies when μ₂ > 1,
  e^{ε₂}q < 1, λ < μ₁ and the q condition above; else the data-independent λ/σ² stands. The threshold
  check is the same with σ√2 in place of σ (sensitivity 1 instead of √2) and q = min(P, 1 − P) for
  P = Pr[max_j n_j + N(0, σ₁²) ≥ T], which is exact. The cost is taken as a non-decreasing function of q
  (the bound at q' holds for every q' ≥ the true probability), which the sensitivity analysis needs.

What the data-dependent ε protects, and why it is not published raw: it is a bound that holds for the
teachers' *actual* data against every neighbour, so it protects the same records as the data-independent
one. But the figure depends on the votes, so printing it leaks about the data (unanimity, for example).
Papernot et al. release it through the smooth-sensitivity mechanism (their §4 and Appendix C): the
local sensitivity LS⁽ᵏ⁾ of the total RDP cost at distance k (k records changed, i.e. every histogram
within k vote moves), the smooth sensitivity SS_β = max_k e^{−βk}·LS⁽ᵏ⁾, and the release
RDP(λ) + SS_β·N(0, σ_s²), which is itself (λ, λe^{2β}/σ_s² + (βλ − ½log(1 − 2λβ))/(λ − 1))-RDP for
1 < λ < 1/(2β) (their Theorem 23). Our LS⁽ᵏ⁾ is an upper bound, looser than the paper's enumeration of
vote moves: over the histograms within k moves, q̃ lies between the union bound with every gap cut by 2k
and the top-two term with that gap grown by 2k; at any such q̃ one more move changes the cost by at most
:func:`_gnmax_neighbour_table`'s figure (Jensen on the union bound's terms), and the threshold check's
top count moves by one; summed over queries. ``tests/pate/test_accounting.py`` checks the bound against a
brute-force search over small histograms.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from estimator.errors import AccountingError

__all__ = [
    "ORDERS",
    "PateAccountingError",
    "rdp_to_epsilon",
    "rdp_gnmax",
    "rdp_threshold",
    "rdp_lnmax",
    "data_independent",
    "logq_gnmax",
    "logpr_answered",
    "rdp_gnmax_dependent",
    "rdp_threshold_dependent",
    "data_dependent",
    "smooth_sensitivity",
    "gnss_rdp",
    "SmoothRelease",
    "release_data_dependent",
    "PROTECTS",
]

#: RDP orders λ searched for the best (ε, δ): fine near 1, then integers, then a log-spaced tail (the
#: data-dependent bound of near-unanimous votes is smallest at large orders).
ORDERS: np.ndarray = np.concatenate(
    [np.linspace(1.1, 10.9, 99), np.arange(11.0, 64.0), np.geomspace(64.0, 20000.0, 60)]
)

PROTECTS = (
    "one record of the teachers' sensitive data (adding, removing or replacing it changes one teacher's vote on "
    "every query), against anyone who sees every released label or ⊥ and the student trained on them; not "
    "against whoever sees the vote histograms or the aggregator's noise"
)


class PateAccountingError(AccountingError):
    """Bad parameters or votes for PATE's accounting."""


def _orders(orders: np.ndarray | None) -> np.ndarray:
    return ORDERS if orders is None else np.asarray(orders, dtype=float)


def rdp_to_epsilon(rdp: np.ndarray, delta: float, orders: np.ndarray | None = None) -> tuple[float, float]:
    """(ε, the best order λ) at ``delta`` from the RDP curve ``rdp`` over ``orders`` (module docstring)."""
    if not 0.0 < delta < 1.0:
        raise PateAccountingError(f"delta must be in (0, 1), got {delta!r}")
    lam = _orders(orders)
    r = np.asarray(rdp, dtype=float)
    eps = r + np.log1p(-1.0 / lam) - (math.log(delta) + np.log(lam)) / (lam - 1.0)
    eps = np.where(np.isfinite(eps), eps, np.inf)
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(lam[i])


def _positive(name: str, v: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise PateAccountingError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


def rdp_gnmax(sigma: float, orders: np.ndarray | None = None) -> np.ndarray:
    """Data-independent RDP of one GNMax answer: λ/σ² (histogram L2 sensitivity √2)."""
    return _orders(orders) / _positive("sigma", sigma) ** 2


def rdp_threshold(sigma1: float, orders: np.ndarray | None = None) -> np.ndarray:
    """Data-independent RDP of one threshold check: λ/(2σ₁²) (top count's sensitivity 1)."""
    return _orders(orders) / (2.0 * _positive("sigma1", sigma1) ** 2)


def rdp_lnmax(scale: float, orders: np.ndarray | None = None) -> np.ndarray:
    """RDP of one LNMax answer with Laplace scale b: it is (2/b)-DP, so min(2/b, λ(2/b)²/2)."""
    eps = 2.0 / _positive("scale", scale)
    return np.minimum(eps, _orders(orders) * eps * eps / 2.0)


def data_independent(
    sigma: float,
    answered: int,
    delta: float,
    queries: int | None = None,
    sigma1: float | None = None,
    orders: np.ndarray | None = None,
) -> dict[str, Any]:
    """ε at ``delta`` of ``answered`` GNMax answers, plus ``queries`` threshold checks with ``sigma1``
    when given (Confident-GNMax: every query pays the check, answered ones the answer too)."""
    lam = _orders(orders)
    if answered < 0 or (queries is not None and queries < answered):
        raise PateAccountingError(f"answered must be in [0, queries], got {answered} of {queries}")
    rdp = answered * rdp_gnmax(sigma, lam)
    if sigma1 is not None:
        rdp = rdp + (answered if queries is None else queries) * rdp_threshold(sigma1, lam)
    eps, order = rdp_to_epsilon(rdp, delta, lam)
    return {"epsilon": eps, "order": order, "rdp": rdp}


def _log_sf(x: np.ndarray) -> np.ndarray:
    """log Pr[N(0, 1) ≥ x], accurate far into the tail."""
    from scipy.special import log_ndtr

    return np.asarray(log_ndtr(-np.asarray(x, dtype=float)))


def _logsumexp(v: np.ndarray) -> float:
    m = float(np.max(v))
    return m if m == -math.inf else m + math.log(float(np.sum(np.exp(v - m))))


def logq_gnmax(votes: np.ndarray, sigma: float) -> float:
    """log q̃: the union bound on GNMax not answering the top class (Proposition 7), capped at 1 − 1/K."""
    n = np.asarray(votes, dtype=float)
    k = n.size
    top = int(np.argmax(n))
    gaps = n[top] - np.delete(n, top)
    return min(_logsumexp(_log_sf(gaps / (sigma * math.sqrt(2.0)))), math.log(1.0 - 1.0 / k))


def logpr_answered(votes: np.ndarray, threshold: float, sigma1: float) -> float:
    """log Pr[max_j n_j + N(0, σ₁²) ≥ T]."""
    return float(_log_sf(np.array([(threshold - float(np.max(votes))) / sigma1]))[0])


def _log1mexp(x: float) -> float:
    """log(1 − e^x) for x < 0."""
    if x >= 0:
        return -math.inf
    return math.log(-math.expm1(x)) if x > -0.693 else math.log1p(-math.exp(x))


def _theorem6(logq: float, s: float, lam: np.ndarray) -> np.ndarray:
    """The data-dependent RDP (Theorem 6 with Proposition 10) of a Gaussian argmax whose data-independent
    RDP is λ/s² (s = σ for GNMax, σ₁√2 for the threshold), at an upper bound q = e^logq; where the
    theorem's conditions fail, λ/s² itself."""
    base = lam / (s * s)
    if logq >= 0 or not math.isfinite(logq):
        return base if logq >= 0 else np.zeros_like(lam)
    mu2 = s * math.sqrt(-logq)
    mu1 = mu2 + 1.0
    e1, e2 = mu1 / (s * s), mu2 / (s * s)
    if mu2 <= 1.0 or logq + e2 >= 0:
        return base
    # q <= e^{(μ2−1)ε2} / (μ1/(μ1−1) · μ2/(μ2−1))^{μ2}
    if logq > (mu2 - 1.0) * e2 - mu2 * (math.log(mu1 / (mu1 - 1.0)) + math.log(mu2 / (mu2 - 1.0))):
        return base
    log1q = _log1mexp(logq)
    log_a = log1q - _log1mexp((logq + e2) * (mu2 - 1.0) / mu2)
    log_b = e1 - logq / (mu1 - 1.0)
    ok = lam < mu1
    out = base.copy()
    lo = lam[ok]
    bound = np.logaddexp(log1q + (lo - 1.0) * log_a, logq + (lo - 1.0) * log_b) / (lo - 1.0)
    out[ok] = np.minimum(base[ok], bound)
    return out


#: log q grid of the cost tables: cap − t, t = 0 and 800 points log-spaced in [1e-4, 1e4]
_T = np.concatenate([[0.0], np.geomspace(1e-4, 1e4, 800)])


@functools.lru_cache(maxsize=32)
def _table(s: float, cap: float, orders: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(ascending log q grid G, cost[g, order]) with cost non-decreasing in q: at G_g the minimum of the
    Theorem 6 bound over the grid points >= G_g (each a valid upper bound on the probability)."""
    lam = np.array(orders)
    grid = cap - _T[::-1]
    raw = np.stack([_theorem6(float(x), s, lam) for x in grid])
    return grid, np.minimum.accumulate(raw[::-1], axis=0)[::-1]


def _lookup(grid: np.ndarray, logq: np.ndarray | float) -> np.ndarray:
    """Index of the first grid point >= log q: the cost of any q' <= that point is bounded there."""
    return np.minimum(np.searchsorted(grid, logq, side="left"), grid.size - 1)


def _cost(logq: float, s: float, cap: float, lam: np.ndarray) -> np.ndarray:
    if logq == -math.inf:
        return np.zeros_like(lam)
    grid, cost = _table(float(s), float(cap), tuple(float(x) for x in lam))
    return cost[int(_lookup(grid, logq))].copy()


def rdp_gnmax_dependent(votes: np.ndarray, sigma: float, orders: np.ndarray | None = None) -> np.ndarray:
    """Data-dependent RDP of one GNMax answer on ``votes`` (never above λ/σ²)."""
    k = np.asarray(votes).size
    return _cost(logq_gnmax(votes, sigma), sigma, math.log(1.0 - 1.0 / k), _orders(orders))


def _threshold_logq(logp: float) -> float:
    """log min(P, 1 − P) from log P."""
    return min(logp, _log1mexp(logp)) if logp < 0 else -math.inf


def rdp_threshold_dependent(
    votes: np.ndarray, threshold: float, sigma1: float, orders: np.ndarray | None = None
) -> np.ndarray:
    """Data-dependent RDP of one threshold check (never above λ/(2σ₁²))."""
    logq = _threshold_logq(logpr_answered(votes, threshold, sigma1))
    return _cost(logq, sigma1 * math.sqrt(2.0), math.log(0.5), _orders(orders))


def _check_votes(votes: Any) -> np.ndarray:
    v = np.asarray(votes)
    if v.ndim != 2 or v.shape[1] < 2 or v.shape[0] < 1:
        raise PateAccountingError(f"votes must be a queries × classes array with >= 2 classes, got shape {v.shape}")
    if not np.issubdtype(v.dtype, np.number) or not np.all(np.isfinite(v)) or np.any(v < 0):
        raise PateAccountingError("votes must be finite non-negative counts")
    if np.any(v != np.round(v)):
        raise PateAccountingError("votes must be whole numbers (counts of teachers)")
    return v.astype(float)


def _answered_mask(votes: np.ndarray, answered: Any) -> np.ndarray:
    if answered is None:
        return np.ones(len(votes), dtype=bool)
    a = np.asarray(answered)
    if a.shape != (len(votes),) or not (a.dtype == bool or np.all((a == 0) | (a == 1))):
        raise PateAccountingError(f"answered must be one 0/1 flag per query ({len(votes)}), got shape {a.shape}")
    return a.astype(bool)


def _check_confident(threshold: float | None, sigma1: float | None) -> None:
    if (threshold is None) != (sigma1 is None):
        raise PateAccountingError("give both threshold and sigma1 (Confident-GNMax) or neither (GNMax)")


def data_dependent(
    votes: Any,
    sigma: float,
    delta: float,
    answered: Any = None,
    threshold: float | None = None,
    sigma1: float | None = None,
    orders: np.ndarray | None = None,
) -> dict[str, Any]:
    """The data-dependent ε at ``delta`` of GNMax answers on the queries flagged in ``answered`` (all when
    None), plus a threshold check (``threshold``, ``sigma1``) on every query when given. Returns
    ``epsilon``, ``order``, ``rdp`` (the curve) and ``per_query`` (each query's RDP at the best order)."""
    v = _check_votes(votes)
    lam = _orders(orders)
    mask = _answered_mask(v, answered)
    _check_confident(threshold, sigma1)
    _positive("sigma", sigma)
    per = np.zeros((len(v), lam.size))
    for i, n in enumerate(v):
        if threshold is not None and sigma1 is not None:
            per[i] += rdp_threshold_dependent(n, threshold, _positive("sigma1", sigma1), lam)
        if mask[i]:
            per[i] += rdp_gnmax_dependent(n, sigma, lam)
    rdp = per.sum(axis=0)
    eps, order = rdp_to_epsilon(rdp, delta, lam)
    j = int(np.argmin(np.abs(lam - order)))
    return {"epsilon": eps, "order": order, "rdp": rdp, "per_query": per[:, j], "answered": int(mask.sum())}


def _gnmax_neighbour_table(sigma: float, k: int, order: float) -> tuple[np.ndarray, np.ndarray]:
    """(grid, L) with L[a] bounding |c(n') − c(n'')| over neighbours n'' of any n' whose q̃ lies in
    (G_{a−1}, G_a]. One vote move changes each gap by at most 2, i.e. each union-bound term p by the map
    m±(p) = Φ̄(Φ̄⁻¹(p) ∓ a), a = √2/σ; m+ is concave and m− convex, so by Jensen the K − 1 terms summing
    to q move to at most (K−1)·m+(q/(K−1)) (capped at 1 − 1/K; this also covers a change of the top class)
    and at least min((K−1)·m−(q/(K−1)), Φ̄(a)) (Φ̄(a): the old top's term when the top changes)."""
    from scipy.special import ndtri_exp

    cap = math.log(1.0 - 1.0 / k)
    grid, cost = _table(float(sigma), cap, (float(order),))
    c = cost[:, 0]
    a = math.sqrt(2.0) / sigma
    per = grid - math.log(k - 1)
    z = -ndtri_exp(per)  # Φ̄⁻¹(q/(K−1))
    up = np.minimum(cap, math.log(k - 1) + _log_sf(z - a))
    lo = np.minimum(np.minimum(math.log(k - 1) + _log_sf(z + a), float(_log_sf(np.array([a]))[0])), cap)
    c_up = c[_lookup(grid, up)]
    c_lo = np.concatenate([[0.0], c[_lookup(grid, lo)][:-1]])  # at the interval's lower end G_{a−1}
    return grid, np.maximum(c_up - c, c - c_lo)


def _threshold_neighbour_table(threshold: float, sigma1: float, teachers: int, order: float) -> np.ndarray:
    """L[m] for m = 0..teachers: the largest change of the threshold check's cost when the top count moves
    from m to m ± 1 (one vote move changes the top count by at most 1)."""
    ms = np.arange(-1, teachers + 2, dtype=float)
    logp = _log_sf((threshold - ms) / sigma1)
    cost = np.array(
        [_cost(_threshold_logq(float(x)), sigma1 * math.sqrt(2.0), math.log(0.5), np.array([order]))[0] for x in logp]
    )
    return np.maximum(np.abs(cost[1:-1] - cost[:-2]), np.abs(cost[1:-1] - cost[2:]))


def _distance_grid(limit: int) -> list[int]:
    """0..8, then about 15 % apart, then ``limit``."""
    ks = list(range(min(limit, 8) + 1))
    while ks[-1] < limit:
        ks.append(min(limit, max(ks[-1] + 1, int(ks[-1] * 1.15))))
    return ks


def _local_sensitivity(
    v: np.ndarray, mask: np.ndarray, r: int, sigma: float, gn: tuple[np.ndarray, np.ndarray], thr: np.ndarray | None
) -> float:
    """Σ over queries of the largest neighbour change of the cost over histograms within ``r`` vote moves:
    q̃ there lies between the union bound with every gap cut by 2r and the top-two term with that gap grown
    by 2r (each coordinate moves by at most r); the top count between m − r and m + r."""
    grid, table = gn
    k = v.shape[1]
    top = v.max(axis=1)
    gaps = top[:, None] - v
    s2 = sigma * math.sqrt(2.0)
    total = 0.0
    for i in np.flatnonzero(mask):
        g = np.delete(gaps[i], int(np.argmax(v[i])))
        hi = min(_logsumexp(_log_sf(np.maximum(g - 2 * r, 0.0) / s2)), math.log(1.0 - 1.0 / k))
        lo = min(float(_log_sf(np.array([(g.min() + 2 * r) / s2]))[0]), math.log(1.0 - 1.0 / k))
        total += float(table[int(_lookup(grid, lo)) : int(_lookup(grid, hi)) + 1].max())
    if thr is not None:
        for m in top.astype(int):
            total += float(thr[max(0, m - r) : m + r + 1].max())
    return total


def smooth_sensitivity(
    votes: Any,
    sigma: float,
    order: float,
    beta: float,
    answered: Any = None,
    threshold: float | None = None,
    sigma1: float | None = None,
) -> dict[str, Any]:
    """An upper bound on SS_β = max_k e^{−βk}·LS⁽ᵏ⁾ of the total data-dependent RDP at ``order`` (module
    docstring). LS⁽ᵏ⁾ (our bound) does not decrease with k, so it is evaluated on a grid g₀ < g₁ < ... of
    distances and every k in (g_{i−1}, g_i] is charged e^{−β(g_{i−1}+1)}·LS⁽ᵍⁱ⁾; once k reaches the number
    of teachers every histogram is within reach and LS stops growing. The search stops early once e^{−βk}
    times the largest possible value (the data-independent cost) is below the maximum found."""
    v = _check_votes(votes)
    mask = _answered_mask(v, answered)
    _check_confident(threshold, sigma1)
    teachers = int(v.sum(axis=1).max())
    gn = _gnmax_neighbour_table(sigma, v.shape[1], order)
    thr = None
    ceiling = float(mask.sum() * order / sigma**2)
    if threshold is not None and sigma1 is not None:
        thr = _threshold_neighbour_table(threshold, sigma1, teachers, order)
        ceiling += len(v) * order / (2 * sigma1**2)
    best, argbest, previous, ls = 0.0, 0, -1, 0.0
    for k in _distance_grid(teachers):
        start = previous + 1  # the smallest distance this grid point stands for
        if math.exp(-beta * start) * ceiling <= best:
            break
        ls = _local_sensitivity(v, mask, k, sigma, gn, thr)
        if math.exp(-beta * start) * ls > best:
            best, argbest = math.exp(-beta * start) * ls, k
        previous = k
    if previous == teachers:  # every farther k: LS no larger than at k = teachers, discounted further
        best = max(best, math.exp(-beta * (teachers + 1)) * ls)
    return {"smooth_sensitivity": best, "at_distance": argbest, "beta": beta, "order": float(order)}


def gnss_rdp(beta: float, sigma_s: float, order: float) -> float:
    """RDP at ``order`` of releasing f(D) + SS_β(D)·N(0, σ_s²) (Papernot et al. 2018, Theorem 23)."""
    if not 1.0 < order < 1.0 / (2.0 * beta):
        raise PateAccountingError(f"the order must be in (1, 1/(2β)) = (1, {1 / (2 * beta):g}), got {order:g}")
    return order * math.exp(2 * beta) / sigma_s**2 + (beta * order - 0.5 * math.log(1 - 2 * order * beta)) / (order - 1)


@dataclasses.dataclass(frozen=True)
class SmoothRelease:
    """The published data-dependent ε and what went into it."""

    epsilon: float
    rdp_noisy: float
    smooth_sensitivity: float
    release_rdp: float
    order: float
    beta: float
    sigma_s: float
    order_chosen_on_data: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def release_data_dependent(
    votes: Any,
    sigma: float,
    delta: float,
    rng: np.random.Generator,
    answered: Any = None,
    threshold: float | None = None,
    sigma1: float | None = None,
    sigma_s: float | None = None,
    beta: float | None = None,
    order: float | None = None,
) -> SmoothRelease:
    """Publish the data-dependent ε through the smooth-sensitivity mechanism: at ``order`` λ (default: the
    order best for the data-dependent ε, chosen on the data: a residual the result says), release
    RDP(λ) + SS_β·N(0, σ_s²) (noise from ``rng``), add the release's own RDP (Theorem 23) and convert at δ.
    Defaults: β = 0.4/λ and σ_s = 2√λ, so the release costs about e^{0.8/λ}/4 + 1.2/(λ − 1) in RDP (the
    paper tunes both per data set). The published figure is noisy: it may fall below the exact
    data-dependent ε (it is an estimate made private, not a bound)."""
    lams = None if order is None else np.array([float(order)])
    dd = data_dependent(votes, sigma, delta, answered, threshold, sigma1, lams)
    lam = float(dd["order"])
    rdp_at = float(dd["rdp"][int(np.argmin(np.abs(_orders(lams) - lam)))])
    b = 0.4 / lam if beta is None else beta
    ss_sigma = 2.0 * math.sqrt(lam) if sigma_s is None else sigma_s
    ss = smooth_sensitivity(votes, sigma, lam, b, answered, threshold, sigma1)["smooth_sensitivity"]
    noisy = max(0.0, rdp_at + ss * ss_sigma * float(rng.standard_normal()))
    extra = gnss_rdp(b, ss_sigma, lam)
    eps = noisy + extra + math.log1p(-1.0 / lam) - (math.log(delta) + math.log(lam)) / (lam - 1.0)
    return SmoothRelease(max(0.0, eps), noisy, ss, extra, lam, b, ss_sigma, order is None)
