"""Reads answer for the whole estimator group: two real members over HTTP, one of them stopped."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from estimator.service import StreamingEstimator, create_app
from estimator.service.state import Tally
from pipeline.catalog import SpecCatalog
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import open_transport
from simulator.stack import serve_in_thread
from tests.support.shuffled_data import default_specs, make_batches, offline, publish

DAYS = [20400, 20401]


@pytest.fixture
def transport(tmp_path: Path):  # type: ignore[no-untyped-def]
    t = open_transport(f"sqlite:///{tmp_path}/log.sqlite3", synchronous="NORMAL")
    t.create_topic(SHUFFLED_TOPIC, 4)
    yield t
    t.close()


def _two_members(tmp_path: Path, transport, batches):  # type: ignore[no-untyped-def]
    cat = SpecCatalog(specs=list(default_specs().items()))
    a = StreamingEstimator(transport, tmp_path / "a", cat, group="g", member="a", checkpoint_seconds=0.05)
    b = StreamingEstimator(transport, tmp_path / "b", cat, group="g", member="b", checkpoint_seconds=0.05)
    a.poll_once(timeout=0.5)
    b.poll_once(timeout=0.5)  # b joins: the group splits the partitions
    stop = threading.Event()
    threads = [threading.Thread(target=e.run, kwargs={"stop": stop}) for e in (a, b)]
    for t in threads:
        t.start()
    total = sum(len(x) for x in batches)
    t0 = time.monotonic()
    # until both members committed their shares (a first read everything, then lost half in b's rebalance)
    while a.state().certain.n + b.state().certain.n < total and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(30)
    return a, b


def _keys(t: Tally) -> set[tuple[str, str, int]]:
    return set(t.keys)


def test_every_read_answers_for_the_group_and_partially_while_a_peer_is_down(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    batches = make_batches(specs, DAYS, 40, np.random.default_rng(11))
    publish(transport, SHUFFLED_TOPIC, batches)
    a, b = _two_members(tmp_path, transport, batches)
    expect = offline(batches)
    only_a, only_b = _keys(a.counted()), _keys(b.counted())
    assert only_a and only_b and not (only_a & only_b), "the group did not split the metric-days"
    peers_a: list[str] = []
    peers_b: list[str] = []
    server_b, url_b, thread_b = serve_in_thread(create_app(b, peers=peers_b, peer_timeout=2.0), lifespan="off")
    server_a, url_a, thread_a = serve_in_thread(create_app(a, peers=peers_a, peer_timeout=2.0), lifespan="off")
    peers_a.append(url_b)
    peers_b.append(url_a)
    try:
        for url in (url_a, url_b):  # either member, no parameter: the whole group
            listing = httpx.get(url + "/v1/estimates").json()
            assert {(e["metric"], e["spec_id"], e["day"]) for e in listing["estimates"]} == set(expect)
            assert listing["merged_instances"] == 2 and listing["partial"] is False
            assert listing["missing_peers"] == []
            for metric, spec_id, day in expect:
                body = httpx.get(f"{url}/v1/estimates/{metric}", params={"day": day}).json()
                acc = expect[(metric, spec_id, day)]
                assert body["n"] == acc.n and body["merged_instances"] == 2 and body["partial"] is False
                if body["kind"] == "frequency":
                    assert body["counts"] == acc.estimate().counts.tolist()
        # freshness answers for the group too: every member's partitions, the oldest snapshot
        own = {u: httpx.get(u + "/v1/freshness", params={"merged": "false"}).json() for u in (url_a, url_b)}
        assert {m: [p["member"] for p in own[u]["partitions"]] for u, m in ((url_a, "a"), (url_b, "b"))} == {
            "a": ["a"] * len(own[url_a]["partitions"]),
            "b": ["b"] * len(own[url_b]["partitions"]),
        }
        assert own[url_a]["partitions"] and own[url_b]["partitions"]
        for url, other in ((url_a, url_b), (url_b, url_a)):
            fresh = httpx.get(url + "/v1/freshness").json()
            assert fresh["merged_instances"] == 2 and fresh["partial"] is False and fresh["missing_peers"] == []
            group_parts = sorted(own[url_a]["partitions"] + own[url_b]["partitions"], key=lambda p: p["partition"])
            assert sorted(fresh["partitions"], key=lambda p: p["partition"]) == group_parts
            assert len({p["partition"] for p in fresh["partitions"]}) == len(fresh["partitions"])  # each once
            assert fresh["snapshot_time"] == min(own[u]["snapshot_time"] for u in own)
            assert fresh["member"] == own[url]["member"]  # who answered
            assert [(m["member"], m["url"]) for m in fresh["members"]] == [
                (own[url]["member"], None),
                (own[other]["member"], other),
            ]
            assert sum(p["committed"] for p in fresh["partitions"]) == len(batches)  # one record per batch
        # the local-only form stays, and so does the old merged=true spelling
        local = httpx.get(url_a + "/v1/estimates", params={"merged": "false"}).json()
        assert {(e["metric"], e["spec_id"], e["day"]) for e in local["estimates"]} == only_a
        assert local["merged_instances"] == 1
        metric, spec_id, day = sorted(only_b)[0]
        r = httpx.get(f"{url_a}/v1/estimates/{metric}", params={"day": day, "merged": "false"})
        assert r.status_code == 404
        r = httpx.get(f"{url_a}/v1/estimates/{metric}", params={"day": day, "merged": "true"})
        assert r.status_code == 200 and r.json()["n"] == expect[(metric, spec_id, day)].n

        server_b.should_exit = True  # member b goes away: a answers with what it holds, marked partial
        thread_b.join(30)
        listing = httpx.get(url_a + "/v1/estimates").json()
        assert {(e["metric"], e["spec_id"], e["day"]) for e in listing["estimates"]} == only_a
        assert listing["partial"] is True and listing["missing_peers"] == [url_b]
        assert listing["merged_instances"] == 1
        metric, spec_id, day = sorted(only_a)[0]
        r = httpx.get(f"{url_a}/v1/estimates/{metric}", params={"day": day})
        assert r.status_code == 200
        body = r.json()
        assert body["partial"] is True and body["missing_peers"] == [url_b]
        assert body["n"] == expect[(metric, spec_id, day)].n  # a key a holds alone is still whole
        fresh = httpx.get(url_a + "/v1/freshness").json()  # a's partitions only, marked partial
        assert fresh["partial"] is True and fresh["missing_peers"] == [url_b] and fresh["merged_instances"] == 1
        assert fresh["partitions"] == own[url_a]["partitions"] and [m["member"] for m in fresh["members"]] == ["a"]
        metric, spec_id, day = sorted(only_b)[0]
        r = httpx.get(f"{url_a}/v1/estimates/{metric}", params={"day": day})
        assert r.status_code == 404 and url_b in r.json()["detail"]
    finally:
        server_a.should_exit = True
        server_b.should_exit = True
        thread_a.join(30)
        a.close()
        b.close()
