"""The streaming estimator on the embedded transport: exact counts, restarts, instances, HTTP."""

from __future__ import annotations

import datetime
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from estimator.service import EstimatorState, StateError, StreamingEstimator, Tail, Tally, create_app, merge_states
from ldp_core.mechanisms import make_spec
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import TopicPartition, open_transport
from tests.support.shuffled_data import default_specs, envelope_of, make_batches, offline, publish

DAYS = [20400, 20401]


@pytest.fixture
def transport(tmp_path: Path):  # type: ignore[no-untyped-def]
    t = open_transport(f"sqlite:///{tmp_path}/log.sqlite3", synchronous="NORMAL")
    t.create_topic(SHUFFLED_TOPIC, 4)
    yield t
    t.close()


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def any_transport(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    """``(transport, topic)``: the embedded log, or the Kafka broker with a topic of this test's own."""
    if request.param == "embedded":
        t = open_transport(f"sqlite:///{tmp_path}/log.sqlite3", synchronous="NORMAL")
        topic = SHUFFLED_TOPIC
    else:
        t = open_transport(f"kafka://{request.getfixturevalue('kafka_bootstrap')}")
        topic = f"{SHUFFLED_TOPIC}.{uuid.uuid4().hex[:10]}"
    t.create_topic(topic, 4)
    yield t, topic
    t.close()


def catalog(specs: dict) -> SpecCatalog:  # type: ignore[type-arg]
    return SpecCatalog(specs=list(specs.items()))


def assert_exact(tally: Tally, batches: list[ReportBatch]) -> None:
    """Same keys, same integer sums, hence bit-identical estimates."""
    expect = offline(batches)
    assert set(tally.keys) == set(expect)
    for key, acc in expect.items():
        got = tally.keys[key].acc
        assert got.n == acc.n, key
        for name, arr in acc.sums.items():
            np.testing.assert_array_equal(got.sums[name], arr, err_msg=str(key))
        np.testing.assert_array_equal(got.estimate().counts, acc.estimate().counts)


def test_counts_equal_the_offline_estimator(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    batches = make_batches(specs, DAYS, 30, np.random.default_rng(1))
    publish(transport, SHUFFLED_TOPIC, batches)
    with StreamingEstimator(transport, tmp_path / "st", catalog(specs), checkpoint_seconds=0.1) as est:
        stats = est.run(idle_timeout=0.5)
        assert stats.reports == sum(len(b) for b in batches)
        assert_exact(est.counted(), batches)
        ks = est.counted().keys[("m_oue", specs["m_oue"].spec_id, DAYS[0])]
        assert ks.batches == sum(1 for b in batches if b.metric == "m_oue" and b.day == DAYS[0])
        assert ks.central_epsilon == 0.25 and ks.central_delta == 1e-6


def test_restart_continues_without_loss_or_double_count(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    batches = make_batches(specs, DAYS, 40, np.random.default_rng(2))
    publish(transport, SHUFFLED_TOPIC, batches[:25])
    with StreamingEstimator(transport, tmp_path / "st", catalog(specs), checkpoint_seconds=0.05) as est:
        est.run(idle_timeout=0.4)
        member = est.member
    publish(transport, SHUFFLED_TOPIC, batches[25:])
    with StreamingEstimator(transport, tmp_path / "st", catalog(specs), checkpoint_seconds=0.05) as again:
        assert again.member == member  # kept in the state folder
        again.run(idle_timeout=0.4)
        assert_exact(again.counted(), batches)


class _Crash(Exception):
    pass


def _crash_at_commit(est: StreamingEstimator) -> None:
    def crash(offsets=None):  # type: ignore[no-untyped-def]
        raise _Crash

    est.consumer.commit = crash  # type: ignore[method-assign]


def _abandon(est: StreamingEstimator) -> None:
    """What kill -9 leaves: the snapshot on disk, no checkpoint, no goodbye to the group."""
    if est._consumer is not None:
        est._consumer.close()
        est._consumer = None
    est.store.close()


def test_crash_between_snapshot_and_commit_recounts_the_tail(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    batches = make_batches(specs, DAYS, 30, np.random.default_rng(3))
    publish(transport, SHUFFLED_TOPIC, batches)
    est = StreamingEstimator(transport, tmp_path / "st", catalog(specs), checkpoint_seconds=1e9)
    while est.poll_once(max_records=7, timeout=0.3):
        pass
    _crash_at_commit(est)
    with pytest.raises(_Crash):
        est.checkpoint()  # the snapshot with pending tails is on disk; the commit never happened
    _abandon(est)
    with StreamingEstimator(transport, tmp_path / "st", catalog(specs), checkpoint_seconds=0.05) as again:
        again.run(idle_timeout=0.5)
        assert again.stats.discarded_pending > 0 and again.stats.restored_uncertain == 0
        assert_exact(again.counted(), batches)


def test_crash_after_commit_keeps_the_committed_tail(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    batches = make_batches(specs, DAYS, 30, np.random.default_rng(4))
    publish(transport, SHUFFLED_TOPIC, batches[:18])
    est = StreamingEstimator(transport, tmp_path / "st", catalog(specs), checkpoint_seconds=1e9)
    while est.poll_once(max_records=50, timeout=0.3):
        pass
    assert est.checkpoint()  # snapshot (pending tails), commit succeeded; the fold is not on disk yet
    _abandon(est)
    publish(transport, SHUFFLED_TOPIC, batches[18:])
    with StreamingEstimator(transport, tmp_path / "st", catalog(specs), checkpoint_seconds=0.05) as again:
        again.run(idle_timeout=0.5)
        assert again.stats.restored_uncertain > 0 and again.stats.discarded_pending == 0
        assert_exact(again.counted(), batches)
        merged = merge_states([again.state()])  # alone, uncertain tails count
        assert_exact(merged, batches)


def test_instances_of_one_group_merge_to_the_single_instance_result(tmp_path: Path, any_transport) -> None:  # type: ignore[no-untyped-def]
    """Three members join one group at different times while batches flow (rebalances move partitions
    with uncommitted tails); the merge of their states equals one instance reading everything."""
    transport, topic = any_transport
    specs = default_specs()
    batches = make_batches(specs, DAYS, 60, np.random.default_rng(5))
    publish(transport, topic, batches[:20])
    cat = catalog(specs)
    group = f"g-multi-{uuid.uuid4().hex[:8]}"
    ests = [
        StreamingEstimator(
            transport,
            tmp_path / f"st{i}",
            cat,
            topic=topic,
            group=group,
            member=f"e{i}",
            checkpoint_seconds=0.05,
            session_timeout=2.0,
        )
        for i in range(3)
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=e.run, kwargs={"stop": stop, "max_records": 2}) for e in ests]
    threads[0].start()
    time.sleep(0.3)
    publish(transport, topic, batches[20:40])
    threads[1].start()
    time.sleep(0.3)
    threads[2].start()
    t0 = time.monotonic()
    while not _split_among_all(ests, 4):  # every member owns partitions, so the next batches spread
        assert time.monotonic() - t0 < 45, "the group never settled on three members"
        time.sleep(0.05)
    publish(transport, topic, batches[40:])  # their keys fall in partitions 1, 2 and 3
    total = sum(len(b) for b in batches)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 45 and merge_states([e.state() for e in ests]).n < total:
        time.sleep(0.1)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(30)
    states = [e.state() for e in ests]
    for e in ests:
        e.close()
    assert sum(1 for s in states if s.certain.n) >= 2, "the partitions were not split"
    merged = merge_states([EstimatorState.from_json_obj(s.to_json_obj()) for s in states])
    with StreamingEstimator(
        transport,
        tmp_path / "single",
        cat,
        topic=topic,
        group=f"g-single-{uuid.uuid4().hex[:8]}",
        checkpoint_seconds=0.1,
    ) as one:
        one.run(idle_timeout=2.0)
        single = one.counted()
    assert_exact(single, batches)
    assert_exact(merged, batches)


def _split_among_all(ests: list[StreamingEstimator], partitions: int) -> bool:
    owned = [e._consumer.assignment() if e._consumer is not None else frozenset() for e in ests]
    return all(owned) and sum(len(o) for o in owned) == partitions and len(frozenset().union(*owned)) == partitions


def test_merged_endpoint_asks_the_peers(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    from simulator.stack import serve_in_thread

    specs = default_specs()
    batches = make_batches(specs, DAYS, 24, np.random.default_rng(9))
    publish(transport, SHUFFLED_TOPIC, batches)
    cat = catalog(specs)
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
    while merge_states([a.state(), b.state()]).n < total and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(30)
    server, url, _ = serve_in_thread(create_app(b), lifespan="off")
    try:
        client = TestClient(create_app(a, peers=[url]))
        ((key, acc),) = offline([x for x in batches if x.metric == "m_olh" and x.day == DAYS[1]]).items()
        body = client.get("/v1/estimates/m_olh", params={"day": DAYS[1], "merged": True}).json()
        assert body["merged_instances"] == 2 and body["n"] == acc.n
        assert body["counts"] == acc.estimate().counts.tolist()
    finally:
        server.should_exit = True
        a.close()
        b.close()


def _tail(tp: TopicPartition, base: int, end: int, started: float, spec, rng, status: str = "uncertain") -> Tail:  # type: ignore[no-untyped-def]
    t = Tally()
    t.add("m", 1, spec, spec.encode(rng.integers(0, spec.domain_size, 10), rng), None)
    return Tail(tp, base, end, started, t, status)


def test_merge_drops_an_uncertain_tail_that_another_member_recounted() -> None:
    """A crashed between snapshot and commit ([10, 20) pending, resolved uncertain), B took the
    partition over at the committed offset 10: B's later range starting inside A's tail proves
    A's commit never happened, so A's tail is dropped; without B it counts."""
    spec = make_spec("grr", epsilon=1.0, domain_size=4)
    rng = np.random.default_rng(0)
    tp = TopicPartition("t", 0)
    a_tail = _tail(tp, 10, 20, 100.0, spec, rng)
    a = EstimatorState(Tally(), {tp: [[0, 10, 50.0]]}, [a_tail], "t", "g", "a")
    b_tally = Tally()
    b_tally.add("m", 1, spec, spec.encode(rng.integers(0, 4, 25), rng), None)
    b = EstimatorState(b_tally, {tp: [[10, 30, 200.0]]}, [], "t", "g", "b")
    assert merge_states([a, b]).n == 25
    assert merge_states([a]).n == 10
    later_start = EstimatorState(b_tally, {tp: [[20, 30, 200.0]]}, [], "t", "g", "b")  # A's commit succeeded
    assert merge_states([a, later_start]).n == 35
    earlier = _tail(tp, 10, 15, 300.0, spec, rng)  # two uncertain tails: only the later start voids
    c = EstimatorState(Tally(), {}, [earlier], "t", "g", "c")
    assert merge_states([a, c]).n == 10
    overlapping = EstimatorState(b_tally, {tp: [[5, 12, 200.0]]}, [], "t", "g", "b")
    with pytest.raises(StateError):
        merge_states([a, overlapping])
    with pytest.raises(StateError):
        merge_states([a, EstimatorState(Tally(), {}, [], "t", "other-group", "x")])


def test_http_estimates(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    batches = make_batches(specs, DAYS, 18, np.random.default_rng(7))
    second = make_spec("grr", epsilon=0.5, domain_size=6)
    rng = np.random.default_rng(8)
    other = ReportBatch("m_grr", second, DAYS[1], second.encode(rng.integers(0, 6, 80), rng))
    publish(transport, SHUFFLED_TOPIC, batches)
    transport.publish(SHUFFLED_TOPIC, b"m_grr/x", envelope_of(other))
    cat = catalog(specs)
    cat.add("m_grr", second)
    with StreamingEstimator(transport, tmp_path / "st", cat, checkpoint_seconds=0.1) as est:
        est.run(idle_timeout=0.5)
        client = TestClient(create_app(est))
        iso = (datetime.date(1970, 1, 1) + datetime.timedelta(days=DAYS[0])).isoformat()
        r = client.get("/v1/estimates/m_oue", params={"day": iso})
        assert r.status_code == 200, r.text
        body = r.json()
        acc = offline([b for b in batches if b.metric == "m_oue" and b.day == DAYS[0]])
        ((key, want),) = acc.items()
        e = want.estimate()
        assert body["day"] == DAYS[0] and body["date"] == iso and body["n"] == want.n and body["spec_id"] == key[1]
        assert body["counts"] == e.counts.tolist()
        assert body["ci_low"] == e.ci_low.tolist() and body["ci_high"] == e.ci_high.tolist()
        assert body["epsilon"] == 1.0 and body["central_epsilon"] == 0.25 and body["central_delta"] == 1e-6
        latest = client.get("/v1/estimates/m_oue").json()
        assert latest["day"] == max(DAYS)
        assert client.get("/v1/estimates/nope").status_code == 404
        assert client.get("/v1/estimates/m_oue", params={"day": "yesterday"}).status_code == 400
        assert client.get("/v1/estimates/m_grr", params={"day": DAYS[1]}).status_code == 409
        one = client.get("/v1/estimates/m_grr", params={"day": DAYS[1], "spec_id": second.spec_id}).json()
        assert one["n"] == 80 and one["central_epsilon"] == 0.25
        ns = client.get("/v1/estimates/m_oue", params={"day": DAYS[0], "norm_sub": True}).json()
        assert min(ns["counts"]) >= 0 and abs(sum(ns["counts"]) - want.n) < 1e-6 * want.n
        listing = client.get("/v1/estimates").json()["estimates"]
        assert sum(x["n"] for x in listing) == sum(len(b) for b in batches) + 80
        state = EstimatorState.from_json_obj(client.get("/v1/state").json())
        assert state.counted().n == sum(len(b) for b in batches) + 80
        prom = client.get("/metrics")
    assert prom.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(prom.text)}
    assert families["ldp_estimator_reports"].type == "counter"
    assert families["ldp_estimator_reports"].samples[0].name == "ldp_estimator_reports_total"
    assert families["ldp_estimator_reports"].samples[0].value == sum(len(b) for b in batches) + 80
    assert families["ldp_estimator_last_checkpoint"].type == "gauge"


def test_state_folder_of_another_group_is_refused(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    cat = catalog(default_specs())
    StreamingEstimator(transport, tmp_path / "st", cat, group="g1").close()
    with pytest.raises(StateError):
        StreamingEstimator(transport, tmp_path / "st", cat, group="g2")


def test_settings_come_from_keywords_over_the_environment_over_defaults(  # type: ignore[no-untyped-def]
    tmp_path: Path, transport
) -> None:
    from estimator.service import EstimatorSettings
    from pipeline.errors import ConfigError

    settings = EstimatorSettings.from_env({"LDP_ESTIMATOR_CHECKPOINT_SECONDS": "3", "LDP_ESTIMATOR_GROUP": "g-env"})
    assert (settings.checkpoint_seconds, settings.group) == (3.0, "g-env")
    with StreamingEstimator(
        transport, tmp_path / "st", catalog(default_specs()), settings, checkpoint_seconds=0.5, member="m"
    ) as est:
        assert (est.group, est.member, est.checkpoint_seconds) == ("g-env", "m", 0.5)
    with pytest.raises(ConfigError, match="partitions"):
        EstimatorSettings(partitions=0)


def test_openapi_types_every_answer(tmp_path: Path, transport) -> None:  # type: ignore[no-untyped-def]
    """The served schema names a typed model for each answer, and the real answers satisfy it exactly."""
    from estimator.service.app import response_models

    specs = default_specs()
    publish(transport, SHUFFLED_TOPIC, make_batches(specs, DAYS[:1], 6, np.random.default_rng(3)))
    with StreamingEstimator(transport, tmp_path / "st", catalog(specs), checkpoint_seconds=0.1) as est:
        est.run(idle_timeout=0.5)
        client = TestClient(create_app(est))
        schema = client.get("/openapi.json").json()
        comps = schema["components"]["schemas"]
        op = schema["paths"]["/v1/estimates/{metric}"]["get"]["responses"]
        s200 = op["200"]["content"]["application/json"]["schema"]
        refs = {x["$ref"].rsplit("/", 1)[1] for x in s200.get("anyOf", [s200])}
        assert {"EstimateBody", "MeanBody", "DistributionBody"} <= refs  # frequency, mean and distribution answers
        props = comps["EstimateBody"]["properties"]
        assert {"counts", "std_error", "ci_low", "ci_high", "central_epsilon", "spec_id", "n"} <= set(props)
        assert props["counts"]["type"] == "array" and props["n"]["type"] == "integer"
        for code in ("400", "404", "409", "422"):  # no 502: a silent peer makes a partial answer
            err = op[code]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
            assert "detail" in comps[err]["properties"], code
        listing_ref = schema["paths"]["/v1/estimates"]["get"]["responses"]["200"]["content"]["application/json"]
        assert listing_ref["schema"]["$ref"].endswith("/AvailableList")
        models = response_models()
        body = client.get("/v1/estimates/m_oue").json()
        models["estimate"].model_validate(body)  # extra="forbid": a key the schema does not name fails here
        assert set(body) - {"labels"} == set(models["estimate"].model_fields) - {"labels"}
        models["available"].model_validate(client.get("/v1/estimates").json())
        missing = client.get("/v1/estimates/nope")
        assert missing.status_code == 404 and set(missing.json()) == {"detail"}
