"""Accounting of the distributed discrete Gaussian (the mechanism is :mod:`ldp_core.fl.ddg`).

The released value of a round is a post-processing of Z = Σ_u r_u + Σ_u N_u (then mod m, scaled,
rotated back): the integer rounded updates r_u (each ‖r_u‖₂² ≤ Δ², :attr:`DDGSpec.norm_bound_sq`)
plus k independent N_Z(0, σ²)^D shares, σ = σ_ℓ. A sum of discrete Gaussians is not a discrete
Gaussian, but it is close: Kairouz, Liu, Steinke (ICML 2021, Prop. 14) bound, for σ ≥ 1/2, every
α ≥ 1 and every integer shift v ∈ Z^D,

    D_α(Z ‖ Z + v) ≤ min{ α/2·‖v‖₂²/(kσ²) + τD,
                          α/2·(‖v‖₂²/(kσ²) + 2‖v‖₁τ/(√k σ) + τ²D),
                          α/2·(‖v‖₂/(√k σ) + τ√D)² },
    τ = 10 Σ_{j=1}^{k−1} exp(−2π²σ²·j/(j+1)).

(τ is negligible once σ is a few integer units: e^{−π²σ²}.) One round is therefore (α, ε(α))-RDP with
ε(α) the bound at the worst shift: ‖v‖₂ ≤ Δ₂ and ‖v‖₁ ≤ √D·Δ₂ (Cauchy–Schwarz), where Δ₂ = 2Δ for
neighbours that *replace* one client's data (fixed-count sampling: the two rounded vectors each have
norm ≤ Δ) — the relation used here (:class:`DDGAccountant` refuses Poisson sampling, whose add/remove
neighbours would change the number of noise shares too).

Adversaries: the server operator sees Z mod m (through SecAgg) and knows the sample; a client may be in
every round, so the rounds compose without amplification: ε_T(α) = Σ_rounds ε(α), converted to (ε, δ)
by ε = min_α ε_T(α) + log((α−1)/α) − (log δ + log α)/(α − 1) (Canonne, Kamath, Steinke 2020, Prop. 12;
the conversion dp_accounting uses). Observers of the released models see a post-processing of what the
server sees, so the same figure holds for them; no amplification by sampling is credited (the
subsampled-RDP bounds in dp_accounting are specific to the continuous Gaussian), so it is conservative.

Shares: k is the number of noise shares summed. The job refuses to release a DDG round with fewer than
``min_shares`` survivors, so an operator who follows the protocol sees k ≥ min_shares. A malicious
server that tells clients some of them dropped can unmask a sum of as few as t (the SecAgg threshold)
shares: :meth:`DDGAccountant.epsilon` with ``shares=t`` is the figure against it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ldp_core.fl.ddg import DDGSpec
from ldp_core.fl.errors import FLError

__all__ = [
    "tau",
    "sum_dg_rdp",
    "round_rdp",
    "rdp_to_epsilon",
    "DDGAccountant",
    "ORDERS",
    "noise_for_epsilon",
    "ddg_epsilon_by_adversary",
    "DEFAULT_ASSUMED_HONEST_FRACTION",
    "assumed_honest_shares",
]

#: the share of a round's sampled devices a task assumes honest when it does not say (``assumed_honest_fraction``
#: of the task's distributed-DG noise): half. The operator runs the enrollment authority and draws the sample,
#: so it can fill a round with devices whose noise it knows; the ε against it holds only for the honest ones'
#: shares, and an honest majority is the usual assumption of multi-party protocols (docs/fl/SECAGG.md)
DEFAULT_ASSUMED_HONEST_FRACTION = 0.5

#: RDP orders α searched by the conversion: 1 + a log-spaced grid from 1e-3 to 1e4 (fine enough that
#: the minimum over the grid is within 0.1 % of the continuous minimum for the figures here).
ORDERS = 1.0 + np.geomspace(1e-3, 1e4, 4000)


def tau(shares: int, sigma2: float) -> float:
    """τ = 10 Σ_{j=1}^{k−1} exp(−2π²σ²·j/(j+1)) (KLS21 Prop. 14), k = ``shares``."""
    if shares < 1:
        raise FLError(f"the number of noise shares must be >= 1, got {shares}")
    j = np.arange(1, shares, dtype=np.float64)
    return float(10.0 * np.sum(np.exp(-2.0 * math.pi**2 * sigma2 * j / (j + 1.0))))


def sum_dg_rdp(alpha: np.ndarray | float, l2: float, l1: float, shares: int, sigma2: float, dim: int) -> np.ndarray:
    """KLS21 Prop. 14's bound on D_α(Z ‖ Z + v) for ‖v‖₂ ≤ l2, ‖v‖₁ ≤ l1, Z a sum of ``shares``
    independent N_Z(0, σ²)^dim (σ² = ``sigma2`` ≥ 1/4)."""
    if sigma2 < 0.25:
        raise FLError(f"KLS21's bound needs σ >= 1/2 per share, got σ² = {sigma2}")
    a = np.asarray(alpha, dtype=np.float64)
    if np.any(a < 1):
        raise FLError("RDP orders must be >= 1")
    t = tau(shares, sigma2)
    ks2 = shares * sigma2
    b1 = a / 2 * l2**2 / ks2 + t * dim
    b2 = a / 2 * (l2**2 / ks2 + 2 * l1 * t / math.sqrt(ks2) + t**2 * dim)
    b3 = a / 2 * (l2 / math.sqrt(ks2) + t * math.sqrt(dim)) ** 2
    out: np.ndarray = np.minimum(np.minimum(b1, b2), b3)
    return out


def round_rdp(spec: DDGSpec, shares: int, alpha: np.ndarray | float = ORDERS) -> np.ndarray:
    """ε(α) of one round with ``shares`` noise shares, replace-one neighbours (Δ₂ = 2Δ, Δ₁ ≤ √D·Δ₂)."""
    if not 1 <= shares <= spec.clients:
        raise FLError(f"shares must be in [1, {spec.clients}] (the devices that add noise), got {shares}")
    l2 = 2.0 * math.sqrt(spec.norm_bound_sq)
    return sum_dg_rdp(alpha, l2, math.sqrt(spec.padded_dim) * l2, shares, spec.local_sigma2, spec.padded_dim)


def rdp_to_epsilon(rdp: np.ndarray, delta: float, orders: np.ndarray = ORDERS) -> float:
    """(ε, δ) from an RDP curve: min_α rdp(α) + log((α−1)/α) − (log δ + log α)/(α − 1) (CKS 2020)."""
    if not 0.0 < delta < 1.0:
        raise FLError(f"delta must be in (0, 1), got {delta}")
    a = np.asarray(orders, dtype=np.float64)
    eps = np.asarray(rdp) + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
    return float(max(0.0, np.min(eps)))


@dataclasses.dataclass
class DDGAccountant:
    """The client-level ε of the DDG rounds released so far, against the server operator (and, the same
    figure, against observers of the models): see the module docstring. ``record(spec, shares)`` per
    released round (``shares``: the minimum number of noise shares the job guarantees it summed)."""

    delta: float
    rounds_recorded: list[tuple[DDGSpec, int]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 < self.delta < 1.0:
            raise FLError(f"delta must be in (0, 1), got {self.delta}")

    @property
    def rounds(self) -> int:
        return len(self.rounds_recorded)

    def record(self, spec: DDGSpec, shares: int | None = None) -> None:
        k = spec.clients if shares is None else shares
        round_rdp(spec, k, 2.0)  # checks shares and σ now, not at the next epsilon()
        self.rounds_recorded.append((spec, k))

    def rdp(self, shares: int | None = None) -> np.ndarray:
        """The composed curve over :data:`ORDERS`; ``shares`` overrides every round's share count."""
        total = np.zeros_like(ORDERS)
        cache: dict[tuple[DDGSpec, int], np.ndarray] = {}
        for spec, k in self.rounds_recorded:
            key = (spec, k if shares is None else min(shares, spec.clients))
            if key not in cache:
                cache[key] = round_rdp(*key)
            total += cache[key]
        return total

    def epsilon(self, shares: int | None = None) -> float:
        """ε at :attr:`delta` (0 before any round)."""
        if not self.rounds_recorded:
            return 0.0
        return rdp_to_epsilon(self.rdp(shares), self.delta)

    def modular_clipping_bound(self) -> float:
        """A bound on the probability that any released round wrapped a coordinate (union over rounds)."""
        return min(1.0, sum(spec.modular_clipping_bound() for spec, _ in self.rounds_recorded))


