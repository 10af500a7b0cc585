"""Means of bounded numbers: Duchi et al.'s mechanism, the Piecewise and the Hybrid Mechanism.

A value ``v`` in a declared range ``[low, high]`` is mapped linearly to
``t = 2 (v − low)/(high − low) − 1`` in ``[−1, 1]``; each mechanism outputs an
unbiased ``t*`` (``E[t*] = t``) and the server's mean is the average of the
``t*`` mapped back. Wang, Xiao, Yang, Zhao, Hui, Shin, Shin and Yu,
"Collecting and Analyzing Multidimensional Data with Local Differential
Privacy", ICDE 2019 (arXiv:1907.00782), define all three (Sec. III and IV):

**Duchi et al.** (their Alg. 1, from Duchi, Jordan and Wainwright 2018):
``t* = ±C_D`` with ``C_D = (e^ε + 1)/(e^ε − 1)`` and
``P[t* = +C_D] = 1/2 + t (e^ε − 1)/(2(e^ε + 1))``. The two output
probabilities differ by at most a factor ``e^ε`` for any two inputs
(``t = 1`` against ``t = −1``: ``e^ε/(e^ε+1)`` against ``1/(e^ε+1)``).
``Var[t*] = C_D² − t²``.

**Piecewise Mechanism (PM)** (Alg. 2): with ``C = (e^{ε/2} + 1)/(e^{ε/2} − 1)``,
``ℓ(t) = (C + 1)/2 · t − (C − 1)/2`` and ``r(t) = ℓ(t) + C − 1``, ``t*`` has
density ``p = (e^ε − e^{ε/2})/(2e^{ε/2} + 2)`` on ``[ℓ(t), r(t)]`` and ``p/e^ε``
on the rest of ``[−C, C]`` (so it lands in the centre piece with probability
``e^{ε/2}/(e^{ε/2} + 1)``). Densities differ by at most ``e^ε``.
``Var[t*] = t²/(e^{ε/2} − 1) + (e^{ε/2} + 3)/(3 (e^{ε/2} − 1)²)`` (Lemma 1).

**Hybrid Mechanism (HM)** (Sec. III-C): PM with probability ``α`` and Duchi
et al. otherwise, both at ε, with ``α = 1 − e^{−ε/2}`` for ``ε > ε* ≈ 0.61``
and ``α = 0`` below (``ε*`` solves the equation that makes the mixture's
worst case no better than Duchi's: it is found numerically here). A mixture
of two ε-LDP outputs with an input-independent coin is ε-LDP.
``Var = α Var_PM(t) + (1 − α) Var_D(t)``.

Every variance is linear in ``t²``, so its worst case over ``[−1, 1]`` is at
``t = 0`` or ``|t| = 1``; :func:`best_mean_mechanism` picks the mechanism
with the lowest worst case at an ε (HM for ε > ε*, Duchi below: the paper's
conclusion, checked numerically in the tests).

**Several attributes** (``dims = d > 1``; Alg. 4): each device samples
``k`` of its ``d`` attributes uniformly without replacement (``sample``;
default ``k = max(1, min(d, ⌊ε/2.5⌋))``, the paper's choice), perturbs each
with the 1-D mechanism at ``ε/k``, and reports the ``k`` pairs (attribute,
``t*``); the server's estimate of attribute ``j`` is ``d/k`` times the sum of
its ``t*`` over ``n``. Each of the ``k`` outputs is ``ε/k``-LDP and which
attributes were sampled does not depend on the values, so a report is ε-LDP
(basic composition). Per user, the estimator's summand
``y_j = (d/k) t*_j 1[j sampled]`` has ``E[y_j] = t_j`` and
``Var[y_j] = (d/k)(Var₁(t_j; ε/k) + t_j²) − t_j²``.

**Records** (little-endian, no padding): Duchi's 1-D record is one byte
``bit`` (1 = ``+C_D``). PM's and HM's is ``value``, ``<i2``: ``t*`` in
fixed point, ``t* · S / C`` with ``S = 32767`` and ``C`` the largest
``|t*|``, **stochastically rounded** (down or up to the neighbouring
integer with the probabilities that keep its mean: ``E[value] = t* S/C``).
The rounding coin does not depend on the input, so this is post-processing
(the report stays ε-LDP) and unbiased; it adds at most ``(C/S)²/4`` to
``Var[t*]`` (a relative ``≤ 2.4·10⁻¹⁰``, not counted in the variances
below). Fixed point makes every server sum an exact integer: merging
accumulators is exact, in any order, as for the frequency oracles, and two
bytes a report halve what a float32 would cost. With ``dims > 1`` the record
is ``attr`` (``u1``, or ``u2`` above 256 attributes) × k and ``value``
``<i2`` × k (Duchi's values then ``±S``). Records carry ``t*`` in
normalized units; the range travels in the spec.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ldp_core.errors import DomainError, FrameError, SpecError
from ldp_core.mechanisms.base import ReportSpec

__all__ = [
    "NumericSpec",
    "MeanSpec",
    "DuchiSpec",
    "PiecewiseSpec",
    "HybridSpec",
    "MEAN_MECHANISMS",
    "best_mean_mechanism",
    "hybrid_alpha",
    "EPSILON_STAR",
    "duchi_variance",
    "pm_variance",
    "hm_variance",
]

#: most attributes one mean metric may have
MAX_DIMS = 4096
#: the fixed-point scale of a ``value`` field: ``t* = value · C / SCALE``
SCALE = 32767


def stochastic_round(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``x`` rounded down or up to an integer, up with probability ``x − ⌊x⌋`` (so ``E[result] = x``)."""
    low = np.floor(x)
    return low + (rng.random(x.shape) < (x - low))


