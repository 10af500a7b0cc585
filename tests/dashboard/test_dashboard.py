"""The dashboard in a real browser (headless Chromium through Playwright) against a live estimator.

A real pipeline run feeds the estimator three days of reports (``conftest.py``). Each test loads the page at
``/``, reads what it shows and checks it against the service's JSON API: the same numbers (each cell's
``data-value`` exactly, its text as the API's value rounded to the shown digits), the greyed rows exactly the
items whose interval includes 0, the Norm-Sub toggle switching to the API's ``norm_sub=true`` counts, the CSV
download holding the shown rows, the numeric metrics' views, the series over days and the freshness panel.
One test saves the screenshot that docs/DASHBOARD.md shows.
"""

from __future__ import annotations

import csv
import math
import os
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.dashboard.conftest import DEVICES, FedPipeline, feed_pipeline

#: docs/img/dashboard.png when LDP_DOCS_SCREENSHOTS=1 (refreshing the picture docs/DASHBOARD.md shows);
#: otherwise the run's own folder, so a test run leaves the checkout unchanged
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"
ROWS_SHOWN = 25  # the page's default row count


def api(fp: FedPipeline, path: str, **params: Any) -> Any:
    r = httpx.get(fp.url + path, params=params, timeout=60)
    r.raise_for_status()
    return r.json()


def settled_freshness(fp: FedPipeline) -> dict[str, Any]:
    """/v1/freshness once every read offset is committed (then no checkpoint moves the snapshot time)."""
    deadline = time.monotonic() + 30
    while True:
        f = api(fp, "/v1/freshness")
        if f["snapshot_time"] is not None and all(p["committed"] == p["read"] for p in f["partitions"]):
            return f
        assert time.monotonic() < deadline, f"the estimator never committed what it read: {f}"
        time.sleep(0.1)


def open_page(page: Any, fp: FedPipeline, metric: str, day: int, shown: str) -> None:
    page.goto(f"{fp.url}/#metric={metric}&day={day}")
    wait_shown(page, metric, day, shown)


def wait_shown(page: Any, metric: str, day: int, shown: str) -> None:
    page.wait_for_selector(f'body[data-shown="{metric}/{day}/{shown}"]:not(.loading)', timeout=30_000)


def table(page: Any) -> list[dict[str, Any]]:
    """The table's rows as the browser shows them: key, greyed or not, and per column the text and data-value."""
    return page.eval_on_selector_all(
        "#table tbody tr",
        """rows => rows.map(tr => ({
            key: tr.dataset.key,
            grey: tr.classList.contains("grey"),
            cells: Object.fromEntries(Array.from(tr.cells).map(td =>
                [td.dataset.col, {text: td.textContent, value: td.dataset.value ?? null}])),
        }))""",
    )


def shown_number(text: str) -> float:
    return float(text.replace(",", "").rstrip("%"))


def check_cell(cell: dict[str, Any], expected: float | None, decimals: int, scale: float = 1.0) -> None:
    """The cell's data-value is the API's value exactly; its text is that value rounded to ``decimals``."""
    if expected is None:
        assert cell["value"] is None and cell["text"] == "—", cell
        return
    assert cell["value"] is not None and float(cell["value"]) == expected, (cell, expected)
    shown = shown_number(cell["text"])
    # half a unit of the last digit shown, plus float slack
    assert abs(shown - expected * scale) <= 0.5 * 10.0**-decimals + 1e-9 * abs(expected * scale), (cell, expected)


def includes_zero(lo: float | None, hi: float | None) -> bool:
    return lo is not None and hi is not None and lo <= 0 <= hi