def noise_for_epsilon(
    target: float,
    delta: float,
    rounds: int,
    *,
    clip_norm: float,
    clients: int,
    dim: int,
    bits: int,
    k_stddevs: float = 6.0,
    shares: int | None = None,
) -> DDGSpec:
    """The :meth:`DDGSpec.for_bits` spec with the smallest noise (to 0.1 %, rounded up) whose ``rounds``
    rounds give at most ε = ``target`` against the server at δ = ``delta`` (bisection on s; ε falls with s)."""

    def eps(s: float) -> float:
        spec = DDGSpec.for_bits(clip_norm, s, clients, dim, bits, k_stddevs)
        acc = DDGAccountant(delta)
        for _ in range(rounds):
            acc.record(spec, shares)
        return acc.epsilon()

    def feasible(s: float) -> bool:
        try:
            return eps(s) <= target
        except Exception:  # σ_ℓ < 1/2: too little noise for this γ
            return False

    lo, hi = 0.0, clip_norm
    for _ in range(60):
        if feasible(hi):
            break
        lo, hi = hi, 2.0 * hi
    else:
        raise FLError(f"no noise reaches ε = {target} with {bits} bits per coordinate (the rounding floor)")
    while hi - lo > 1e-3 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return DDGSpec.for_bits(clip_norm, hi, clients, dim, bits, k_stddevs)