def duchi_variance(t: Any, epsilon: float) -> np.ndarray:
    """``Var[t*] = C_D² − t²`` of Duchi et al.'s 1-D mechanism."""
    c = (math.exp(epsilon) + 1.0) / (math.exp(epsilon) - 1.0)
    return c * c - np.square(np.asarray(t, dtype=np.float64))


def pm_variance(t: Any, epsilon: float) -> np.ndarray:
    """``Var[t*] = t²/(e^{ε/2} − 1) + (e^{ε/2} + 3)/(3(e^{ε/2} − 1)²)`` of the Piecewise Mechanism."""
    h = math.exp(epsilon / 2.0)
    return np.square(np.asarray(t, dtype=np.float64)) / (h - 1.0) + (h + 3.0) / (3.0 * (h - 1.0) ** 2)


def _alpha_raw(epsilon: float) -> float:
    return 1.0 - math.exp(-epsilon / 2.0)


def _mixture_worst(epsilon: float, alpha: float) -> float:
    v0 = alpha * float(pm_variance(0.0, epsilon)) + (1 - alpha) * float(duchi_variance(0.0, epsilon))
    v1 = alpha * float(pm_variance(1.0, epsilon)) + (1 - alpha) * float(duchi_variance(1.0, epsilon))
    return max(v0, v1)


def _epsilon_star() -> float:
    """The ε* below which mixing in PM does not lower the worst case (bisection; ≈ 0.61 per the paper)."""
    lo, hi = 0.05, 3.0

    def gain(e: float) -> float:  # > 0 when the α mixture beats Duchi's worst case
        return float(duchi_variance(0.0, e)) - _mixture_worst(e, _alpha_raw(e))

    for _ in range(100):
        mid = (lo + hi) / 2
        if gain(mid) > 0:
            hi = mid
        else:
            lo = mid
    return hi


#: the ε above which the Hybrid Mechanism mixes in PM (Wang et al. 2019: ε* ≈ 0.61)
EPSILON_STAR = _epsilon_star()


def hybrid_alpha(epsilon: float) -> float:
    """HM's probability of using PM: ``1 − e^{−ε/2}`` above :data:`EPSILON_STAR`, else 0."""
    return _alpha_raw(epsilon) if epsilon > EPSILON_STAR else 0.0


