"""``ldp pate --sweep``: accuracy–ε curves of GNMax and Confident-GNMax, compared at matched student accuracy.

Papernot et al. (2018) claim that Confident-GNMax answers more queries at lower ε than GNMax for the same
student accuracy. The study of :mod:`estimator.pate.experiment` compares a handful of settings with a linear
student, which plateaus at the votes' accuracy; this module does the comparison as a curve:

* **data**: a generated 10-class task (scikit-learn's ``make_classification``, offline) with enough sensitive
  rows that each of many teachers (default 200) is fairly accurate, so that the votes show the strong
  consensus the paper's analysis rewards; teachers are softmax regressions on disjoint partitions (each
  record placed by its own draw);
* **student**: a one-hidden-layer MLP (scikit-learn's ``MLPClassifier``, early stopping off, fixed seed) trained
  on the answered public inputs only, so that it keeps gaining from more, cleaner labels;
* **curves**: GNMax over a grid of σ × number of queries asked, Confident-GNMax over a grid of (T, σ₁, σ₂) ×
  number of queries asked; every point's student accuracy on the test rows and its ε at δ, data-independent and
  data-dependent (:func:`estimator.pate.accounting.data_dependent`, the figure the paper reports);
* **comparison**: each aggregator's Pareto frontier (no other point of the same aggregator has both lower
  data-dependent ε and higher accuracy); at each target accuracy both frontiers reach, the ε of each by linear
  interpolation between the neighbouring frontier points, and the relative reduction.

Randomness: one generator per point derived from the seed and the point's index (so adding a point does not
change the others), the data and teachers from the seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from estimator.pate.accounting import data_dependent, data_independent
from estimator.pate.aggregators import confident_gnmax, gnmax, vote_histograms
from estimator.pate.experiment import Digits, make_synthetic_split, train_softmax
from ldp_core.fl.models import SoftmaxRegression

__all__ = ["SweepGrid", "GRIDS", "consensus_split", "run_sweep", "frontier", "epsilon_at", "plot_sweep"]


@dataclasses.dataclass(frozen=True)
class SweepGrid:
    """The sweep's size: ``teachers``, rows (``sensitive``, ``public``, ``test``), GNMax's ``gnmax_sigmas`` ×
    ``gnmax_queries`` and Confident-GNMax's ``confident`` (T, σ₁, σ₂, queries asked) settings."""

    teachers: int
    sensitive: int
    public: int
    test: int
    gnmax_sigmas: tuple[float, ...]
    gnmax_queries: tuple[int, ...]
    confident: tuple[tuple[float, float, float, int], ...]
    hidden: int = 64


GRIDS: dict[str, SweepGrid] = {
    "full": SweepGrid(
        teachers=200,
        sensitive=40_000,
        public=2000,
        test=2000,
        gnmax_sigmas=(10.0, 20.0, 40.0, 60.0),
        gnmax_queries=(250, 500, 1000, 2000),
        confident=tuple((t, s1, s2, 2000) for t in (130.0, 150.0) for s1 in (50.0, 100.0) for s2 in (20.0, 40.0))
        + tuple((t, 100.0, s2, q) for q in (500, 1000) for t in (130.0, 150.0) for s2 in (20.0, 40.0)),
    ),
    "small": SweepGrid(
        teachers=30,
        sensitive=3000,
        public=200,
        test=200,
        gnmax_sigmas=(5.0, 10.0),
        gnmax_queries=(100, 200),
        confident=((20.0, 10.0, 5.0, 200), (15.0, 10.0, 10.0, 200), (15.0, 10.0, 10.0, 100)),
        hidden=16,
    ),
}


def consensus_split(rng: np.random.Generator, grid: SweepGrid) -> Digits:
    """The sweep's task: :func:`make_synthetic_split` (``make_classification``, 10 classes, its seed drawn
    from ``rng``) at the grid's sizes of sensitive, public and test rows."""
    return make_synthetic_split(rng, grid.sensitive, grid.public, grid.test)


def _student_accuracy(data: Digits, x: np.ndarray, y: np.ndarray, hidden: int, seed: int) -> float | None:
    """An MLP trained on (x, y), its accuracy on the test rows (None with fewer than 2 classes to learn)."""
    if len(np.unique(y)) < 2:
        return None
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    clf = MLPClassifier(hidden_layer_sizes=(hidden,), alpha=1e-3, max_iter=300, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x, y)
    return float(np.mean(clf.predict(data.x_test) == data.y_test))


