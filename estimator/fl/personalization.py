"""Personalization strategies: Ditto, Per-FedAvg and MOON on FedAvg's server step.

Each is :class:`~estimator.fl.strategies.FedAvg` whose round configuration
carries a device-side spec (:mod:`ldp_core.fl.personalization`); the server
step and the upload (Δ = y − x, one model's size) are FedAvg's, so every
aggregator wrapper (clipping, DP noise, robust rules, SecAgg) applies unchanged.
What differs is the device's objective and what a device uses afterwards
(:func:`~ldp_core.fl.personalized_training.personalized_params`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from estimator.fl.strategies import FedAvg
from ldp_core.fl.personalization import DittoSpec, MoonSpec, PerFedAvgSpec
from ldp_core.fl.training import RoundConfig

__all__ = ["Ditto", "PerFedAvg", "Moon"]


@dataclasses.dataclass
class Ditto(FedAvg):
    """Ditto (Li et al. 2021): FedAvg for w, a personal v_k on each device pulled toward w with λ."""

    spec: DittoSpec = DittoSpec()

    def configure(self, round: int, params: np.ndarray) -> RoundConfig:
        return RoundConfig(round, np.asarray(params, np.float32), "fedavg", self.training, personalization=self.spec)


@dataclasses.dataclass
class PerFedAvg(FedAvg):
    """Per-FedAvg, first-order (Fallah et al. 2020): FedAvg of first-order MAML steps."""

    spec: PerFedAvgSpec = PerFedAvgSpec()

    def configure(self, round: int, params: np.ndarray) -> RoundConfig:
        return RoundConfig(round, np.asarray(params, np.float32), "fedavg", self.training, personalization=self.spec)


@dataclasses.dataclass
class Moon(FedAvg):
    """MOON (Li, He, Song 2021): FedAvg of model-contrastive local training (an MLP's hidden layer)."""

    spec: MoonSpec = MoonSpec()

    def configure(self, round: int, params: np.ndarray) -> RoundConfig:
        return RoundConfig(round, np.asarray(params, np.float32), "fedavg", self.training, personalization=self.spec)
