"""A categorical table (integer codes per column), the seeded population the evaluations use, marginals."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from estimator.errors import EstimatorError

__all__ = ["Table", "population", "plant_rare", "marginal", "SynthError"]


class SynthError(EstimatorError, ValueError):
    """A synthetic-data request that cannot be run (bad parameters, missing package, bad input)."""


@dataclasses.dataclass(frozen=True)
class Table:
    """Rows of categorical codes: ``codes[:, j]`` in ``range(len(labels[j]))``."""

    columns: tuple[str, ...]
    labels: tuple[tuple[str, ...], ...]
    codes: np.ndarray

    def __post_init__(self) -> None:
        codes = np.asarray(self.codes)
        if codes.ndim != 2 or codes.shape[1] != len(self.columns) or len(self.labels) != len(self.columns):
            raise SynthError(f"a table of {len(self.columns)} columns needs an (n, {len(self.columns)}) code array")
        if codes.size and (codes.min() < 0 or np.any(codes.max(axis=0) >= np.array(self.shape))):
            raise SynthError("a code is outside its column's labels")
        object.__setattr__(self, "codes", codes.astype(np.int64, copy=False))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.labels)

    @property
    def rows(self) -> int:
        return int(self.codes.shape[0])

    def with_codes(self, codes: np.ndarray) -> Table:
        return Table(self.columns, self.labels, codes)

    def take(self, index: np.ndarray) -> Table:
        return self.with_codes(self.codes[np.asarray(index)])

    def select(self, columns: Sequence[str]) -> Table:
        """The table of ``columns`` only."""
        idx = [self.columns.index(c) for c in columns]
        return Table(tuple(columns), tuple(self.labels[j] for j in idx), self.codes[:, idx])

    def one_hot(self, exclude: Sequence[str] = ()) -> np.ndarray:
        """The rows as concatenated one-hot blocks (columns in ``exclude`` left out), float64."""
        blocks = [np.eye(k)[self.codes[:, j]] for j, k in enumerate(self.shape) if self.columns[j] not in exclude]
        return np.concatenate(blocks, axis=1) if blocks else np.zeros((self.rows, 0))

    def records(self) -> list[dict[str, str]]:
        return [{c: self.labels[j][v] for j, (c, v) in enumerate(zip(self.columns, row))} for row in self.codes]

    def frame(self) -> object:
        """A pandas DataFrame of labels (pandas is imported here)."""
        import pandas as pd

        return pd.DataFrame(
            {c: np.asarray(self.labels[j], dtype=object)[self.codes[:, j]] for j, c in enumerate(self.columns)}
        )


def marginal(table: Table, clique: Sequence[int]) -> np.ndarray:
    """The counts of ``clique``'s value combinations (row-major over the clique's columns, flattened)."""
    shape = [table.shape[j] for j in clique]
    if not clique:
        return np.array([float(table.rows)])
    flat = np.ravel_multi_index(tuple(table.codes[:, j] for j in clique), shape)
    return np.bincount(flat, minlength=int(np.prod(shape))).astype(np.float64)


#: the population's columns: a device's platform and app version, where and who its user is, how it connects, its
#: subscription tier and how often the app crashed (what the downstream model predicts)
_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("platform", ("android", "ios", "web")),
    ("region", ("na", "eu", "asia", "latam", "africa")),
    ("age", ("18-24", "25-34", "35-49", "50-64", "65+")),
    ("network", ("wifi", "5g", "4g", "3g")),
    ("app_version", ("v1", "v2", "v3", "v4")),
    ("tier", ("free", "plus", "pro")),
    ("crashes", ("none", "some", "many")),
)
#: each column's parents in the generating Bayesian network
_PARENTS: dict[str, tuple[str, ...]] = {
    "platform": (),
    "region": ("platform",),
    "age": ("region",),
    "network": ("region", "platform"),
    "app_version": ("platform", "age"),
    "tier": ("age", "region"),
    "crashes": ("network", "app_version", "platform"),
}


def population(rows: int, seed: int = 0, *, structure_seed: int = 7) -> Table:
    """``rows`` devices drawn from a fixed Bayesian network over seven correlated categorical attributes.

    The network's conditional tables come from ``structure_seed`` (Dirichlet(0.6) rows: peaked, so that the
    attributes are strongly dependent), the rows from ``seed``: two seeds give two samples of one population."""
    if rows < 1:
        raise SynthError(f"rows must be >= 1, got {rows}")
    srng = np.random.default_rng(structure_seed)
    rng = np.random.default_rng(seed)
    names = [c for c, _ in _COLUMNS]
    sizes = {c: len(v) for c, v in _COLUMNS}
    codes = np.zeros((rows, len(names)), dtype=np.int64)
    for j, c in enumerate(names):
        parents = _PARENTS[c]
        pshape = [sizes[p] for p in parents]
        cpt = srng.dirichlet(np.full(sizes[c], 0.6), size=int(np.prod(pshape)) if pshape else 1)
        row = (
            np.ravel_multi_index(tuple(codes[:, names.index(p)] for p in parents), pshape)
            if parents
            else np.zeros(rows, dtype=np.int64)
        )
        cum = np.cumsum(cpt, axis=1)[row]
        u = rng.random(rows)[:, None]
        codes[:, j] = np.minimum((u > cum).sum(axis=1), sizes[c] - 1)
    return Table(tuple(names), tuple(v for _, v in _COLUMNS), codes)


def plant_rare(table: Table, count: int, rng: np.random.Generator) -> tuple[Table, np.ndarray]:
    """``table`` with ``count`` planted records appended, each once: value combinations that occur nowhere in
    the table, built from each column's rarest values (the outliers a generator must not reproduce). Returns
    the new table and the planted records' codes."""
    freq = [np.bincount(table.codes[:, j], minlength=k) for j, k in enumerate(table.shape)]
    rare = [np.argsort(f)[:2] for f in freq]  # each column's two rarest values
    seen = {tuple(r) for r in table.codes.tolist()}
    options = [c for c in itertools.product(*rare) if tuple(int(x) for x in c) not in seen]
    if len(options) < count:
        raise SynthError(f"only {len(options)} unseen rare combinations to plant, asked for {count}")
    pick = rng.choice(len(options), size=count, replace=False)
    planted = np.array([options[i] for i in pick], dtype=np.int64)
    return table.with_codes(np.concatenate([table.codes, planted])), planted