def check_frequency_table(page: Any, est: dict[str, Any]) -> list[int]:
    """The table against one API answer; returns the indices shown, in order."""
    rows = table(page)
    counts = np.array([-math.inf if c is None else c for c in est["counts"]])
    assert len(rows) == min(ROWS_SHOWN, counts.size)
    shown = [int(r["cells"]["index"]["value"]) for r in rows]
    # the rows are the largest estimates, largest first (ties by index)
    assert shown == sorted(range(counts.size), key=lambda i: (-counts[i], i))[: len(rows)]
    for r, i in zip(rows, shown):
        c = r["cells"]
        check_cell(c["estimate"], est["counts"][i], 1)
        check_cell(c["std_error"], est["std_error"][i], 1)
        check_cell(c["ci_low"], est["ci_low"][i], 1)
        check_cell(c["ci_high"], est["ci_high"][i], 1)
        if est.get("labels"):
            assert c["label"]["text"] == est["labels"][i]
        zero = includes_zero(est["ci_low"][i], est["ci_high"][i])
        assert c["includes_zero"]["text"] == ("yes" if zero else "no"), (r, i)
        # grey: the API's could_be_noise (Bonferroni over the d items), which every interval with 0 in it has
        noise = est["could_be_noise"][i]
        assert r["grey"] == noise and c["could_be_noise"]["text"] == ("yes" if noise else "no"), (r, i)
        assert noise or not zero
        check_cell(c["adjusted_ci_low"], est["adjusted_ci_low"][i], 1)
    return shown


def card_value(page: Any, testid: str) -> str | None:
    return page.get_attribute(f'[data-testid="{testid}"] .v', "data-value")


def test_frequency_view_shows_the_api_numbers_and_norm_sub(fed_pipeline: FedPipeline, page: Any) -> None:
    fp = fed_pipeline
    day = fp.days[-1]
    fresh = settled_freshness(fp)
    open_page(page, fp, "settings_tab", day, "none")
    est = api(fp, "/v1/estimates/settings_tab", day=day)
    assert est["n"] == DEVICES[-1]  # one report per device and metric on each day
    shown_plain = check_frequency_table(page, est)

    # the cards: n, the local ε (and r·ε per person), the per-person central ε of the shuffle
    assert card_value(page, "n") == str(est["n"])
    assert float(card_value(page, "local-epsilon") or "nan") == est["epsilon"]
    assert "up to 2 a day: 2 per person and day" in page.inner_text('[data-testid="local-epsilon"]')
    assert est["central_epsilon"] is not None
    assert float(card_value(page, "central-epsilon") or "nan") == est["central_epsilon"]
    assert page.inner_text('[data-testid="postprocessing"] .v') == "none"

    # freshness: the snapshot time and each partition's offsets, as /v1/freshness says
    assert float(page.get_attribute('[data-testid="snapshot-time"]', "data-value") or "nan") == fresh["snapshot_time"]
    offsets = page.eval_on_selector_all(
        "#freshness tbody tr",
        "rows => rows.map(tr => [Number(tr.dataset.partition), Number(tr.cells[1].dataset.value), "
        "Number(tr.cells[2].dataset.value)])",
    )
    assert offsets == [[p["partition"], p["committed"], p["read"]] for p in fresh["partitions"]]
    assert sum(p["read"] for p in fresh["partitions"]) > 0

    # the toggle: the numbers become the API's Norm-Sub counts (non-negative, summing to n)
    page.check("#normsub")
    wait_shown(page, "settings_tab", day, "norm-sub")
    ns = api(fp, "/v1/estimates/settings_tab", day=day, norm_sub="true")
    assert ns["postprocessing"] == "norm-sub" and ns["counts"] != est["counts"]
    assert min(ns["counts"]) >= 0 and abs(sum(ns["counts"]) - ns["n"]) < 1e-6 * ns["n"]
    check_frequency_table(page, ns)
    assert page.inner_text('[data-testid="postprocessing"] .v') == "norm-sub"
    # and back
    page.uncheck("#normsub")
    wait_shown(page, "settings_tab", day, "none")
    assert check_frequency_table(page, est) == shown_plain


