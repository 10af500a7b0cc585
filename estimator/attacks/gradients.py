"""Gradient inversion: one client's input from the gradient it shares (an MLP, numpy).

In federated learning a client sends ∇θ L(x, y) (or a model delta made of a few of them). For a dense
first layer z = x·W1 + b1 and one example, ∂L/∂W1 = x ⊗ ∂L/∂b1: every column of the first layer's
weight gradient is the input times one number, so x = ∂L/∂W1 · g_b / ‖g_b‖² (g_b = ∂L/∂b1) exactly: the
*analytic* recovery (Phong et al. 2017; Geiping et al. 2020, Prop. D.1). The label comes first from the
last layer's bias gradient p − onehot(y), negative only at the true label (iDLG, Zhao et al. 2020).
*DLG* (Zhu, Liu, Han 2019) needs no such structure: it searches for the x' whose gradient matches the
shared one, here by L-BFGS on 1 − cos(∇θ L(x', ŷ), g) (the cosine distance of Geiping et al., which
clipping's rescaling does not change), from a random start.

The defences measured (:data:`DEFENCES`), each applied to what the server receives:

* ``none``: the raw gradient of one example;
* ``clip``: scaled to norm ≤ C (DP-SGD's clipping without noise): a rescaled gradient still has
  x ⊗ g_b in it, so clipping alone hides nothing;
* ``noise``: clipped, plus N(0, σ²C²·I) (one client's DP-SGD step or a locally noised update);
* ``secagg``: the server sees only the sum of k clients' clipped gradients (SecAgg, no noise): the
  least-squares recovery returns a weighted mix of the k inputs, and DLG a point among them; but with
  ReLU a hidden unit that fired for one client only still gives that client's input exactly.

The error is ‖x̂ − x‖/‖x‖ against the nearest client's input (the attack wins when it recovers any
contributor; with one client that is the target). ``clients_exposed`` counts the clients whose input
one hidden unit's ratio ∂L/∂W1[:, j]/∂L/∂b1[j] gives to within 1 % (:func:`per_unit_recovery`): with
tanh every unit mixes every client, with ReLU a unit that fired for one client isolates it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from estimator.errors import DatasetError
from ldp_core.fl.models import MLP

__all__ = ["DEFENCES", "client_gradient", "shared_gradient", "recover_label", "analytic_recovery", "dlg", "dlg_case"]

DEFENCES: tuple[str, ...] = ("none", "clip", "noise", "secagg")


def _plain(model: MLP) -> MLP:
    return model if model.l2 == 0 else MLP(model.n_features, model.hidden, model.n_classes, model.activation)


def client_gradient(model: MLP, params: np.ndarray, x: np.ndarray, y: int) -> np.ndarray:
    """∇θ of one example's cross-entropy (float64; the model's L2 penalty excluded)."""
    p, xr = np.asarray(params, dtype=np.float64), np.asarray(x, dtype=np.float64)[None, :]
    _, g = _plain(model).loss_and_grad(p, xr, np.array([y]))
    return g


def _clip(g: np.ndarray, clip_norm: float) -> np.ndarray:
    n = float(np.linalg.norm(g))
    return g if n <= clip_norm else g * (clip_norm / n)


def shared_gradient(
    model: MLP,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    defence: str,
    rng: np.random.Generator,
    clip_norm: float = 1.0,
    noise_multiplier: float = 0.0,
) -> np.ndarray:
    """What the server sees of the clients' rows (X, y), one row per client (row 0 the target): row 0's
    gradient for ``none``/``clip``/``noise``, the sum of every row's clipped gradient for ``secagg``."""
    if defence not in DEFENCES:
        raise DatasetError(f"defence must be one of {', '.join(DEFENCES)}, got {defence!r}")
    if defence == "secagg":
        return np.sum([_clip(client_gradient(model, params, x, int(c)), clip_norm) for x, c in zip(X, y)], axis=0)
    g = client_gradient(model, params, X[0], int(y[0]))
    if defence == "none":
        return g
    g = _clip(g, clip_norm)
    if defence == "noise":
        g = g + rng.normal(0.0, noise_multiplier * clip_norm, size=g.shape)
    return g


