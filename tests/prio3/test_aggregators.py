"""Prio3 end to end on real components over HTTP: devices (client_sdk.prio3: shard, seal, outbox, upload), the
FastAPI collector on the embedded log, the leader reading the log and driving the helper over HTTP, the
collector's combine step. And the adversaries the design names: a replaying client, a client sending an
invalid proof or garbage, a helper that deviates from the protocol."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from client_sdk.prio3 import Prio3Client
from collector.aggregator.collect import CollectionRejected
from ldp_core.days import utc_day
from ldp_core.prio3.report import CTX, Prio3Spec, share_info
from ldp_core.prio3.vdaf import NONCE_SIZE
from ldp_core.wire import hpke
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, ReportBatch, encode_frame
from simulator.prio3.stack import Deployment, Prio3Stack, new_deployment

METRICS = {
    "p.count": {"type": "count"},
    "p.sum": {"type": "sum", "max_measurement": 100},
    "p.hist": {"type": "histogram", "length": 5},
    "p.vec": {"type": "sumvec", "max_measurement": 7, "length": 3},
}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    return new_deployment(tmp_path_factory.mktemp("ops"), METRICS)


@pytest.fixture
def stack(deployment: Deployment, tmp_path: Path) -> Iterator[Prio3Stack]:
    with Prio3Stack(deployment, tmp_path / "run") as st:
        yield st


def _values(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "p.count": int(rng.integers(0, 2)),
        "p.sum": int(rng.integers(0, 101)),
        "p.hist": int(rng.integers(0, 5)),
        "p.vec": [int(x) for x in rng.integers(0, 8, 3)],
    }


def _add(truth: dict[str, Any], name: str, v: Any) -> None:
    if name == "p.hist":
        truth[name][v] += 1
    elif name == "p.vec":
        truth[name] = [a + b for a, b in zip(truth[name], v, strict=True)]
    else:
        truth[name] += v


def _empty() -> dict[str, Any]:
    return {"p.count": 0, "p.sum": 0, "p.hist": [0] * 5, "p.vec": [0] * 3}


def _devices(st: Prio3Stack, tmp: Path, n: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    truth = _empty()
    for i in range(n):
        dev = Prio3Client(st.metrics, tmp / f"dev{seed}-{i}", st.collector_url)
        for name, v in _values(rng).items():
            assert dev.record(name, v)
            _add(truth, name, v)
        assert dev.flush() == "idle" and dev.pending() == 0
        dev.close()
    return truth


def _post(st: Prio3Stack, metric: str, spec: Prio3Spec, day: int, reports: list[bytes]) -> httpx.Response:
    recs = np.frombuffer(b"".join(reports), dtype=spec.record_dtype)
    frame = encode_frame(ReportBatch(metric, spec, day, recs))
    return httpx.post(
        st.collector_url + "/v1/reports", content=frame, headers={"content-type": FRAME_CONTENT_TYPE}, timeout=30
    )


def _crafted(st: Prio3Stack, metric: str, day: int, tamper: int) -> bytes:
    """A malicious client's report: a valid value's shares with one byte of the leader's measurement share
    flipped before sealing (so both shares open, and only the proof can tell)."""
    spec = st.metrics.prio3_spec(metric)
    keys = st.metrics.prio3_aggregators
    rid = np.random.default_rng(tamper).bytes(NONCE_SIZE)
    public, (lead, help_) = spec.config.vdaf().shard(1, rid, CTX)
    lead = bytearray(lead)
    lead[0] ^= 1
    suite = hpke.Suite()
    out = rid + public
    for role, (k, share) in enumerate(zip((keys["leader"], keys["helper"]), (bytes(lead), help_), strict=True)):
        out += suite.seal(k.public_key, share_info(role, spec.spec_id, day, rid), share, aad=public)
    return out


def test_exact_aggregates_through_the_pipeline(stack: Prio3Stack, tmp_path: Path) -> None:
    truth = _devices(stack, tmp_path, 12, seed=1)
    stack.wait_settled(12 * 4)
    day = utc_day(time.time())
    for name, want in truth.items():
        got = stack.collect(name, day)
        assert got.reports == 12 and got.value == want, name
    # a batch is released once: collecting it again around one more report would isolate that report
    with pytest.raises(CollectionRejected, match="released already"):
        stack.collect("p.sum", day)
    status = httpx.get(stack.leader_url + "/v1/prio3/status").json()
    assert status["counts"]["accepted"] == 48 and status["cpu_per_report_us"] > 0


def test_replayed_report_is_dropped(stack: Prio3Stack, tmp_path: Path) -> None:
    """A client (or anyone who saw an upload) sends the same report again under a new batch id: the collector's
    batch-id dedup does not see it, the leader's report-id table does; and the leader replaying a report to
    the helper is refused by the helper."""
    day = utc_day(time.time())
    dev = Prio3Client(stack.metrics, tmp_path / "dev", stack.collector_url)
    assert dev.record("p.sum", 60)
    rows = dev.store.connection().execute("SELECT record FROM outbox").fetchall()
    report = bytes(rows[0][0])
    assert dev.flush() == "idle"
    spec = stack.metrics.prio3_spec("p.sum")
    for _ in range(2):
        assert _post(stack, "p.sum", spec, day, [report]).status_code == 202
    stack.wait_settled(3)
    assert stack.leader.counts["replayed"] == 2 and stack.leader.counts["accepted"] == 1
    job = {"id": report[:NONCE_SIZE].hex(), "public": "", "share": "00", "vs": "00"}
    answer = stack.helper.aggregate_job("p.sum", day, [job])
    assert answer["results"][0] == {"id": job["id"], "status": "reject", "reason": "replayed"}
    result = stack.collect("p.sum", day)
    assert (result.reports, result.value) == (1, 60)


@pytest.mark.parametrize("metric", ["p.count", "p.sum", "p.hist"])
def test_malformed_report_is_rejected(stack: Prio3Stack, tmp_path: Path, metric: str) -> None:
    """An invalid proof (a tampered share) and garbage bytes are rejected by the aggregators; the honest
    reports' aggregate is exact without them."""
    day = utc_day(time.time())
    spec = stack.metrics.prio3_spec(metric)
    bad = [_crafted(stack, metric, day, tamper=1), np.random.default_rng(2).bytes(spec.layout.size)]
    assert _post(stack, metric, spec, day, bad).status_code == 202  # the collector cannot tell: it sees ciphertexts
    dev = Prio3Client(stack.metrics, tmp_path / "dev", stack.collector_url)
    assert dev.record(metric, 1) and dev.flush() == "idle"
    stack.wait_settled(3)
    c = stack.leader.counts
    assert c["rejected:invalid_proof"] == 1 and c["rejected:invalid_share"] == 1 and c["accepted"] == 1, c
    assert stack.helper.counts["rejected:invalid_proof"] == 1
    result = stack.collect(metric, day)
    assert result.reports == 1
    assert result.value == (1 if metric != "p.hist" else [0, 1, 0, 0, 0])