def test_csv_download_holds_what_is_shown(fed_pipeline: FedPipeline, page: Any, tmp_path: Path) -> None:
    fp = fed_pipeline
    day = fp.days[-1]
    open_page(page, fp, "emoji_used", day, "none")
    page.check("#normsub")
    wait_shown(page, "emoji_used", day, "norm-sub")
    shown = [int(r["cells"]["index"]["value"]) for r in table(page)]
    with page.expect_download() as info:
        page.click("#download")
    dl = info.value
    est = api(fp, "/v1/estimates/emoji_used", day=day, norm_sub="true")
    assert dl.suggested_filename == f"emoji_used-{est['date']}-normsub.csv"
    target = tmp_path / dl.suggested_filename
    dl.save_as(target)
    with target.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["index"]) for r in rows] == shown and len(rows) == ROWS_SHOWN
    for r in rows:
        i = int(r["index"])
        assert (r["metric"], r["date"], r["spec_id"], r["kind"], r["postprocessing"]) == (
            "emoji_used",
            est["date"],
            est["spec_id"],
            "frequency",
            "norm-sub",
        )
        assert r["label"] == f"#{i}"  # a hashed domain has no labels: buckets are named by index
        for col, key in (
            ("estimate", "counts"),
            ("std_error", "std_error"),
            ("ci_low", "ci_low"),
            ("ci_high", "ci_high"),
        ):
            assert float(r[col]) == est[key][i], (col, r)  # full precision: the API's float, not the shown text
        assert r["includes_zero"] == ("true" if includes_zero(est["ci_low"][i], est["ci_high"][i]) else "false")


def test_days_series_and_day_switch(fed_pipeline: FedPipeline, page: Any) -> None:
    fp = fed_pipeline
    open_page(page, fp, "emoji_used", fp.days[-1], "none")
    dates = page.eval_on_selector_all("#day option", "os => os.map(o => o.textContent)")
    expected = [api(fp, "/v1/estimates/emoji_used", day=d)["date"] for d in fp.days]
    assert dates == expected
    # the series: the top items of the day, one line each with a point per day and a band around it
    lines = page.eval_on_selector_all(
        "#series g.line",
        "gs => gs.map(g => [g.dataset.name, g.querySelectorAll('circle').length, g.querySelectorAll('polygon').length])",
    )
    top = [r["cells"]["label"]["text"] for r in table(page)][:5]
    assert lines == [[name, len(fp.days), 1] for name in top]
    # grey points in the chart are exactly the greyed rows (could be noise)
    grey_points = page.eval_on_selector_all("#chart g.point.grey", "gs => gs.map(g => g.dataset.label)")
    assert grey_points == [r["cells"]["label"]["text"] for r in table(page) if r["grey"]]
    # another day: its own numbers
    page.select_option("#day", index=0)
    wait_shown(page, "emoji_used", fp.days[0], "none")
    est = api(fp, "/v1/estimates/emoji_used", day=fp.days[0])
    assert est["n"] == DEVICES[0]
    check_frequency_table(page, est)
    assert card_value(page, "n") == str(DEVICES[0])


def test_mean_view(fed_pipeline: FedPipeline, page: Any) -> None:
    fp = fed_pipeline
    day = fp.days[-1]
    open_page(page, fp, "settings_tab", day, "none")
    page.click('nav button[data-metric="minutes"]')
    wait_shown(page, "minutes", day, "mean")
    est = api(fp, "/v1/estimates/minutes", day=day)
    assert est["kind"] == "mean" and page.is_disabled("#normsub")
    rows = table(page)
    assert len(rows) == len(est["mean"]) == 1
    c = rows[0]["cells"]
    check_cell(c["mean"], est["mean"][0], 3)
    check_cell(c["std_error"], est["std_error"][0], 3)
    check_cell(c["ci_low"], est["ci_low"][0], 3)
    check_cell(c["ci_high"], est["ci_high"][0], 3)
    assert rows[0]["grey"] is includes_zero(est["ci_low"][0], est["ci_high"][0])
    assert float(card_value(page, "central-epsilon") or "nan") == est["central_epsilon"]
    lines = page.eval_on_selector_all("#series g.line", "gs => gs.map(g => g.querySelectorAll('circle').length)")
    assert lines == [len(fp.days)]