def assumed_honest_shares(sampled: int, fraction: float, min_shares: int | None = None) -> int:
    """The noise shares an operator is assumed not to know: h = ⌈f·n⌉ of the n sampled devices are honest,
    and of the k = ``min_shares`` (default n) shares a released round sums at least h − (n − k) are theirs
    (the n − k that dropped may all be honest); at least 1."""
    if isinstance(sampled, bool) or not isinstance(sampled, int) or sampled < 1:
        raise FLError(f"sampled must be an integer >= 1, got {sampled!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction <= 1.0:
        raise FLError(f"the assumed honest fraction must be a number in (0, 1], got {fraction!r}")
    k = sampled if min_shares is None else min_shares
    honest = math.ceil(fraction * sampled - 1e-9)
    return max(1, min(k, honest - (sampled - k)))


def ddg_epsilon_by_adversary(
    acc: DDGAccountant,
    threshold: int | None = None,
    honest_shares: int | None = None,
    honest_fraction: float | None = None,
) -> list[dict[str, Any]]:
    """The distributed-DG counterpart of :func:`estimator.fl.dp.epsilon_by_adversary`: the same three
    adversaries in the same order and keys, all with the figure of :meth:`DDGAccountant.epsilon` (observers
    see a post-processing of what the server sees; no amplification credited). The server operator's entry
    also carries ``epsilon_if_dropouts_faked``, the figure with only t = ``threshold`` noise shares (what a
    server that lies about dropouts could unmask), the modular-clipping bound, ``epsilon_all_honest`` (its
    ``epsilon``: every sampled device genuine and honest) and, given ``honest_shares`` (h, from
    :func:`assumed_honest_shares` of the task's ``assumed_honest_fraction``), ``epsilon_assumed_honest``: the
    figure when only h shares are noise the operator does not know (the rest from devices it enrolled or
    controls: their noise it subtracts)."""
    e = acc.epsilon()
    server: dict[str, Any] = {
        "adversary": "server_operator",
        "sees": "the sample and the SecAgg sum (mod 2^bits) of the devices' rounded updates, each already "
        "carrying its discrete Gaussian noise share: never an un-noised sum",
        "amplification": False,
        "epsilon": e,
        "protection": "distributed discrete Gaussian (Kairouz, Liu, Steinke 2021): the devices add the noise "
        "before secure aggregation",
        "modular_clipping_bound": acc.modular_clipping_bound(),
    }
    if threshold is not None:
        server["epsilon_if_dropouts_faked"] = acc.epsilon(shares=threshold)
    server["epsilon_all_honest"] = e
    if honest_shares is not None:
        server["epsilon_assumed_honest"] = acc.epsilon(shares=honest_shares)
        server["assumed_honest_shares"] = honest_shares
        server["assumed_honest_fraction"] = honest_fraction
    return [
        {
            "adversary": "observer",
            "sees": "the released models, not the sample",
            "amplification": False,
            "epsilon": e,
        },
        {
            "adversary": "knows_sample",
            "sees": "the sample and the released models",
            "amplification": False,
            "epsilon": e,
        },
        server,
    ]
