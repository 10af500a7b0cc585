"""A PyTorch ``nn.Module`` as a :class:`ldp_core.fl.models.Model` (CPU; optional).

Federated learning here moves flat float vectors; :class:`TorchModel` lets any
classifier written as a ``torch.nn.Module`` train on devices and aggregate on the
server like the numpy models. The flat vector is the module's parameters in
registration order, each flattened row-major — the order of
``torch.nn.utils.parameters_to_vector`` — so ``nn.Linear(d, 1)`` has exactly the
layout of :class:`~ldp_core.fl.models.LogisticRegression` (w, then b).

Each call evaluates the module *functionally* on views of one flat leaf tensor
(``torch.func.functional_call``), so the gradient comes back already flat and
the module is never modified; :meth:`TorchModel.load_into` copies a vector into
the module (``vector_to_parameters``) when a trained ``nn.Module`` is wanted.

Loss, as in :mod:`ldp_core.fl.models`: the mean cross-entropy over the batch
plus ``(l2 / 2)·Σ‖W‖²`` over the parameters whose name ends in ``weight``
(biases and other parameters are not penalized).

* ``task="binary"``: the module maps (n, ·) inputs to n logits z (shape (n,) or
  (n, 1)); loss = mean[log(1 + e^z) − y z], y ∈ {0, 1}; prediction 1{z > 0}.
* ``task="multiclass"``: logits of shape (n, K); loss = mean[logsumexp(z) − z_y];
  prediction argmax.

Computations run in float64 when the parameters or the inputs are float64 (as a
gradient check wants), else in float32; the gradient has that dtype.
The module runs in ``eval()`` mode (dropout off: training randomness comes only
from the generator the caller passes), and modules with buffers (BatchNorm's
running statistics) are refused, since only parameters travel between devices
and the server. PyTorch is imported when a :class:`TorchModel` is made, never by
``import client_sdk`` (install the ``torch`` extra to use it).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import numpy as np

from ldp_core.fl.errors import ModelError

__all__ = ["TorchModel"]


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ModelError(
            f"TorchModel needs PyTorch, which is not importable ({e}); "
            "install the optional extra: pip install 'ldp-telemetry[torch]'"
        ) from None
    return torch


@dataclasses.dataclass(frozen=True, eq=False)
class TorchModel:
    """Adapts ``module`` (a classifier producing logits) to the :class:`Model` interface."""

    module: Any
    task: Literal["binary", "multiclass"]
    l2: float = 0.0
    # set once in __post_init__ (the dataclass is frozen): the torch module, the parameter layout, the count
    _torch: Any = dataclasses.field(init=False, repr=False, compare=False)
    _layout: tuple[tuple[str, tuple[int, ...], int, int, bool], ...] = dataclasses.field(
        init=False, repr=False, compare=False
    )
    _n: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        torch = _torch()
        if not isinstance(self.module, torch.nn.Module):
            raise ModelError(f"module must be a torch.nn.Module, got {type(self.module).__name__}")
        if self.task not in ("binary", "multiclass"):
            raise ModelError(f"task must be 'binary' or 'multiclass', got {self.task!r}")
        if (
            isinstance(self.l2, bool)
            or not isinstance(self.l2, (int, float))
            or not math.isfinite(self.l2)
            or self.l2 < 0
        ):
            raise ModelError(f"l2 must be a finite number >= 0, got {self.l2!r}")
        if any(True for _ in self.module.buffers()):
            names = [n for n, _ in self.module.named_buffers()]
            raise ModelError(
                f"modules with buffers ({', '.join(names[:3])}) are not supported: only parameters "
                "travel in federated learning; use a normalization without running statistics"
            )
        named = list(self.module.named_parameters())
        if not named:
            raise ModelError("the module has no parameters")
        bad = [n for n, p in named if not p.dtype.is_floating_point]
        if bad:
            raise ModelError(f"parameters must be floating point; not: {', '.join(bad)}")
        layout, offset = [], 0
        for name, p in named:
            layout.append((name, tuple(p.shape), offset, p.numel(), name.endswith("weight")))
            offset += p.numel()
        object.__setattr__(self, "_torch", torch)
        object.__setattr__(self, "_layout", tuple(layout))
        object.__setattr__(self, "_n", offset)
        self.module.eval()

    @property
    def num_params(self) -> int:
        return self._n

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """Glorot-uniform (Glorot and Bengio 2010) for parameters of two or more
        dimensions, a = √(6 / (fan_in + fan_out)) with fan_in = shape[1]·r and
        fan_out = shape[0]·r (r the product of the remaining dimensions, as for
        convolutions); zeros for one-dimensional parameters. Drawn from ``rng``,
        never from torch's global generator."""
        p = np.zeros(self._n, dtype=np.float32)
        for _, shape, off, n, _ in self._layout:
            if len(shape) >= 2:
                r = int(np.prod(shape[2:])) if len(shape) > 2 else 1
                a = math.sqrt(6.0 / (shape[1] * r + shape[0] * r))
                p[off : off + n] = rng.uniform(-a, a, size=n)
        return p

    def current_params(self) -> np.ndarray:
        """The module's own parameters as a flat float32 vector (``parameters_to_vector``)."""
        with self._torch.no_grad():
            return (
                self._torch.nn.utils.parameters_to_vector(self.module.parameters())
                .detach()
                .cpu()
                .numpy()
                .astype(np.float32)
            )

    def load_into(self, params: np.ndarray) -> None:
        """Copy a flat vector into the module's parameters. A copy: ``vector_to_parameters``
        on ``as_tensor(params)`` would make the parameters views of the caller's array,
        which in-place training (:mod:`client_sdk.fl.torch_dpsgd`) would then overwrite."""
        p = self._flat(params)
        with self._torch.no_grad():
            for (_, shape, off, n, _), q in zip(self._layout, self.module.parameters(), strict=True):
                q.copy_(self._torch.as_tensor(p[off : off + n].reshape(shape), dtype=q.dtype))

    # -- the Model interface --------------------------------------------------------
    def predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.no_grad():
            z = self._logits(self._tensor(params, X), X)
            if self.task == "binary":
                return (z > 0).numpy().astype(np.int64)
            return torch.argmax(z, dim=1).numpy().astype(np.int64)

    def loss(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        with self._torch.no_grad():
            flat = self._tensor(params, X)
            return float(self._loss(flat, X, y))

    def loss_and_grad(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        flat = self._tensor(params, X).requires_grad_(True)
        loss = self._loss(flat, X, y)
        (g,) = self._torch.autograd.grad(loss, flat)
        return float(loss.detach()), g.numpy()

    # -- internals ---------------------------------------------------------------------
    def _flat(self, params: np.ndarray) -> np.ndarray:
        p = np.asarray(params)
        if p.ndim != 1 or p.shape[0] != self._n:
            raise ModelError(f"expected a flat parameter vector of length {self._n}, got shape {p.shape}")
        return p

    def _tensor(self, params: np.ndarray, X: np.ndarray) -> Any:
        p = self._flat(params)
        dt = np.float64 if np.result_type(p.dtype, np.asarray(X).dtype, np.float32) == np.float64 else np.float32
        return self._torch.tensor(p, dtype=self._torch.float64 if dt == np.float64 else self._torch.float32)

    def _logits(self, flat: Any, X: np.ndarray) -> Any:
        torch = self._torch
        tensors = {name: flat[off : off + n].view(shape) for name, shape, off, n, _ in self._layout}
        x = torch.as_tensor(np.asarray(X), dtype=flat.dtype)
        z = torch.func.functional_call(self.module, tensors, (x,))
        if self.task == "binary":
            if not (z.dim() == 1 or (z.dim() == 2 and z.shape[1] == 1)):
                raise ModelError(f"a binary model must output one logit per row, got shape {tuple(z.shape)}")
            return z.reshape(-1)
        if z.dim() != 2:
            raise ModelError(f"a multiclass model must output (n, K) logits, got shape {tuple(z.shape)}")
        return z

    def _loss(self, flat: Any, X: np.ndarray, y: np.ndarray) -> Any:
        torch = self._torch
        F = torch.nn.functional
        z = self._logits(flat, X)
        yv = np.asarray(y)
        k = 2 if self.task == "binary" else z.shape[1]
        if yv.shape != (z.shape[0],):
            raise ModelError(f"expected {z.shape[0]} labels, got shape {yv.shape}")
        if yv.size and (yv.min() < 0 or yv.max() >= k):
            raise ModelError(f"labels must be integers in [0, {k}), got range [{yv.min()}, {yv.max()}]")
        if self.task == "binary":
            loss = F.binary_cross_entropy_with_logits(z, torch.as_tensor(yv, dtype=flat.dtype))
        else:
            loss = F.cross_entropy(z, torch.as_tensor(yv, dtype=torch.int64))
        if self.l2:
            reg = sum(flat[off : off + n].square().sum() for _, _, off, n, is_w in self._layout if is_w)
            loss = loss + 0.5 * self.l2 * reg
        return loss
