"""CSV the project writes (``ldp estimate --out x.csv``, ``ldp heavy-hitters --out x.csv``, both through
:func:`estimator.jobs.batch.write_table`): device-supplied strings are never live formulas and never split a
row. The dashboard's download applies the same rule in the browser (tests/dashboard/test_dashboard_csv.py)."""

from __future__ import annotations

import csv

import pandas as pd
import pytest

from estimator.jobs.batch import write_table
from pipeline.csv_export import safe_cell

#: strings a device can send as a heavy hitter's value (or a label), as a spreadsheet would read them
HOSTILE = ["=SUM(40,2)", "+1", "-2", "@x", "\tA", "a\rb", '"q"', "\rB", "plain", "x=1", "a,b", "l1\nl2"]


def _table() -> pd.DataFrame:
    n = len(HOSTILE)
    return pd.DataFrame(
        {
            "value": HOSTILE,
            "estimate": [-0.5 + i for i in range(n)],  # negative numbers stay numbers
            "rank": list(range(1, n + 1)),
        }
    )


def _spreadsheet_would_run(cell: str) -> bool:
    return cell[:1] in ("=", "+", "-", "@", "\t", "\r")


def test_write_table_neutralises_formulas_and_keeps_rows_whole(tmp_path) -> None:
    path = tmp_path / "hh.csv"
    write_table(_table(), path)
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["value", "estimate", "rank"]
    body = rows[1:]
    assert len(body) == len(HOSTILE)  # no value split its row
    for row, want in zip(body, HOSTILE):
        assert len(row) == 3
        value, estimate, rank = row
        assert not _spreadsheet_would_run(value), value
        assert value == (("'" + want) if _spreadsheet_would_run(want) else want)
        assert float(estimate) == -0.5 + (int(rank) - 1)
    # a negative number is written as a number, not as text
    assert body[0][1] == "-0.5"
    # every line of the file ends with CRLF, and a bare CR only ever appears inside a quoted field
    raw = path.read_bytes().decode("utf-8")
    assert raw.endswith("\r\n") and '"a\rb"' in raw and '"\'\rB"' in raw
    # pandas, as a downstream reader, gets the same strings back
    back = pd.read_csv(path, keep_default_na=False)
    assert list(back["value"]) == [safe_cell(v) for v in HOSTILE]


@pytest.mark.parametrize("value", [3, -2.5, None, b"=x"])
def test_only_strings_are_changed(value: object) -> None:
    assert safe_cell(value) is value