def test_distribution_view(fed_pipeline: FedPipeline, page: Any) -> None:
    fp = fed_pipeline
    day = fp.days[-1]
    open_page(page, fp, "minutes_dist", day, "distribution")
    est = api(fp, "/v1/estimates/minutes_dist", day=day)
    rows = {r["key"]: r for r in table(page)}
    assert list(rows) == list(est["quantiles"]) + [f"bin{i}" for i in range(len(est["hist"]))]
    for q, v in est["quantiles"].items():
        c = rows[q]["cells"]
        check_cell(c["estimate"], v["value"], 3)
        check_cell(c["ci_low"], v["ci_low"], 3)
        check_cell(c["ci_high"], v["ci_high"], 3)
    for i, h in enumerate(est["hist"]):
        r = rows[f"bin{i}"]
        check_cell(r["cells"]["estimate"], h, 2, scale=100.0)  # shown as a percentage
        check_cell(r["cells"]["ci_low"], est["hist_low"][i], 2, scale=100.0)
        check_cell(r["cells"]["ci_high"], est["hist_high"][i], 2, scale=100.0)
        check_cell(r["cells"]["low_edge"], est["edges"][i], 3)
        check_cell(r["cells"]["high_edge"], est["edges"][i + 1], 3)
        assert r["grey"] == includes_zero(est["hist_low"][i], est["hist_high"][i])
    assert page.locator("#chart g.bin").count() == len(est["hist"])
    # its CSV: the same rows at full precision (quantiles' values, bins' shares)
    with page.expect_download() as info:
        page.click("#download")
    with open(info.value.path(), newline="") as f:
        got = list(csv.DictReader(f))
    assert [r["row"] for r in got] == list(est["quantiles"]) + [f"bin {i}" for i in range(len(est["hist"]))]
    for r in got[: len(est["quantiles"])]:
        v = est["quantiles"][r["row"]]
        assert (float(r["estimate"]), float(r["ci_low"]), float(r["ci_high"])) == (
            v["value"],
            v["ci_low"],
            v["ci_high"],
        )
        assert r["low_edge"] == r["high_edge"] == ""
    for i, r in enumerate(got[len(est["quantiles"]) :]):
        assert (float(r["estimate"]), float(r["ci_low"]), float(r["ci_high"])) == (
            est["hist"][i],
            est["hist_low"][i],
            est["hist_high"][i],
        )
        assert (float(r["low_edge"]), float(r["high_edge"])) == (est["edges"][i], est["edges"][i + 1])
        assert (r["metric"], r["kind"], r["date"]) == ("minutes_dist", "distribution", est["date"])
    assert page.eval_on_selector_all("#series g.line", "gs => gs.map(g => g.dataset.name)") == list(est["quantiles"])


def test_screenshot_for_the_docs(fed_pipeline: FedPipeline, page: Any, tmp_path: Path) -> None:
    fp = fed_pipeline
    shot = DOCS_SCREENSHOT if os.environ.get("LDP_DOCS_SCREENSHOTS") == "1" else tmp_path / "dashboard.png"
    settled_freshness(fp)
    open_page(page, fp, "emoji_used", fp.days[-1], "none")
    assert page.locator("#table tbody tr.grey").count() > 0  # the picture shows greyed items too
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page.click('nav button[data-metric="minutes_dist"]')
    wait_shown(page, "minutes_dist", fp.days[-1], "distribution")
    numeric = shot.with_name("dashboard-distribution.png")
    page.screenshot(path=str(numeric), full_page=False)  # the histogram and the quantiles' series
    assert numeric.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.kafka
def test_the_page_over_kafka(kafka_bootstrap: str, page: Any, tmp_path: Path) -> None:
    """The same page over a pipeline on Kafka: the numbers, the toggle and the freshness panel."""
    with feed_pipeline(tmp_path, f"kafka://{kafka_bootstrap}") as fp:
        day = fp.days[-1]
        fresh = settled_freshness(fp)
        open_page(page, fp, "emoji_used", day, "none")
        check_frequency_table(page, api(fp, "/v1/estimates/emoji_used", day=day))
        page.check("#normsub")
        wait_shown(page, "emoji_used", day, "norm-sub")
        check_frequency_table(page, api(fp, "/v1/estimates/emoji_used", day=day, norm_sub="true"))
        snap = page.get_attribute('[data-testid="snapshot-time"]', "data-value")
        assert float(snap or "nan") == fresh["snapshot_time"]
        batches = sum(e["batches"] for e in api(fp, "/v1/estimates")["estimates"])
        # on Kafka the shuffler's transactions leave a commit marker at an offset of its own, so the offsets
        # exceed the batches (the embedded log has none: test_dashboard_api checks equality there)
        assert sum(p["committed"] for p in fresh["partitions"]) >= batches > 0
