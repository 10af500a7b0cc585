"""DLG against a small CNN's shared gradient, in PyTorch (the ``torch`` extra; tests in ``tests_torch/``).

The numpy MLP of :mod:`estimator.attacks.gradients` has a dense first layer, which gives its input
away in closed form. A convolutional first layer does not (its weight gradient sums x's patches), so
here the attack is the optimisation of DLG (Zhu, Liu, Han 2019) alone: the label from the last
layer's bias gradient (iDLG), then a dummy image x' optimised by L-BFGS so that its gradient matches
the shared one in cosine distance (Geiping et al. 2020). The network is small and smooth (sigmoid
activations, as in the DLG paper: a ReLU network's second derivatives vanish, which the optimiser
needs): two 3×3 convolutions on 1×8×8 inputs and a dense layer to K classes. The defences are those
of :mod:`estimator.attacks.gradients` (``none``, ``clip``, ``noise``, ``secagg``), the error the same
(‖x̂ − x‖/‖x‖ to the nearest client's image). Everything runs in float64 on the CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from estimator.attacks.gradients import DEFENCES
from estimator.errors import DatasetError

__all__ = ["small_cnn", "cnn_dlg_case"]

SIDE = 8


def small_cnn(n_classes: int, seed: int) -> Any:
    """The CNN (float64), its weights from ``seed``."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(1, 6, 3, padding=1),
        nn.Sigmoid(),
        nn.Conv2d(6, 6, 3, padding=1, stride=2),
        nn.Sigmoid(),
        nn.Flatten(),
        nn.Linear(6 * (SIDE // 2) ** 2, n_classes),
    )
    return net.double()


def _grad(net: Any, x: Any, y: Any, create_graph: bool = False) -> Any:
    import torch

    loss = torch.nn.functional.cross_entropy(net(x), y)
    gs = torch.autograd.grad(loss, list(net.parameters()), create_graph=create_graph)
    return torch.cat([g.reshape(-1) for g in gs])


def _shared(net: Any, X: Any, y: Any, defence: str, clip_norm: float, sigma: float, rng: np.random.Generator) -> Any:
    import torch

    def clipped(i: int) -> Any:
        g = _grad(net, X[i : i + 1], y[i : i + 1]).detach()
        n = float(g.norm())
        return g if n <= clip_norm else g * (clip_norm / n)

    if defence == "none":
        return _grad(net, X[:1], y[:1]).detach()
    if defence == "secagg":
        return sum(clipped(i) for i in range(len(X)))
    g = clipped(0)
    if defence == "noise":
        g = g + torch.from_numpy(rng.normal(0.0, sigma * clip_norm, size=g.shape[0]))
    return g


def cnn_dlg_case(
    images: np.ndarray,
    labels: np.ndarray,
    defence: str,
    rng: np.random.Generator,
    n_classes: int = 10,
    clip_norm: float = 1.0,
    noise_multiplier: float = 0.0,
    iterations: int = 60,
    seed: int = 0,
    bound: float = 10.0,
) -> dict[str, Any]:
    """One case of the CNN attack: ``images`` (n × 8 × 8; row 0 the target, all rows the SecAgg clients).
    The dummy image is kept in [−bound, bound] (the attacker knows the pixels' range)."""
    import torch

    if defence not in DEFENCES:
        raise DatasetError(f"defence must be one of {', '.join(DEFENCES)}, got {defence!r}")
    net = small_cnn(n_classes, seed)
    X = torch.from_numpy(np.asarray(images, dtype=np.float64).reshape(-1, 1, SIDE, SIDE))
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    target = _shared(net, X, y, defence, clip_norm, noise_multiplier, rng)
    bias_grad = target[-n_classes:]
    label = int(torch.argmin(bias_grad))
    dummy = torch.from_numpy(rng.normal(size=(1, 1, SIDE, SIDE))).requires_grad_(True)
    opt = torch.optim.LBFGS([dummy], lr=1.0, max_iter=20, history_size=20, line_search_fn="strong_wolfe")
    tn = target.norm()
    yl = torch.tensor([label])

    def closure() -> Any:
        opt.zero_grad()
        g = _grad(net, dummy, yl, create_graph=True)
        loss = 1.0 - (g @ target) / (g.norm() * tn + 1e-30)
        loss.backward()
        return loss

    best_x, best_loss = dummy.detach().clone(), float(closure().detach())
    for _ in range(max(1, iterations // 20)):
        opt.step(closure)
        with torch.no_grad():
            if not bool(torch.isfinite(dummy).all()):  # a line search that diverged: go back to the best point
                dummy.copy_(best_x)
                break
            dummy.clamp_(-bound, bound)
        loss = float(closure().detach())
        if loss < best_loss:
            best_x, best_loss = dummy.detach().clone(), loss
    xhat = best_x.numpy().reshape(-1)
    pool = np.asarray(images, dtype=np.float64).reshape(len(images), -1)
    pool = pool if defence == "secagg" else pool[:1]
    errs = np.linalg.norm(pool - xhat, axis=1) / np.linalg.norm(pool, axis=1)
    return {
        "defence": defence,
        "clients": len(images) if defence == "secagg" else 1,
        "noise_multiplier": noise_multiplier if defence == "noise" else 0.0,
        "label_recovered": label in set(int(c) for c in (labels if defence == "secagg" else labels[:1])),
        "dlg_error": float(errs.min()),
        "final_cosine_distance": best_loss,
    }
