"""Device-side local training: FedAvg, FedProx and SCAFFOLD client updates.

The server publishes a :class:`RoundConfig` (the global parameters, the
round number, the algorithm and its hyper-parameters); a device trains on its
own data with :func:`ldp_core.fl.client_round.train_client` and uploads one flat vector, a
:class:`ClientUpdate`. Nothing else about the device's data leaves it.

* FedAvg (McMahan et al., "Communication-efficient learning of deep networks
  from decentralized data", AISTATS 2017): local minibatch SGD from the global
  parameters x; the update is Δ = y − x.
* FedProx (Li et al., "Federated optimization in heterogeneous networks",
  MLSys 2020): the local objective adds (μ/2)‖y − x‖², so each step uses
  g(y) + μ (y − x).
* SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1 with option II): each
  step uses g(y) − c_i + c, where c is the server's control variate and c_i
  the device's; after K steps of size η, c_i⁺ = c_i − c + (x − y)/(K η). The
  upload is the concatenation (Δy, Δc) = (y − x, c_i⁺ − c_i), one flat vector
  of twice the model's size, and the device keeps c_i⁺ in its
  :class:`ClientState`.
* Ditto, Per-FedAvg and MOON: ``algorithm = "fedavg"`` with a
  ``personalization`` spec (:mod:`ldp_core.fl.personalization`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Literal, cast

import numpy as np

from ldp_core.fl.errors import ModelError
from ldp_core.fl.models import Model
from ldp_core.fl.personalization import DittoSpec, MoonSpec, PerFedAvgSpec

__all__ = [
    "Algorithm",
    "LocalTraining",
    "RoundConfig",
    "ClientState",
    "ClientUpdate",
    "local_sgd",
    "train_plain",
    "clip_to_norm",
    "upload_digest",
]

Algorithm = Literal["fedavg", "fedprox", "scaffold"]


def _pos(name: str, v: object, integer: bool = False) -> None:
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not math.isfinite(cast(float, v)) or cast(float, v) <= 0:
        kind = "a positive integer" if integer else "a finite number > 0"
        raise ModelError(f"{name} must be {kind}, got {v!r}")


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """Local minibatch SGD: ``epochs`` passes over the device's data in shuffled
    batches of ``batch_size`` with step size ``learning_rate``, stopping early
    after ``max_steps`` steps if given."""

    epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 0.1
    max_steps: int | None = None

    def __post_init__(self) -> None:
        _pos("epochs", self.epochs, integer=True)
        _pos("batch_size", self.batch_size, integer=True)
        _pos("learning_rate", self.learning_rate)
        if self.max_steps is not None:
            _pos("max_steps", self.max_steps, integer=True)


@dataclasses.dataclass(frozen=True)
class RoundConfig:
    """What the server publishes for one round.

    ``control`` is SCAFFOLD's server control variate c (None otherwise);
    ``prox_mu`` is FedProx's μ (0 otherwise)."""

    round: int
    params: np.ndarray
    algorithm: Algorithm = "fedavg"
    training: LocalTraining = LocalTraining()
    prox_mu: float = 0.0
    control: np.ndarray | None = None
    personalization: DittoSpec | PerFedAvgSpec | MoonSpec | None = None
    #: the task's ``local_dp_sgd`` (:class:`ldp_core.fl.local_dpsgd.LocalDPSGDSpec`): train by DP-SGD
    local_dp_sgd: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.round, bool) or not isinstance(self.round, int) or self.round < 0:
            raise ModelError(f"round must be an integer >= 0, got {self.round!r}")
        if self.algorithm not in ("fedavg", "fedprox", "scaffold"):
            raise ModelError(f"algorithm must be 'fedavg', 'fedprox' or 'scaffold', got {self.algorithm!r}")
        if not (isinstance(self.prox_mu, (int, float)) and math.isfinite(self.prox_mu) and self.prox_mu >= 0):
            raise ModelError(f"prox_mu must be a finite number >= 0, got {self.prox_mu!r}")
        if self.algorithm == "fedprox" and self.prox_mu == 0:
            raise ModelError("fedprox needs prox_mu > 0 (with prox_mu = 0 it is fedavg)")
        if (self.algorithm == "scaffold") != (self.control is not None):
            raise ModelError("control (SCAFFOLD's server control variate) is required for scaffold and only for it")
        if self.control is not None and np.shape(self.control) != np.shape(self.params):
            raise ModelError(f"control has shape {np.shape(self.control)}, params {np.shape(self.params)}")
        if self.personalization is not None:
            if not isinstance(self.personalization, (DittoSpec, PerFedAvgSpec, MoonSpec)):
                raise ModelError(
                    f"personalization must be a Ditto, Per-FedAvg or MOON spec, got {self.personalization!r}"
                )
            if self.algorithm != "fedavg":
                raise ModelError(f"personalization runs with algorithm 'fedavg', got {self.algorithm!r}")

    @property
    def payload_size(self) -> int:
        """Length of the vector a client uploads."""
        n = int(np.shape(self.params)[0])
        return 2 * n if self.algorithm == "scaffold" else n