def _point(
    kind: str,
    votes: np.ndarray,
    data: Digits,
    params: dict[str, float],
    queries: int,
    delta: float,
    rng: np.random.Generator,
    hidden: int,
    seed: int,
) -> dict[str, Any]:
    v = votes[:queries]
    if kind == "gnmax":
        labels = gnmax(v, params["sigma"], rng)
        answered = np.ones(queries, dtype=bool)
        eps = data_independent(params["sigma"], queries, delta)["epsilon"]
        dd = data_dependent(v, params["sigma"], delta)
    else:
        ans = confident_gnmax(v, params["threshold"], params["sigma1"], params["sigma"], rng)
        labels, answered = ans.labels, ans.answered
        eps = data_independent(params["sigma"], ans.count, delta, queries=queries, sigma1=params["sigma1"])["epsilon"]
        dd = data_dependent(v, params["sigma"], delta, answered, params["threshold"], params["sigma1"])
    truth = data.y_public[:queries]
    mask = np.asarray(answered, dtype=bool)
    x = data.x_public[:queries][answered]
    acc = _student_accuracy(data, x, labels[answered], hidden, seed)
    return {
        "aggregator": kind,
        **params,
        "queries": queries,
        "answered": int(answered.sum()),
        "label_accuracy": float(np.mean(labels[answered] == truth[answered])) if answered.any() else None,
        "student_accuracy": acc,
        "epsilon": float(eps),
        "epsilon_data_dependent": float(dd["epsilon"]),
        "order_data_dependent": float(dd["order"]),
        "answered_mask": mask,
    }


def frontier(rows: Sequence[dict[str, Any]], key: str = "epsilon_data_dependent") -> list[dict[str, Any]]:
    """The Pareto frontier of ``rows``: sorted by ε (``key``), each more accurate than every cheaper one."""
    out: list[dict[str, Any]] = []
    best = -math.inf
    for r in sorted(
        (r for r in rows if r["student_accuracy"] is not None), key=lambda r: (r[key], -r["student_accuracy"])
    ):
        if r["student_accuracy"] > best:
            out.append(r)
            best = r["student_accuracy"]
    return out


def epsilon_at(front: Sequence[dict[str, Any]], accuracy: float, key: str = "epsilon_data_dependent") -> float | None:
    """The ε at which the frontier ``front`` reaches ``accuracy``: linear between the two frontier points around
    it, the cheapest point's ε when that already reaches it, None when no point does."""
    prev = None
    for r in front:
        if r["student_accuracy"] >= accuracy:
            if prev is None:
                return float(r[key])
            a0, a1 = prev["student_accuracy"], r["student_accuracy"]
            e0, e1 = prev[key], r[key]
            return float(e0 + (e1 - e0) * (accuracy - a0) / (a1 - a0))
        prev = r
    return None


