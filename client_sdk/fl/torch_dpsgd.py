"""DP-SGD for PyTorch modules through the torch adapter (optional ``torch`` extra).

The mechanism is :mod:`ldp_core.fl.dpsgd`'s (Abadi et al., CCS 2016, Alg. 1):
Poisson batches at rate q, each example's gradient clipped to norm C, the
sum noised with N(0, σ²C²·I) and divided by the *expected* batch size qN,
then the L2 penalty's gradient (it depends on no example) and θ ← θ − η·g.
Its privacy event is the same ``DPSGDConfig.event`` and its ε comes from the
same accountants (:class:`ldp_core.fl.dpsgd_accounting.StepAccountant`: PLD, RDP second).

Only the module's *trainable* parameters (``requires_grad``) are clipped,
noised and updated: with a frozen backbone and low-rank adapters
(:func:`add_lora`, Hu et al., "LoRA", ICLR 2022) the clipping norm and the
noise cover the adapters alone. The frozen parameters are public (they do not
depend on the private data), so the mechanism's sensitivity argument is
unchanged: adding or removing one example moves the clipped sum of the
trainable gradients by at most C.

Two ways to the clipped sum Σ_i min(1, C/‖∇ℓ_i‖)·∇ℓ_i:

* ``"vmap"``: per-sample gradients by ``torch.func.vmap(torch.func.grad(ℓ))``
  (:func:`per_sample_grads`), an (n, P) tensor in memory, for any module.
* ``"ghost"``: ghost clipping (Goodfellow 2015; Li, Tramèr, Liang, Hashimoto,
  ICLR 2022) for modules whose trainable parameters all belong to
  ``nn.Linear`` layers (each called once per forward). One backward gives
  each layer's input a_i and output gradient g_i = ∂ℓ_i/∂z_i; for 2-D inputs
  ‖∂ℓ_i/∂W‖²_F = ‖a_i‖²·‖g_i‖² and ‖∂ℓ_i/∂b‖² = ‖g_i‖², for sequence inputs
  (n, T, ·) ‖Σ_t g_it a_itᵀ‖²_F = Σ_{t,s} (a_it·a_is)(g_it·g_is) and
  ‖Σ_t g_it‖² (:func:`ghost_norms`). A second backward of Σ_i s_i ℓ_i with
  s_i = min(1, C/‖∇ℓ_i‖) then gives the clipped sum at the cost of one
  ordinary gradient; no per-example gradient is ever formed.

Per-example losses are the adapter's (binary or multiclass cross-entropy)
without the L2 penalty and without the 1/n. Randomness: ``sample_rng`` draws
the batches and ``noise_rng`` the noise, both numpy generators; torch's global
generator is never used.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from client_sdk.fl.torch_adapter import TorchModel, _torch
from ldp_core.fl.dpsgd import DPSGDConfig, dpsgd_loop, dpsgd_step_on
from ldp_core.fl.errors import ModelError

__all__ = [
    "Method",
    "trainable_parameters",
    "per_example_losses",
    "per_sample_grads",
    "ghost_norms",
    "clipped_grad_sum",
    "TorchModuleBackend",
    "torch_dpsgd_step",
    "train_torch_dpsgd",
    "lora_linear",
    "add_lora",
]

Method = Literal["ghost", "vmap"]


def trainable_parameters(model: TorchModel) -> list[tuple[str, Any]]:
    """(name, parameter) of every parameter with ``requires_grad``, in registration order."""
    out = [(n, p) for n, p in model.module.named_parameters() if p.requires_grad]
    if not out:
        raise ModelError("the module has no trainable parameters (every parameter has requires_grad=False)")
    return out


def _per_example_loss(model: TorchModel, z: Any, y: Any) -> Any:
    F = model._torch.nn.functional
    if model.task == "binary":
        if not (z.dim() == 1 or (z.dim() == 2 and z.shape[1] == 1)):
            raise ModelError(f"a binary model must output one logit per row, got shape {tuple(z.shape)}")
        return F.binary_cross_entropy_with_logits(z.reshape(-1), y.to(z.dtype), reduction="none")
    if z.dim() != 2:
        raise ModelError(f"a multiclass model must output (n, K) logits, got shape {tuple(z.shape)}")
    return F.cross_entropy(z, y, reduction="none")


def _inputs(model: TorchModel, X: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
    torch = model._torch
    ref = next(model.module.parameters())
    x = torch.as_tensor(np.asarray(X), dtype=ref.dtype)
    yv = np.asarray(y)
    if yv.shape != (x.shape[0],):
        raise ModelError(f"expected {x.shape[0]} labels, got shape {yv.shape}")
    k = 2 if model.task == "binary" else None
    if yv.size and (yv.min() < 0 or (k is not None and yv.max() >= k)):
        raise ModelError(f"labels out of range: [{yv.min()}, {yv.max()}]")
    return x, torch.as_tensor(yv, dtype=torch.int64)


def per_example_losses(model: TorchModel, X: np.ndarray, y: np.ndarray) -> Any:
    """ℓ_i for each row (a tensor of shape (n,), attached to the module's graph)."""
    x, yt = _inputs(model, X, y)
    return _per_example_loss(model, model.module(x), yt)


def per_sample_grads(model: TorchModel, X: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """{name: ∂ℓ_i/∂θ stacked over i, shape (n, *θ.shape)} for the trainable
    parameters, by ``vmap(grad(ℓ))`` over single examples (no Python loop)."""
    torch = model._torch
    x, yt = _inputs(model, X, y)
    train = {n: p.detach() for n, p in trainable_parameters(model)}
    frozen = {n: p.detach() for n, p in model.module.named_parameters() if n not in train}

    def loss_one(params: dict[str, Any], xi: Any, yi: Any) -> Any:
        z = torch.func.functional_call(model.module, {**frozen, **params}, (xi.unsqueeze(0),))
        return _per_example_loss(model, z, yi.unsqueeze(0)).sum()

    return dict(torch.func.vmap(torch.func.grad(loss_one), in_dims=(None, 0, 0))(train, x, yt))


def _linear_layers(model: TorchModel) -> list[Any]:
    """The nn.Linear layers holding trainable parameters; refuses trainable parameters elsewhere."""
    nn = model._torch.nn
    layers: list[Any] = []
    covered: set[int] = set()
    for mod in model.module.modules():
        if isinstance(mod, nn.Linear):
            own = [p for p in mod.parameters(recurse=False) if p.requires_grad]
            if own:
                layers.append(mod)
                covered.update(id(p) for p in own)
    rest = [n for n, p in trainable_parameters(model) if id(p) not in covered]
    if rest:
        raise ModelError(
            f"ghost clipping covers nn.Linear layers only; trainable parameters outside them: "
            f"{', '.join(rest[:3])} (freeze them, or use method='vmap')"
        )
    return layers


def _ghost_pass(model: TorchModel, X: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
    """(per-example losses with their graph kept, per-example gradient norms)."""
    torch = model._torch
    layers = _linear_layers(model)
    seen: dict[int, list[tuple[Any, Any]]] = {id(m): [] for m in layers}

    def hook(mod: Any, args: tuple[Any, ...], out: Any) -> None:
        seen[id(mod)].append((args[0].detach(), out))

    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        losses = per_example_losses(model, X, y)
    finally:
        for h in handles:
            h.remove()
    for m in layers:
        if len(seen[id(m)]) != 1:
            raise ModelError(
                f"ghost clipping needs each trainable nn.Linear called once per forward; one was called "
                f"{len(seen[id(m)])} times (use method='vmap')"
            )
    outs = [seen[id(m)][0][1] for m in layers]
    grads = torch.autograd.grad(losses.sum(), outs, retain_graph=True, allow_unused=True)
    sq = torch.zeros(losses.shape[0], dtype=losses.dtype)
    for m, (a, _), g in zip(layers, (seen[id(m)][0] for m in layers), grads, strict=True):
        if g is None:
            continue  # the layer does not reach the loss
        if a.dim() == 2:
            if m.weight.requires_grad:
                sq = sq + a.square().sum(1) * g.square().sum(1)
            if m.bias is not None and m.bias.requires_grad:
                sq = sq + g.square().sum(1)
        else:  # (n, ..., features): flatten the middle dimensions into one sequence axis
            a3, g3 = a.reshape(a.shape[0], -1, a.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])
            if m.weight.requires_grad:
                sq = sq + (torch.bmm(a3, a3.transpose(1, 2)) * torch.bmm(g3, g3.transpose(1, 2))).sum((1, 2))
            if m.bias is not None and m.bias.requires_grad:
                sq = sq + g3.sum(1).square().sum(1)
    return losses, sq.clamp_min(0).sqrt()


def ghost_norms(model: TorchModel, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """‖∇ℓ_i‖₂ over the trainable parameters, per example, by the ghost norm
    (see the module docstring), without per-example gradients."""
    _, norms = _ghost_pass(model, X, y)
    return np.asarray(norms.detach().numpy(), dtype=np.float64)


def _scales(torch: Any, norms: Any, clip_norm: float) -> Any:
    return torch.clamp(clip_norm / norms.clamp_min(torch.finfo(norms.dtype).tiny), max=1.0)


def clipped_grad_sum(
    model: TorchModel, X: np.ndarray, y: np.ndarray, clip_norm: float, method: Method = "ghost"
) -> tuple[list[Any], np.ndarray]:
    """(Σ_i min(1, C/‖∇ℓ_i‖)·∇ℓ_i, one tensor per trainable parameter; the norms)."""
    if not (isinstance(clip_norm, (int, float)) and clip_norm > 0 and math.isfinite(clip_norm)):
        raise ModelError(f"clip_norm must be a finite number > 0, got {clip_norm!r}")
    torch = model._torch
    params = [p for _, p in trainable_parameters(model)]
    if method == "ghost":
        losses, norms = _ghost_pass(model, X, y)
        s = _scales(torch, norms.detach(), float(clip_norm))
        total = torch.autograd.grad((s * losses).sum(), params, allow_unused=True)
        out = [torch.zeros_like(p) if g is None else g for p, g in zip(params, total, strict=True)]
        return out, np.asarray(norms.detach().numpy(), dtype=np.float64)
    if method == "vmap":
        grads = per_sample_grads(model, X, y)
        names = [n for n, _ in trainable_parameters(model)]
        n = grads[names[0]].shape[0]
        norms = torch.sqrt(sum(grads[k].reshape(n, -1).square().sum(1) for k in names))
        s = _scales(torch, norms, float(clip_norm))
        out = [torch.einsum("n,n...->...", s, grads[k]) for k in names]
        return out, np.asarray(norms.numpy(), dtype=np.float64)
    raise ModelError(f"method must be 'ghost' or 'vmap', got {method!r}")


class TorchModuleBackend:
    """The DP-SGD loop's backend (:class:`ldp_core.fl.dpsgd.DPSGDBackend`) for the trainable parameters of
    ``model``, updated in place: the loop's ``params`` is not used (None) and the module holds the state.
    Sums and gradients are lists of tensors, one per trainable parameter in registration order, in the
    parameters' dtype; the loop's flat noise draw is cut into them in that order."""

    def __init__(self, model: TorchModel, method: Method = "ghost") -> None:
        self.model = model
        self.method: Method = method
        self.named = trainable_parameters(model)

    @property
    def noise_size(self) -> int:
        return sum(int(p.numel()) for _, p in self.named)

    def clipped_sum(self, params: None, X: np.ndarray, y: np.ndarray, clip_norm: float) -> list[Any]:
        return clipped_grad_sum(self.model, X, y, clip_norm, self.method)[0]

    def zero_sum(self, params: None) -> list[Any]:
        return [self.model._torch.zeros_like(p) for _, p in self.named]

    def noised_mean(self, total: list[Any], noise: np.ndarray, expected_batch: float) -> list[Any]:
        torch = self.model._torch
        out, at = [], 0
        with torch.no_grad():
            for (_, p), s in zip(self.named, total, strict=True):
                k = int(p.numel())
                z = torch.as_tensor(noise[at : at + k].reshape(tuple(p.shape)), dtype=p.dtype)
                out.append((s + z) / expected_batch)
                at += k
        return out

    def step(self, params: None, g: list[Any], learning_rate: float) -> None:
        """θ ← θ − η·(g + l2·θ on the weights), in place."""
        l2 = self.model.l2
        with self.model._torch.no_grad():
            for (name, p), gp in zip(self.named, g, strict=True):
                if l2 and name.endswith("weight"):
                    gp = gp + l2 * p
                p.sub_(learning_rate * gp)


def torch_dpsgd_step(
    model: TorchModel,
    X: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    method: Method = "ghost",
    expected_batch: float | None = None,
) -> int:
    """One DP-SGD step on the module's trainable parameters, in place; returns the
    Poisson batch's size. Noise N(0, σ²C²) per coordinate from ``noise_rng``, the
    sum divided by ``expected_batch`` (default qN, N = len(X), taken as public).
    The step is :func:`ldp_core.fl.dpsgd.dpsgd_step_on` through a :class:`TorchModuleBackend`."""
    _, size = dpsgd_step_on(
        TorchModuleBackend(model, method), None, X, y, config, sample_rng, noise_rng, expected_batch
    )
    return size


def train_torch_dpsgd(
    model: TorchModel,
    X: np.ndarray,
    y: np.ndarray,
    config: DPSGDConfig,
    steps: int,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
    method: Method = "ghost",
    on_step: Callable[[int], None] | None = None,
) -> None:
    """``steps`` DP-SGD steps (:func:`ldp_core.fl.dpsgd.dpsgd_loop`) on the module's trainable parameters,
    in place; ``on_step(t)`` after each (t from 1). Read the result with ``model.current_params()`` or from
    the module."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ModelError(f"steps must be an integer >= 0, got {steps!r}")
    if steps == 0:
        return
    each = None if on_step is None else (lambda t, _: on_step(t))
    dpsgd_loop(TorchModuleBackend(model, method), None, X, y, config, steps, sample_rng, noise_rng, each)


@functools.cache
def _lora_class() -> Any:
    torch = _torch()
    nn = torch.nn

    class LoRALinear(nn.Module):  # type: ignore[misc,name-defined]
        """base(x) + (α/r)·B(A(x)) with ``base`` frozen; A: in → r, B: r → out, both
        bias-free ``nn.Linear`` (so ghost clipping covers them)."""

        def __init__(self, base: Any, rank: int, alpha: float) -> None:
            super().__init__()
            self.base = base
            self.lora_a = nn.Linear(base.in_features, rank, bias=False, dtype=base.weight.dtype)
            self.lora_b = nn.Linear(rank, base.out_features, bias=False, dtype=base.weight.dtype)
            self.scale = float(alpha) / rank
            for p in base.parameters():
                p.requires_grad_(False)

        def forward(self, x: Any) -> Any:
            return self.base(x) + self.scale * self.lora_b(self.lora_a(x))

    return LoRALinear


def lora_linear(base: Any, rank: int, rng: np.random.Generator, alpha: float | None = None) -> Any:
    """Wrap the ``nn.Linear`` ``base`` (frozen) with a rank-``rank`` adapter. A is drawn
    N(0, 1/in) from ``rng`` and B starts at zero, so the wrapped layer starts equal
    to ``base`` (Hu et al. 2022, §4.1); α defaults to the rank (scale 1)."""
    torch = _torch()
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ModelError(f"rank must be a positive integer, got {rank!r}")
    layer = _lora_class()(base, rank, float(rank if alpha is None else alpha))
    with torch.no_grad():
        a = rng.normal(0.0, 1.0 / math.sqrt(base.in_features), size=(rank, base.in_features))
        layer.lora_a.weight.copy_(torch.as_tensor(a, dtype=base.weight.dtype))
        layer.lora_b.weight.zero_()
    return layer


def add_lora(module: Any, rank: int, rng: np.random.Generator, alpha: float | None = None) -> Any:
    """Freeze every parameter of ``module`` and replace each ``nn.Linear`` inside it
    by :func:`lora_linear` (in place; returns ``module``). Only the adapters train."""
    torch = _torch()
    for p in module.parameters():
        p.requires_grad_(False)
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, lora_linear(child, rank, rng, alpha))
        else:
            add_lora(child, rank, rng, alpha)
    return module