@dataclasses.dataclass
class ClientState:
    """What a device keeps between rounds: SCAFFOLD's control variate c_i, Ditto's
    personal model v_k, MOON's previous local model (:mod:`ldp_core.fl.personalization`)."""

    control: np.ndarray | None = None
    personal: np.ndarray | None = None
    previous: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class ClientUpdate:
    """One upload: a flat float32 vector for ``round``, weighted by ``num_examples``.

    ``upload_id`` identifies this exact upload (see :func:`upload_digest`): the
    server rejects a second upload with the same id as a replay."""

    client_id: str
    round: int
    delta: np.ndarray
    num_examples: int
    upload_id: str = ""

    def __post_init__(self) -> None:
        if not self.upload_id:
            object.__setattr__(self, "upload_id", upload_digest(self.client_id, self.round, self.delta))


def upload_digest(client_id: str, round: int, delta: np.ndarray) -> str:
    """BLAKE2b-128 of (client id, round, vector bytes): equal for a replayed upload."""
    h = hashlib.blake2b(digest_size=16)
    h.update(client_id.encode())
    h.update(int(round).to_bytes(8, "little"))
    h.update(np.ascontiguousarray(delta).tobytes())
    return h.hexdigest()


def clip_to_norm(v: np.ndarray, clip_norm: float) -> tuple[np.ndarray, float]:
    """v · min(1, C/‖v‖₂) and ‖v‖₂ (Abadi et al. 2016; McMahan et al. 2018)."""
    norm = float(np.linalg.norm(np.asarray(v, dtype=np.float64)))
    if norm <= clip_norm:
        return v, norm
    return (v * (clip_norm / norm)).astype(v.dtype, copy=False), norm


def local_sgd(
    model: Model,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    training: LocalTraining,
    rng: np.random.Generator,
    prox_mu: float = 0.0,
    correction: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """Minibatch SGD from ``params``; returns the final parameters and the number
    of steps K. Each step moves by −η (g(y) + μ (y − params) + correction)."""
    anchor = np.asarray(params, dtype=np.float32)
    w = anchor.copy()
    n = len(X)
    if n == 0:
        return w, 0
    steps = 0
    for _ in range(training.epochs):
        order = rng.permutation(n)
        for start in range(0, n, training.batch_size):
            idx = order[start : start + training.batch_size]
            _, g = model.loss_and_grad(w, X[idx], y[idx])
            if prox_mu:
                g = g + prox_mu * (w - anchor)
            if correction is not None:
                g = g + correction
            w -= np.float32(training.learning_rate) * g.astype(np.float32, copy=False)
            steps += 1
            if training.max_steps is not None and steps >= training.max_steps:
                return w, steps
    return w, steps


def train_plain(
    model: Model,
    config: RoundConfig,
    X: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator,
    client_id: str,
    state: ClientState | None = None,
) -> ClientUpdate:
    """A FedAvg, FedProx or SCAFFOLD round on (X, y) by :func:`local_sgd` (see the module docstring);
    SCAFFOLD updates ``state``'s control variate. ``config.params`` must fit the model (checked by
    :func:`ldp_core.fl.client_round.train_client`, which also routes personalization and DP-SGD)."""
    x = np.asarray(config.params, dtype=np.float32)
    tr = config.training
    if config.algorithm == "scaffold":
        if state is None:
            raise ModelError("scaffold needs the device's ClientState (its control variate)")
        c = np.asarray(config.control, dtype=np.float32)
        ci = state.control if state.control is not None else np.zeros_like(x)
        w, k = local_sgd(model, x, X, y, tr, rng, correction=c - ci)
        if k == 0:
            return ClientUpdate(client_id, config.round, np.zeros(2 * x.size, np.float32), 0)
        ci_new = (ci - c + (x - w) / np.float32(k * tr.learning_rate)).astype(np.float32)
        state.control = ci_new
        delta = np.concatenate([w - x, ci_new - ci]).astype(np.float32)
        return ClientUpdate(client_id, config.round, delta, len(X))
    w, _ = local_sgd(model, x, X, y, tr, rng, prox_mu=config.prox_mu)
    return ClientUpdate(client_id, config.round, (w - x).astype(np.float32), len(X))
