"""Client-level differential privacy as wrappers around a linear aggregator,
and the accountant that reports (ε, δ) after every round.

Neighbouring datasets differ by *one client's entire data* (add or remove a
client): the guarantee covers everything a client contributes over all the
rounds it takes part in (McMahan, Ramage, Talwar, Zhang, "Learning
differentially private recurrent language models", ICLR 2018).

:class:`FixedClippingDP` (DP-FedAvg, ibid.): each update Δᵢ is clipped to
L2 norm C, Δᵢ·min(1, C/‖Δᵢ‖), all clients weigh the same, and the aggregate
is (Σ clip(Δᵢ) + N(0, σ²C²·I)) / m̄ with m̄ the *expected* number of clients.
One client moves the sum by at most C, so a round is a Gaussian mechanism
with noise multiplier σ run on the sampled clients.

:class:`AdaptiveClippingDP` (Andrew, Thakkar, McMahan, Ramaswamy,
"Differentially private learning with adaptive clipping", NeurIPS 2021,
Algorithm 1 with geometric updates): the clip norm C follows the γ-quantile
of the update norms. Each client also contributes bᵢ − ½ with
bᵢ = 1[‖Δᵢ‖ ≤ C]; the server releases b̄ = (Σ(bᵢ − ½) + N(0, σ_b²))/m̄ + ½
and sets C ← C·exp(−η_C (b̄ − γ)). *How the count is accounted*: the round
releases two Gaussian sums, the clipped updates (sensitivity C, noise
σ_Δ·C) and the centred bits (sensitivity ½, noise σ_b). Composing two
Gaussian mechanisms gives one with μ² = σ_Δ⁻² + (2σ_b)⁻² (Dong, Roth, Su,
"Gaussian differential privacy", 2019, Cor. 3.3; the same identity is Andrew
et al.'s Theorem 1), so the wrapper takes the *overall* noise multiplier z
that the accountant charges and uses σ_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) on the
updates: the clipped count costs slightly more noise on the updates, never
an unaccounted release. The default σ_b = m̄/20 is the paper's suggestion.

:class:`DPFLTrust` (issue 18): FLTrust (Cao, Fang, Liu, Gong, NDSS 2021)
made a bounded-sensitivity sum. The root update g₀ is clipped to C, g₀' =
g₀·min(1, C/‖g₀‖); client i's contribution is TSᵢ·‖g₀'‖·Δᵢ/‖Δᵢ‖ with
TSᵢ = ReLU(cos(Δᵢ, g₀)) ∈ [0, 1], so its norm is at most C whatever the client
sends (its norm never matters, only its direction); the release is
(Σᵢ TSᵢ·ḡᵢ + N(0, σ²C²·I)) / m̄ with m̄ the expected number of clients,
not FLTrust's Σ TSᵢ. Adding or removing one client moves the sum by at most
C, exactly as in DP-FedAvg, so :class:`ClientLevelAccountant` accounts it
unchanged. C is a task parameter, never a function of the root data: g₀
only chooses a direction and a length below C, and the server's data is not
what the client-level guarantee protects.

Only a linear aggregator may sit inside (``inner.linear``): the sensitivity
argument needs a sum. Clipping happens here, on the server; with secure
aggregation the devices clip before masking (:func:`ldp_core.fl.training.clip_to_norm`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from estimator.accounting.accountant import NEIGHBORS, Neighbors, RdpAccountant, epsilon_pld, exact_gaussian_epsilon
from estimator.fl.aggregators import AggregateResult, Aggregator, RoundContext
from estimator.fl.sampling import FixedCountSampling, PoissonSampling, Sampling
from ldp_core.fl.errors import FLError
from ldp_core.fl.training import ClientUpdate, clip_to_norm
from ldp_core.privacy_events import ComposedEvent, GaussianEvent, PoissonSampledEvent, PrivacyEvent, SelfComposedEvent

__all__ = [
    "ClientLevelAccountant",
    "FixedClippingDP",
    "AdaptiveClippingDP",
    "DPFLTrust",
    "fltrust_contributions",
    "FLTRUST_OPERATOR_SEES",
    "update_noise_multiplier",
    "ADVERSARIES",
    "epsilon_by_adversary",
]


class ClientLevelAccountant:
    """Client-level (ε, δ) of the rounds run so far.

    Poisson sampling: the PLD accountant of :mod:`estimator.accounting`
    (tight; pessimistic discretization, ``discretization`` 1e-3 by default,
    within about 1e-4 relative of 1e-4's figure for the settings here) on the
    composition of Poisson-subsampled Gaussian rounds, add/remove-one-client
    neighbours. Fixed-count sampling: the RDP accountant on rounds sampled
    without replacement, replace-one-client neighbours (see
    :mod:`estimator.fl.sampling`); replacing a client moves the clipped sum by up
    to 2C, so the Gaussian's multiplier relative to that change is σ/2 (the
    convention of :mod:`ldp_core.privacy_events`). A round without noise makes
    ε infinite.

    Two adversaries (issue 13). :meth:`epsilon` holds against observers of the
    models who do *not* know the sample (amplification by sampling credited).
    :meth:`epsilon_known_sample` holds against whoever knows the sample (the
    server operator): no amplification, and a client may have been sampled in
    every round, so it is the exact ε of the composed unsampled Gaussian rounds
    (Dong, Roth, Su 2019) under the same neighbouring relation. Any valid bound
    for the second also holds for the first, so for fixed-count sampling, where
    the RDP bound of the amplified rounds can exceed the exact unamplified one
    (it does for 10 of 20 clients over 100 rounds: RDP's conversion to (ε, δ)
    loses more than amplification gains), :meth:`epsilon` is the smaller of the
    two; :meth:`epsilon_amplified` is the RDP figure alone."""

    #: :meth:`epsilon` credits amplification by a secret sample (DP-FTRL's accountant does not)
    amplification: ClassVar[bool] = True

    def __init__(self, sampling: Sampling, population: int, delta: float, discretization: float = 1e-3) -> None:
        if not 0.0 < delta < 1.0:
            raise FLError(f"delta must be in (0, 1), got {delta}; choose it below 1/population")
        if population < 1:
            raise FLError(f"population must be >= 1, got {population}")
        if isinstance(sampling, FixedCountSampling) and sampling.count > population:
            raise FLError(f"fixed count {sampling.count} exceeds the population {population}")
        if not isinstance(sampling, (PoissonSampling, FixedCountSampling)):
            raise FLError(f"no accounting for sampling scheme {sampling!r}")
        self.sampling = sampling
        self.population = population
        self.delta = float(delta)
        self.discretization = discretization
        self._groups: list[list[Any]] = []  # [noise multiplier, count]

    @property
    def rounds(self) -> int:
        return sum(c for _, c in self._groups)

    def record(self, noise_multiplier: float) -> None:
        """One round with Gaussian noise of multiplier z (0: no noise)."""
        z = float(noise_multiplier)
        if not z >= 0:
            raise FLError(f"noise multiplier must be >= 0, got {noise_multiplier}")
        if self._groups and self._groups[-1][0] == z:
            self._groups[-1][1] += 1
        else:
            self._groups.append([z, 1])

    def event(self) -> PrivacyEvent:
        """The composed event of the rounds so far (Poisson sampling only)."""
        if not isinstance(self.sampling, PoissonSampling):
            raise FLError("fixed-count sampling has no event in the project's event language; see epsilon()")
        if not self._groups:
            raise FLError("no round recorded yet")
        parts: list[PrivacyEvent] = []
        for z, count in self._groups:
            step: PrivacyEvent = GaussianEvent(z)
            if self.sampling.rate < 1.0:
                step = PoissonSampledEvent(self.sampling.rate, step)
            parts.append(SelfComposedEvent(step, count))
        return parts[0] if len(parts) == 1 else ComposedEvent(tuple(parts))

    @property
    def neighbors(self) -> Neighbors:
        """The neighbouring relation of every figure: add/remove (Poisson) or replace-one (fixed count)."""
        return "add_or_remove" if isinstance(self.sampling, PoissonSampling) else "replace"

    def epsilon(self) -> float:
        """ε at ``delta`` after the rounds recorded so far (0 before any round), against
        observers who do not know the sample."""
        if not self._groups:
            return 0.0
        if any(z == 0 for z, _ in self._groups):
            return math.inf
        if isinstance(self.sampling, PoissonSampling):
            return epsilon_pld(self.event(), self.delta, "add_or_remove", self.discretization)
        return min(self.epsilon_amplified(), self.epsilon_known_sample())

    def epsilon_known_sample(self) -> float:
        """ε at ``delta`` against an adversary who knows the sample: the exact ε of every
        recorded round as an unsampled Gaussian release (a client may be in all of them),
        under :attr:`neighbors`."""
        if not self._groups:
            return 0.0
        if any(z == 0 for z, _ in self._groups):
            return math.inf
        parts: list[PrivacyEvent] = [SelfComposedEvent(GaussianEvent(z), count) for z, count in self._groups]
        event = parts[0] if len(parts) == 1 else ComposedEvent(tuple(parts))
        eps = exact_gaussian_epsilon(event, self.delta, self.neighbors)
        assert eps is not None  # unsampled Gaussian rounds always have the exact form
        return eps

    def epsilon_amplified(self) -> float:
        """The amplified bound alone: PLD (Poisson, add/remove) or dp_accounting's RDP for
        sampling without replacement (fixed count, replace-one)."""
        if not self._groups:
            return 0.0
        if any(z == 0 for z, _ in self._groups):
            return math.inf
        if isinstance(self.sampling, PoissonSampling):
            return epsilon_pld(self.event(), self.delta, "add_or_remove", self.discretization)
        import dp_accounting

        acc = RdpAccountant(neighboring_relation=NEIGHBORS["replace"])
        for z, count in self._groups:
            # dp_accounting's multiplier is noise / (change of the sum under one replacement) = σC / 2C
            ev = dp_accounting.SampledWithoutReplacementDpEvent(
                self.population, self.sampling.count, dp_accounting.GaussianDpEvent(z / 2.0)
            )
            acc.compose(ev, count)
        return float(acc.get_epsilon(self.delta))


#: The adversaries every FL ε is stated against (issue 13), in the order they are printed.
ADVERSARIES = ("observer", "knows_sample", "server_operator")


class _AdversaryAccountant(Protocol):
    """What :func:`epsilon_by_adversary` reads: this module's accountant or DP-FTRL's
    (:class:`estimator.fl.ftrl.FtrlAccountant`, ``amplification`` False: both figures are one)."""

    @property
    def amplification(self) -> bool: ...

    def epsilon(self) -> float: ...

    def epsilon_known_sample(self) -> float: ...


#: what the server operator of a DP-FLTrust task holds (:class:`DPFLTrust`): more than DP-FedAvg's, since
#: the trust scores need every raw update, never a clipped or masked one
FLTRUST_OPERATOR_SEES = (
    "the sample, every client's raw update (FLTrust scores each against the root update, so no SecAgg), "
    "the root data and the un-noised trust-weighted sum (the server adds the noise)"
)


def epsilon_by_adversary(
    acc: _AdversaryAccountant,
    *,
    secagg: bool,
    observer: float | None = None,
    known_sample: float | None = None,
    operator_sees: str | None = None,
) -> list[dict[str, Any]]:
    """The accountant's ε against each adversary, labelled (issue 13; the threat table in docs/fl/DESIGN.md).

    * ``observer``: sees the released models (and the public status) but not the sample:
      :meth:`ClientLevelAccountant.epsilon`, sampling amplification credited.
    * ``knows_sample``: knows which clients were sampled in every round but sees only the
      released models (a coalition of selected devices, anyone the sample leaks to; the operator
      too if the noise were added where it cannot see the sum, which is not done):
      :meth:`ClientLevelAccountant.epsilon_known_sample`, no amplification.
    * ``server_operator``: knows the sample and, because the noise here is *central* (added by the
      server after aggregation), sees the un-noised aggregate — with ``secagg`` the un-noised sum of
      the sampled clients' clipped updates, without it every clipped update. No DP holds against it:
      ε is None (``protection`` says why), not a number.

    Every figure is a function of the recorded noise multipliers, the sampling scheme, the
    population and δ only (public task parameters and the number of rounds released), never of the
    realized sample, so it may be shown publicly. ∞ stays ``math.inf`` (callers format it).
    ``observer`` / ``known_sample``: the accountant's figures if the caller already has them (the
    PLD computation is not free); they must be what the methods return. With DP-FTRL's accountant
    (``acc.amplification`` False) the observer's and the known-sample figures are the same number.
    ``operator_sees``: the operator's view where it is not DP-FedAvg's (DP-FLTrust: :data:`FLTRUST_OPERATOR_SEES`)."""
    sees = operator_sees or (
        "the sample and the un-noised sum of the sampled clients' clipped updates (SecAgg hides each update; "
        "the server adds the noise after unmasking)"
        if secagg
        else "the sample and every clipped update before the noise (the server clips, sums and adds the noise)"
    )
    amplified = bool(acc.amplification)  # DP-FTRL credits none: the observer's figure is the known-sample one
    return [
        {
            "adversary": "observer",
            "sees": "the released models, not the sample",
            "amplification": amplified,
            "epsilon": acc.epsilon() if observer is None else observer,
        },
        {
            "adversary": "knows_sample",
            "sees": "the sample and the released models, not the un-noised aggregate",
            "amplification": False,
            "epsilon": acc.epsilon_known_sample() if known_sample is None else known_sample,
        },
        {
            "adversary": "server_operator",
            "sees": sees,
            "amplification": False,
            "epsilon": None,
            "protection": "none: central noise is added by the server after it has seen the un-noised "
            + ("sum" if secagg and operator_sees is None else "updates"),
        },
    ]


def _require_linear(inner: Aggregator, who: str) -> None:
    if not getattr(inner, "linear", False):
        raise FLError(
            f"{who} needs a linear inner aggregator (a weighted sum); {type(inner).__name__} is not. "
            "Robust aggregators have no bounded-sensitivity sum to add noise to."
        )


def _report(acc: ClientLevelAccountant | None, every: int, info: dict[str, Any]) -> None:
    if acc is None:
        return
    info["rounds_accounted"] = acc.rounds
    if acc.rounds % every == 0:
        info["epsilon"] = acc.epsilon()
        info["delta"] = acc.delta


def _check_gaussian(clip_norm: float, noise_multiplier: float) -> None:
    """C finite and > 0, σ finite and ≥ 0 (the Gaussian releases' parameters)."""
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise FLError(f"clip_norm must be a finite number > 0, got {clip_norm}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise FLError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier}")


def _gaussian_release(
    total: np.ndarray,
    clip_norm: float,
    noise_multiplier: float,
    accountant: ClientLevelAccountant | None,
    rng: np.random.Generator,
) -> tuple[np.ndarray, float]:
    """``total`` + N(0, (σ·C)²) per coordinate, the round told to ``accountant``; returns (noisy, σ·C)."""
    sd = noise_multiplier * clip_norm
    noisy = total + (rng.normal(0.0, sd, size=total.shape) if sd > 0 else 0.0)
    if accountant is not None:
        accountant.record(noise_multiplier)
    return noisy, sd


@dataclasses.dataclass
class FixedClippingDP:
    """Clip each update to ``clip_norm``, sum with ``inner``, add N(0, (σ·C)²), divide
    by the expected client count; tell ``accountant`` (every ``report_every``
    rounds its ε goes into ``info["epsilon"]``)."""

    inner: Aggregator
    clip_norm: float
    noise_multiplier: float
    accountant: ClientLevelAccountant | None = None
    report_every: int = 1
    linear: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        _require_linear(self.inner, "FixedClippingDP")
        _check_gaussian(self.clip_norm, self.noise_multiplier)

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        clipped, n_clipped = [], 0
        for u in updates:
            d, norm = clip_to_norm(np.asarray(u.delta, dtype=np.float64), self.clip_norm)
            n_clipped += norm > self.clip_norm
            clipped.append(dataclasses.replace(u, delta=d, num_examples=1))
        res = self.inner.aggregate(clipped, ctx)
        total = res.delta * res.total_weight
        noisy, sd = _gaussian_release(total, self.clip_norm, self.noise_multiplier, self.accountant, ctx.rng)
        info = dict(res.info)
        info.update(clip_norm=self.clip_norm, noise_stddev=sd, clipped_fraction=n_clipped / max(1, len(updates)))
        _report(self.accountant, self.report_every, info)
        return AggregateResult(noisy / ctx.expected_clients, ctx.expected_clients, res.num_clients, info)


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """σ_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the update noise that, with count noise σ_b,
    makes the round a Gaussian mechanism of multiplier z (Andrew et al. 2021, Thm. 1)."""
    rest = noise_multiplier**-2 - (2.0 * count_stddev) ** -2
    if rest <= 0:
        raise FLError(
            f"count noise σ_b = {count_stddev} alone costs more than noise multiplier {noise_multiplier} "
            f"allows: need σ_b > z/2 = {noise_multiplier / 2}"
        )
    return rest**-0.5


@dataclasses.dataclass
class AdaptiveClippingDP:
    """Adaptive clipping at the ``target_quantile`` of update norms (see the module docstring).

    ``noise_multiplier`` is the overall z the accountant charges each round;
    ``count_stddev`` is σ_b (default: expected clients / 20)."""

    inner: Aggregator
    initial_clip: float
    noise_multiplier: float
    target_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    count_stddev: float | None = None
    accountant: ClientLevelAccountant | None = None
    report_every: int = 1
    linear: bool = dataclasses.field(default=False, init=False)
    clip_norm: float = dataclasses.field(default=0.0, init=False)

    def __post_init__(self) -> None:
        _require_linear(self.inner, "AdaptiveClippingDP")
        if not (math.isfinite(self.initial_clip) and self.initial_clip > 0):
            raise FLError(f"initial_clip must be a finite number > 0, got {self.initial_clip}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise FLError("AdaptiveClippingDP needs noise_multiplier > 0 (without noise use a plain quantile estimate)")
        if not 0.0 < self.target_quantile < 1.0:
            raise FLError(f"target_quantile must be in (0, 1), got {self.target_quantile}")
        if not self.clip_learning_rate > 0:
            raise FLError(f"clip_learning_rate must be > 0, got {self.clip_learning_rate}")
        self.clip_norm = float(self.initial_clip)

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        m_bar = ctx.expected_clients
        sb = self.count_stddev if self.count_stddev is not None else m_bar / 20.0
        z_delta = update_noise_multiplier(self.noise_multiplier, sb)
        C = self.clip_norm
        clipped, below = [], 0
        for u in updates:
            d, norm = clip_to_norm(np.asarray(u.delta, dtype=np.float64), C)
            below += norm <= C
            clipped.append(dataclasses.replace(u, delta=d, num_examples=1))
        res = self.inner.aggregate(clipped, ctx)
        total = res.delta * res.total_weight
        noisy = total + ctx.rng.normal(0.0, z_delta * C, size=total.shape)
        centred = below - 0.5 * len(updates) + ctx.rng.normal(0.0, sb)
        b_bar = centred / m_bar + 0.5
        self.clip_norm = C * math.exp(-self.clip_learning_rate * (b_bar - self.target_quantile))
        if self.accountant is not None:
            self.accountant.record(self.noise_multiplier)
        info = dict(res.info)
        info.update(
            clip_norm=C,
            next_clip_norm=self.clip_norm,
            noisy_fraction_below=b_bar,
            update_noise_multiplier=z_delta,
            count_stddev=sb,
            noise_stddev=z_delta * C,
        )
        _report(self.accountant, self.report_every, info)
        return AggregateResult(noisy / m_bar, m_bar, res.num_clients, info)


def fltrust_contributions(X: np.ndarray, root: np.ndarray, clip_norm: float) -> tuple[np.ndarray, np.ndarray, float]:
    """DP-FLTrust's per-client contributions (rows), the trust scores and ‖g₀'‖ (module docstring).

    Row i is TSᵢ·‖g₀'‖·Δᵢ/‖Δᵢ‖ with g₀' = g₀ clipped to ``clip_norm`` and TSᵢ = ReLU(cos(Δᵢ, g₀)) held in
    [0, 1] (rounding could put a cosine a few ulps above 1); a zero update or a zero root gets trust 0. Each
    row's norm is at most ``clip_norm`` (up to float64 rounding) for any ``X``."""
    X = np.asarray(X, dtype=np.float64)
    root = np.asarray(root, dtype=np.float64)
    r = min(float(np.linalg.norm(root)), float(clip_norm))
    norms = np.linalg.norm(X, axis=1)
    ok = (norms > 0) & np.isfinite(norms)
    safe = np.where(ok, norms, 1.0)
    unit = X / safe[:, None]  # direction first: a huge update is never multiplied before it is normalized
    if r > 0:
        cos = unit @ (root / float(np.linalg.norm(root)))
        ts = np.where(ok, np.clip(cos, 0.0, 1.0), 0.0)
    else:
        ts = np.zeros(X.shape[0])
    return (ts * r)[:, None] * np.where(ok[:, None], unit, 0.0), ts, r


@dataclasses.dataclass
class DPFLTrust:
    """FLTrust with client-level DP (module docstring): trust-scored, rescaled contributions of norm ≤ C,
    summed, N(0, (σ·C)²) added, divided by the expected client count; the accountant is told every round.

    ``root(ctx)`` is FLTrust's root update (:class:`estimator.fl.fltrust_root.RootTraining` in the job). A
    round where nobody is trusted still releases its noise over m̄ (a zero sum plus noise): whether any score
    is positive depends on the clients' data, so skipping the release would not be private."""

    root: Callable[[RoundContext], np.ndarray]
    clip_norm: float
    noise_multiplier: float
    accountant: ClientLevelAccountant | None = None
    report_every: int = 1
    linear: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        _check_gaussian(self.clip_norm, self.noise_multiplier)

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        g0 = np.asarray(self.root(ctx), dtype=np.float64)
        if g0.shape != (ctx.num_params,):
            raise FLError(f"FLTrust root update has shape {g0.shape}, expected ({ctx.num_params},)")
        if updates:
            X = np.stack([np.asarray(u.delta, dtype=np.float64) for u in updates])
            contrib, ts, r = fltrust_contributions(X, g0, self.clip_norm)
            total = contrib.sum(axis=0)
        else:
            ts, r, total = np.zeros(0), min(float(np.linalg.norm(g0)), self.clip_norm), np.zeros(ctx.num_params)
        noisy, sd = _gaussian_release(total, self.clip_norm, self.noise_multiplier, self.accountant, ctx.rng)
        info: dict[str, Any] = {
            "trust_scores": {u.client_id: float(t) for u, t in zip(updates, ts, strict=True)},
            "trusted_clients": int(np.count_nonzero(ts)),
            "trust_total": float(ts.sum()),
            "root_update_norm": float(np.linalg.norm(g0)),
            "rescale_norm": r,
            "clip_norm": self.clip_norm,
            "noise_stddev": sd,
        }
        _report(self.accountant, self.report_every, info)
        return AggregateResult(noisy / ctx.expected_clients, ctx.expected_clients, len(updates), info)
