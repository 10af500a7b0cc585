"""Server strategies: what a round publishes and how the aggregate moves the model.

A strategy builds the round's :class:`~ldp_core.fl.training.RoundConfig` and
applies an aggregate (from any :class:`~estimator.fl.aggregators.Aggregator`
stack) to the global parameters. The aggregation itself (weighting,
clipping, noise, robustness) is the aggregator's business, so every strategy
combines with every wrapper.

* :class:`FedAvg`: x ← x + η_g Δ̄ (η_g = 1 is McMahan et al. 2017).
* :class:`FedProx`: the same server step; the clients add (μ/2)‖y − x‖².
* :class:`Scaffold`: the upload is (Δy, Δc); x ← x + η_g Δȳ and
  c ← c + (|S|/N) Δc̄ (Karimireddy et al. 2020, Algorithm 1, lines 16–17),
  with |S| the expected number of sampled clients.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from estimator.fl.aggregators import AggregateResult
from ldp_core.fl.errors import FLError
from ldp_core.fl.training import LocalTraining, RoundConfig

__all__ = ["Strategy", "FedAvg", "FedProx", "Scaffold"]


class Strategy(Protocol):
    def configure(self, round: int, params: np.ndarray) -> RoundConfig: ...

    def payload_size(self, num_params: int) -> int: ...

    def apply(self, params: np.ndarray, result: AggregateResult, participation: float) -> np.ndarray: ...


@dataclasses.dataclass
class FedAvg:
    """Federated averaging; the aggregator decides the weighting."""

    training: LocalTraining = LocalTraining()
    server_learning_rate: float = 1.0
    #: the devices' DP-SGD (:class:`ldp_core.fl.local_dpsgd.LocalDPSGDSpec`), None for plain local SGD
    local_dp_sgd: Any = None

    def configure(self, round: int, params: np.ndarray) -> RoundConfig:
        return RoundConfig(
            round, np.asarray(params, np.float32), "fedavg", self.training, local_dp_sgd=self.local_dp_sgd
        )

    def payload_size(self, num_params: int) -> int:
        return num_params

    def apply(self, params: np.ndarray, result: AggregateResult, participation: float) -> np.ndarray:
        return (params + self.server_learning_rate * result.delta).astype(np.float32)


@dataclasses.dataclass
class FedProx(FedAvg):
    """FedProx with proximal weight ``mu`` (Li et al. 2020)."""

    mu: float = 0.01

    def __post_init__(self) -> None:
        if not self.mu > 0:
            raise FLError(f"FedProx needs mu > 0, got {self.mu}")

    def configure(self, round: int, params: np.ndarray) -> RoundConfig:
        return RoundConfig(round, np.asarray(params, np.float32), "fedprox", self.training, prox_mu=self.mu)


@dataclasses.dataclass
class Scaffold:
    """SCAFFOLD with server control variate c (starts at 0)."""

    training: LocalTraining = LocalTraining()
    server_learning_rate: float = 1.0
    control: np.ndarray | None = None

    def configure(self, round: int, params: np.ndarray) -> RoundConfig:
        if self.control is None:
            self.control = np.zeros(len(params), np.float32)
        return RoundConfig(round, np.asarray(params, np.float32), "scaffold", self.training, control=self.control)

    def payload_size(self, num_params: int) -> int:
        return 2 * num_params

    def apply(self, params: np.ndarray, result: AggregateResult, participation: float) -> np.ndarray:
        n = len(params)
        if self.control is None:
            self.control = np.zeros(n, np.float32)
        dy, dc = result.delta[:n], result.delta[n:]
        self.control = (self.control + participation * dc).astype(np.float32)
        return (params + self.server_learning_rate * dy).astype(np.float32)
