"""The demo's ``demo.png``: each metric's estimates against the truth (the pipeline run), or each frequency
oracle's (``--offline``). Matplotlib (server extra), drawn off-screen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.text import printable
from simulator.run import SimulationResult

__all__ = ["plot_pipeline", "plot_offline", "label"]


def label(metrics: Any, name: str, i: int, words: dict[str, dict[int, str]]) -> str:
    """Item ``i`` of metric ``name`` as the demo shows it: its simulated word if it has one, else the domain's
    label."""
    return words.get(name, {}).get(i) or metrics[name].domain.label(i)


def _plot_heavy_hitters(ax: Any, m: Any, est: dict[str, Any]) -> None:
    found = est["found"][::-1]
    truth = dict(est["true_top"])
    y = np.arange(len(found))
    e = np.array([f[1] for f in found], dtype=np.float64)
    err = np.vstack([e - [f[2] for f in found], np.array([f[3] for f in found]) - e]) if found else None
    ax.barh(y, [truth.get(f[0], 0) for f in found], color="#cfd8e3", label="truth")
    ax.errorbar(e, y, xerr=err, fmt="o", ms=3, color="#b03a2e", capsize=2, label="estimate, 95% CI")
    ax.set_yticks(y, [printable(f[0]) for f in found], fontsize=7)
    ax.set_title(f"{m.name}: {m.spec.name} ε={m.spec.epsilon:g}, discovered words, n={est['n']:,}", fontsize=10)


def _plot_numeric(ax: Any, m: Any, est: dict[str, Any], values: np.ndarray) -> None:
    if m.kind == "mean":
        ax.hist(values, bins=40, color="#cfd8e3", label="true values")
        ax.axvline(float(values.mean()), color="k", ls="--", lw=1, label=f"true mean {values.mean():.2f}")
        ax.axvspan(est["ci_low"][0], est["ci_high"][0], color="#b03a2e", alpha=0.3, label="estimate, 95% CI")
        ax.axvline(est["mean"][0], color="#b03a2e", lw=1.5)
        ax.set_xlabel("value")
    else:
        edges = np.array(est["edges"], dtype=np.float64)
        centres = (edges[:-1] + edges[1:]) / 2
        true_hist = np.histogram(np.clip(values, edges[0], edges[-1]), bins=edges)[0] / max(1, values.size)
        ax.bar(centres, true_hist, width=np.diff(edges), color="#cfd8e3", label="truth")
        ax.plot(centres, est["hist"], color="#b03a2e", drawstyle="steps-mid", label="estimate")
        ax.fill_between(centres, est["hist_low"], est["hist_high"], step="mid", color="#b03a2e", alpha=0.25)
        for q, v in est["quantiles"].items():
            ax.axvline(v["value"], color="#555", ls=":", lw=1)
            ax.annotate(q, (v["value"], max(true_hist) * 0.95), fontsize=7, ha="center")
        ax.set_xlabel("value")
    ce = est.get("central_epsilon")
    extra = f", central ε={ce:.2g}" if ce is not None else ""
    ax.set_title(f"{m.name}: {m.spec.name} ({m.kind}) ε={m.spec.epsilon:g}{extra}, n={est['n']:,}", fontsize=10)
    ax.legend(fontsize=7)


def _plot_frequency(
    ax: Any, metrics: Any, name: str, est: dict[str, Any], t: np.ndarray, words: dict[str, dict[int, str]], top: int
) -> None:
    m = metrics[name]
    counts, lo, hi = (np.array(est[k], dtype=np.float64) for k in ("counts", "ci_low", "ci_high"))
    order = np.argsort(-t, kind="stable")[:top]
    x = np.arange(order.size)
    ax.bar(x, t[order], color="#cfd8e3", label="truth")
    noise = np.asarray(est.get("could_be_noise") or [False] * len(counts), dtype=bool)[order]
    yerr = np.vstack([counts[order] - lo[order], hi[order] - counts[order]])
    for flagged, color, what in ((False, "#b03a2e", "estimate, 95% CI"), (True, "#999999", "could be noise")):
        sel = noise == flagged
        if sel.any():
            ax.errorbar(
                x[sel], counts[order][sel], yerr=yerr[:, sel], fmt="o", ms=3, color=color, capsize=2, label=what
            )
    ax.set_xticks(
        x, [printable(label(metrics, name, int(i), words)) for i in order], rotation=60, ha="right", fontsize=7
    )
    ce = est.get("central_epsilon")
    extra = f", central ε={ce:.2g}" if ce is not None else ""
    ax.set_title(f"{name}: {m.spec.name} ε={m.spec.epsilon:g}{extra}, n={est['n']:,}", fontsize=10)
    ax.axhline(0, color="#888", lw=0.5)


def plot_pipeline(
    metrics: Any,
    live: dict[str, Any],
    truth: dict[str, np.ndarray],
    words: dict[str, dict[int, str]],
    path: Path,
    top: int = 20,
) -> None:
    """One panel per metric of the pipeline run: the truth beside the streaming estimate and its 95% interval
    (a frequency metric's ``top`` most frequent items, a string metric's discovered words, a numeric metric's
    values or histogram), written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(live)
    cols = 2
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        est, t, m = live[name], truth[name], metrics[name]
        if m.kind == "heavy_hitters":
            _plot_heavy_hitters(ax, m, est)
        elif m.kind != "frequency":
            _plot_numeric(ax, m, est, t)
        else:
            _plot_frequency(ax, metrics, name, est, t, words, top)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("count")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_offline(results: list[SimulationResult], path: Path, top: int = 25) -> None:
    """One panel per oracle of the ``--offline`` run: the ``top`` most frequent items' true frequencies beside
    the estimates and their 95% intervals, written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 2
    rows = (len(results) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.2 * rows), squeeze=False, sharey=True)
    for ax, res in zip(axes.flat, results):
        order = np.argsort(-res.true_counts, kind="stable")[:top]
        x = np.arange(order.size)
        est = res.estimate
        ax.bar(x, res.true_counts[order] / res.users, color="#cfd8e3", label="truth")
        err = np.vstack([est.counts[order] - est.ci_low[order], est.ci_high[order] - est.counts[order]]) / res.users
        ax.errorbar(
            x, est.counts[order] / res.users, yerr=err, fmt="o", ms=3, color="#b03a2e", label="estimate, 95% CI"
        )
        ax.set_title(
            f"{res.spec.name}  (ε={res.spec.epsilon:g}, d={res.spec.domain_size}, n={res.users:,})", fontsize=10
        )
        ax.set_xticks(x[::5])
        ax.set_xlabel("item (rank by true frequency)")
    for ax in axes.flat[len(results) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("frequency")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
