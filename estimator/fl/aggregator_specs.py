"""The task file's ``aggregator`` object, read into a typed spec that builds the server's aggregator stack.

:func:`aggregator_spec` reads ``{"kind": ...}`` (:func:`~estimator.fl.options.read_kind`) into one of the
specs here (:data:`AggregatorSpec`), which writes the same object back with ``to_dict``. Each spec checks
what it needs of the rest of the task (``check``: DP settings, SecAgg, enough sampled clients), says
whether devices clip (``device_clips``), and builds its stack (``build``) over the task's accountant
(:data:`FLAccountant`); they read the task through :class:`~estimator.fl.options.TaskView`. Every refusal is an :class:`~ldp_core.fl.errors.FLError`.
"""

from __future__ import annotations

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
from estimator.fl.options import (
    FixedSamplingSpec,
    TaskView,
    read_int,
    read_kind,
    read_number,
)
from estimator.fl.robust import CoordinateMedian, FLTrust, Krum, TrimmedMean
from ldp_core.fl.errors import FLError, ModelError
from ldp_core.fl.personalization import (
    MoonSpec,
    personalization_from_dict,
)

__all__ = [
    "FLAccountant",
    "AggregatorSpec",
    "FedAvgSpec",
    "AdaptiveClippingSpec",
    "DPFTRLSpec",
    "secagg_quantization_slack",
    "MedianSpec",
    "TrimmedMeanSpec",
    "KrumSpec",
    "FLTRUST_DIVISORS",
    "FLTrustSpec",
    "aggregator_spec",
]

#: The accountant a task's DP aggregator reports to (:meth:`FLTaskSpec.build_accountant`).
FLAccountant = ClientLevelAccountant | FtrlAccountant


def _client_level(accountant: FLAccountant | None) -> ClientLevelAccountant | None:
    if accountant is not None and not isinstance(accountant, ClientLevelAccountant):
        raise FLError(f"this aggregator reports to a ClientLevelAccountant, got {type(accountant).__name__}")
    return accountant


# -- aggregators -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FedAvgSpec:
    """``{"kind": "fedavg"}``: the weighted mean, under ``FixedClippingDP`` when the task sets ``clip_norm``.
    Devices clip to C too."""

    kind: ClassVar[str] = "fedavg"
    requirement: ClassVar[dict[str, str]] = {}
    device_clips: ClassVar[bool] = True

    def check(self, task: TaskView) -> None:
        """Nothing beyond the task's own checks: fedavg works with and without DP and SecAgg."""

    def build(self, task: TaskView, accountant: FLAccountant | None) -> Aggregator:
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
        read_number("aggregator 'adaptive_clipping': clip_learning_rate", self.clip_learning_rate)
        if self.count_stddev is not None:
            read_number("count_stddev", self.count_stddev)

    def check(self, task: TaskView) -> None:
        if task.clip_norm is None or not task.noise_multiplier > 0:
            raise FLError(
                "adaptive_clipping needs clip_norm (the initial C) and noise_multiplier > 0 (the overall "
                "z the accountant charges, shared by the updates and the clipped-count release)"
            )
        read_number("clip_norm", task.clip_norm)
        if task.secagg:
            raise FLError(
                "adaptive_clipping cannot run with secagg: the server needs each client's bit "
                "1[‖Δ‖ ≤ C], which secure aggregation does not sum; use kind 'fedavg' with secagg"
            )
        self.build(task, None)  # the wrapper's own checks
        update_noise_multiplier(task.noise_multiplier, self.count_stddev_for(task))  # σ_b > z/2

    def count_stddev_for(self, task: TaskView) -> float:
        """σ_b: the option, or the task's expected clients per round / 20."""
        if self.count_stddev is not None:
            return float(self.count_stddev)
        return task.build_sampling().expected_clients(len(task.clients)) / 20.0

    def build(self, task: TaskView, accountant: FLAccountant | None) -> Aggregator:
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


def secagg_quantization_slack(task: TaskView) -> float:
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
            read_int("aggregator 'dp_ftrl': restart_every", self.restart_every, 1)
        if not isinstance(self.efficient, bool):
            raise FLError(f"aggregator 'dp_ftrl': efficient must be true or false, got {self.efficient!r}")

    def check(self, task: TaskView) -> None:
        if task.clip_norm is None or not task.noise_multiplier > 0:
            raise FLError("dp_ftrl needs clip_norm (C) and noise_multiplier > 0 (the noise of every tree node is z·C)")
        read_number("clip_norm", task.clip_norm)
        if task.algorithm == "scaffold":
            raise FLError("dp_ftrl runs with algorithm fedavg or fedprox (scaffold's control variates are not noised)")

    def build(self, task: TaskView, accountant: FLAccountant | None) -> Aggregator:
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
        read_int(f"aggregator {self.kind!r}: f", self.f, 0)

    @property
    def min_updates(self) -> int:
        return 2 * self.f + 1

    def check(self, task: TaskView) -> None:
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

    def build(self, task: TaskView, accountant: FLAccountant | None) -> Aggregator:
        return ValidatingAggregator(CoordinateMedian(WeightedMean(), self.f))


@dataclasses.dataclass(frozen=True)
class TrimmedMeanSpec(_RobustSpec):
    """``{"kind": "trimmed_mean", "f": f}``: ``TrimmedMean(WeightedMean(), f)``."""

    kind: ClassVar[str] = "trimmed_mean"

    def build(self, task: TaskView, accountant: FLAccountant | None) -> Aggregator:
        return ValidatingAggregator(TrimmedMean(WeightedMean(), self.f))


@dataclasses.dataclass(frozen=True)
class KrumSpec(_RobustSpec):
    """``{"kind": "krum", "f": f, "multi": m}`` (m optional, 1): ``Krum(WeightedMean(), f, multi)``;
    a round needs 2f + 3 updates and at least m + f."""

    multi: int = 1
    kind: ClassVar[str] = "krum"

    def __post_init__(self) -> None:
        super().__post_init__()
        read_int(f"aggregator {self.kind!r}: multi", self.multi, 1)

    @property
    def min_updates(self) -> int:
        return max(2 * self.f + 3, self.multi + self.f)

    def build(self, task: TaskView, accountant: FLAccountant | None) -> Aggregator:
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

    def check(self, task: TaskView) -> None:
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
            read_number("clip_norm", task.clip_norm)
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

    def build(self, task: TaskView, accountant: FLAccountant | None) -> Aggregator:
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


def aggregator_spec(d: Mapping[str, Any] | AggregatorSpec) -> AggregatorSpec:
    """The typed spec of a task file's ``aggregator`` object (a spec is returned as it is)."""
    if isinstance(d, tuple(_AGGREGATOR_KINDS.values())):
        return d  # type: ignore[return-value]
    return read_kind("aggregator", d, _AGGREGATOR_KINDS)
