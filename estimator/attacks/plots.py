"""The plots of ``ldp attack ... --plot FILE`` (matplotlib, Agg), one per study."""

from __future__ import annotations

from typing import Any

__all__ = ["plot_attack"]


def _sigma_label(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        eps = r.get("printed_epsilon", r.get("epsilon"))
        out.append("no DP" if r["noise_multiplier"] == 0 else f"σ={r['noise_multiplier']:g}\nε={eps:.3g}")
    return out


def plot_attack(kind: str, result: dict[str, Any], path: str) -> None:
    """Draw ``result`` (from :mod:`estimator.attacks.runs`) of study ``kind`` to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if kind in ("mia", "lira"):
        labels = _sigma_label(rows)
        x = np.arange(len(rows))
        names = result["scores"]
        width = 0.8 / (len(names) + 1)
        for i, name in enumerate(names):
            ax.bar(
                x + i * width,
                [r["attacks"][name]["epsilon_lower_bound"] for r in rows],
                width,
                label=f"{name} ε lower bound",
            )
        printed = [r["printed_epsilon"] if r["printed_epsilon"] is not None else np.nan for r in rows]
        ax.bar(x + len(names) * width, printed, width, color="black", alpha=0.3, label="printed ε (accountant)")
        ax.set_xticks(x + 0.4 - width / 2, labels)
        ax.set_ylabel(f"ε (δ = {result['study']['delta']:g})")
        ax.set_title("membership inference: the attack's ε lower bound beside the printed ε")
        ax.legend(fontsize=8)
    elif kind == "inversion":
        eps = [r["printed_epsilon"] for r in rows]
        ax.plot(
            range(len(rows)), [r["mean_cosine_to_class_mean"] for r in rows], marker="o", label="cosine to class mean"
        )
        ax.plot(range(len(rows)), [r["train_accuracy"] for r in rows], marker=".", ls="--", label="training accuracy")
        ax.set_xticks(range(len(rows)), _sigma_label([{**r, "printed_epsilon": e} for r, e in zip(rows, eps)]))
        ax.set_ylim(0, 1.05)
        ax.set_title("model inversion of a softmax classifier")
        ax.legend(fontsize=8)
    elif kind == "dlg":
        labels = [
            r["defence"]
            + (f"\nσ={r['noise_multiplier']:g}" if r["defence"] == "noise" else "")
            + (f"\nk={r['clients']}" if r["defence"] == "secagg" else "")
            for r in rows
        ]
        x = np.arange(len(rows))
        if rows and rows[0]["analytic_error"] is not None:
            ax.bar(x - 0.2, [r["analytic_error"] for r in rows], 0.4, label="analytic (first layer)")
        if rows and rows[0]["dlg_error"] is not None:
            ax.bar(x + 0.2, [r["dlg_error"] for r in rows], 0.4, label="DLG (cosine, L-BFGS)")
        ax.axhline(1.0, color="grey", ls=":", label="error of guessing zeros")
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("relative reconstruction error")
        ax.set_title(f"gradient inversion of one client's input: {result['model']}")
        ax.legend(fontsize=8)
    elif kind == "groups":
        x = np.arange(len(rows))
        ax.bar(x - 0.27, [r["drop"]["majority"] for r in rows], 0.27, label="majority classes (DP-SGD)")
        ax.bar(x, [r["drop"]["minority"] for r in rows], 0.27, label="minority class (DP-SGD)")
        ax.bar(x + 0.27, [r["drop_clip_only"]["minority"] for r in rows], 0.27, label="minority class (clipping alone)")
        ax.set_xticks(x, [f"σ={r['noise_multiplier']:g}\nε={r['epsilon']:.3g}" for r in rows])
        ax.set_ylabel("accuracy lost against SGD without DP")
        ax.set_title("DP-SGD's accuracy per group")
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
