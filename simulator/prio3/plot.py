"""The ``ldp demo --prio3`` plot: per metric, the error of each release against the truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_prio3"]


def plot_prio3(doc: dict[str, Any], path: Path) -> Path:
    """Bars per metric: Prio3's error (0: exact), the LDP estimate's error, and with central noise its error,
    each as a fraction of the truth's total (so metrics of different scales share one axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["metrics"]
    names = [r["metric"].removeprefix("prio3.") for r in rows]

    def err(r: dict[str, Any], est: Any) -> float:
        truth = np.atleast_1d(np.asarray(r["truth"], dtype=np.float64))
        return float(np.abs(np.atleast_1d(np.asarray(est, dtype=np.float64)) - truth).sum() / max(truth.sum(), 1.0))

    series = {
        "Prio3 (two aggregators)": [err(r, r["prio3"]) for r in rows],
        f"local DP (ε={rows[0]['ldp']['epsilon']:g})": [err(r, r["ldp"]["estimate"]) for r in rows],
    }
    if "central" in rows[0]:
        series[f"Prio3 + central DP (ε={rows[0]['central']['epsilon']:g})"] = [
            err(r, r["central"]["value"]) for r in rows
        ]
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(rows))
    w = 0.8 / len(series)
    for i, (label, ys) in enumerate(series.items()):
        ax.bar(x + i * w, ys, w, label=label)
    ax.set_xticks(x + w * (len(series) - 1) / 2, names)
    ax.set_ylabel("L1 error / total of the truth")
    ax.set_title(f"{doc['devices']} devices: exact Prio3 aggregates vs local DP estimates")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
