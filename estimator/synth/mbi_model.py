"""The thin layer over the ``mbi`` package (private-pgm's maintained successor, 2.x): measurements in, a
graphical model out, records sampled from it with an explicit generator.

``mbi`` brings ``jax``; it is imported on first use (the ``synth`` extra), in 64-bit mode and without jax's
persistent compilation cache (``mbi`` warns against both otherwise)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from estimator.synth.data import SynthError, Table

__all__ = ["Measurement", "load_mbi", "fit", "sample", "model_marginal"]


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Noisy counts ``y`` of ``clique``'s marginal (flattened row-major), each with noise std ``stddev``."""

    clique: tuple[str, ...]
    y: np.ndarray
    stddev: float


def load_mbi() -> Any:
    try:
        import jax
    except ImportError:
        raise SynthError("marginal-based synthesis needs the mbi package: pip install 'ldp-telemetry[synth]'") from None
    jax.config.update("jax_enable_x64", True)  # type: ignore[no-untyped-call]
    jax.config.update("jax_enable_compilation_cache", False)  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import mbi
        from mbi import estimation
    return mbi, estimation


def domain_of(table: Table) -> Any:
    mbi, _ = load_mbi()
    return mbi.Domain(table.columns, table.shape)


def fit(
    table: Table,
    measurements: Sequence[Measurement],
    *,
    iters: int = 1000,
    warm_start: Any = None,
    total: float | None = None,
    callback: Callable[[Any], None] | None = None,
    pad: Sequence[tuple[str, ...]] = (),
) -> Any:
    """A Markov random field fitted by ``mbi``'s mirror descent to ``measurements`` (weighted by 1/stddev),
    the total estimated from them (minimum-variance) unless given. Post-processing of the measurements.

    Measurements of one clique are merged (:func:`merge`) and every clique of ``pad`` not measured gets a
    placeholder of weight ~0: the loss then has the same structure whatever was measured, so jax compiles
    it once per process rather than once per AIM round (the compile dominates a fit on small domains)."""
    mbi, estimation = load_mbi()
    merged = merge(table, measurements, pad)
    # plain floats and float64 arrays throughout: a leaf changing from weak to strong type would recompile
    ms = [mbi.LinearMeasurement(np.asarray(m.y, dtype=np.float64), m.clique, stddev=float(m.stddev)) for m in merged]
    return estimation.MirrorDescent().estimate(
        domain_of(table), ms, known_total=total, iters=iters, warm_start=warm_start, callback_fn=callback
    )


#: the noise std of a placeholder measurement (its weight 1/σ is ~0: it shapes the loss, never the fit)
PLACEHOLDER_STD = 1e9
#: padding is used only while the whole domain has at most this many cells (the model is then at most the
#: full contingency table, which is small)
PAD_MAX_CELLS = 2_000_000


def merge(table: Table, measurements: Sequence[Measurement], pad: Sequence[tuple[str, ...]] = ()) -> list[Measurement]:
    """One measurement per clique: repeated ones combined by inverse-variance weighting (the same
    least-squares fit), then placeholders for the cliques of ``pad`` not measured (none on a domain over
    :data:`PAD_MAX_CELLS`)."""
    acc: dict[tuple[str, ...], tuple[np.ndarray, float]] = {}
    for m in measurements:
        w = 1.0 / float(m.stddev) ** 2
        y = np.asarray(m.y, dtype=np.float64)
        if m.clique in acc:
            s, tw = acc[m.clique]
            acc[m.clique] = (s + w * y, tw + w)
        else:
            acc[m.clique] = (w * y, w)
    out = [Measurement(c, s / tw, 1.0 / np.sqrt(tw)) for c, (s, tw) in acc.items()]
    if float(np.prod(table.shape, dtype=np.float64)) <= PAD_MAX_CELLS:
        for c in pad:
            if c not in acc:
                n = int(np.prod([table.shape[table.columns.index(a)] for a in c]))
                out.append(Measurement(tuple(c), np.zeros(n), PLACEHOLDER_STD))
    index = {c: j for j, c in enumerate(table.columns)}
    return sorted(out, key=lambda m: (len(m.clique), [index[a] for a in m.clique]))


def model_marginal(model: Any, clique: Sequence[str]) -> np.ndarray:
    """The model's counts of ``clique`` (flattened row-major)."""
    return np.asarray(model.project(tuple(clique)).datavector(), dtype=np.float64)


def sample(model: Any, table: Table, rows: int, rng: np.random.Generator) -> Table:
    """``rows`` records from ``model`` by randomized rounding along its junction tree, every draw from ``rng``.

    Columns are filled in reverse elimination order (``mbi``'s junction tree over the model's cliques): the
    first from its marginal, each later one, per configuration of the already-filled columns it shares a
    clique with, from the model's conditional counts. Rounding keeps each group's counts within one of the
    model's (``mbi``'s own ``synthetic_data`` does the same but draws from numpy's global generator)."""
    if rows < 1:
        raise SynthError(f"rows must be >= 1, got {rows}")
    from mbi import junction_tree

    jtree, elimination = junction_tree.make_junction_tree(model.domain, [tuple(c) for c in model.cliques])
    cliques = [set(c) for c in jtree.nodes]
    order = list(elimination)[::-1]
    data: dict[Any, np.ndarray] = {}
    for col in order:
        parents = tuple(c for c in order if c in data and any(col in cl and c in cl for cl in cliques))
        counts = np.asarray(model.project(parents + (col,)).datavector(flatten=False), dtype=np.float64)
        if not parents:
            data[col] = _rounded(counts, rows, rng)
            continue
        keys = np.stack([data[p] for p in parents], axis=1)
        configs, inverse = np.unique(keys, axis=0, return_inverse=True)
        by_group = np.argsort(inverse.ravel(), kind="stable")
        sizes = np.bincount(inverse.ravel(), minlength=len(configs))
        out = np.empty(rows, dtype=np.int64)
        for cfg, idx in zip(configs, np.split(by_group, np.cumsum(sizes)[:-1]), strict=True):
            out[idx] = _rounded(counts[tuple(cfg)], idx.size, rng)
        data[col] = out
    codes = np.stack([data[c] for c in table.columns], axis=1)
    return table.with_codes(codes)


def _rounded(counts: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """``total`` codes in random order whose histogram rounds ``counts`` scaled to ``total``: the integer parts,
    then the remaining units to distinct codes drawn with probability proportional to the fractional parts."""
    counts = np.clip(np.asarray(counts, dtype=np.float64), 0.0, None)
    mass = counts.sum()
    counts = counts * (total / mass) if mass > 0 else np.full(counts.size, total / counts.size)
    frac, whole = np.modf(counts)
    n = whole.astype(np.int64)
    extra = total - int(n.sum())
    if extra > 0:
        p = frac / frac.sum() if frac.sum() > 0 else None
        n[rng.choice(counts.size, extra, replace=False, p=p)] += 1
    return rng.permutation(np.repeat(np.arange(counts.size, dtype=np.int64), n))