def hm_variance(t: Any, epsilon: float) -> np.ndarray:
    """``α Var_PM(t) + (1 − α) Var_D(t)``."""
    a = hybrid_alpha(epsilon)
    return a * pm_variance(t, epsilon) + (1.0 - a) * duchi_variance(t, epsilon)


@dataclasses.dataclass(frozen=True)
class NumericSpec(ReportSpec):
    """A spec over a bounded number: values in ``[low, high]``."""

    low: float
    high: float

    kind: ClassVar[str] = "mean"

    def _validate_base(self) -> None:
        for f in ("low", "high"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise SpecError(f"{self.name}: {f} must be a number, got {v!r}")
            if not math.isfinite(float(v)):
                raise SpecError(f"{self.name}: {f} must be finite, got {v!r}")
            # integral values stay ints, so 0 and 0.0 give one canonical form (and one spec_id)
            object.__setattr__(self, f, int(v) if float(v).is_integer() and abs(float(v)) < 2**53 else float(v))
        if not self.low < self.high:
            raise SpecError(f"{self.name}: low ({self.low}) must be below high ({self.high})")

    @property
    def half_width(self) -> float:
        """``(high − low)/2``: one normalized unit in the value's units."""
        return (float(self.high) - float(self.low)) / 2.0

    def normalize(self, values: Any) -> np.ndarray:
        """``values`` (finite, within ``[low, high]``) as ``t`` in ``[−1, 1]``; :class:`DomainError` otherwise."""
        v = np.asarray(values, dtype=np.float64)
        if v.size and not np.all(np.isfinite(v)):
            raise DomainError(f"{self.name}: values must be finite numbers")
        lo, hi = float(self.low), float(self.high)
        if v.size and (v.min() < lo or v.max() > hi):
            bad = v[(v < lo) | (v > hi)].reshape(-1)[0]
            raise DomainError(f"{self.name}: value {float(bad)!r} is outside [{self.low}, {self.high}]")
        return np.clip((v - lo) / self.half_width - 1.0, -1.0, 1.0)

    def denormalize(self, t: Any) -> np.ndarray:
        """The inverse of :meth:`normalize` (for means: a linear map, so unbiasedness carries over)."""
        return float(self.low) + (np.asarray(t, dtype=np.float64) + 1.0) * self.half_width


@dataclasses.dataclass(frozen=True)
class MeanSpec(NumericSpec):
    """Common part of the three mean mechanisms: ``dims`` attributes, ``sample`` of them per report."""

    dims: int = 1
    sample: int | None = None

    #: the 1-D variance function of the mechanism
    _variance_1d: ClassVar[Any] = None

    def _validate(self) -> None:
        d = self._require_int(self.name, "dims", self.dims, 1, MAX_DIMS)
        object.__setattr__(self, "dims", d)
        if d == 1:
            if self.sample not in (None, 1):
                raise SpecError(f"{self.name}: sample must be 1 (or omitted) for one attribute, got {self.sample!r}")
            object.__setattr__(self, "sample", 1)
        else:
            k = max(1, min(d, int(self.epsilon // 2.5))) if self.sample is None else self.sample
            object.__setattr__(self, "sample", self._require_int(self.name, "sample", k, 1, d))

    @property
    def k(self) -> int:
        return int(self.sample)  # type: ignore[arg-type]

    @property
    def epsilon_each(self) -> float:
        """The ε of each of the ``k`` perturbed attributes: ``ε/k``."""
        return self.epsilon / self.k

    # -- the 1-D mechanism at a given ε (subclasses) -------------------------------------
    def _perturb(self, t: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def output_bound(self) -> float:
        """The largest ``|t*|`` a report may carry (at ``ε/k``)."""
        raise NotImplementedError

    def output_variance(self, t: Any) -> np.ndarray:
        """``Var[t*]`` of one perturbed attribute with normalized value ``t``, at ``ε/k``."""
        return np.asarray(type(self)._variance_1d(t, self.epsilon_each))

    def summand_variance(self, t: Any) -> np.ndarray:
        """Variance of one user's summand ``y_j`` of attribute ``j`` (module docstring), normalized units."""
        t2 = np.square(np.asarray(t, dtype=np.float64))
        if self.dims == 1:
            return self.output_variance(t)
        r = self.dims / self.k
        return r * (self.output_variance(t) + t2) - t2

    def worst_case_variance(self) -> float:
        """The largest :meth:`summand_variance` over ``t`` in ``[−1, 1]`` (at ``t = 0`` or ``|t| = 1``)."""
        return float(max(self.summand_variance(0.0), self.summand_variance(1.0)))

    # -- records -------------------------------------------------------------------------
    @cached_property
    def record_dtype(self) -> np.dtype:
        if self.dims == 1:
            return np.dtype([("value", "<i2")])
        attr = "u1" if self.dims <= 256 else "<u2"
        return np.dtype([("attr", attr, (self.k,)), ("value", "<i2", (self.k,))])

    def values_of(self, records: np.ndarray) -> np.ndarray:
        """The ``t*`` of records, as float64 (shape ``(n,)``, or ``(n, k)`` with several attributes)."""
        return records["value"].astype(np.float64) * (self.output_bound() / SCALE)

    def check_records(self, records: np.ndarray) -> None:
        vals = records["value"].reshape(records.shape[0], -1)
        bad = (vals < -SCALE).any(axis=1)
        if bad.any():
            raise FrameError(f"{self.name}: record {int(np.argmax(bad))} has value -32768 (at least -{SCALE})")
        if self.dims > 1:
            attr = records["attr"]
            if attr.size:
                if int(attr.max()) >= self.dims:
                    raise FrameError(f"{self.name}: an attribute index is not below {self.dims}")
                srt = np.sort(attr, axis=1)
                if self.k > 1 and np.any(srt[:, 1:] == srt[:, :-1]):
                    raise FrameError(f"{self.name}: a record samples one attribute twice")

    # -- device side ------------------------------------------------------------------------
    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """Privatize values in ``[low, high]``: shape ``(n,)`` for one attribute, ``(n, dims)`` for several."""
        v = np.asarray(values, dtype=np.float64)
        if self.dims == 1:
            v = v.reshape(-1)
        elif v.ndim != 2 or v.shape[1] != self.dims:
            raise DomainError(f"{self.name}: values must have shape (n, {self.dims}), got {v.shape}")
        t = self.normalize(v)
        out = np.empty(t.shape[0], dtype=self.record_dtype)
        scale = SCALE / self.output_bound()
        if self.dims == 1:
            out["value"] = np.clip(stochastic_round(self._perturb(t, self.epsilon, rng) * scale, rng), -SCALE, SCALE)
            return out
        n, d, k = t.shape[0], self.dims, self.k
        # k distinct attributes per user: the first k of a random permutation (argsort of uniforms)
        attrs = np.argsort(rng.random((n, d)), axis=1)[:, :k] if k < d else np.tile(np.arange(d), (n, 1))
        picked = np.take_along_axis(t, attrs, axis=1)
        out["attr"] = attrs
        t_star = self._perturb(picked.reshape(-1), self.epsilon_each, rng).reshape(n, k)
        out["value"] = np.clip(stochastic_round(t_star * scale, rng), -SCALE, SCALE)
        return out

    def encode_one(self, value: Any, rng: np.random.Generator) -> np.ndarray:
        v = np.asarray(value, dtype=np.float64).reshape(1, -1) if self.dims > 1 else np.asarray([value], np.float64)
        return self.encode(v, rng)


def _duchi(t: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    e = math.exp(epsilon)
    c = (e + 1.0) / (e - 1.0)
    plus = rng.random(t.shape) < 0.5 + t * (e - 1.0) / (2.0 * (e + 1.0))
    return np.where(plus, c, -c)


def _pm(t: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    h = math.exp(epsilon / 2.0)
    c = (h + 1.0) / (h - 1.0)
    left = (c + 1.0) / 2.0 * t - (c - 1.0) / 2.0
    centre = rng.random(t.shape) < h / (h + 1.0)
    u = rng.random(t.shape)
    inside = left + u * (c - 1.0)
    # outside: uniform over [−C, ℓ) ∪ (r, C], total length C + 1: walk the two pieces as one
    s = u * (c + 1.0)
    low_len = left + c
    outside = np.where(s < low_len, -c + s, left + (c - 1.0) + (s - low_len))
    return np.where(centre, inside, outside)


@dataclasses.dataclass(frozen=True)
class DuchiSpec(MeanSpec):
    """Duchi et al.'s mechanism (module docstring)."""

    name: ClassVar[str] = "duchi"
    _variance_1d: ClassVar[Any] = staticmethod(duchi_variance)

    def output_bound(self) -> float:
        e = math.exp(self.epsilon_each)
        return (e + 1.0) / (e - 1.0)

    @cached_property
    def record_dtype(self) -> np.dtype:
        if self.dims == 1:
            return np.dtype([("bit", "u1")])
        attr = "u1" if self.dims <= 256 else "<u2"
        return np.dtype([("attr", attr, (self.k,)), ("value", "<i2", (self.k,))])

    def check_records(self, records: np.ndarray) -> None:
        if self.dims == 1:
            if records.size and int(records["bit"].max()) > 1:
                raise FrameError(f"{self.name}: bit must be 0 or 1")
            return
        super().check_records(records)

    def values_of(self, records: np.ndarray) -> np.ndarray:
        if self.dims > 1:
            return super().values_of(records)
        c = self.output_bound()
        return np.where(records["bit"] == 1, c, -c)

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        if self.dims > 1:
            return super().encode(values, rng)
        t = self.normalize(np.asarray(values, dtype=np.float64).reshape(-1))
        e = math.exp(self.epsilon)
        out = np.empty(t.size, dtype=self.record_dtype)
        out["bit"] = rng.random(t.shape) < 0.5 + t * (e - 1.0) / (2.0 * (e + 1.0))
        return out

    def _perturb(self, t: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        return _duchi(t, epsilon, rng)


@dataclasses.dataclass(frozen=True)
class PiecewiseSpec(MeanSpec):
    """The Piecewise Mechanism (module docstring)."""

    name: ClassVar[str] = "pm"
    _variance_1d: ClassVar[Any] = staticmethod(pm_variance)

    def output_bound(self) -> float:
        h = math.exp(self.epsilon_each / 2.0)
        return (h + 1.0) / (h - 1.0)

    def _perturb(self, t: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        return _pm(t, epsilon, rng)


@dataclasses.dataclass(frozen=True)
class HybridSpec(MeanSpec):
    """The Hybrid Mechanism (module docstring)."""

    name: ClassVar[str] = "hm"
    _variance_1d: ClassVar[Any] = staticmethod(hm_variance)

    def output_bound(self) -> float:
        e = self.epsilon_each
        d = (math.exp(e) + 1.0) / (math.exp(e) - 1.0)
        h = math.exp(e / 2.0)
        return max(d, (h + 1.0) / (h - 1.0)) if hybrid_alpha(e) > 0 else d

    def _perturb(self, t: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        use_pm = rng.random(t.shape) < hybrid_alpha(epsilon)
        return np.where(use_pm, _pm(t, epsilon, rng), _duchi(t, epsilon, rng))


#: the mean mechanisms by name
MEAN_MECHANISMS: dict[str, type[MeanSpec]] = {"duchi": DuchiSpec, "pm": PiecewiseSpec, "hm": HybridSpec}


def best_mean_mechanism(epsilon: float, dims: int = 1, sample: int | None = None) -> str:
    """The name of the mean mechanism with the lowest worst-case variance at ``epsilon`` (ties: the first of
    duchi, hm, pm)."""
    worst = {
        name: cls(epsilon=epsilon, low=-1, high=1, dims=dims, sample=sample).worst_case_variance()
        for name, cls in (("duchi", DuchiSpec), ("hm", HybridSpec), ("pm", PiecewiseSpec))
    }
    return min(worst, key=lambda n: (worst[n], list(worst).index(n)))
