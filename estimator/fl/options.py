"""The task file's options: each read into a frozen spec, or checked against the rest of the task.

The shared readers of a task file's values (:func:`read_kind` reads a ``{"kind": ...}`` object into the
spec of its kind, refusing an unknown kind, an unknown or missing option and an option of the wrong type,
each with a message that names it; :func:`read_number`, :func:`read_int`, :func:`read_base64`); the
sampling specs (:func:`sampling_spec`); the distributed-noise spec (:func:`noise_spec`); and the checks of
the options that :class:`~estimator.fl.task.FLTaskSpec` keeps as plain JSON objects: ``personalization``,
``local_dp_sgd`` (with the sample-level ε it gives, :func:`sample_level_privacy`) and ``compression``.
The specs read the task through :class:`TaskView`. The aggregator specs are :mod:`estimator.fl.aggregator_specs`. Every refusal
is an :class:`~ldp_core.fl.errors.FLError`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from estimator.fl.sampling import FixedCountSampling, PoissonSampling, Sampling
from estimator.fl.strategies import Strategy
from ldp_core.fl.errors import FLError, ModelError
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec, local_dp_sgd_from_dict
from ldp_core.fl.models import MLP
from ldp_core.fl.personalization import MoonSpec, personalization_from_dict, personalization_to_dict
from ldp_core.fl.protocol import model_from_dict

__all__ = [
    "TaskView",
    "read_kind",
    "read_number",
    "read_int",
    "read_base64",
    "SamplingSpec",
    "PoissonSamplingSpec",
    "FixedSamplingSpec",
    "sampling_spec",
    "NoiseSpec",
    "DistributedDGSpec",
    "noise_spec",
    "check_personalization",
    "check_local_dp_sgd",
    "sample_level_privacy",
    "check_compression",
]


class _Kinded(Protocol):
    @property
    def kind(self) -> str: ...


class TaskView(Protocol):
    """What the option and aggregator specs read of the task they check or build for. The task
    (:class:`~estimator.fl.task.FLTaskSpec`) is one; the specs take this view rather than import it,
    since the task reads its options with them."""

    @property
    def clients(self) -> tuple[str, ...]: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def clip_norm(self) -> float | None: ...
    @property
    def noise_multiplier(self) -> float: ...
    @property
    def secagg(self) -> bool: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def sampling(self) -> SamplingSpec: ...
    @property
    def aggregator(self) -> _Kinded: ...
    @property
    def personalization(self) -> Mapping[str, Any] | None: ...
    @property
    def local_dp_sgd(self) -> Mapping[str, Any] | None: ...
    def build_model(self) -> Any: ...
    def build_sampling(self) -> Sampling: ...
    def build_strategy(self) -> Strategy: ...


def read_number(name: str, v: object, *, low: float = 0.0, strict: bool = True) -> float:
    """``v`` as a float if it is a finite number above ``low`` (or at least ``low``), else :class:`FLError`."""
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or (v <= low if strict else v < low)
    ):
        raise FLError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {v!r}")
    return float(v)


def read_int(name: str, v: object, low: int) -> int:
    """``v`` if it is an integer (not a bool) of at least ``low``, else :class:`FLError`."""
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise FLError(f"{name} must be an integer >= {low}, got {v!r}")
    return v


def read_kind(what: str, d: object, kinds: Mapping[str, Any]) -> Any:
    """The spec of ``kinds[d["kind"]]`` built from the other keys of ``d``: the shared reading of a ``{"kind": ...}``
    object (``what`` names it in messages). Unknown kinds and options, and missing required options, are refused."""
    if not isinstance(d, Mapping):
        raise FLError(f'{what} must be an object with a "kind", got {d!r}')
    kind = d.get("kind")
    if kind not in kinds:
        raise FLError(f"{what} kind must be one of {sorted(kinds)}, got {kind!r}")
    cls = kinds[str(kind)]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    options = {k: v for k, v in d.items() if k != "kind"}
    unknown = set(options) - set(fields)
    if unknown:
        raise FLError(f"{what} {kind!r} has no options {sorted(unknown)}; it takes {sorted(fields) or 'none'}")
    for name, f in fields.items():
        if name not in options and f.default is dataclasses.MISSING:
            raise FLError(f"{what} {kind!r}: {name} must be {cls.requirement[name]}; the option is missing")
    return cls(**options)


def read_base64(name: str, v: object) -> bytes:
    """The bytes of the base64 string ``v`` (the field ``name``), else :class:`FLError`."""
    import base64
    import binascii

    if not isinstance(v, str):
        raise FLError(f"{name} must be a base64 string, got {type(v).__name__}")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise FLError(f"{name} is not valid base64") from None


# -- sampling --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PoissonSamplingSpec:
    """``{"kind": "poisson", "rate": q}``: every client independently with probability q ∈ (0, 1]."""

    rate: float
    kind: ClassVar[str] = "poisson"
    requirement: ClassVar[dict[str, str]] = {"rate": "a number in (0, 1]"}

    def __post_init__(self) -> None:
        r = self.rate
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < r <= 1.0:
            raise FLError(f"sampling 'poisson': rate must be a number in (0, 1], got {r!r}")

    def build(self, population: int) -> Sampling:
        return PoissonSampling(float(self.rate))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rate": self.rate}


@dataclasses.dataclass(frozen=True)
class FixedSamplingSpec:
    """``{"kind": "fixed", "count": m}``: exactly m clients per round (m at most the population)."""

    count: int
    kind: ClassVar[str] = "fixed"
    requirement: ClassVar[dict[str, str]] = {"count": "a positive integer"}

    def __post_init__(self) -> None:
        read_int("sampling 'fixed': count", self.count, 1)

    def build(self, population: int) -> Sampling:
        if self.count > population:
            raise FLError(f"fixed count {self.count} exceeds the {population} clients")
        return FixedCountSampling(self.count)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": self.count}


SamplingSpec = PoissonSamplingSpec | FixedSamplingSpec


_SAMPLING_KINDS: dict[str, type] = {c.kind: c for c in (PoissonSamplingSpec, FixedSamplingSpec)}


def sampling_spec(d: Mapping[str, Any] | SamplingSpec) -> SamplingSpec:
    """The typed spec of a task file's ``sampling`` object (a spec is returned as it is)."""
    if isinstance(d, (PoissonSamplingSpec, FixedSamplingSpec)):
        return d
    if isinstance(d, Mapping) and d.get("kind") not in _SAMPLING_KINDS:
        raise FLError(f"sampling kind must be 'poisson' or 'fixed', got {d.get('kind')!r}")
    return read_kind("sampling", d, _SAMPLING_KINDS)


