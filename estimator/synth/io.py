"""Tables in and out: a CSV of categorical columns, and CSV or Parquet output (pandas)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from estimator.synth.data import SynthError, Table

__all__ = ["read_csv", "write_table"]

#: a column with more distinct values than this is refused (the methods model every value of every column)
MAX_VALUES = 200


def read_csv(path: str | Path) -> Table:
    """Every column read as text and treated as categorical (values sorted); empty cells are a value too."""
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as exc:
        raise SynthError(f"cannot read {path}: {exc}") from None
    if frame.shape[1] < 2 or frame.shape[0] < 1:
        raise SynthError(f"{path}: a table needs at least two columns and one row")
    labels, codes = [], []
    for c in frame.columns:
        values, inverse = np.unique(frame[c].to_numpy(dtype=str), return_inverse=True)
        if len(values) > MAX_VALUES:
            raise SynthError(f"{path}: column {c!r} has {len(values)} values (at most {MAX_VALUES}: bin it first)")
        labels.append(tuple(str(v) for v in values))
        codes.append(inverse)
    return Table(tuple(str(c) for c in frame.columns), tuple(labels), np.stack(codes, axis=1))


def write_table(table: Table, path: str | Path) -> None:
    """``.parquet`` (pyarrow) or anything else as CSV."""
    frame = table.frame()
    p = Path(path)
    try:
        if p.suffix == ".parquet":
            frame.to_parquet(p, index=False)  # type: ignore[attr-defined]
        else:
            frame.to_csv(p, index=False)  # type: ignore[attr-defined]
    except OSError as exc:
        raise SynthError(f"cannot write {path}: {exc}") from None
