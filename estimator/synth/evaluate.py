"""What a synthetic table is worth, and what it gives away.

Fidelity: the mean total-variation distance between the synthetic and the real table's normalised k-way
marginals over every set of k columns (k = 1, 2, 3), and a downstream model (softmax regression on the
other columns' one-hot codes, :class:`ldp_core.fl.models.SoftmaxRegression`) trained on the synthetic table
and tested on real records held out from every generator.

Memorisation: each synthetic record's Hamming distance to the closest training record (DCR), summarised as
the share at distance 0 (exact copies) beside the same share for the held-out real records, which were
never seen (a generator that copies scores above that reference); and how many of the planted rare records
(value combinations found nowhere else, :func:`~estimator.synth.data.plant_rare`) reappear exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from estimator.synth.data import SynthError, Table, marginal

__all__ = ["marginal_errors", "downstream_accuracy", "dcr", "planted_found", "evaluate", "plot"]


def marginal_errors(real: Table, synth: Table, ways: Sequence[int] = (1, 2, 3)) -> dict[str, float]:
    """``{"tv_1way": ..., ...}``: the mean TV distance over every k-way marginal."""
    out = {}
    for k in ways:
        tvs = []
        for c in itertools.combinations(range(len(real.columns)), k):
            x, y = marginal(real, c), marginal(synth, c)
            tvs.append(0.5 * float(np.abs(x / max(x.sum(), 1) - y / max(y.sum(), 1)).sum()))
        out[f"tv_{k}way"] = float(np.mean(tvs)) if tvs else 0.0
    return out


def downstream_accuracy(train: Table, test: Table, target: str, *, l2: float = 1e-3) -> float:
    """Accuracy on ``test`` of a softmax regression predicting ``target`` from the other columns, fitted
    on ``train`` by L-BFGS (scipy)."""
    from scipy.optimize import minimize

    from ldp_core.fl.models import SoftmaxRegression

    if target not in train.columns:
        raise SynthError(f"no column {target!r}")
    j = train.columns.index(target)
    X, y = train.one_hot(exclude=(target,)), train.codes[:, j]
    k = train.shape[j]
    model = SoftmaxRegression(X.shape[1], k, l2=l2)
    p0 = model.init_params(np.random.default_rng(0)).astype(np.float64)

    def f(p: np.ndarray) -> tuple[float, np.ndarray]:
        loss, g = model.loss_and_grad(p.astype(np.float32), X, y)
        return float(loss) / len(y), np.asarray(g, dtype=np.float64) / len(y)

    res = minimize(f, p0, jac=True, method="L-BFGS-B", options={"maxiter": 200})
    pred = model.predict(res.x.astype(np.float32), test.one_hot(exclude=(target,)))
    return float(np.mean(pred == test.codes[:, j]))


def dcr(synth: Table, real: Table, chunk: int = 512) -> np.ndarray:
    """Each synthetic record's Hamming distance to the closest record of ``real`` (distinct records compared)."""
    ref = np.unique(real.codes, axis=0)
    out = np.empty(synth.rows, dtype=np.int64)
    for i in range(0, synth.rows, chunk):
        block = synth.codes[i : i + chunk]
        out[i : i + chunk] = (block[:, None, :] != ref[None, :, :]).sum(axis=2).min(axis=1)
    return out


def planted_found(synth: Table, planted: np.ndarray) -> int:
    """How many planted records appear (exactly) in ``synth``."""
    rows = {tuple(r) for r in synth.codes.tolist()}
    return int(sum(tuple(int(v) for v in p) in rows for p in planted))


def evaluate(synth: Table, train: Table, holdout: Table, planted: np.ndarray, target: str) -> dict[str, Any]:
    """Every figure above for one synthetic table."""
    d = dcr(synth, train)
    out: dict[str, Any] = dict(marginal_errors(holdout, synth))
    out["accuracy_synthetic_to_real"] = downstream_accuracy(synth, holdout, target)
    out["exact_copy_share"] = float(np.mean(d == 0))
    out["dcr_mean"] = float(np.mean(d))
    out["planted_found"] = planted_found(synth, planted)
    out["planted"] = int(len(planted))
    return out


def reference(train: Table, holdout: Table, target: str) -> dict[str, Any]:
    """The figures of real data: the training table itself against the held-out one (marginal error =
    sampling error; accuracy = trained on real), and the held-out records' DCR to the training ones (the
    exact-copy share a generator that never copies still shows, by chance)."""
    d = dcr(holdout, train)
    out: dict[str, Any] = dict(marginal_errors(holdout, train))
    out["accuracy_real_to_real"] = downstream_accuracy(train, holdout, target)
    out["holdout_exact_copy_share"] = float(np.mean(d == 0))
    out["holdout_dcr_mean"] = float(np.mean(d))
    return out


def plot(rows: list[dict[str, Any]], ref: dict[str, Any], path: str) -> None:
    """Three panels: k-way marginal error, downstream accuracy and exact-copy share per generator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["generator"] for r in rows]
    x = np.arange(len(names))
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.5))
    for i, k in enumerate((1, 2, 3)):
        ax[0].bar(x + (i - 1) * 0.27, [r[f"tv_{k}way"] for r in rows], 0.27, label=f"{k}-way")
    ax[0].axhline(ref["tv_2way"], color="k", ls=":", lw=1, label="real vs real, 2-way")
    ax[0].set_title("marginal error (mean total variation)")
    ax[1].bar(x, [r["accuracy_synthetic_to_real"] for r in rows], color="tab:green")
    ax[1].axhline(ref["accuracy_real_to_real"], color="k", ls=":", lw=1, label="trained on real")
    ax[1].set_title("downstream accuracy (train synthetic, test real)")
    ax[2].bar(x, [r["exact_copy_share"] for r in rows], color="tab:red")
    ax[2].axhline(ref["holdout_exact_copy_share"], color="k", ls=":", lw=1, label="unseen real records")
    ax[2].set_title("share of synthetic records that copy a training record")
    for a in ax:
        a.set_xticks(x, names, rotation=30, ha="right")
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