def _split(model: MLP, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    d, h, k = model.n_features, model.hidden, model.n_classes
    i1, i2, i3 = d * h, d * h + h, d * h + h + h * k
    return g[:i1].reshape(d, h), g[i1:i2], g[i2:i3].reshape(h, k), g[i3:]


def recover_label(model: MLP, g: np.ndarray) -> int:
    """iDLG: the class whose output-bias gradient p_c − 1[c = y] is the most negative."""
    return int(np.argmin(_split(model, g)[3]))


def analytic_recovery(model: MLP, g: np.ndarray) -> np.ndarray:
    """The least-squares x of ∂L/∂W1 ≈ x ⊗ ∂L/∂b1: exact for one example's gradient, however rescaled."""
    gW1, gb1, _, _ = _split(model, g)
    den = float(gb1 @ gb1)
    return np.zeros(model.n_features) if den == 0 else gW1 @ gb1 / den


def per_unit_recovery(model: MLP, g: np.ndarray, rel_tol: float = 1e-9) -> np.ndarray:
    """One candidate input per hidden unit j whose bias gradient is not ~0: ∂L/∂W1[:, j] / ∂L/∂b1[j].

    For one example every candidate is x. For a sum over clients, unit j's candidate is the mix of the
    inputs of the clients for which j had a non-zero gradient, weighted by their ∂L/∂b1[j]; with ReLU a
    unit that fired for one client only gives that client's input exactly, and such exact candidates
    repeat across units, which lets the server pick them out (Fowl et al. 2022, "Robbing the fed")."""
    gW1, gb1, _, _ = _split(model, g)
    keep = np.abs(gb1) > rel_tol * max(float(np.abs(gb1).max()), 1e-300)
    return (gW1[:, keep] / gb1[keep]).T


def _exposed(candidates: np.ndarray, X: np.ndarray, tol: float = 0.01) -> int:
    """How many rows of X some candidate matches within relative error ``tol``."""
    if len(candidates) == 0:
        return 0
    err = np.linalg.norm(candidates[:, None, :] - X[None, :, :], axis=2) / np.linalg.norm(X, axis=1)[None, :]
    return int((err.min(axis=0) < tol).sum())


def dlg(
    model: MLP,
    params: np.ndarray,
    g: np.ndarray,
    label: int,
    rng: np.random.Generator,
    bound: float = 10.0,
    max_iter: int = 100,
) -> np.ndarray:
    """DLG with the cosine distance: the x' in the box [−bound, bound]^d (the attacker knows the inputs'
    range), from a N(0, I) start, minimising 1 − cos(∇θ L(x', label), g), by L-BFGS-B. The objective's
    gradient is by central differences, all 2d + 1 points in one batched per-example-gradient call
    (:func:`ldp_core.fl.per_example.per_example_grads`)."""
    from scipy.optimize import minimize

    from ldp_core.fl.per_example import per_example_grads

    gn = float(np.linalg.norm(g))
    if gn == 0:
        return np.zeros(model.n_features)
    plain, p, d = _plain(model), np.asarray(params, dtype=np.float64), model.n_features
    h = 1e-5
    steps = np.vstack([np.zeros(d), h * np.eye(d), -h * np.eye(d)])
    labels = np.full(2 * d + 1, label)

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        G = per_example_grads(plain, p, x[None, :] + steps, labels)
        norms = np.linalg.norm(G, axis=1)
        f = 1.0 - (G @ g) / (np.maximum(norms, 1e-300) * gn)
        return float(f[0]), (f[1 : d + 1] - f[d + 1 :]) / (2 * h)

    x0 = np.clip(rng.normal(size=model.n_features), -bound, bound)
    box = [(-bound, bound)] * model.n_features
    res = minimize(objective, x0, jac=True, method="L-BFGS-B", bounds=box, options={"maxiter": max_iter})
    return np.asarray(res.x)


def _nearest_error(xhat: np.ndarray, X: np.ndarray) -> float:
    errs = np.linalg.norm(X - xhat, axis=1) / np.maximum(np.linalg.norm(X, axis=1), 1e-12)
    return float(errs.min())


def dlg_case(
    model: MLP,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    defence: str,
    rng: np.random.Generator,
    clip_norm: float = 1.0,
    noise_multiplier: float = 0.0,
    run_dlg: bool = True,
    bound: float = 10.0,
) -> dict[str, Any]:
    """One case: the shared gradient under ``defence``, then both attacks; their errors (nearest client)."""
    g = shared_gradient(model, params, X, y, defence, rng, clip_norm, noise_multiplier)
    label = recover_label(model, g)
    xa = analytic_recovery(model, g)
    out: dict[str, Any] = {
        "defence": defence,
        "clients": len(X) if defence == "secagg" else 1,
        "noise_multiplier": noise_multiplier if defence == "noise" else 0.0,
        "clip_norm": None if defence == "none" else clip_norm,
        "label_recovered": label in set(int(c) for c in (y if defence == "secagg" else y[:1])),
        "analytic_error": _nearest_error(xa, X if defence == "secagg" else X[:1]),
        "clients_exposed": _exposed(per_unit_recovery(model, g), X if defence == "secagg" else X[:1]),
        "dlg_error": None,
    }
    if run_dlg:
        out["dlg_error"] = _nearest_error(dlg(model, params, g, label, rng, bound), X if defence == "secagg" else X[:1])
    return out
