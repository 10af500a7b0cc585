"""The dashboard's CSV download never holds a live formula or a split row, whatever a device sent.

A heavy hitter's value is a string devices chose. The pipeline's PEM metric carries strings of at most 4
bytes, too short for ``=SUM(40,2)``, so the page is served the real discovery answer with the top values
replaced by such strings (what a fleet reporting them would have made the API return), in a real browser,
and the downloaded file is read back as a spreadsheet would: no cell starts with ``= + - @``, a tab or CR,
and every row is whole. The Python side's CSV is in tests/pipeline/test_csv_export.py.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from tests.dashboard.conftest import FedPipeline
from tests.dashboard.test_dashboard import api, open_page

METRIC = "search_word"
LEADS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet runs as a formula
HOSTILE = ["=SUM(40,2)", "+1", "-2", "@x", "\tA", "a\rb", '"q"', "x,y"]


def test_downloaded_csv_neutralises_device_strings(fed_pipeline: FedPipeline, page: Any, tmp_path: Path) -> None:
    fp = fed_pipeline
    day = fp.days[-1]

    def hostile(route: Any) -> None:
        body = route.fetch().json()
        for h, v in zip(body["found"], HOSTILE):
            h["value"] = v
        route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

    page.route(f"**/v1/heavy-hitters/{METRIC}?*", hostile)
    open_page(page, fp, METRIC, day, "heavy_hitters")
    page.check("#noise")  # list the top 50 whether or not they stand out, so that 8 rows carry hostile values
    page.wait_for_function("document.getElementById('chart-title').textContent.includes('grey: could be noise')")
    found = api(fp, f"/v1/heavy-hitters/{METRIC}", day=day, top=50, include_noise="true")["found"]
    with page.expect_download() as dl:
        page.click("#download")
    path = tmp_path / "hh.csv"
    dl.value.save_as(path)
    with path.open(newline="", encoding="utf-8") as f:
        got = list(csv.DictReader(f))
    assert len(got) >= len(HOSTILE) and all(None not in g for g in got)  # no row split, no stray field
    for g, v, h in zip(got, HOSTILE, found):
        want = "'" + v if v[:1] in LEADS else v
        assert g["value"] == want
        assert float(g["estimate"]) == h["estimate"]  # the numbers are the untouched answer's
    for g in got:
        for cell in g.values():
            assert _number(cell) or cell[:1] not in LEADS, cell  # a number may be negative, text may not lead so


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
