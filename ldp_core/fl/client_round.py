"""A device's round, whatever the task asks: :func:`train_client` picks the local training.

It sits above the three ways a device trains (each imports only the round types of
:mod:`ldp_core.fl.training` and never this module): DP-SGD under ``local_dp_sgd``
(:mod:`ldp_core.fl.local_dpsgd`), Ditto, Per-FedAvg or MOON under ``personalization``
(:mod:`ldp_core.fl.personalized_training`), else FedAvg, FedProx or SCAFFOLD
(:func:`ldp_core.fl.training.train_plain`).
"""

from __future__ import annotations

import numpy as np

from ldp_core.fl.errors import ModelError
from ldp_core.fl.local_dpsgd import train_local_dpsgd
from ldp_core.fl.models import Model
from ldp_core.fl.personalized_training import train_personalized
from ldp_core.fl.training import ClientState, ClientUpdate, RoundConfig, train_plain

__all__ = ["train_client"]


def train_client(
    model: Model,
    config: RoundConfig,
    X: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator,
    client_id: str,
    state: ClientState | None = None,
) -> ClientUpdate:
    """Train on (X, y) as ``config`` asks and return the upload: DP-SGD under ``local_dp_sgd``
    (:func:`ldp_core.fl.local_dpsgd.train_local_dpsgd`, the batches and the noise from ``rng``),
    else the personalization's local training (:func:`ldp_core.fl.personalized_training.train_personalized`),
    else FedAvg, FedProx or SCAFFOLD (:func:`ldp_core.fl.training.train_plain`)."""
    x = np.asarray(config.params, dtype=np.float32)
    if x.shape != (model.num_params,):
        raise ModelError(f"the round's params have shape {x.shape}, the model needs ({model.num_params},)")
    if config.local_dp_sgd is not None:  # in one process the batches and the noise share ``rng``
        return train_local_dpsgd(model, config, X, y, config.local_dp_sgd, rng, rng, client_id)
    if config.personalization is not None:
        return train_personalized(model, config, X, y, rng, client_id, state)
    return train_plain(model, config, X, y, rng, client_id, state)
