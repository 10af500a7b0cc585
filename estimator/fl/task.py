"""A federated task: what the aggregation job runs, as a frozen, validated value read from a JSON task file.

:class:`FLTaskSpec` holds the task file's fields (docs/fl/TASK.md).
Its ``sampling`` and ``aggregator`` are typed specs rather than the file's
``{"kind": ...}`` objects: :func:`sampling_spec` and :func:`aggregator_spec`
read those objects (refusing an unknown kind, an unknown or missing option
and an option of the wrong type, each with a message that names it), and
every spec writes the same object back with ``to_dict``. So the file format
stays one JSON object, while the code that builds the sampling scheme and
the aggregator stack (:meth:`FLTaskSpec.build_sampling`,
:meth:`FLTaskSpec.build_aggregator`) dispatches on types, not on strings.

Each aggregator spec also checks what it needs of the rest of the task
(``check``): DP settings, SecAgg, enough sampled clients. Every refusal is an
:class:`~ldp_core.fl.errors.FLError`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from estimator.fl.aggregators import Aggregator, ValidatingAggregator, WeightedMean
from estimator.fl.dp import (
    AdaptiveClippingDP,
    ClientLevelAccountant,
    DPFLTrust,
    FixedClippingDP,
    update_noise_multiplier,
)
from estimator.fl.ftrl import DPFTRL, FtrlAccountant
from estimator.fl.personalization import Ditto, Moon, PerFedAvg
from estimator.fl.robust import CoordinateMedian, FLTrust, Krum, TrimmedMean
from estimator.fl.sampling import FixedCountSampling, PoissonSampling, Sampling
from estimator.fl.strategies import FedAvg, FedProx, Scaffold, Strategy
from ldp_core.fl.errors import FLError, ModelError
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec, local_dp_sgd_from_dict
from ldp_core.fl.models import MLP
from ldp_core.fl.personalization import (
    DittoSpec,
    MoonSpec,
    PerFedAvgSpec,
    personalization_from_dict,
    personalization_to_dict,
)
from ldp_core.fl.protocol import model_from_dict
from ldp_core.fl.training import LocalTraining

__all__ = [
    "FLTaskSpec",
    "SamplingSpec",
    "PoissonSamplingSpec",
    "FixedSamplingSpec",
    "sampling_spec",
    "AggregatorSpec",
    "FedAvgSpec",
    "AdaptiveClippingSpec",
    "DPFTRLSpec",
    "secagg_quantization_slack",
    "MedianSpec",
    "TrimmedMeanSpec",
    "KrumSpec",
    "FLTrustSpec",
    "aggregator_spec",
    "resolve_task_paths",
    "FLAccountant",
    "DistributedDGSpec",
    "NoiseSpec",
    "noise_spec",
]


#: The accountant a task's DP aggregator reports to (:meth:`FLTaskSpec.build_accountant`).
FLAccountant = ClientLevelAccountant | FtrlAccountant


def _client_level(accountant: FLAccountant | None) -> ClientLevelAccountant | None:
    if accountant is not None and not isinstance(accountant, ClientLevelAccountant):
        raise FLError(f"this aggregator reports to a ClientLevelAccountant, got {type(accountant).__name__}")
    return accountant


def _num(name: str, v: object, *, low: float = 0.0, strict: bool = True) -> float:
    """``v`` as a float if it is a finite number above ``low`` (or at least ``low``), else :class:`FLError`."""
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or (v <= low if strict else v < low)
    ):
        raise FLError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {v!r}")
    return float(v)


def _int(name: str, v: object, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise FLError(f"{name} must be an integer >= {low}, got {v!r}")
    return v


def _read_kind(what: str, d: object, kinds: Mapping[str, Any]) -> Any:
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
        _int("sampling 'fixed': count", self.count, 1)

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
    return _read_kind("sampling", d, _SAMPLING_KINDS)


# -- aggregators -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FedAvgSpec:
    """``{"kind": "fedavg"}``: the weighted mean, under ``FixedClippingDP`` when the task sets ``clip_norm``.
    Devices clip to C too."""

    kind: ClassVar[str] = "fedavg"
    requirement: ClassVar[dict[str, str]] = {}
    device_clips: ClassVar[bool] = True

    def check(self, task: FLTaskSpec) -> None:
        """Nothing beyond the task's own checks: fedavg works with and without DP and SecAgg."""

    def build(self, task: FLTaskSpec, accountant: FLAccountant | None) -> Aggregator:
        if task.clip_norm is None:
            return ValidatingAggregator(WeightedMean())
        return ValidatingAggregator(
            FixedClippingDP(WeightedMean(), task.clip_norm, task.noise_multiplier, _client_level(accountant))
        )

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclasses.dataclass(frozen=True)
class AdaptiveClippingSpec:
    """``{"kind": "adaptive_clipping", "target_quantile": γ, "clip_learning_rate": η_C, "count_stddev": σ_b}``
    (all optional: 0.5, 0.2, expected clients / 20): ``AdaptiveClippingDP`` from C = ``clip_norm`` with overall
    noise multiplier z = ``noise_multiplier`` > 0. Devices do not clip (the server needs each norm against C)."""

    target_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    count_stddev: float | None = None
    kind: ClassVar[str] = "adaptive_clipping"
    requirement: ClassVar[dict[str, str]] = {}
    device_clips: ClassVar[bool] = False

    def __post_init__(self) -> None:
        q = self.target_quantile
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < q < 1.0:
            raise FLError(f"aggregator 'adaptive_clipping': target_quantile must be a number in (0, 1), got {q!r}")
        _num("aggregator 'adaptive_clipping': clip_learning_rate", self.clip_learning_rate)
        if self.count_stddev is not None:
            _num("count_stddev", self.count_stddev)

    def check(self, task: FLTaskSpec) -> None:
        if task.clip_norm is None or not task.noise_multiplier > 0:
            raise FLError(
                "adaptive_clipping needs clip_norm (the initial C) and noise_multiplier > 0 (the overall "
                "z the accountant charges, shared by the updates and the clipped-count release)"
            )
        _num("clip_norm", task.clip_norm)
        if task.secagg:
            raise FLError(
                "adaptive_clipping cannot run with secagg: the server needs each client's bit "
                "1[‖Δ‖ ≤ C], which secure aggregation does not sum; use kind 'fedavg' with secagg"
            )
        self.build(task, None)  # the wrapper's own checks
        update_noise_multiplier(task.noise_multiplier, self.count_stddev_for(task))  # σ_b > z/2

    def count_stddev_for(self, task: FLTaskSpec) -> float:
        """σ_b: the option, or the task's expected clients per round / 20."""
        if self.count_stddev is not None:
            return float(self.count_stddev)
        return task.build_sampling().expected_clients(len(task.clients)) / 20.0

    def build(self, task: FLTaskSpec, accountant: FLAccountant | None) -> Aggregator:
        assert task.clip_norm is not None and task.noise_multiplier is not None  # checked with the task's DP
        return ValidatingAggregator(
            AdaptiveClippingDP(
                WeightedMean(),
                float(task.clip_norm),
                task.noise_multiplier,
                target_quantile=float(self.target_quantile),
                clip_learning_rate=float(self.clip_learning_rate),
                count_stddev=None if self.count_stddev is None else float(self.count_stddev),
                accountant=_client_level(accountant),
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target_quantile": self.target_quantile,
            "clip_learning_rate": self.clip_learning_rate,
            "count_stddev": self.count_stddev,
        }


def secagg_quantization_slack(task: FLTaskSpec) -> float:
    """How far the norm of one device's contribution to a SecAgg sum, as the job decodes it, may exceed
    C: the float32 cast of the clipped update (below 2⁻²⁴ relative per coordinate; C·2⁻²³ covers it)
    plus the stochastic rounding (below 1/s per coordinate, so √d/s in L2), with s the quantizer's
    scale for the largest cohort the task can sample (the whole population: the scale falls with n)."""
    from ldp_core.fl.secagg import Quantizer

    assert task.clip_norm is not None
    dim = task.build_strategy().payload_size(task.build_model().num_params)
    scale = Quantizer.for_clients(len(task.clients), float(task.clip_norm)).scale
    return float(task.clip_norm) * 2.0**-23 + math.sqrt(dim) / scale


@dataclasses.dataclass(frozen=True)
class DPFTRLSpec:
    """``{"kind": "dp_ftrl", "restart_every": R, "efficient": e}`` (optional: R null, one tree for the
    whole task; e false, true for Honaker's estimator of the tree noise):
    :class:`~estimator.fl.ftrl.DPFTRL` with clip norm C = ``clip_norm`` and per-node noise multiplier
    z = ``noise_multiplier`` > 0, the tree restarting every R rounds. Its ε (:class:`FtrlAccountant`)
    credits no sampling amplification, so it holds whoever knows the sample; a client's second update
    within one tree is dropped. Devices clip to C too. With ``secagg`` the job unmasks the round's sum of
    clipped updates and adds the tree increment to it (central noise: the operator never sees an
    individual update, but no DP figure holds against it); a client already in the current tree is then
    left out of the round's sample, and the node noise covers the quantizer's slack
    (:func:`secagg_quantization_slack`). Not with ``scaffold`` (the FTRL iterate is the model's only
    server state), nor with distributed noise (docs/fl/DESIGN.md says why)."""

    restart_every: int | None = None
    efficient: bool = False
    kind: ClassVar[str] = "dp_ftrl"
    requirement: ClassVar[dict[str, str]] = {}
    device_clips: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.restart_every is not None:
            _int("aggregator 'dp_ftrl': restart_every", self.restart_every, 1)
        if not isinstance(self.efficient, bool):
            raise FLError(f"aggregator 'dp_ftrl': efficient must be true or false, got {self.efficient!r}")

    def check(self, task: FLTaskSpec) -> None:
        if task.clip_norm is None or not task.noise_multiplier > 0:
            raise FLError("dp_ftrl needs clip_norm (C) and noise_multiplier > 0 (the noise of every tree node is z·C)")
        _num("clip_norm", task.clip_norm)
        if task.algorithm == "scaffold":
            raise FLError("dp_ftrl runs with algorithm fedavg or fedprox (scaffold's control variates are not noised)")

    def build(self, task: FLTaskSpec, accountant: FLAccountant | None) -> Aggregator:
        assert task.clip_norm is not None
        if accountant is not None and not isinstance(accountant, FtrlAccountant):
            raise FLError("dp_ftrl needs the DP-FTRL accountant (FLTaskSpec.build_accountant)")
        return ValidatingAggregator(
            DPFTRL(
                WeightedMean(),
                float(task.clip_norm),
                task.noise_multiplier,
                self.restart_every,
                accountant,
                efficient=self.efficient,
                quantization_slack=secagg_quantization_slack(task) if task.secagg else 0.0,
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "restart_every": self.restart_every, "efficient": self.efficient}


@dataclasses.dataclass(frozen=True)
class _RobustSpec:
    """A robust wrapper over a weighted mean tolerating ``f`` malicious clients: not linear, so without DP and
    without SecAgg (it needs every individual update); a round needs :attr:`min_updates` updates."""

    f: int
    kind: ClassVar[str] = ""
    requirement: ClassVar[dict[str, str]] = {"f": "an integer >= 0 (the malicious clients tolerated)"}
    device_clips: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _int(f"aggregator {self.kind!r}: f", self.f, 0)

    @property
    def min_updates(self) -> int:
        return 2 * self.f + 1

    def check(self, task: FLTaskSpec) -> None:
        kind = self.kind
        if task.secagg:
            raise FLError(
                f"aggregator {kind!r} needs every client's individual update, and secure aggregation "
                "reveals only their sum: set secagg to false, or use kind 'fedavg' with secagg"
            )
        if task.clip_norm is not None or task.noise_multiplier:
            raise FLError(
                f"aggregator {kind!r} is not linear, and the DP wrappers need a bounded-sensitivity sum "
                "to add noise to: a robust task runs without client-level DP; set clip_norm to null and "
                "noise_multiplier to 0, or use kind 'fedavg' or 'adaptive_clipping' for DP"
            )
        if isinstance(task.sampling, FixedSamplingSpec) and task.sampling.count < self.min_updates:
            raise FLError(
                f"aggregator {kind!r} with f = {self.f} needs at least {self.min_updates} updates per "
                f"round; the task samples {task.sampling.count}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "f": self.f}


@dataclasses.dataclass(frozen=True)
class MedianSpec(_RobustSpec):
    """``{"kind": "median", "f": f}``: ``CoordinateMedian(WeightedMean(), f)``."""

    kind: ClassVar[str] = "median"

    def build(self, task: FLTaskSpec, accountant: FLAccountant | None) -> Aggregator:
        return ValidatingAggregator(CoordinateMedian(WeightedMean(), self.f))


@dataclasses.dataclass(frozen=True)
class TrimmedMeanSpec(_RobustSpec):
    """``{"kind": "trimmed_mean", "f": f}``: ``TrimmedMean(WeightedMean(), f)``."""

    kind: ClassVar[str] = "trimmed_mean"

    def build(self, task: FLTaskSpec, accountant: FLAccountant | None) -> Aggregator:
        return ValidatingAggregator(TrimmedMean(WeightedMean(), self.f))


@dataclasses.dataclass(frozen=True)
class KrumSpec(_RobustSpec):
    """``{"kind": "krum", "f": f, "multi": m}`` (m optional, 1): ``Krum(WeightedMean(), f, multi)``;
    a round needs 2f + 3 updates and at least m + f."""

    multi: int = 1
    kind: ClassVar[str] = "krum"

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(f"aggregator {self.kind!r}: multi", self.multi, 1)

    @property
    def min_updates(self) -> int:
        return max(2 * self.f + 3, self.multi + self.f)

    def build(self, task: FLTaskSpec, accountant: FLAccountant | None) -> Aggregator:
        return ValidatingAggregator(Krum(WeightedMean(), self.f, self.multi))

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "multi": self.multi}


#: ``fltrust``'s ``divisor`` values: the paper's Σ TSᵢ (no DP), or the expected cohort m̄ (DP-FLTrust)
FLTRUST_DIVISORS = ("total_trust", "expected_clients")


@dataclasses.dataclass(frozen=True)
class FLTrustSpec:
    """``{"kind": "fltrust", "root_data": "PATH.npz", "sha256": h}`` (h optional: the root file's hex SHA-256, checked
    whenever the job reads the file, at start and at every restore): ``FLTrust(WeightedMean(), RootTraining(...))`` (Cao et al.,
    NDSS 2021). The job holds the trusted root dataset (arrays ``x`` and ``y``, checked against the model when the
    task is read: :func:`~estimator.fl.fltrust_root.load_root_data`) and each round trains g₀ on it from the round's
    global model with the task's local training; a client's trust is ReLU(cos(Δᵢ, g₀)), its update is rescaled to
    ‖g₀‖, and the round releases the trust-weighted mean (the model is kept when every score is 0). A relative path
    is relative to the task file (:meth:`FLTaskSpec.from_file`; to the working directory for :meth:`from_dict`).

    ``divisor`` (``"total_trust"``, the default: the paper's Σ TSᵢ) picks the release's denominator. With
    ``"expected_clients"`` the task runs DP-FLTrust (:class:`~estimator.fl.dp.DPFLTrust`): g₀ clipped to C =
    ``clip_norm``, each contribution TSᵢ·ḡᵢ of norm ≤ C, N(0, (σC)²) on the sum, divided by the expected cohort
    m̄; the client-level accountant is DP-FedAvg's. It needs ``clip_norm``; client-level DP with the default
    divisor is refused (one client moves Σ TSᵢḡᵢ / Σ TSᵢ by up to 2‖g₀‖, not C/m: docs/fl/FLTRUST.md).

    Not with ``secagg`` (it needs each update), ``scaffold``, MOON or ``local_dp_sgd`` (g₀ would not be the
    same kind of update as the devices')."""

    root_data: str
    sha256: str | None = None
    divisor: str = "total_trust"
    kind: ClassVar[str] = "fltrust"
    requirement: ClassVar[dict[str, str]] = {"root_data": "the path of a .npz file with arrays x and y"}
    device_clips: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not isinstance(self.root_data, str) or not self.root_data:
            raise FLError(
                f"aggregator 'fltrust': root_data must be the path of a .npz file with arrays x and y, "
                f"got {self.root_data!r}"
            )
        h = self.sha256
        if h is not None and (
            not isinstance(h, str) or len(h) != 64 or any(c not in "0123456789abcdefABCDEF" for c in h)
        ):
            raise FLError(f"aggregator 'fltrust': sha256 must be 64 hex digits (the root file's digest), got {h!r}")
        if self.divisor not in FLTRUST_DIVISORS:
            raise FLError(
                f"aggregator 'fltrust': divisor must be one of {list(FLTRUST_DIVISORS)} (the paper's total trust, "
                f"or the expected cohort for client-level DP), got {self.divisor!r}"
            )

    @property
    def dp(self) -> bool:
        """Whether this is DP-FLTrust (divisor ``expected_clients``: clipped root, fixed denominator)."""
        return self.divisor == "expected_clients"

    def check(self, task: FLTaskSpec) -> None:
        from estimator.fl.fltrust_root import load_root_data

        if task.secagg:
            raise FLError(
                "aggregator 'fltrust' scores every client's individual update against the root update, and "
                "secure aggregation reveals only their sum: set secagg to false"
            )
        if not self.dp and (task.clip_norm is not None or task.noise_multiplier):
            raise FLError(
                "aggregator 'fltrust' with divisor 'total_trust' (the default) runs without client-level DP: its "
                "release Σ TSᵢ·ḡᵢ / Σ TSᵢ divides by the data-dependent total trust, not by a fixed count, so one "
                "client can move it by up to 2‖g₀‖ (not C/m), and ‖g₀‖ itself is a function of the root data; "
                'for DP-FLTrust set "divisor": "expected_clients" on the aggregator (g₀ clipped to clip_norm, the '
                "sum divided by the expected cohort), or set clip_norm to null and noise_multiplier to 0"
            )
        if self.dp and task.clip_norm is None:
            raise FLError(
                "aggregator 'fltrust' with divisor 'expected_clients' is DP-FLTrust and needs clip_norm C: the root "
                "update is clipped to C, which bounds each client's contribution TSᵢ·ḡᵢ (set clip_norm, and "
                "noise_multiplier > 0 for a finite epsilon)"
            )
        if self.dp:
            _num("clip_norm", task.clip_norm)
        if task.algorithm == "scaffold":
            raise FLError(
                "aggregator 'fltrust' runs with algorithm fedavg or fedprox: a scaffold upload carries the "
                "control-variate change beside the model update, which the root training has no counterpart for"
            )
        if task.local_dp_sgd is not None:
            raise FLError(
                "aggregator 'fltrust' cannot run with local_dp_sgd: the devices' updates are noised DP-SGD "
                "steps, the server's root update would be plain SGD, and their cosine would not measure trust"
            )
        try:
            pers = personalization_from_dict(task.personalization)
        except ModelError:
            pers = None  # the task's personalization check reports it
        if isinstance(pers, MoonSpec):
            raise FLError(
                "aggregator 'fltrust' cannot run with personalization moon: the contrastive objective needs "
                "a previous local model, which the server's root training does not have (ditto and perfedavg work)"
            )
        load_root_data(self.root_data, task.build_model(), self.sha256)

    def build(self, task: FLTaskSpec, accountant: FLAccountant | None) -> Aggregator:
        from estimator.fl.fltrust_root import RootTraining, load_root_data

        model = task.build_model()
        x, y = load_root_data(self.root_data, model, self.sha256)
        root = RootTraining(model, task.build_strategy(), x, y, task.seed)
        if self.dp:
            assert task.clip_norm is not None  # checked with the task
            return ValidatingAggregator(
                DPFLTrust(root, float(task.clip_norm), float(task.noise_multiplier), _client_level(accountant))
            )
        return ValidatingAggregator(FLTrust(WeightedMean(), root))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "root_data": self.root_data, "sha256": self.sha256}
        if self.dp:  # the default is left out: a task file written before the option reads back unchanged
            out["divisor"] = self.divisor
        return out


AggregatorSpec = FedAvgSpec | AdaptiveClippingSpec | DPFTRLSpec | MedianSpec | TrimmedMeanSpec | KrumSpec | FLTrustSpec
_AGGREGATOR_KINDS: dict[str, type] = {
    c.kind: c
    for c in (FedAvgSpec, AdaptiveClippingSpec, DPFTRLSpec, MedianSpec, TrimmedMeanSpec, KrumSpec, FLTrustSpec)
}


def resolve_task_paths(d: Mapping[str, Any], base_dir: str) -> dict[str, Any]:
    """A copy of the task object ``d`` with its file paths (``fltrust``'s ``root_data``) made absolute against
    ``base_dir`` (the task file's directory) where they are relative."""
    import os

    out = dict(d)
    agg = out.get("aggregator")
    if isinstance(agg, Mapping) and agg.get("kind") == FLTrustSpec.kind:
        root = agg.get("root_data")
        if isinstance(root, str) and root and not os.path.isabs(root):
            out["aggregator"] = {**agg, "root_data": os.path.join(base_dir, root)}
    return out


def aggregator_spec(d: Mapping[str, Any] | AggregatorSpec) -> AggregatorSpec:
    """The typed spec of a task file's ``aggregator`` object (a spec is returned as it is)."""
    if isinstance(d, tuple(_AGGREGATOR_KINDS.values())):
        return d  # type: ignore[return-value]
    return _read_kind("aggregator", d, _AGGREGATOR_KINDS)


# -- noise ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DistributedDGSpec:
    """``{"kind": "distributed_discrete_gaussian", "bits": b, "k_stddevs": k, "beta": β, "min_shares": s}``
    (all but bits optional: 6, e^{-1/2}, the sampled count): the devices add the noise σ·C as discrete
    Gaussian shares in Z_{2^b} before SecAgg (:mod:`ldp_core.fl.ddg`), so the server never sees an
    un-noised sum; a round with fewer than ``min_shares`` survivors is not released. Needs ``secagg``,
    ``clip_norm``, ``noise_multiplier`` > 0, fixed-count sampling and the ``fedavg`` aggregator."""

    bits: int
    k_stddevs: float = 6.0
    beta: float = math.exp(-0.5)
    min_shares: int | None = None
    kind: ClassVar[str] = "distributed_discrete_gaussian"
    requirement: ClassVar[dict[str, str]] = {"bits": "an integer in [2, 32] (bits per coordinate of the SecAgg ring)"}

    def __post_init__(self) -> None:
        b = self.bits
        if isinstance(b, bool) or not isinstance(b, int) or not 2 <= b <= 32:
            raise FLError(f"noise {self.kind!r}: bits must be an integer in [2, 32], got {b!r}")
        _num(f"noise {self.kind!r}: k_stddevs", self.k_stddevs)
        beta = self.beta
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 < beta < 1.0:
            raise FLError(f"noise {self.kind!r}: beta must be a number in (0, 1), got {beta!r}")
        if self.min_shares is not None:
            _int(f"noise {self.kind!r}: min_shares", self.min_shares, 1)

    def check(self, task: FLTaskSpec) -> None:
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
        if not isinstance(task.aggregator, FedAvgSpec):
            raise FLError(
                "noise 'distributed_discrete_gaussian' works with the 'fedavg' aggregator only (dp_ftrl's tree "
                "reuses each node's noise over rounds, which per-round devices cannot share: docs/fl/DESIGN.md)"
            )
        if self.min_shares is not None and self.min_shares > task.sampling.count:
            raise FLError(f"min_shares {self.min_shares} exceeds the {task.sampling.count} clients sampled per round")
        self.build(task, task.build_model().num_params)  # the spec's own checks (ring room, σ per share)

    def shares(self, task: FLTaskSpec) -> int:
        """The fewest noise shares a released round sums (min_shares, or every sampled client)."""
        assert isinstance(task.sampling, FixedSamplingSpec)
        return task.sampling.count if self.min_shares is None else self.min_shares

    def build(self, task: FLTaskSpec, dim: int) -> Any:
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
        }


