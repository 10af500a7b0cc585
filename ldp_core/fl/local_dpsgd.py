"""DP-SGD on a device inside federated learning: sample-level DP under the job's client-level DP.

A task's ``local_dp_sgd`` option (:class:`LocalDPSGDSpec`, in the file
``{"noise_multiplier": σ, "clip": c, "sample_rate": q, "steps": T}`` or
``"epochs": E`` instead of ``steps``, E·round(1/q) steps) makes every selected
device train its round with the numpy DP-SGD of :mod:`ldp_core.fl.dpsgd`
instead of plain minibatch SGD: Poisson batches at rate q over the device's
N examples, each example's gradient clipped to c, Gaussian noise N(0, σ²c²·I)
on the sum, division by the expected batch qN, T steps from the global
parameters with the task's ``training.learning_rate``. The upload is the
difference to the global parameters, then clipped to the job's C as before.

What each ε protects (docs/fl/LOCAL_DPSGD.md):

* **sample-level** (this module): one *example* of one device, replaced by any
  other (the device's example count N is public: its upload carries N as
  FedAvg's weight and qN divides the noisy sum, so add/remove of an example is
  visible in N and the relation is replace-one), against anyone who sees that
  device's update, the server included, even in the clear (no SecAgg, no
  client-level noise). One round on the device is
  ``SelfComposed(PoissonSampled(q, Gaussian(σ)), T)``; the rounds a device takes
  part in compose (everything released later is post-processing of the
  uploads). It assumes the device's Poisson batches stay secret (they are
  drawn on the device). It says nothing about a device's data as a whole.
* **client-level** (:mod:`estimator.fl.dp`): the whole of one device's data,
  against whoever sees the released models; not against the server that sees
  updates in the clear (unless distributed noise is used).

:class:`SampleLevelAccountant` is the device's own ledger: it records each round
this device trained under local DP-SGD and answers its sample-level ε from
``dp_accounting`` (:func:`ldp_core.fl.dpsgd_accounting.dpsgd_epsilon`: PLD under replace-one; the add/remove figures by PLD and
RDP beside it, for comparison: dp_accounting's RDP has no Poisson-sampled
replace-one analysis). It lives on the device
and is never uploaded: how many rounds a device joined is not public. The
server can state only the worst case (every round), see
:meth:`estimator.fl.task.FLTaskSpec.sample_level_privacy`.

Randomness: the batches come from the round's training generator and the noise
from a separate generator (on a real device the OS CSPRNG, so that the server
cannot predict and subtract it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ldp_core.fl.dpsgd import DPSGDConfig, PerExampleGradients, train_flat_dpsgd
from ldp_core.fl.dpsgd_accounting import dpsgd_epsilon
from ldp_core.fl.errors import FLError, ModelError
from ldp_core.fl.models import Model
from ldp_core.fl.per_example import NumpyGradients
from ldp_core.fl.training import ClientUpdate, RoundConfig
from ldp_core.privacy_events import PrivacyEvent, sampled_gaussian_event

__all__ = [
    "LocalDPSGDSpec",
    "local_dp_sgd_from_dict",
    "train_local_dpsgd",
    "local_dpsgd_update",
    "SampleLevelAccountant",
]

_OPTIONS = ("noise_multiplier", "clip", "sample_rate", "steps", "epochs")


def _finite(name: str, v: object, *, zero_ok: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or (v < 0 if zero_ok else v <= 0):  # type: ignore[operator]
        raise FLError(f"local_dp_sgd: {name} must be a finite number > 0, got {v!r}")
    return float(v)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class LocalDPSGDSpec:
    """σ (``noise_multiplier`` > 0), c (``clip`` > 0, the per-example clip norm), q (``sample_rate`` in
    (0, 1]) and either ``steps`` T or ``epochs`` E (T = E·round(1/q)) per round; exactly one of the two."""

    noise_multiplier: float
    clip: float
    sample_rate: float
    steps: int | None = None
    epochs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.noise_multiplier, (int, float)) and self.noise_multiplier == 0:
            raise FLError(
                "local_dp_sgd: noise_multiplier must be > 0 (without noise there is no sample-level DP; "
                "drop local_dp_sgd for plain local SGD)"
            )
        _finite("noise_multiplier", self.noise_multiplier)
        _finite("clip", self.clip)
        q = self.sample_rate
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < q <= 1.0:
            raise FLError(f"local_dp_sgd: sample_rate must be a number in (0, 1], got {q!r}")
        if (self.steps is None) == (self.epochs is None):
            raise FLError(
                "local_dp_sgd: give exactly one of steps (DP-SGD steps per round) and epochs "
                f"(round(1/q) steps each), got steps={self.steps!r}, epochs={self.epochs!r}"
            )
        for name in ("steps", "epochs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise FLError(f"local_dp_sgd: {name} must be an integer >= 1, got {v!r}")

    def dpsgd_config(self, learning_rate: float) -> DPSGDConfig:
        try:
            return DPSGDConfig(float(self.noise_multiplier), float(self.clip), float(self.sample_rate), learning_rate)
        except ModelError as exc:
            raise FLError(f"local_dp_sgd: {exc}") from None

    @property
    def steps_per_round(self) -> int:
        """T: ``steps``, or ``epochs`` · round(1/q)."""
        if self.steps is not None:
            return int(self.steps)
        assert self.epochs is not None
        return int(self.epochs) * max(1, round(1.0 / float(self.sample_rate)))

    def round_event(self) -> PrivacyEvent:
        """One round on one device, per example: T Poisson-sampled Gaussian steps (account it under replace-one,
        the device's N being public; see the module docstring)."""
        return sampled_gaussian_event(float(self.noise_multiplier), float(self.sample_rate), self.steps_per_round)

    def event(self, rounds: int) -> PrivacyEvent:
        """``rounds`` rounds on one device: (σ, q) for T·rounds steps (the rounds compose)."""
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise FLError(f"rounds must be an integer >= 1, got {rounds!r}")
        return sampled_gaussian_event(
            float(self.noise_multiplier), float(self.sample_rate), self.steps_per_round * rounds
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "noise_multiplier": self.noise_multiplier,
            "clip": self.clip,
            "sample_rate": self.sample_rate,
        }
        if self.steps is not None:
            out["steps"] = self.steps
        else:
            out["epochs"] = self.epochs
        return out


def local_dp_sgd_from_dict(d: Mapping[str, Any] | LocalDPSGDSpec | None) -> LocalDPSGDSpec | None:
    """The spec of a task file's ``local_dp_sgd`` object (None: plain local SGD). Unknown and missing
    options are refused by name."""
    if d is None or isinstance(d, LocalDPSGDSpec):
        return d
    if not isinstance(d, Mapping):
        raise FLError(f"local_dp_sgd must be an object with {list(_OPTIONS[:3])} and steps or epochs, got {d!r}")
    unknown = set(d) - set(_OPTIONS)
    if unknown:
        raise FLError(f"local_dp_sgd has no options {sorted(unknown)}; it takes {list(_OPTIONS)}")
    missing = [k for k in _OPTIONS[:3] if k not in d]
    if missing:
        raise FLError(f"local_dp_sgd: {', '.join(missing)} missing (it needs noise_multiplier, clip, sample_rate)")
    return LocalDPSGDSpec(**d)


def local_round_start(
    config: RoundConfig, X: np.ndarray, num_params: int, spec: LocalDPSGDSpec
) -> tuple[np.ndarray, DPSGDConfig, float]:
    """What a device's DP-SGD round starts from, for the numpy and the torch path alike: the round's
    parameters θ₀ (float32, checked against the model's size), the steps' configuration at the round's
    learning rate, and FedProx's μ (0 for FedAvg). Refuses SCAFFOLD, personalization and an empty dataset."""
    if config.algorithm not in ("fedavg", "fedprox") or config.personalization is not None:
        raise FLError("local_dp_sgd trains the fedavg or fedprox client update only (no scaffold or personalization)")
    x = np.asarray(config.params, dtype=np.float32)
    if x.shape != (num_params,):
        raise ModelError(f"the round's params have shape {x.shape}, the model needs ({num_params},)")
    if len(X) == 0:
        raise FLError("local_dp_sgd needs at least one training example on the device")
    mu = float(config.prox_mu) if config.algorithm == "fedprox" else 0.0
    return x, spec.dpsgd_config(float(config.training.learning_rate)), mu


def local_dpsgd_update(
    grads: PerExampleGradients,
    config: RoundConfig,
    X: np.ndarray,
    y: np.ndarray,
    spec: LocalDPSGDSpec,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    client_id: str,
) -> ClientUpdate:
    """A device's DP-SGD round through any per-example gradients (the numpy model's, the torch module's):
    T = ``spec.steps_per_round`` steps of :func:`ldp_core.fl.dpsgd.train_flat_dpsgd` from the round's
    parameters at its learning rate (FedProx's pull with μ); the upload is θ_T − θ_0, weighted by len(X)."""
    x, cfg, mu = local_round_start(config, X, grads.num_params, spec)
    w = train_flat_dpsgd(grads, x, X, y, cfg, spec.steps_per_round, sample_rng, noise_rng, prox_mu=mu)
    return ClientUpdate(client_id, config.round, (w - x).astype(np.float32), len(X))


def train_local_dpsgd(
    model: Model,
    config: RoundConfig,
    X: np.ndarray,
    y: np.ndarray,
    spec: LocalDPSGDSpec,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    client_id: str,
) -> ClientUpdate:
    """Round ``config`` on (X, y) by DP-SGD under ``spec`` (see the module docstring): T steps from the global
    parameters at the round's learning rate; the upload is θ_T − θ_0, weighted by len(X). FedAvg, or FedProx
    (each step's noised gradient plus μ·(θ − θ_0), a function of θ and the public θ_0 only: post-processing,
    the same sample-level ε); the task refuses SCAFFOLD and personalization with ``local_dp_sgd``."""
    return local_dpsgd_update(NumpyGradients(model), config, X, y, spec, sample_rng, noise_rng, client_id)


class SampleLevelAccountant:
    """A device's sample-level ledger: the rounds it trained under local DP-SGD (each once) and their ε.

    Kept on the device only (never uploaded). ``epsilon()`` composes the recorded rounds with
    ``dp_accounting``'s PLD accountant at ``delta`` (one example replaced, N public),
    ``epsilon_add_remove()`` and ``epsilon_add_remove_rdp()`` for add/remove (PLD, RDP). Needs the ``dp-accounting`` package (the ``server`` extra)
    only when asked for an ε; recording does not."""

    def __init__(self, delta: float) -> None:
        if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
            raise FLError(f"delta must be in (0, 1), got {delta!r}")
        self.delta = float(delta)
        self.spec: LocalDPSGDSpec | None = None
        self._rounds: set[int] = set()

    @property
    def rounds(self) -> int:
        """How many rounds this device trained under local DP-SGD."""
        return len(self._rounds)

    def record(self, round: int, spec: LocalDPSGDSpec) -> None:
        """Round ``round`` was trained under ``spec`` (a second record of the same round is ignored: it
        trained once). A task's spec is fixed by its signed configuration; another one is refused."""
        if self.spec is not None and spec != self.spec:
            raise FLError("local_dp_sgd changed between rounds of one task; the signed configuration fixes it")
        self.spec = spec
        self._rounds.add(int(round))

    @property
    def recorded_rounds(self) -> frozenset[int]:
        """The rounds recorded."""
        return frozenset(self._rounds)

    def with_round(self, round: int, spec: LocalDPSGDSpec) -> SampleLevelAccountant:
        """A copy with ``round`` recorded under ``spec`` (this one unchanged): what the ledger would be after it."""
        out = SampleLevelAccountant(self.delta)
        out.spec, out._rounds = self.spec, set(self._rounds)
        out.record(round, spec)
        return out

    def event(self) -> PrivacyEvent | None:
        return None if self.spec is None or not self._rounds else self.spec.event(self.rounds)

    def _accountant_epsilon(self, kind: Literal["pld", "rdp"], relation: Literal["add_or_remove", "replace"]) -> float:
        ev = self.event()
        return 0.0 if ev is None else dpsgd_epsilon(ev, self.delta, relation, kind)

    def epsilon(self) -> float:
        """Sample-level ε over the recorded rounds at :attr:`delta`, one example *replaced* (the device's example
        count N is public: the upload carries it as FedAvg's weight, and qN divides the noisy sum), by PLD;
        0 before any round. The figure that holds against the server."""
        return self._accountant_epsilon("pld", "replace")

    def epsilon_add_remove(self) -> float:
        """The same for one example added or removed (PLD): what would hold if N were not revealed."""
        return self._accountant_epsilon("pld", "add_or_remove")

    def epsilon_add_remove_rdp(self) -> float:
        """The add/remove figure by the RDP accountant (a second opinion, looser than PLD; dp_accounting's RDP
        has no Poisson-sampled replace-one analysis, so the replace-one figure has PLD only)."""
        return self._accountant_epsilon("rdp", "add_or_remove")

    def report(self) -> dict[str, Any]:
        """What the device may show its user (locally): rounds joined, ε, δ, what it protects."""
        return {
            "rounds": self.rounds,
            "epsilon": self.epsilon(),
            "neighbors": "replace one example (the device's example count is public)",
            "epsilon_add_remove_rdp": self.epsilon_add_remove_rdp(),
            "delta": self.delta,
            "local_dp_sgd": None if self.spec is None else self.spec.to_dict(),
            "protects": "one training example of this device, against anyone who sees its updates (the server too)",
        }