def _tamper_helper(field: str) -> Any:
    """A deviating helper: it runs the job honestly, then alters one field of every other answer (its
    verifier share or the verifier message) before sending it to the leader."""

    def wrap(helper: Any) -> None:
        honest = helper.aggregate_job
        seen = [0]

        def job(metric: str, day: int, reports: list[Any]) -> dict[str, Any]:
            out = honest(metric, day, reports)
            for r in out["results"]:
                seen[0] += 1
                if r["status"] == "continue" and r[field] and seen[0] % 2 == 1:
                    b = bytearray.fromhex(r[field])
                    b[0] ^= 0x01
                    r[field] = b.hex()
            return out

        helper.aggregate_job = job

    return wrap


@pytest.mark.parametrize(("field", "metric"), [("vs", "p.count"), ("vs", "p.hist"), ("message", "p.hist")])
def test_deviating_helper_is_caught(deployment: Deployment, tmp_path: Path, field: str, metric: str) -> None:
    with Prio3Stack(deployment, tmp_path / "run", helper_wrapper=_tamper_helper(field)) as st:
        day = utc_day(time.time())
        for i in range(3):
            dev = Prio3Client(st.metrics, tmp_path / f"d{i}", st.collector_url)
            assert dev.record(metric, 1) and dev.flush() == "idle"
            dev.close()
        st.wait_settled(3)
        assert st.leader.counts["accepted"] == 1, st.leader.counts  # the leader refused the two altered ones
        assert st.helper.counts["accepted"] == 3
        with pytest.raises(CollectionRejected, match="cover different reports"):
            st.collect(metric, day)


def test_client_refuses_invalid_values_and_caps_reports(stack: Prio3Stack, tmp_path: Path) -> None:
    dev = Prio3Client(stack.metrics, tmp_path / "dev", stack.collector_url)
    assert not dev.record("p.sum", 101)
    assert not dev.record("p.vec", [1, 2])
    assert not dev.record("nope", 1)
    assert dev.record("p.count", 1)
    assert not dev.record("p.count", 1)  # max_reports_per_day is 1
    assert dict(dev.errors) == {"bad_value": 2, "unknown_metric": 1, "daily_cap": 1}
    dev.close()


