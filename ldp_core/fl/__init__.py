"""The half of federated learning that devices and servers share: models as flat parameter vectors
(:mod:`.models`), local training for FedAvg/FedProx/SCAFFOLD (:mod:`.training`), DP-SGD, the round
messages (:mod:`.protocol`), secure-aggregation masking (:mod:`.secagg`, which needs the ``fl`` extra,
i.e. the ``cryptography`` package, and is not imported here), distributed discrete Gaussian noise and
update compression.

Importing this package needs only numpy, and loads nothing until a name is used: the names below
are looked up in their modules on first access (PEP 562), so that importing a submodule such as
:mod:`ldp_core.fl.errors` (which every estimator error class needs) does not load the training code."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ldp_core.fl.client_round import train_client
    from ldp_core.fl.errors import FLError, ModelError, SecAggError, UpdateRejected
    from ldp_core.fl.models import MLP, LogisticRegression, Model, SoftmaxRegression, accuracy
    from ldp_core.fl.training import ClientState, ClientUpdate, LocalTraining, RoundConfig, clip_to_norm

#: exported name -> the module that defines it
_WHERE = {
    "train_client": "ldp_core.fl.client_round",
    **dict.fromkeys(("FLError", "ModelError", "SecAggError", "UpdateRejected"), "ldp_core.fl.errors"),
    **dict.fromkeys(("MLP", "LogisticRegression", "Model", "SoftmaxRegression", "accuracy"), "ldp_core.fl.models"),
    **dict.fromkeys(
        ("ClientState", "ClientUpdate", "LocalTraining", "RoundConfig", "clip_to_norm"), "ldp_core.fl.training"
    ),
}


def __getattr__(name: str) -> Any:
    try:
        module = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'ldp_core.fl' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ClientState",
    "ClientUpdate",
    "LocalTraining",
    "RoundConfig",
    "clip_to_norm",
    "train_client",
    "FLError",
    "ModelError",
    "SecAggError",
    "UpdateRejected",
    "MLP",
    "LogisticRegression",
    "Model",
    "SoftmaxRegression",
    "accuracy",
]