# -- noise ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DistributedDGSpec:
    """``{"kind": "distributed_discrete_gaussian", "bits": b, "k_stddevs": k, "beta": β, "min_shares": s,
    "assumed_honest_fraction": f}`` (all but bits optional: 6, e^{-1/2}, the sampled count, 0.5; f is the share
    of the sampled devices the ε against the operator assumes honest, printed beside the all-honest one): the devices add the noise σ·C as discrete
    Gaussian shares in Z_{2^b} before SecAgg (:mod:`ldp_core.fl.ddg`), so the server never sees an
    un-noised sum; a round with fewer than ``min_shares`` survivors is not released. Needs ``secagg``,
    ``clip_norm``, ``noise_multiplier`` > 0, fixed-count sampling and the ``fedavg`` aggregator."""

    bits: int
    k_stddevs: float = 6.0
    beta: float = math.exp(-0.5)
    min_shares: int | None = None
    assumed_honest_fraction: float = 0.5
    kind: ClassVar[str] = "distributed_discrete_gaussian"
    requirement: ClassVar[dict[str, str]] = {"bits": "an integer in [2, 32] (bits per coordinate of the SecAgg ring)"}

    def __post_init__(self) -> None:
        b = self.bits
        if isinstance(b, bool) or not isinstance(b, int) or not 2 <= b <= 32:
            raise FLError(f"noise {self.kind!r}: bits must be an integer in [2, 32], got {b!r}")
        read_number(f"noise {self.kind!r}: k_stddevs", self.k_stddevs)
        beta = self.beta
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 < beta < 1.0:
            raise FLError(f"noise {self.kind!r}: beta must be a number in (0, 1), got {beta!r}")
        if self.min_shares is not None:
            read_int(f"noise {self.kind!r}: min_shares", self.min_shares, 1)
        f = self.assumed_honest_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f <= 1.0:
            raise FLError(f"noise {self.kind!r}: assumed_honest_fraction must be a number in (0, 1], got {f!r}")

    def check(self, task: TaskView) -> None:
        if not task.secagg or task.clip_norm is None or not task.noise_multiplier > 0:
            raise FLError(
                "noise 'distributed_discrete_gaussian' needs secagg (the shares are summed by secure aggregation), "
                "clip_norm and noise_multiplier > 0 (the total noise is noise_multiplier·clip_norm)"
            )
        if not isinstance(task.sampling, FixedSamplingSpec):
            raise FLError(
                "noise 'distributed_discrete_gaussian' needs fixed-count sampling: its accounting is for "
                "neighbours that replace one client (with Poisson sampling the number of noise shares varies)"
            )
        if task.aggregator.kind != "fedavg":
            raise FLError(
                "noise 'distributed_discrete_gaussian' works with the 'fedavg' aggregator only (dp_ftrl's tree "
                "reuses each node's noise over rounds, which per-round devices cannot share: docs/fl/DESIGN.md)"
            )
        if self.min_shares is not None and self.min_shares > task.sampling.count:
            raise FLError(f"min_shares {self.min_shares} exceeds the {task.sampling.count} clients sampled per round")
        self.build(task, task.build_model().num_params)  # the spec's own checks (ring room, σ per share)

    def shares(self, task: TaskView) -> int:
        """The fewest noise shares a released round sums (min_shares, or every sampled client)."""
        assert isinstance(task.sampling, FixedSamplingSpec)
        return task.sampling.count if self.min_shares is None else self.min_shares

    def honest_shares(self, task: TaskView) -> int:
        """The noise shares of a released round the operator is assumed not to know (``assumed_honest_fraction``
        of the sampled devices, less those that may have dropped: :func:`estimator.fl.ddg_accounting.assumed_honest_shares`)."""
        from estimator.fl.ddg_accounting import assumed_honest_shares

        assert isinstance(task.sampling, FixedSamplingSpec)
        return assumed_honest_shares(task.sampling.count, float(self.assumed_honest_fraction), self.shares(task))

    def build(self, task: TaskView, dim: int) -> Any:
        """The round's :class:`ldp_core.fl.ddg.DDGSpec` (the same on every device: public parameters only)."""
        from ldp_core.fl.ddg import DDGSpec
        from ldp_core.fl.errors import SecAggError

        assert task.clip_norm is not None and isinstance(task.sampling, FixedSamplingSpec)
        try:
            return DDGSpec.for_bits(
                float(task.clip_norm),
                float(task.noise_multiplier) * float(task.clip_norm),
                task.sampling.count,
                dim,
                self.bits,
                float(self.k_stddevs),
                float(self.beta),
            )
        except SecAggError as exc:
            raise FLError(f"noise 'distributed_discrete_gaussian': {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "bits": self.bits,
            "k_stddevs": self.k_stddevs,
            "beta": self.beta,
            "min_shares": self.min_shares,
            "assumed_honest_fraction": self.assumed_honest_fraction,
        }


