"""The heavy-hitter view: discovered strings by name, in a real browser, against the API and the batch job.

The pipeline of ``conftest.py`` carries a PEM metric (``search_word``, strings of up to 4 bytes) beside the
others. The estimator serves the Parquet sink's folder, so ``GET /v1/heavy-hitters/{metric}`` discovers a
day's values from its part files; the answer must be the batch job's (``discover_dataset``) on the same files,
the page must show exactly those values and numbers (greyed where the interval includes 0), the series one
discovery per day, and the CSV the shown rows at full precision. Without a dataset the API says so (404).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import httpx

from estimator.jobs.heavy_hitters import discover_dataset
from pipeline.text import printable
from simulator.stack import demo_words
from tests.dashboard.conftest import DEVICES, FedPipeline
from tests.dashboard.test_dashboard import ROWS_SHOWN, api, card_value, check_cell, includes_zero, open_page, table

METRIC = "search_word"
HH_TOP = 50  # what the page asks for (dashboard.js)
SHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard-heavy-hitters.png"


def test_discovery_api_is_the_batch_jobs_answer(fed_pipeline: FedPipeline) -> None:
    fp = fed_pipeline
    day = fp.days[-1]
    got = api(fp, f"/v1/heavy-hitters/{METRIC}", day=day, top=20)
    assert got["kind"] == "heavy_hitters" and got["mechanism"] == "pem" and got["day"] == day
    assert got["n"] == DEVICES[-1] and sum(got["reports_per_part"]) == got["n"]
    ref = discover_dataset(fp.dataset, METRIC, [day], top=20)
    assert [h["value"] for h in got["found"]] == list(ref.table["value"])
    for h, r in zip(got["found"], ref.table.itertuples(index=False)):
        assert (h["estimate"], h["std_error"], h["ci_low"], h["ci_high"]) == (
            r.estimate,
            r.std_error,
            r.ci_low,
            r.ci_high,
        )
    # the simulated population is Zipf(1.1) over demo_words(4): its most frequent word (about 13% of 5,000
    # devices, against a standard error of about 60 at ε = 4 with 1,250 reports per level) is found first
    assert got["found"][0]["value"] == demo_words(4)[0]
    assert got["found"][0]["adjusted_ci_low"] > 0
    # the selection adjustment: Bonferroni over the candidates ranked at the last level, z = Φ⁻¹(1 − 0.025/m)
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - 0.025 / got["candidates"])
    assert got["candidates"] == ref.discovery.candidates[-1] > 1000
    for h in got["found"]:
        assert abs(h["adjusted_ci_low"] - (h["estimate"] - z * h["std_error"])) < 1e-9 * abs(h["estimate"]) + 1e-9
    # the answer is the typed model the OpenAPI schema names, field for field
    from estimator.service.app import response_models

    model = response_models()["discovered"]
    assert model.model_validate(got).model_dump() == got
    op = api(fp, "/openapi.json")["paths"]["/v1/heavy-hitters/{metric}"]["get"]["responses"]
    assert op["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/DiscoveredBody")
    again = api(fp, f"/v1/heavy-hitters/{METRIC}", day=day, top=20)
    assert again["cached"] is True and again["found"] == got["found"]


def test_discovery_api_refuses_bad_requests(fed_pipeline: FedPipeline) -> None:
    fp = fed_pipeline
    url = f"{fp.url}/v1/heavy-hitters"
    r = httpx.get(f"{url}/{METRIC}", params={"day": "yesterday-ish"})
    assert r.status_code == 400 and "day" in r.json()["detail"]
    assert httpx.get(f"{url}/{METRIC}", params={"top": 0}).status_code == 422
    r = httpx.get(f"{url}/settings_tab")
    assert r.status_code == 400 and "ldp estimate" in r.json()["detail"]
    r = httpx.get(f"{url}/no_such_metric")
    assert r.status_code == 404 and "no part files" in r.json()["detail"]


def test_without_a_dataset_the_api_says_so() -> None:
    from fastapi.testclient import TestClient

    from estimator.service import EstimatorState, Tally, create_app

    state = EstimatorState(Tally(), {}, [], "shuffled", "g", "m")
    r = TestClient(create_app(state=lambda: state)).get(f"/v1/heavy-hitters/{METRIC}")
    assert r.status_code == 404 and "--dataset" in r.json()["detail"]


def test_heavy_hitter_view_shows_the_discovered_values(fed_pipeline: FedPipeline, page: Any, tmp_path: Path) -> None:
    fp = fed_pipeline
    day = fp.days[-1]
    open_page(page, fp, METRIC, day, "heavy_hitters")
    est = api(fp, f"/v1/estimates/{METRIC}", day=day)
    found = api(fp, f"/v1/heavy-hitters/{METRIC}", day=day, spec_id=est["spec_id"], top=HH_TOP)
    assert card_value(page, "n") == str(est["n"])
    assert card_value(page, "hh-source") == str(found["n"])
    assert float(card_value(page, "central-epsilon") or "nan") == est["central_epsilon"]

    rows = table(page)
    want = found["found"][:ROWS_SHOWN]
    # by default only values that stand out from the noise are listed (none greyed)
    assert len(rows) == len(want) >= 1 and found["include_noise"] is False
    assert found["significant"] >= len(found["found"]) and not any(r["grey"] for r in rows)
    assert not any(h["could_be_noise"] for h in found["found"])
    # the "could be noise" box lists the rest too, greyed
    page.check("#noise")
    page.wait_for_function("document.getElementById('chart-title').textContent.includes('grey: could be noise')")
    found = api(fp, f"/v1/heavy-hitters/{METRIC}", day=day, spec_id=est["spec_id"], top=HH_TOP, include_noise="true")
    assert found["include_noise"] is True and len(found["found"]) == HH_TOP
    rows = table(page)
    want = found["found"][:ROWS_SHOWN]
    assert len(rows) == len(want) > 5
    for r, h in zip(rows, want):
        c = r["cells"]
        # device-supplied text is shown with control characters escaped (pipeline/text.py's rule)
        assert c["value"]["text"] == printable(h["value"]) and r["key"] == h["value"]
        check_cell(c["estimate"], h["estimate"], 1)
        check_cell(c["std_error"], h["std_error"], 1)
        check_cell(c["ci_low"], h["ci_low"], 1)
        check_cell(c["ci_high"], h["ci_high"], 1)
        check_cell(c["frequency"], h["frequency"], 2, scale=100.0)
        check_cell(c["adjusted_ci_low"], h["adjusted_ci_low"], 1)
        assert h["adjusted_ci_low"] <= h["ci_low"]
        assert r["grey"] == (h["adjusted_ci_low"] <= 0) == h["could_be_noise"]
        assert c["includes_zero"]["text"] == ("yes" if includes_zero(h["ci_low"], h["ci_high"]) else "no")
    # all rows: the tail of the list holds candidates the noise put there; their own 95% intervals often
    # exclude 0 (each is the best of thousands of noisy candidates), the selection-adjusted ones do not
    page.select_option("#rows", "0")
    page.wait_for_function(f"document.querySelectorAll('#table tbody tr').length === {len(found['found'])}")
    every = table(page)
    assert [r["grey"] for r in every] == [h["adjusted_ci_low"] <= 0 for h in found["found"]]
    assert any(r["grey"] for r in every) and not all(r["grey"] for r in every)
    page.select_option("#rows", str(ROWS_SHOWN))
    page.wait_for_function(f"document.querySelectorAll('#table tbody tr').length === {len(want)}")
    labels = page.eval_on_selector_all("#chart g.point", "gs => gs.map(g => g.dataset.label)")
    assert labels == [h["value"] for h in want]

    # the series: each day's own discovery of the selected day's top 5
    lines = page.eval_on_selector_all("#series g.line", "gs => gs.map(g => g.dataset.name)")
    assert lines == [h["value"] for h in want[:5]]

    with page.expect_download() as dl:
        page.click("#download")
    path = tmp_path / "hh.csv"
    dl.value.save_as(path)
    assert dl.value.suggested_filename == f"{METRIC}-{est['date']}.csv"
    with path.open(newline="") as f:
        got = list(csv.DictReader(f))
    assert [g["value"] for g in got] == [h["value"] for h in want]
    for g, h in zip(got, want):
        assert (g["metric"], g["date"], g["kind"], g["source"]) == (METRIC, est["date"], "heavy_hitters", "dataset")
        assert (float(g["estimate"]), float(g["ci_low"]), float(g["ci_high"])) == (
            h["estimate"],
            h["ci_low"],
            h["ci_high"],
        )

    shot = SHOT if os.environ.get("LDP_DOCS_SCREENSHOTS") == "1" else tmp_path / SHOT.name
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_a_dataset_the_page_shows_the_streams_prefixes(
    fed_pipeline: FedPipeline, page: Any, tmp_path: Path
) -> None:
    """The same counts served without ``--dataset`` (a fixed copy of the live estimator's state): the view
    falls back to PEM's first-level prefixes from the stream, says why, and its CSV says ``source=stream``."""
    from estimator.service import EstimatorState, create_app
    from ldp_core.metrics import load_metrics
    from simulator.stack import serve_in_thread
    from tests.dashboard.conftest import METRICS

    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    defs = load_metrics(tmp_path / "metrics.json")
    state = EstimatorState.from_json_obj(api(fed_pipeline, "/v1/state"))
    server, url, thread = serve_in_thread(create_app(state=lambda: state, metrics=defs), lifespan="off")
    try:
        fixed = FedPipeline(url, fed_pipeline.days, fed_pipeline.metrics, fed_pipeline.reports, fed_pipeline.dataset)
        day = fixed.days[-1]
        open_page(page, fixed, METRIC, day, "heavy_hitters")
        est = api(fixed, f"/v1/estimates/{METRIC}", day=day)
        assert est["discovery_url"] is None and "--dataset" in est["discovery"]
        assert api(fed_pipeline, f"/v1/estimates/{METRIC}", day=day)["discovery_url"] == f"v1/heavy-hitters/{METRIC}"
        prefixes = est["first_level_prefixes"][:ROWS_SHOWN]
        rows = table(page)
        assert [r["key"] for r in rows] == [p[0] for p in prefixes] and len(rows) > 0
        for r, p in zip(rows, prefixes):
            assert r["cells"]["bits"]["text"] == str(p[1])
            check_cell(r["cells"]["estimate"], p[2], 1)
            assert r["grey"] == p[5]  # could be noise, Bonferroni over all first-level prefixes
            assert p[5] or not includes_zero(p[3], p[4])
        assert "--dataset" in page.inner_text("#chart-title")
        assert page.get_attribute('[data-testid="hh-source"] .v', "data-value") is None
        with page.expect_download() as dl:
            page.click("#download")
        path = tmp_path / "prefixes.csv"
        dl.value.save_as(path)
        with path.open(newline="") as f:
            got = list(csv.DictReader(f))
        assert [g["prefix"] for g in got] == [p[0] for p in prefixes]
        assert {g["source"] for g in got} == {"stream"}
    finally:
        server.should_exit = True
        thread.join(timeout=10)
