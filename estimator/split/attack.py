"""Activation inversion: a curious server learns to map smashed data back to inputs.

The server holds auxiliary inputs from the client's distribution and gets their cut-layer activations
through the same release path the client uses (the threat model of He et al. 2019's query-access
attacker: a colluding client with the same bottom half, or a client that answers queries); it fits an
inverse model, activations → inputs (scikit-learn's ridge regression or multi-layer perceptron,
whichever predicts its held-out auxiliary pairs best; the ``ml`` extra), and applies it to the activations the client sent. The reconstruction error is measured
against the client's true inputs by the mean squared error and a global SSIM per image, and against
the error of guessing the auxiliary mean image, which knows nothing about the client's example.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["fit_inverse", "reconstruction_errors", "ssim_global"]


def fit_inverse(
    aux_smashed: np.ndarray, aux_x: np.ndarray, seed: int, mlp: bool = True, hidden: int = 128, max_iter: int = 300
) -> Any:
    """The inverse model, activations → inputs, that the attacker trusts most: it holds out a fifth of
    its auxiliary pairs, fits candidates on the rest (ridge regressions at several penalties and a
    multi-layer perceptron unless ``mlp`` is off), keeps the one with the least held-out error and refits it on all pairs.
    ``.predict(smashed)`` reconstructs; ``.name`` says which model won."""
    import warnings

    from sklearn.base import clone
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import Ridge
    from sklearn.neural_network import MLPRegressor

    a = np.asarray(aux_smashed, dtype=np.float64)
    x = np.asarray(aux_x, dtype=np.float64)
    order = np.random.default_rng([seed, 19]).permutation(len(a))
    cut = len(a) // 5
    val, fit = order[:cut], order[cut:]
    candidates: dict[str, Any] = {f"ridge(alpha={al:g})": Ridge(alpha=al) for al in (0.1, 1.0, 10.0, 100.0)}
    if mlp:
        candidates["mlp"] = MLPRegressor(hidden_layer_sizes=(hidden,), alpha=1e-2, max_iter=max_iter, random_state=seed)
    best, best_err = "", np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for name, est in candidates.items():
            err = float(np.mean((clone(est).fit(a[fit], x[fit]).predict(a[val]) - x[val]) ** 2))
            if err < best_err:
                best, best_err = name, err
        model = clone(candidates[best]).fit(a, x)
    model.name = best
    return model


def ssim_global(x: np.ndarray, y: np.ndarray, data_range: float = 1.0) -> np.ndarray:
    """Each row pair's SSIM computed over the whole image (one window), Wang et al. 2004's formula with
    c1 = (0.01·L)², c2 = (0.03·L)²."""
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mx, my = x.mean(axis=1), y.mean(axis=1)
    vx, vy = x.var(axis=1), y.var(axis=1)
    cov = ((x - mx[:, None]) * (y - my[:, None])).mean(axis=1)
    return ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))


def reconstruction_errors(true_x: np.ndarray, recon: np.ndarray, aux_x: np.ndarray) -> dict[str, float]:
    """MSE and mean global SSIM of the reconstructions, and of the auxiliary mean image (the baseline)."""
    recon = np.clip(recon, 0.0, 1.0)
    base = np.broadcast_to(aux_x.mean(axis=0), true_x.shape)
    return {
        "mse": float(np.mean((recon - true_x) ** 2)),
        "ssim": float(np.mean(ssim_global(true_x, recon))),
        "mse_baseline": float(np.mean((base - true_x) ** 2)),
        "ssim_baseline": float(np.mean(ssim_global(true_x, np.array(base)))),
    }
