"""Each metric of the demo's pipeline run set against the devices' truth: printed, as its ``demo.json``
entry, and with whether the streaming estimate equals the batch job's over the Parquet dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.text import printable
from simulator.demo.plots import label

__all__ = ["central_text", "frequency_row", "numeric_row", "heavy_hitters_row"]


def central_text(est: dict[str, Any], m: Any) -> str:
    """The central ε the shuffle gives per person, beside the r·ε the person's reports spend locally."""
    ce, r = est.get("central_epsilon"), m.max_reports_per_day
    if ce is None:
        return "central ε n/a"
    return f"central ε={ce:.3g} per person (δ={est['central_delta']:g}; locally {r}×ε={r * m.spec.epsilon:g})"


def frequency_row(
    metrics: Any,
    name: str,
    est: dict[str, Any],
    t: np.ndarray,
    table: Any,
    words: dict[str, dict[int, str]],
    top: int,
    uploaded: int,
    counted: int,
) -> tuple[dict[str, Any], bool]:
    """Print a frequency metric's live estimate against the true counts ``t`` (its ``top`` most frequent
    items); its demo.json entry (with the reports ``uploaded`` and ``counted``), and whether the batch job's ``table`` over the
    Parquet dataset gave the same numbers."""
    m = metrics[name]
    counts, lo, hi = (np.array(est[k], dtype=np.float64) for k in ("counts", "ci_low", "ci_high"))
    same = bool(
        np.array_equal(table["estimate"].to_numpy(), counts)
        and np.array_equal(table["ci_low"].to_numpy(), lo)
        and np.array_equal(table["ci_high"].to_numpy(), hi)
    )
    cover = float(np.mean((lo <= t) & (t <= hi)))
    rmse = float(np.sqrt(np.mean((counts - t) ** 2)))
    r = m.max_reports_per_day
    print(
        f"{name}: {m.spec.name} ε={m.spec.epsilon:g}, d={len(counts)}, n={est['n']:,} in "
        f"{est['batches']} shuffled batches; {central_text(est, m)}; RMSE {rmse:,.1f}, 95% CI coverage {cover:.0%}"
    )
    noise = est.get("could_be_noise") or [False] * len(counts)
    print(f"  {'item':>18} {'truth':>8} {'estimate':>9} {'95% CI':>20}")
    for i in np.argsort(-t, kind="stable")[:top]:
        print(
            f"  {printable(label(metrics, name, int(i), words)):>18} {int(t[i]):>8,} {counts[i]:>9,.0f} "
            f"{'[' + format(lo[i], ',.0f') + ', ' + format(hi[i], ',.0f') + ']':>20}"
            + ("  could be noise" if noise[i] else "")
        )
    row = {
        "mechanism": m.spec.name,
        "epsilon": m.spec.epsilon,
        "n": est["n"],
        "reports_per_day": r,
        "person_epsilon": r * m.spec.epsilon,
        "uploaded": uploaded,
        "counted": counted,
        "central_epsilon": est.get("central_epsilon"),
        "central_delta": est.get("central_delta"),
        "rmse": rmse,
        "ci_coverage": cover,
        "batch_equals_streaming": same,
        "truth": t.tolist(),
        "estimate": est["counts"],
        "ci_low": est["ci_low"],
        "ci_high": est["ci_high"],
    }
    return row, same