NoiseSpec = DistributedDGSpec
_NOISE_KINDS: dict[str, type] = {DistributedDGSpec.kind: DistributedDGSpec}


def noise_spec(d: Mapping[str, Any] | NoiseSpec | None) -> NoiseSpec | None:
    """The typed spec of a task file's ``noise`` object (None: central noise, added by the server)."""
    if d is None or isinstance(d, DistributedDGSpec):
        return d
    return _read_kind("noise", d, _NOISE_KINDS)


def _b64_field(name: str, v: object) -> bytes:
    import base64
    import binascii

    if not isinstance(v, str):
        raise FLError(f"{name} must be a base64 string, got {type(v).__name__}")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise FLError(f"{name} is not valid base64") from None


# -- the task --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FLTaskSpec:
    """What the job runs (frozen, validated; JSON via :meth:`from_dict`/:meth:`to_dict`).

    ``sampling`` is a :data:`SamplingSpec` (in the file ``{"kind": "poisson", "rate": q}`` or
    ``{"kind": "fixed", "count": m}``; a mapping given here is read by :func:`sampling_spec`);
    ``clip_norm`` C turns on client-level DP (devices clip to C, the server
    clips again and adds N(0, (σC)²) with σ = ``noise_multiplier``); ``secagg``
    needs C (the quantizer's range). ``round_timeout`` bounds the plain
    ``train`` phase, ``phase_timeout`` each SecAgg phase (seconds). ``seed``
    fixes the job's generator (sampling, SecAgg graph, noise) for
    simulations; ``None`` (production) draws every value from the OS CSPRNG
    (:func:`ldp_core.randomness.secure_generator`: an observer of released
    models must not be able to predict the noise or the sample, which a
    seeded PCG64 would allow) and keeps no generator state in checkpoints.

    Devices are authenticated (:mod:`ldp_core.tokens.enrollment`): ``enrollment_key`` (required) is the base64
    Ed25519 public key of the operator's enrollment authority; every upload must be signed by a device
    whose credential it issued for that client id (collector and job both check). ``task_signature`` is
    the authority's signature (base64, ``ldp fl sign-task``) of :meth:`signed_config` (the task name,
    secagg, ``secagg_threshold`` and the enrollment key): devices refuse a SecAgg round whose
    configuration is not signed, and take t from it, so a malicious server cannot lower it.
    ``secagg_threshold`` fixes t (the job then keeps each client's degree k with t ≤ k < 2t); None lets
    the job use ⌊k/2⌋ + 1, and devices still require 2t > k.

    ``aggregator`` (an :data:`AggregatorSpec`; a mapping is read by :func:`aggregator_spec`) picks the
    server's stack (:meth:`build_aggregator`):

    * ``{"kind": "fedavg"}`` (default, :class:`FedAvgSpec`): the weighted mean, under
      ``FixedClippingDP`` when ``clip_norm`` is set (devices clip to C too).
    * ``{"kind": "adaptive_clipping", "target_quantile": γ, "clip_learning_rate": η_C,
      "count_stddev": σ_b}`` (:class:`AdaptiveClippingSpec`; the last three optional: 0.5, 0.2,
      expected clients / 20): ``AdaptiveClippingDP`` starting at C = ``clip_norm`` with overall noise
      multiplier z = ``noise_multiplier`` > 0 (the count's noise is paid for on the updates, as the
      wrapper documents; needs σ_b > z/2). Devices do not clip: the server needs each
      update's norm against C (the bit 1[‖Δ‖ ≤ C]); the current C is in the round's ``stats``.
      Not with ``secagg`` (that bit is not securely summed).
    * ``{"kind": "dp_ftrl", "restart_every": R}`` (:class:`DPFTRLSpec`; R optional, null): DP-FTRL
      (:mod:`estimator.fl.ftrl`), tree-aggregated noise of multiplier z = ``noise_multiplier`` > 0 per
      node, no sampling assumption (the same ε for every adversary that sees only the models). With
      ``secagg`` the tree noise goes on the unmasked sum (central: nothing against the operator). Not
      with ``scaffold`` or distributed noise.
    * ``{"kind": "median", "f": f}``, ``{"kind": "trimmed_mean", "f": f}``,
      ``{"kind": "krum", "f": f, "multi": m}`` (:class:`MedianSpec`, :class:`TrimmedMeanSpec`,
      :class:`KrumSpec`; m optional, 1): the robust wrappers over a weighted mean, tolerating f
      malicious clients. They are not linear, so they run without DP (``clip_norm`` null,
      ``noise_multiplier`` 0) and without ``secagg`` (they need every individual update; secure
      aggregation reveals only the sum). A round with fewer updates than the wrapper needs
      (2f + 1; Krum 2f + 3) fails without release.
    * ``{"kind": "fltrust", "root_data": "PATH.npz"}`` (:class:`FLTrustSpec`): FLTrust against a root update the
      job trains each round on its trusted root dataset (:mod:`estimator.fl.fltrust_root`); without ``secagg``,
      with ``fedavg`` or ``fedprox``, ditto or perfedavg (not ``scaffold``, moon, ``local_dp_sgd``). Client-level
      DP only with ``"divisor": "expected_clients"`` (DP-FLTrust, :class:`~estimator.fl.dp.DPFLTrust`).

    ``noise`` (a :data:`NoiseSpec`; a mapping is read by :func:`noise_spec`): None keeps the central
    noise above; ``{"kind": "distributed_discrete_gaussian", "bits": b, ...}`` (:class:`DistributedDGSpec`)
    has the devices add the noise σ·C as discrete Gaussian shares before SecAgg, so that the printed ε
    holds against the server operator too (:mod:`ldp_core.fl.ddg`, :mod:`estimator.fl.ddg_accounting`).

    ``personalization`` (None, or ``{"kind": "ditto", "lam": λ}``, ``{"kind": "perfedavg",
    "inner_learning_rate": α, "eval_steps": s}``, ``{"kind": "moon", "mu": μ, "tau": τ}``; algorithm
    ``fedavg``; MOON needs an ``mlp`` model): the devices' local objective
    (:mod:`ldp_core.fl.personalization`); the server step and the upload stay FedAvg's, so every
    aggregator above applies. Ditto's personal model and MOON's previous model live in the device's
    memory (:class:`~ldp_core.fl.training.ClientState`) and never leave it.

    ``local_dp_sgd`` (None, or ``{"noise_multiplier": σ, "clip": c, "sample_rate": q, "steps": T}`` with
    ``"epochs": E`` in place of ``steps``; :mod:`ldp_core.fl.local_dpsgd`): the devices train each round by
    DP-SGD on their own examples, sample-level DP for one example of one device that holds even against the
    server seeing the update in the clear, under the client-level DP above (one device's whole data against
    whoever sees the models). It goes into :meth:`signed_config` (devices take it from there only) and needs
    ``fedavg`` without personalization, ``training`` with ``learning_rate`` only, and a ``task_signature``
    when the job runs it; :meth:`sample_level_privacy` is the ε the job states."""

    task: str
    model: Mapping[str, Any]
    clients: tuple[str, ...]
    rounds: int
    sampling: SamplingSpec
    algorithm: str = "fedavg"
    training: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    prox_mu: float = 0.01
    server_learning_rate: float = 1.0
    clip_norm: float | None = None
    noise_multiplier: float = 0.0
    delta: float = 1e-5
    secagg: bool = False
    secagg_degree: int | None = None
    round_timeout: float = 60.0
    phase_timeout: float = 30.0
    seed: int | None = None
    aggregator: AggregatorSpec = dataclasses.field(default_factory=FedAvgSpec)
    enrollment_key: str | None = None
    task_signature: str | None = None
    secagg_threshold: int | None = None
    noise: NoiseSpec | None = None
    personalization: Mapping[str, Any] | None = None
    local_dp_sgd: Mapping[str, Any] | None = None
    compression: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "clients", tuple(self.clients))
        if not self.clients or len(set(self.clients)) != len(self.clients):
            raise FLError("clients must be a non-empty list of distinct client ids")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise FLError(f"rounds must be a positive integer, got {self.rounds!r}")
        self.build_model()
        object.__setattr__(self, "sampling", sampling_spec(self.sampling))
        self.build_sampling()
        LocalTraining(**self.training)
        if self.algorithm not in ("fedavg", "fedprox", "scaffold"):
            raise FLError(f"algorithm must be fedavg, fedprox or scaffold, got {self.algorithm!r}")
        _num("server_learning_rate", self.server_learning_rate)
        _num("noise_multiplier", self.noise_multiplier, strict=False)
        _num("round_timeout", self.round_timeout)
        _num("phase_timeout", self.phase_timeout)
        if not 0 < self.delta < 1:
            raise FLError(f"delta must be in (0, 1), got {self.delta!r}")
        object.__setattr__(self, "aggregator", aggregator_spec(self.aggregator))
        self.aggregator.check(self)
        if self.clip_norm is not None:
            _num("clip_norm", self.clip_norm)
        elif self.noise_multiplier:
            raise FLError("noise_multiplier needs clip_norm (the noise is σ·C)")
        if self.secagg and self.clip_norm is None:
            raise FLError("secagg needs clip_norm: devices clip to C and quantize values in [-C, C]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise FLError(f"seed must be an integer >= 0 or null, got {self.seed!r}")
        self.authority_key  # noqa: B018 - checks enrollment_key
        if self.task_signature is not None and len(_b64_field("task_signature", self.task_signature)) != 64:
            raise FLError("task_signature must be base64 of a 64-byte Ed25519 signature")
        if self.secagg_threshold is not None:
            _int("secagg_threshold", self.secagg_threshold, 2)
            if not self.secagg:
                raise FLError("secagg_threshold needs secagg")
        object.__setattr__(self, "noise", noise_spec(self.noise))
        if self.noise is not None:
            self.noise.check(self)
        self._check_personalization()
        self._check_local_dp_sgd()
        self._check_compression()

    def _check_local_dp_sgd(self) -> None:
        """``local_dp_sgd`` (:mod:`ldp_core.fl.local_dpsgd`): read, and refused where the devices' local
        objective is not plain FedAvg SGD, or where ``training`` sets what DP-SGD decides itself."""
        spec = local_dp_sgd_from_dict(self.local_dp_sgd)
        if spec is None:
            return
        object.__setattr__(self, "local_dp_sgd", spec.to_dict())
        if self.algorithm not in ("fedavg", "fedprox"):
            raise FLError(
                f"local_dp_sgd runs with algorithm fedavg or fedprox, got {self.algorithm!r}: the device's DP-SGD "
                "steps carry no control variate (SCAFFOLD's would be trained on the examples outside DP-SGD)"
            )
        if self.personalization is not None:
            raise FLError(
                "local_dp_sgd cannot run with personalization: the personal and contrastive objectives train "
                "on the device's examples outside DP-SGD, so the sample-level ε would not cover them"
            )
        other = sorted(set(self.training) - {"learning_rate"})
        if other:
            raise FLError(
                f"with local_dp_sgd, training takes only learning_rate (got {other}): the batches are Poisson "
                "samples at local_dp_sgd's sample_rate and the step count is its steps or epochs"
            )

    @property
    def local_dp_sgd_spec(self) -> LocalDPSGDSpec | None:
        """The devices' DP-SGD (None: plain local SGD)."""
        return local_dp_sgd_from_dict(self.local_dp_sgd)

    def sample_level_privacy(self, rounds: int | None = None, add_remove: bool = True) -> dict[str, Any] | None:
        """The sample-level ε of ``local_dp_sgd`` (None without it) for a device that took part in ``rounds``
        rounds (default: every round of the task, the worst case over devices, since any device may be
        sampled every round), at the task's δ: ``epsilon`` by PLD for one example replaced (a device's
        example count is public: its upload carries it), ``epsilon_add_remove`` (PLD) and
        ``epsilon_add_remove_rdp`` (RDP, the second opinion) for one example added or removed, which would
        hold if the count were hidden (left out with ``add_remove=False``: PLD takes about a second). A function of the task's public parameters only (not of who was
        sampled), so it may be published."""
        from estimator.accounting.accountant import account

        spec = self.local_dp_sgd_spec
        if spec is None:
            return None
        k = self.rounds if rounds is None else rounds
        if k == 0:
            return {
                "rounds": 0,
                "epsilon": 0.0,
                "epsilon_add_remove": 0.0,
                "epsilon_add_remove_rdp": 0.0,
                "delta": self.delta,
            }
        rep = account(spec.event(k), self.delta, "replace")
        out = {
            "rounds": k,
            "steps_per_round": spec.steps_per_round,
            "epsilon": rep.epsilon_pld,
            "neighbors": "replace",
            "delta": self.delta,
        }
        if add_remove:
            ar = account(spec.event(k), self.delta)
            out["epsilon_add_remove"], out["epsilon_add_remove_rdp"] = ar.epsilon_pld, ar.epsilon_rdp
        return out

    def _check_compression(self) -> None:
        """``compression`` (issue 18): ``{"kind": "quantize", "bits": b, "rotate": bool}`` or
        ``{"kind": "count_sketch", "rows": r, "cols": c, "bits": b}`` runs under SecAgg
        with the fedavg aggregator and central noise; every other combination is refused
        (:func:`ldp_core.fl.compress.check_composition` for the data-dependent top-k)."""
        c = self.compression
        if c is None:
            return
        if not isinstance(c, Mapping) or not isinstance(c.get("kind"), str):
            raise FLError(f"compression must be an object with a kind, got {c!r}")
        from ldp_core.fl.compress import check_composition

        try:
            check_composition(c["kind"], secagg=self.secagg, distributed_noise=self.noise is not None)
        except ModelError as exc:
            raise FLError(f"compression: {exc}") from None
        if c["kind"] not in ("quantize", "count_sketch"):
            raise FLError(
                f"compression {c['kind']!r} is not wired through the job yet (scenario only: ldp fl compress); "
                "the task option supports kinds 'quantize' and 'count_sketch'"
            )
        if not self.secagg or self.noise is not None or self.aggregator.kind != "fedavg":
            raise FLError(
                f"compression {c['kind']!r} runs with secagg, central noise and the fedavg aggregator (the "
                "distributed DG already rounds into its own ring; plain uploads are float32)"
            )
        object.__setattr__(self, "compression", dict(c))
        self.build_compression()

    def build_compression(self) -> Any:
        """The task's :class:`ldp_core.fl.compress.RingQuantization` or
        :class:`ldp_core.fl.ring_sketch.RingCountSketch` (None without compression)."""
        if self.compression is None:
            return None
        from ldp_core.fl.ring_sketch import ring_compression_for_task

        assert self.clip_norm is not None
        dim = self.build_strategy().payload_size(self.build_model().num_params)
        try:
            return ring_compression_for_task(dict(self.compression), float(self.clip_norm), len(self.clients), dim)
        except ModelError as exc:
            raise FLError(f"compression: {exc}") from None

    def _check_personalization(self) -> None:
        try:
            spec = personalization_from_dict(self.personalization)
        except ModelError as exc:
            raise FLError(f"personalization: {exc}") from None
        if spec is None:
            return
        object.__setattr__(self, "personalization", personalization_to_dict(spec))
        if self.algorithm != "fedavg":
            raise FLError(f"personalization ({spec.kind}) runs on algorithm fedavg, got {self.algorithm!r}")
        if isinstance(spec, MoonSpec) and not isinstance(self.build_model(), MLP):
            raise FLError("personalization moon needs an mlp model (its contrastive term is on the hidden layer)")

    @property
    def authority_key(self) -> bytes:
        """The enrollment authority's raw Ed25519 public key (32 bytes)."""
        if self.enrollment_key is None:
            raise FLError(
                "enrollment_key is required: the base64 public key of the authority that enrolls the task's "
                "devices (create one with `ldp fl enroll --init-authority FILE`); uploads are authenticated with it"
            )
        raw = _b64_field("enrollment_key", self.enrollment_key)
        if len(raw) != 32:
            raise FLError(f"enrollment_key must be base64 of 32 bytes (an Ed25519 public key), got {len(raw)} bytes")
        return raw

    def signed_config(self) -> dict[str, Any]:
        """What ``task_signature`` signs and devices check before they trust a round's SecAgg parameters."""
        out: dict[str, Any] = {
            "v": 1,
            "task": self.task,
            "secagg": self.secagg,
            "secagg_threshold": self.secagg_threshold,
            "enrollment_key": self.enrollment_key,
        }
        if self.local_dp_sgd is not None:  # devices take their DP-SGD from here, never from the server's word
            out["local_dp_sgd"] = {**self.local_dp_sgd, "delta": self.delta}
        if self.noise is not None:  # devices derive their noise share from these, never from the server's word
            spec = self.noise.build(self, self.build_strategy().payload_size(self.build_model().num_params))
            out["ddg"] = {**spec.to_dict(), "min_shares": self.noise.shares(self)}
        if self.compression is not None:  # devices quantize with these, never with the server's word
            out["compression"] = self.build_compression().to_dict()
        return out

    @property
    def device_clip_norm(self) -> float | None:
        """What devices clip to (published in the round state): C for ``fedavg`` with DP, else None."""
        return self.clip_norm if self.aggregator.device_clips else None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FLTaskSpec:
        """The task of a task file's JSON object; unknown fields are refused."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise FLError(f"unknown task fields {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)

    @classmethod
    def from_file(cls, path: str) -> FLTaskSpec:
        """The task of the JSON task file at ``path``; a relative ``root_data`` (``fltrust``) is relative to the
        file's directory (:func:`resolve_task_paths`). A file that is not a JSON object is an :class:`FLError`."""
        import json
        import os

        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError) as exc:
            raise FLError(f"task file {path!r}: {exc}") from None
        if not isinstance(d, Mapping):
            raise FLError(f"task file {path!r} must hold one JSON object, got {type(d).__name__}")
        return cls.from_dict(resolve_task_paths(d, os.path.dirname(os.path.abspath(path))))

    def to_dict(self) -> dict[str, Any]:
        """The task file's JSON object (:meth:`from_dict` of it gives an equal spec)."""
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["clients"] = list(self.clients)
        out["model"], out["training"] = dict(out["model"]), dict(out["training"])
        out["sampling"] = self.sampling.to_dict()
        out["aggregator"] = self.aggregator.to_dict()
        out["noise"] = None if self.noise is None else self.noise.to_dict()
        out["local_dp_sgd"] = None if self.local_dp_sgd is None else dict(self.local_dp_sgd)
        out["compression"] = None if self.compression is None else dict(self.compression)
        return out

    def build_model(self) -> Any:
        return model_from_dict(self.model)

    def build_sampling(self) -> Sampling:
        return self.sampling.build(len(self.clients))

    def build_strategy(self) -> Strategy:
        tr = LocalTraining(**self.training)
        spec = personalization_from_dict(self.personalization)
        if isinstance(spec, DittoSpec):
            return Ditto(tr, self.server_learning_rate, spec=spec)
        if isinstance(spec, PerFedAvgSpec):
            return PerFedAvg(tr, self.server_learning_rate, spec=spec)
        if isinstance(spec, MoonSpec):
            return Moon(tr, self.server_learning_rate, spec=spec)
        if self.algorithm == "fedprox":
            return FedProx(tr, self.server_learning_rate, mu=self.prox_mu)
        if self.algorithm == "scaffold":
            return Scaffold(tr, self.server_learning_rate)
        return FedAvg(tr, self.server_learning_rate, local_dp_sgd=self.local_dp_sgd_spec)

    def build_accountant(self) -> FLAccountant | None:
        """None without DP; :class:`FtrlAccountant` for ``dp_ftrl`` (no sampling credited), else
        :class:`ClientLevelAccountant`."""
        if self.clip_norm is None:
            return None
        if isinstance(self.aggregator, DPFTRLSpec):
            return FtrlAccountant(self.aggregator.restart_every, self.delta)
        return ClientLevelAccountant(self.build_sampling(), len(self.clients), self.delta)

    def build_aggregator(self, accountant: FLAccountant | None) -> Aggregator:
        """The stack an in-process run with the same spec uses: ``ValidatingAggregator`` around
        ``FixedClippingDP(WeightedMean(), C, σ, accountant)`` (``fedavg``; without the DP wrapper when
        ``clip_norm`` is None), ``AdaptiveClippingDP(WeightedMean(), C, z, γ, η_C, σ_b, accountant)``,
        ``CoordinateMedian``/``TrimmedMean(WeightedMean(), f)``, ``Krum(WeightedMean(), f, multi)`` or
        ``FLTrust(WeightedMean(), RootTraining(...))`` (``DPFLTrust(RootTraining(...), C, σ, accountant)`` with
        ``"divisor": "expected_clients"``)."""
        return self.aggregator.build(self, accountant)
