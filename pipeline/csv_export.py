"""CSV the project writes: no cell a spreadsheet would run as a formula, every row on one line.

Strings in a table can come from devices (a heavy hitter's discovered value,
a label): a cell such as ``=SUM(40,2)`` or ``@x`` would be evaluated by a
spreadsheet that opens the file (CSV formula injection), and a value holding
a bare carriage return would split its row for a reader that takes ``\\r`` as
a line end. :func:`safe_cell` puts a ``'`` before any string that starts with
``=``, ``+``, ``-``, ``@``, a tab or a carriage return (so a spreadsheet shows
it as text); :func:`write_csv` applies it to every string cell (numbers stay
numbers: a negative estimate is written as such), ends lines with CRLF (RFC
4180) and quotes every field that holds a comma, a quote, ``\\r`` or ``\\n``.
The dashboard's CSV download (``static/dashboard.js``) applies the same rule.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["FORMULA_LEADS", "safe_cell", "write_csv"]

#: A string cell starting with one of these is written with a leading ``'``.
FORMULA_LEADS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> Any:
    """``value`` with a ``'`` in front if it is a string a spreadsheet could take as a formula."""
    if isinstance(value, str) and value.startswith(FORMULA_LEADS):
        return "'" + value
    return value


def write_csv(table: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write ``table`` (without its index) as CSV at ``path``, string cells through :func:`safe_cell`."""
    out = table.copy(deep=False)
    for col in out.columns:
        if not (pd.api.types.is_numeric_dtype(out[col]) or pd.api.types.is_bool_dtype(out[col])):
            out[col] = out[col].map(safe_cell)
    out.columns = [safe_cell(str(c)) for c in out.columns]
    out.to_csv(Path(path), index=False, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