def _lenient_helper(helper: Any) -> None:
    """A helper colluding with a malicious client: it skips the proof check (Prio3Count has no joint
    randomness, so its verifier message is empty and the leader's own verify_next cannot tell) and
    aggregates every report, to push an out-of-range value into the sum."""
    from ldp_core.prio3.report import ReportParts, open_share

    def job(metric: str, day: int, reports: list[Any]) -> dict[str, Any]:
        spec, vdaf = helper.specs[metric], helper._vdafs[metric]
        results, verdicts, outs = [], {}, []
        for r in reports:
            rid, public = bytes.fromhex(r["id"]), bytes.fromhex(r["public"])
            share = open_share(helper.key, 1, spec, day, ReportParts(rid, public, (b"", bytes.fromhex(r["share"]))))
            state, vs1 = vdaf.verify_init(helper.verify_key, CTX, 1, rid, public, share)
            outs.append(vdaf.verify_next(CTX, 1, state, b""))
            verdicts[rid] = "accepted"
            results.append({"id": r["id"], "status": "continue", "vs": vs1.hex(), "message": ""})
        helper._settle(metric, day, verdicts, outs, vdaf, insert=True)
        return {"results": results}

    helper.aggregate_job = job


def test_helper_accepting_an_invalid_proof_is_caught(deployment: Deployment, tmp_path: Path) -> None:
    """The leader recomputes the verifier message from both verifier shares: the invalid proof shows, the
    leader refuses the report the helper took, and the collector refuses the mismatched shares."""
    with Prio3Stack(deployment, tmp_path / "run", helper_wrapper=_lenient_helper) as st:
        day = utc_day(time.time())
        spec = st.metrics.prio3_spec("p.count")
        assert _post(st, "p.count", spec, day, [_crafted(st, "p.count", day, tamper=7)]).status_code == 202
        dev = Prio3Client(st.metrics, tmp_path / "dev", st.collector_url)
        assert dev.record("p.count", 1) and dev.flush() == "idle"
        st.wait_settled(2)
        assert st.leader.counts["rejected:invalid_proof"] == 1 and st.helper.counts["accepted"] == 2
        with pytest.raises(CollectionRejected, match="cover different reports"):
            st.collect("p.count", day)


def test_a_device_with_stale_aggregator_keys_is_refused(stack: Prio3Stack, tmp_path: Path) -> None:
    """The wire spec binds both aggregators' key ids: shares sealed to keys the aggregators no longer hold are
    refused at the collector (spec_mismatch), not carried to aggregators that cannot open them."""
    import dataclasses

    day = utc_day(time.time())
    spec = stack.metrics.prio3_spec("p.count")
    stale = dataclasses.replace(spec, helper_key_id="0badc0de")
    resp = _post(stack, "p.count", stale, day, [bytes(stale.layout.size)])
    assert resp.status_code == 422 and resp.json()["error"] == "spec_mismatch"


def test_reports_of_a_released_batch_are_rejected(stack: Prio3Stack, tmp_path: Path) -> None:
    day = utc_day(time.time())
    dev = Prio3Client(stack.metrics, tmp_path / "a", stack.collector_url)
    assert dev.record("p.count", 1) and dev.flush() == "idle"
    stack.wait_settled(1)
    assert stack.collect("p.count", day).value == 1
    late = Prio3Client(stack.metrics, tmp_path / "b", stack.collector_url)
    assert late.record("p.count", 1) and late.flush() == "idle"
    stack.wait_settled(2)
    assert stack.leader.counts["rejected:batch_collected"] == 1


def test_queued_reports_survive_a_restart(stack: Prio3Stack, tmp_path: Path) -> None:
    """A report recorded but not uploaded when the app stops is sent by the next client over the same store
    (the outbox keeps the opaque report; the new client knows its spec again)."""
    day = utc_day(time.time())
    dev = Prio3Client(stack.metrics, tmp_path / "dev", stack.collector_url)
    assert dev.record("p.sum", 42)
    dev.close()
    again = Prio3Client(stack.metrics, tmp_path / "dev", stack.collector_url)
    assert again.pending() == 1 and again.flush() == "idle" and again.pending() == 0
    stack.wait_settled(1)
    assert stack.collect("p.sum", day).value == 42
