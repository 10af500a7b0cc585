"""A PyTorch module as an FL device's model, with DP-SGD on the device (task option ``local_dp_sgd``).

:class:`TorchDeviceModel` stands for one task model (the task file's ``model`` object:
``logistic``, ``softmax`` or ``mlp``) on a device that computes with PyTorch. Tasks move
flat vectors in the numpy models' layout (:mod:`ldp_core.fl.models`: each layer's
in × out weight matrix row-major, then its bias); :class:`~client_sdk.fl.torch_adapter.TorchModel`
moves the module's ``parameters_to_vector`` order, where ``nn.Linear`` keeps its matrix
out × in. The adapter holds the permutation between the two (``index``: the torch vector
is ``task_vector[index]``), so a device hands the job exactly what a numpy device would.
:meth:`TorchDeviceModel.for_task_model` builds the module for a task's model
(``nn.Linear(d, 1)``, ``nn.Linear(d, K)``, or ``Linear, tanh/ReLU, Linear``); any other
module whose parameters are the task vector in the module's own order can be given
with the model it stands for (``TorchDeviceModel(TorchModel(...), task_model)``).

It is a :class:`~ldp_core.fl.models.Model` in the task's layout, so plain rounds train
with :func:`~ldp_core.fl.client_round.train_client` on torch gradients (FedAvg, FedProx,
SCAFFOLD, Ditto, Per-FedAvg; MOON's contrastive term needs the numpy MLP and is refused). Under
``local_dp_sgd``, :func:`train_torch_local_dpsgd` replaces
:func:`~ldp_core.fl.local_dpsgd.train_local_dpsgd`: the same mechanism step for step
(:mod:`ldp_core.fl.dpsgd`: Poisson batch at rate q from the round's training generator,
each example's gradient clipped to c, N(0, σ²c²·I) on the sum, division by qN, the L2
penalty's gradient, θ ← θ − η·g in float32), with the clipped sum computed by
:func:`client_sdk.fl.torch_dpsgd.clipped_grad_sum` (ghost clipping by default,
``torch.func`` per-sample gradients with ``method="vmap"``). The noise is drawn in the
task's layout from the device's DP-SGD noise generator (the OS CSPRNG unless a
simulation fixes it; torch's global generator is never used), as one draw of the whole
vector like the numpy path, so the same generators give the numpy device's update to
float rounding. The privacy event is the spec's, and the device records the round in its
:class:`~ldp_core.fl.local_dpsgd.SampleLevelAccountant` before training, through the
same spend step as the numpy path (:meth:`client_sdk.fl.device.FLDevice._spend_sample_level`).

Every parameter of the module trains (the task vector is all of them): modules with
frozen parameters (a LoRA backbone) are refused here. PyTorch is imported when a
:class:`TorchDeviceModel` is made, never by ``import client_sdk.fl.device``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from client_sdk.fl.torch_adapter import TorchModel, _torch
from client_sdk.fl.torch_dpsgd import Method, clipped_grad_sum
from ldp_core.fl.dpsgd import DPSGDConfig, FlatBackend, dpsgd_step_on, train_flat_dpsgd
from ldp_core.fl.errors import FLError, ModelError
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec, local_dpsgd_update
from ldp_core.fl.models import MLP, LogisticRegression, SoftmaxRegression
from ldp_core.fl.protocol import model_from_dict, model_to_dict
from ldp_core.fl.training import ClientUpdate, RoundConfig

__all__ = ["TorchDeviceModel", "train_torch_dpsgd_task", "train_torch_local_dpsgd"]


def _key(model: Mapping[str, Any]) -> str:
    """The task model's canonical JSON, defaults filled in (``{"kind": "logistic", "n_features": 5}`` and the
    same with ``"l2": 0.0`` are one model)."""
    return json.dumps(model_to_dict(model_from_dict(model)), sort_keys=True, separators=(",", ":"))


def _linear_index(offset: int, n_in: int, n_out: int) -> np.ndarray:
    """Task positions of an ``nn.Linear(n_in, n_out)`` weight in torch order: torch's W[j, i] (row-major over
    out × in) is the task's W[i, j] at ``offset + i·n_out + j``."""
    return (offset + np.arange(n_in * n_out).reshape(n_in, n_out).T).ravel()


