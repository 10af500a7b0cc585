"""The JSON the dashboard reads besides the estimates: ``/v1/freshness`` and ``/v1/metrics``, and the page's
files (no browser here; the browser tests are ``test_dashboard.py``)."""

from __future__ import annotations

import httpx

from estimator.service.dashboard import ASSETS, asset
from tests.dashboard.conftest import METRICS, FedPipeline
from tests.dashboard.test_dashboard import api, settled_freshness


def test_freshness_offsets_account_for_every_shuffled_batch(fed_pipeline: FedPipeline) -> None:
    fp = fed_pipeline
    fresh = settled_freshness(fp)
    # each record of the shuffled topic is one shuffled batch and offsets start at 0, so once everything is
    # committed the partitions' offsets add up to the batches the estimates count
    batches = sum(e["batches"] for e in api(fp, "/v1/estimates")["estimates"])
    assert sum(p["committed"] for p in fresh["partitions"]) == batches > 0
    assert fresh["snapshot_time"] <= fresh["now"]
    assert len({p["topic"] for p in fresh["partitions"]}) == 1


def test_metrics_lists_the_definitions(fed_pipeline: FedPipeline) -> None:
    got = {m["name"]: m for m in api(fed_pipeline, "/v1/metrics")["metrics"]}
    assert sorted(got) == sorted(METRICS["metrics"])
    for name, m in METRICS["metrics"].items():
        assert got[name]["max_reports_per_day"] == m["max_reports_per_day"]
        assert got[name]["epsilon"] == m["mechanism"]["epsilon"]
        assert got[name]["kind"] == m.get("kind", "frequency")


def test_page_and_assets_are_served_and_nothing_else(fed_pipeline: FedPipeline) -> None:
    url = fed_pipeline.url
    page = httpx.get(url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.content == asset("index.html")
    # the page loads only files of this service (no CDN): every src/href is relative or a data: URL
    for name in ("dashboard.js", "dashboard.css"):
        assert f'"dashboard/{name}"' in page.text
        r = httpx.get(f"{url}/dashboard/{name}")
        assert r.status_code == 200 and r.content == asset(name) and r.headers["content-type"] == ASSETS[name]
    assert "http://" not in page.text and "https://" not in page.text
    assert "http" not in asset("dashboard.js").decode().replace("http://www.w3.org/2000/svg", "")
    for bad in ("index.html", "..%2Fapp.py", "__init__.py", "nope.js"):
        assert httpx.get(f"{url}/dashboard/{bad}").status_code == 404, bad


def test_freshness_of_a_fixed_state() -> None:
    """Without an engine, the offsets come from the state: committed ranges and restored (uncertain) tails
    count as committed; an open tail starts at the committed offset and has been read to its end."""
    from fastapi.testclient import TestClient

    from estimator.service import EstimatorState, Tail, Tally, create_app
    from pipeline.transport.base import TopicPartition

    a, b = TopicPartition("shuffled", 0), TopicPartition("shuffled", 1)
    state = EstimatorState(
        Tally(),
        {a: [[0, 10, 1.0], [12, 20, 2.0]], b: []},
        [Tail(a, 20, 25, 3.0, Tally(), "uncertain"), Tail(b, 5, 9, 4.0, Tally(), "open")],
        "shuffled",
        "g",
        "m",
    )
    body = TestClient(create_app(state=lambda: state)).get("/v1/freshness").json()
    assert body["snapshot_time"] is None and body["state"] == "fixed" and body["ready"] is True
    assert [(p["partition"], p["committed"], p["read"]) for p in body["partitions"]] == [(0, 25, 25), (1, 5, 9)]
    assert (body["group"], body["member"]) == ("g", "m")


def test_estimates_flag_noise_and_take_postprocess(fed_pipeline: FedPipeline) -> None:
    """A frequency answer carries could_be_noise and adjusted_ci_low (Bonferroni over the d items, from the
    unbiased counts); ``postprocess=norm-sub`` is ``norm_sub=true``; a bad postprocess value is a 422."""
    fp = fed_pipeline
    day = fp.days[-1]
    plain = api(fp, "/v1/estimates/emoji_used", day=day)
    ns = api(fp, "/v1/estimates/emoji_used", day=day, postprocess="norm-sub")
    assert ns == api(fp, "/v1/estimates/emoji_used", day=day, norm_sub="true")
    assert ns["postprocessing"] == "norm-sub" and plain["noise_rule"] == "bonferroni"
    assert ns["could_be_noise"] == plain["could_be_noise"] and ns["adjusted_ci_low"] == plain["adjusted_ci_low"]
    assert min(ns["counts"]) >= 0 and abs(sum(ns["counts"]) - ns["n"]) < 1e-6 * ns["n"]
    for lo, adj, z in zip(plain["ci_low"], plain["adjusted_ci_low"], plain["could_be_noise"], strict=True):
        assert adj <= lo and z == (adj <= 0) and (z or lo > 0)
    assert any(plain["could_be_noise"]) and not all(plain["could_be_noise"])
    assert httpx.get(f"{fp.url}/v1/estimates/emoji_used", params={"postprocess": "clip"}).status_code == 422