def heavy_hitters_row(dataset: Path, m: Any, ranks: np.ndarray, day: int, top: int) -> dict[str, Any]:
    """Discover a string metric's words from the day's Parquet parts (``ldp heavy-hitters``) and print them by name
    beside the truth (docs/HEAVY_HITTERS.md)."""
    from estimator.jobs.heavy_hitters import discover_dataset
    from simulator.stack import demo_words

    words = demo_words(m.domain.length)
    true = np.bincount(np.asarray(ranks, dtype=np.int64), minlength=len(words))
    order = np.argsort(-true, kind="stable")[:top]
    true_top = [[words[i], int(true[i])] for i in order]
    counts = {words[i]: int(c) for i, c in enumerate(true) if c}
    res = discover_dataset(dataset, m.name, [day], top=top)  # only values that stand out from the noise
    found = res.table[["value", "estimate", "ci_low", "ci_high"]].values.tolist()
    hits = len({f[0] for f in found} & {t[0] for t in true_top})
    recall = hits / len(true_top) if true_top else 0.0
    print(
        f"{m.name}: {m.spec.name} ε={m.spec.epsilon:g} discovered {len(found)} words from {res.n:,} reports "
        f"(no word listed in advance; {res.discovery.tested:,} candidates, only those that stand out from the "
        f"noise are listed: Bonferroni); recall@{top} {recall:.2f}, decode {res.discovery.seconds:.1f} s"
    )
    print(f"  {'word':>18} {'truth':>8} {'estimate':>9} {'95% CI':>20}")
    for value, e, lo, hi in found:
        print(
            f"  {printable(value):>18} {counts.get(value, 0):>8,} {e:>9,.0f} {'[' + format(lo, ',.0f') + ', ' + format(hi, ',.0f') + ']':>20}"
        )
    return {
        "kind": "heavy_hitters",
        "mechanism": m.spec.name,
        "epsilon": m.spec.epsilon,
        "n": res.n,
        "found": found,
        "found_true_counts": [counts.get(f[0], 0) for f in found],
        "candidates": res.discovery.tested,
        "true_top": true_top,
        "recall": recall,
        "seconds": res.discovery.seconds,
        "reports_per_part": res.parts,
    }


def numeric_row(m: Any, est: dict[str, Any], values: np.ndarray, table: Any) -> tuple[dict[str, Any], bool]:
    """Print a numeric metric's live estimate against the devices' true values; its demo.json entry, and
    whether the batch job over the Parquet dataset gave the same numbers."""
    head = f"{m.name}: {m.spec.name} ε={m.spec.epsilon:g}, range [{m.spec.low:g}, {m.spec.high:g}], n={est['n']:,} in "
    head += f"{est['batches']} shuffled batches; {central_text(est, m)}"
    row: dict[str, Any] = {
        "kind": m.kind,
        "mechanism": m.spec.name,
        "epsilon": m.spec.epsilon,
        "n": est["n"],
        "reports_per_day": m.max_reports_per_day,
        "person_epsilon": m.max_reports_per_day * m.spec.epsilon,
        "central_epsilon": est.get("central_epsilon"),
        "central_delta": est.get("central_delta"),
    }
    if m.kind == "mean":
        mean, lo, hi = est["mean"][0], est["ci_low"][0], est["ci_high"][0]
        truth = float(values.mean())
        covered = bool(lo <= truth <= hi)
        same = bool(np.array_equal(table["mean"].to_numpy(), np.array(est["mean"], dtype=np.float64)))
        print(head)
        print(f"  true mean {truth:,.3f}   estimate {mean:,.3f}   95% CI [{lo:,.3f}, {hi:,.3f}]   covered: {covered}")
        row.update(true_mean=truth, mean=mean, ci_low=lo, ci_high=hi, ci_covers=covered, batch_equals_streaming=same)
        return row, same
    edges = np.array(est["edges"], dtype=np.float64)
    hist = np.array(est["hist"], dtype=np.float64)
    true_hist = np.histogram(np.clip(values, edges[0], edges[-1]), bins=edges)[0] / max(1, values.size)
    tv = float(0.5 * np.abs(hist - true_hist).sum())
    same = bool(np.array_equal(table["share"].to_numpy(), hist))
    print(head)
    print(f"  histogram of {hist.size} bins: total variation from the truth {tv:.3f}")
    quantiles = {}
    for q, v in est["quantiles"].items():
        true_q = float(np.quantile(values, float(q[1:]) / 100))
        quantiles[q] = {**v, "truth": true_q}
        print(
            f"  {q:>4}: true {true_q:,.2f}   estimate {v['value']:,.2f}   95% CI [{v['ci_low']:,.2f}, {v['ci_high']:,.2f}]"
        )
    row.update(
        tv=tv,
        quantiles=quantiles,
        edges=est["edges"],
        hist=est["hist"],
        true_hist=true_hist.tolist(),
        batch_equals_streaming=same,
    )
    return row, same