class TorchDeviceModel:
    """``torch_model`` standing for the task model ``task_model`` (its JSON object); ``index`` maps the task
    vector to the module's (default: the same order); ``method`` the clipped sum's (``"ghost"`` or ``"vmap"``)."""

    def __init__(
        self,
        torch_model: TorchModel,
        task_model: Mapping[str, Any],
        index: np.ndarray | None = None,
        method: Method = "ghost",
    ) -> None:
        if not isinstance(torch_model, TorchModel):
            raise ModelError(f"torch_model must be a TorchModel, got {type(torch_model).__name__}")
        ref = model_from_dict(task_model)
        n = torch_model.num_params
        if ref.num_params != n:
            raise ModelError(f"the module has {n} parameters, the task's model {dict(task_model)} has {ref.num_params}")
        if float(getattr(ref, "l2", 0.0)) != float(torch_model.l2):
            raise ModelError(f"the module's l2 is {torch_model.l2}, the task's model has {getattr(ref, 'l2', 0.0)}")
        frozen = [name for name, p in torch_model.module.named_parameters() if not p.requires_grad]
        if frozen:
            raise ModelError(
                f"every parameter of a device's module trains (the task vector is all of them); frozen: "
                f"{', '.join(frozen[:3])}"
            )
        idx = np.arange(n, dtype=np.int64) if index is None else np.asarray(index, dtype=np.int64)
        if idx.shape != (n,) or not np.array_equal(np.sort(idx), np.arange(n)):
            raise ModelError(f"index must be a permutation of range({n})")
        if method not in ("ghost", "vmap"):
            raise ModelError(f"method must be 'ghost' or 'vmap', got {method!r}")
        self.torch_model = torch_model
        self.task_model = dict(task_model)
        self.index = idx
        self.inverse = np.argsort(idx)
        self.method: Method = method
        self.l2 = float(torch_model.l2)
        mask = np.zeros(n, dtype=bool)  # the penalized (weight) coordinates, in the task's layout
        for _, _, off, size, is_w in torch_model._layout:
            if is_w:
                mask[idx[off : off + size]] = True
        self._weights = mask
        self._key = _key(task_model)

    @classmethod
    def for_task_model(
        cls, task_model: Mapping[str, Any], *, dtype: Any = None, method: Method = "ghost"
    ) -> TorchDeviceModel:
        """The module for a task's ``logistic``, ``softmax`` or ``mlp`` model (parameters in ``dtype``, default
        float32), with the permutation to the task's layout."""
        torch = _torch()
        nn = torch.nn
        dt = torch.float32 if dtype is None else dtype
        ref = model_from_dict(task_model)
        if isinstance(ref, LogisticRegression):
            d = ref.n_features
            module: Any = nn.Linear(d, 1, dtype=dt)
            return cls(TorchModel(module, "binary", ref.l2), task_model, np.arange(d + 1), method)
        if isinstance(ref, SoftmaxRegression):
            d, k = ref.n_features, ref.n_classes
            module = nn.Linear(d, k, dtype=dt)
            index = np.concatenate([_linear_index(0, d, k), d * k + np.arange(k)])
            return cls(TorchModel(module, "multiclass", ref.l2), task_model, index, method)
        if isinstance(ref, MLP):
            d, h, k = ref.n_features, ref.hidden, ref.n_classes
            act = nn.Tanh() if ref.activation == "tanh" else nn.ReLU()
            module = nn.Sequential(nn.Linear(d, h, dtype=dt), act, nn.Linear(h, k, dtype=dt))
            i2, i3 = d * h + h, d * h + h + h * k
            index = np.concatenate(
                [_linear_index(0, d, h), d * h + np.arange(h), _linear_index(i2, h, k), i3 + np.arange(k)]
            )
            return cls(TorchModel(module, "multiclass", ref.l2), task_model, index, method)
        raise ModelError(f"no torch module is known for the task model {dict(task_model)}")  # pragma: no cover

    # -- the layouts -----------------------------------------------------------------------------------
    def for_view(self, task_model: Mapping[str, Any]) -> TorchDeviceModel:
        """This model, if the round's task model is the one it stands for (else the round is refused)."""
        if _key(task_model) != self._key:
            raise FLError(
                f"the round's model {dict(task_model)} is not the one this device's torch module stands for "
                f"({self.task_model})"
            )
        return self

    def to_torch(self, params: np.ndarray) -> np.ndarray:
        """The module's flat vector (``parameters_to_vector`` order) of a task vector."""
        return np.asarray(self._check(params))[self.index]

    def to_task(self, torch_vector: np.ndarray) -> np.ndarray:
        """The task vector of the module's flat vector."""
        return np.asarray(self._check(torch_vector))[self.inverse]

    def _check(self, p: np.ndarray) -> np.ndarray:
        v = np.asarray(p)
        if v.shape != (self.num_params,):
            raise ModelError(f"expected a flat parameter vector of length {self.num_params}, got shape {v.shape}")
        return v

    # -- the Model interface, in the task's layout ----------------------------------------------------------
    @property
    def num_params(self) -> int:
        return self.torch_model.num_params

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        return self.to_task(self.torch_model.init_params(rng))

    def predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        return self.torch_model.predict(self.to_torch(params), X)

    def loss(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        return self.torch_model.loss(self.to_torch(params), X, y)

    def loss_and_grad(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        loss, g = self.torch_model.loss_and_grad(self.to_torch(params), X, y)
        return loss, self.to_task(g)

    # -- DP-SGD ---------------------------------------------------------------------------------------------
    def clipped_grad_sum(
        self, params: np.ndarray, X: np.ndarray, y: np.ndarray, clip_norm: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Σ_i min(1, c/‖∇ℓ_i‖)·∇ℓ_i at the task vector ``params`` (float64, the task's layout) and the
        per-example norms, by the torch adapter (:func:`client_sdk.fl.torch_dpsgd.clipped_grad_sum`)."""
        tm = self.torch_model
        tm.load_into(self.to_torch(params))
        sums, norms = clipped_grad_sum(tm, X, y, float(clip_norm), self.method)
        flat = np.concatenate([s.detach().reshape(-1).cpu().numpy().astype(np.float64) for s in sums])
        return self.to_task(flat), norms

    def penalty_grad(self, params: np.ndarray) -> np.ndarray:
        """∇ of (l2/2)·‖weights‖² in the task's layout (0 on the biases)."""
        p = np.asarray(self._check(params), dtype=np.float64)
        return np.where(self._weights, self.l2 * p, 0.0)

    def dpsgd_step(
        self,
        params: np.ndarray,
        X: np.ndarray,
        y: np.ndarray,
        config: DPSGDConfig,
        sample_rng: np.random.Generator,
        noise_rng: np.random.Generator,
        prox_mu: float = 0.0,
        anchor: np.ndarray | None = None,
    ) -> np.ndarray:
        """One step of :func:`ldp_core.fl.dpsgd.dpsgd_step`'s mechanism, the same draws from the same
        generators: θ − η·[(clipped sum + N(0, σ²c²·I)) / qN + l2·W + μ·(θ − anchor)], float32 (the
        proximal term with ``prox_mu`` > 0 only: post-processing, as in the numpy step). The step is the
        shared one (:func:`ldp_core.fl.dpsgd.dpsgd_step_on` through a :class:`~ldp_core.fl.dpsgd.FlatBackend`
        of this model)."""
        w, _ = dpsgd_step_on(FlatBackend(self, prox_mu, anchor), params, X, y, config, sample_rng, noise_rng)
        out: np.ndarray = w
        return out


def train_torch_dpsgd_task(
    model: TorchDeviceModel,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    steps: int,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    prox_mu: float = 0.0,
) -> np.ndarray:
    """``steps`` DP-SGD steps from the task vector ``params`` (as :func:`ldp_core.fl.dpsgd.train_dpsgd`,
    FedProx's pull toward ``params`` with ``prox_mu`` > 0); returns the task vector, float32."""
    return train_flat_dpsgd(model, params, X, y, config, steps, sample_rng, noise_rng, prox_mu=prox_mu)


def train_torch_local_dpsgd(
    model: TorchDeviceModel,
    config: RoundConfig,
    X: np.ndarray,
    y: np.ndarray,
    spec: LocalDPSGDSpec,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    client_id: str,
) -> ClientUpdate:
    """:func:`ldp_core.fl.local_dpsgd.train_local_dpsgd` with the torch module: T = ``spec.steps_per_round``
    steps from the round's parameters at its learning rate; the upload is θ_T − θ_0 weighted by len(X)."""
    if not isinstance(model, TorchDeviceModel):
        raise ModelError(f"model must be a TorchDeviceModel, got {type(model).__name__}")
    return local_dpsgd_update(model, config, X, y, spec, sample_rng, noise_rng, client_id)
