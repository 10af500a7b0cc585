"""The half of federated learning that devices and servers share: models as flat parameter vectors
(:mod:`.models`), local training for FedAvg/FedProx/SCAFFOLD (:mod:`.training`), DP-SGD, the round
messages (:mod:`.protocol`), secure-aggregation masking (:mod:`.secagg`, which needs the ``fl`` extra,
i.e. the ``cryptography`` package, and is not imported here), distributed discrete Gaussian noise and
update compression.

Importing this package needs only numpy."""

from ldp_core.fl.client_round import train_client
from ldp_core.fl.errors import FLError, ModelError, SecAggError, UpdateRejected
from ldp_core.fl.models import MLP, LogisticRegression, Model, SoftmaxRegression, accuracy
from ldp_core.fl.training import ClientState, ClientUpdate, LocalTraining, RoundConfig, clip_to_norm

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