def _compare(gn: list[dict[str, Any]], cf: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    if not gn or not cf:
        return []
    lo = max(gn[0]["student_accuracy"], cf[0]["student_accuracy"])
    hi = min(gn[-1]["student_accuracy"], cf[-1]["student_accuracy"])
    out = []
    for a in np.linspace(lo, hi, 5) if hi > lo else [hi]:
        e_g, e_c = epsilon_at(gn, float(a), key), epsilon_at(cf, float(a), key)
        if e_g is None or e_c is None:
            continue
        out.append(
            {
                "student_accuracy": round(float(a), 4),
                "epsilon_gnmax": e_g,
                "epsilon_confident": e_c,
                "reduction": 1.0 - e_c / e_g if e_g > 0 else None,
            }
        )
    return out


def run_sweep(
    seed: int | None,
    grid: SweepGrid | str = "full",
    delta: float = 1e-5,
    progress: Callable[[str], None] | None = None,
    keep_arrays: bool = False,
) -> dict[str, Any]:
    """The sweep of the module docstring; JSON-ready (``keep_arrays``: also the vote histograms as ``votes`` and
    each row's answered mask as ``answered_mask``, numpy arrays, for a test to recompute the ε)."""
    import time

    g = GRIDS[grid] if isinstance(grid, str) else grid
    t0 = time.monotonic()
    base = int(np.random.SeedSequence(seed).generate_state(1)[0])
    rng = np.random.default_rng([base, 0])
    data = consensus_split(rng, g)
    owner = rng.integers(0, g.teachers, size=len(data.x_sensitive))
    model = SoftmaxRegression(data.x_public.shape[1], 10, l2=1e-3)
    preds = []
    for t in range(g.teachers):
        w = train_softmax(data.x_sensitive[owner == t], data.y_sensitive[owner == t], 10, rng)
        preds.append(model.predict(w, data.x_public))
    predictions = np.stack(preds)
    votes = vote_histograms(predictions, 10)
    top = votes.max(axis=1)
    if progress:
        progress(
            f"{g.teachers} teachers trained; the vote's accuracy {np.mean(np.argmax(votes, 1) == data.y_public):.3f}"
        )
    points: list[tuple[str, dict[str, float], int]] = [
        ("gnmax", {"sigma": s}, q) for s in g.gnmax_sigmas for q in g.gnmax_queries if q <= g.public
    ]
    points += [
        ("confident", {"threshold": t, "sigma1": s1, "sigma": s2}, min(q, g.public)) for t, s1, s2, q in g.confident
    ]
    rows = []
    for i, (kind, params, q) in enumerate(points):
        r = _point(kind, votes, data, params, q, delta, np.random.default_rng([base, 1, i]), g.hidden, base % 2**31)
        rows.append(r)
        if progress:
            progress(
                f"{kind} {params} on {q}: answered {r['answered']}, student {r['student_accuracy']}, "
                f"ε {r['epsilon']:.2f}, data-dependent {r['epsilon_data_dependent']:.2f}"
            )
    out: dict[str, Any] = {
        "data": "synthetic-consensus",
        "teachers": g.teachers,
        "sensitive_examples": int(len(data.x_sensitive)),
        "public_examples": g.public,
        "test_examples": g.test,
        "delta": delta,
        "student": f"MLP, {g.hidden} hidden units (scikit-learn MLPClassifier)",
        "vote_accuracy": float(np.mean(np.argmax(votes, axis=1) == data.y_public)),
        "mean_top_vote_share": float(np.mean(top) / g.teachers),
        "all_public_student_accuracy": _student_accuracy(data, data.x_public, data.y_public, g.hidden, base % 2**31),
        "rows": rows,
    }
    for key in ("epsilon_data_dependent", "epsilon"):
        gn = frontier([r for r in rows if r["aggregator"] == "gnmax"], key)
        cf = frontier([r for r in rows if r["aggregator"] == "confident"], key)
        suffix = "" if key == "epsilon_data_dependent" else "_data_independent"
        out["frontier_gnmax" + suffix] = gn
        out["frontier_confident" + suffix] = cf
        out["matched_accuracy" + suffix] = _compare(gn, cf, key)
    if keep_arrays:
        out["votes"] = votes
    else:
        for r in rows:
            r.pop("answered_mask")
    m = out["matched_accuracy"]
    reds = [c["reduction"] for c in m if c["reduction"] is not None]
    out["holds"] = bool(reds) and all(r > 0 for r in reds)
    out["reduction_range"] = [min(reds), max(reds)] if reds else None
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


def plot_sweep(result: dict[str, Any], path: str) -> None:
    """Student accuracy against data-dependent ε: every point, and each aggregator's frontier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind, colour, name in (("gnmax", "tab:blue", "GNMax"), ("confident", "tab:red", "Confident-GNMax")):
        pts = [r for r in result["rows"] if r["aggregator"] == kind and r["student_accuracy"] is not None]
        ax.scatter(
            [r["epsilon_data_dependent"] for r in pts], [r["student_accuracy"] for r in pts], c=colour, s=14, alpha=0.5
        )
        f = result["frontier_gnmax" if kind == "gnmax" else "frontier_confident"]
        ax.plot([r["epsilon_data_dependent"] for r in f], [r["student_accuracy"] for r in f], c=colour, label=name)
    ax.set_xscale("log")
    ax.set_xlabel(f"data-dependent ε at δ = {result['delta']:g}")
    ax.set_ylabel("student (MLP) test accuracy")
    ax.set_title(f"PATE sweep: {result['teachers']} teachers, {result['public_examples']} public inputs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