NoiseSpec = DistributedDGSpec


_NOISE_KINDS: dict[str, type] = {DistributedDGSpec.kind: DistributedDGSpec}


def noise_spec(d: Mapping[str, Any] | NoiseSpec | None) -> NoiseSpec | None:
    """The typed spec of a task file's ``noise`` object (None: central noise, added by the server)."""
    if d is None or isinstance(d, DistributedDGSpec):
        return d
    return read_kind("noise", d, _NOISE_KINDS)


# -- options kept as JSON objects in the task ----------------------------------------------------
def check_personalization(
    personalization: Mapping[str, Any] | None, algorithm: str, model: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The task's ``personalization`` (:mod:`ldp_core.fl.personalization`) in its canonical form (None without
    it); refused on another algorithm than fedavg, and MOON on a ``model`` without a hidden layer."""
    try:
        spec = personalization_from_dict(personalization)
    except ModelError as exc:
        raise FLError(f"personalization: {exc}") from None
    if spec is None:
        return None
    if algorithm != "fedavg":
        raise FLError(f"personalization ({spec.kind}) runs on algorithm fedavg, got {algorithm!r}")
    if isinstance(spec, MoonSpec) and not isinstance(model_from_dict(model), MLP):
        raise FLError("personalization moon needs an mlp model (its contrastive term is on the hidden layer)")
    return personalization_to_dict(spec)


def check_local_dp_sgd(
    local_dp_sgd: Mapping[str, Any] | None,
    algorithm: str,
    personalization: Mapping[str, Any] | None,
    training: Mapping[str, Any],
) -> dict[str, Any] | None:
    """The task's ``local_dp_sgd`` (:mod:`ldp_core.fl.local_dpsgd`) in its canonical form (None without it);
    refused where the devices' local objective is not plain FedAvg SGD (``algorithm``, ``personalization``),
    or where ``training`` sets what DP-SGD decides itself."""
    spec = local_dp_sgd_from_dict(local_dp_sgd)
    if spec is None:
        return None
    if algorithm not in ("fedavg", "fedprox"):
        raise FLError(
            f"local_dp_sgd runs with algorithm fedavg or fedprox, got {algorithm!r}: the device's DP-SGD "
            "steps carry no control variate (SCAFFOLD's would be trained on the examples outside DP-SGD)"
        )
    if personalization is not None:
        raise FLError(
            "local_dp_sgd cannot run with personalization: the personal and contrastive objectives train "
            "on the device's examples outside DP-SGD, so the sample-level ε would not cover them"
        )
    other = sorted(set(training) - {"learning_rate"})
    if other:
        raise FLError(
            f"with local_dp_sgd, training takes only learning_rate (got {other}): the batches are Poisson "
            "samples at local_dp_sgd's sample_rate and the step count is its steps or epochs"
        )
    return spec.to_dict()


def sample_level_privacy(
    spec: LocalDPSGDSpec | None, rounds: int, delta: float, add_remove: bool = True
) -> dict[str, Any] | None:
    """The sample-level ε of the devices' DP-SGD ``spec`` (None without it) for a device that took part in
    ``rounds`` rounds, at ``delta``: ``epsilon`` by PLD for one example replaced (a device's example count
    is public: its upload carries it), ``epsilon_add_remove`` (PLD) and ``epsilon_add_remove_rdp`` (RDP, the
    second opinion) for one example added or removed, which would hold if the count were hidden (left out
    with ``add_remove=False``: PLD takes about a second). A function of the task's public parameters only
    (not of who was sampled), so it may be published."""
    from estimator.accounting.accountant import account

    if spec is None:
        return None
    if rounds == 0:
        return {
            "rounds": 0,
            "epsilon": 0.0,
            "epsilon_add_remove": 0.0,
            "epsilon_add_remove_rdp": 0.0,
            "delta": delta,
        }
    rep = account(spec.event(rounds), delta, "replace")
    out = {
        "rounds": rounds,
        "steps_per_round": spec.steps_per_round,
        "epsilon": rep.epsilon_pld,
        "neighbors": "replace",
        "delta": delta,
    }
    if add_remove:
        ar = account(spec.event(rounds), delta)
        out["epsilon_add_remove"], out["epsilon_add_remove_rdp"] = ar.epsilon_pld, ar.epsilon_rdp
    return out


def check_compression(
    compression: object, *, secagg: bool, distributed_noise: bool, aggregator: str
) -> dict[str, Any] | None:
    """The task's ``compression`` (issue 18) as a plain dict (None without it): ``{"kind": "quantize", "bits":
    b, "rotate": bool}`` or ``{"kind": "count_sketch", "rows": r, "cols": c, "bits": b}`` runs under SecAgg
    with the fedavg ``aggregator`` and central noise; every other combination is refused
    (:func:`ldp_core.fl.compress.check_composition` for the data-dependent top-k). The ring parameters
    themselves are checked by building them (:meth:`FLTaskSpec.build_compression`) once the task holds this value."""
    c = compression
    if c is None:
        return None
    if not isinstance(c, Mapping) or not isinstance(c.get("kind"), str):
        raise FLError(f"compression must be an object with a kind, got {c!r}")
    from ldp_core.fl.compress import check_composition

    try:
        check_composition(c["kind"], secagg=secagg, distributed_noise=distributed_noise)
    except ModelError as exc:
        raise FLError(f"compression: {exc}") from None
    if c["kind"] not in ("quantize", "count_sketch"):
        raise FLError(
            f"compression {c['kind']!r} is not wired through the job yet (scenario only: ldp fl compress); "
            "the task option supports kinds 'quantize' and 'count_sketch'"
        )
    if not secagg or distributed_noise or aggregator != "fedavg":
        raise FLError(
            f"compression {c['kind']!r} runs with secagg, central noise and the fedavg aggregator (the "
            "distributed DG already rounds into its own ring; plain uploads are float32)"
        )
    return dict(c)
