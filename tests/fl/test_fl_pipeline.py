"""Federated rounds over the pipeline (embedded log): devices → real collector → ldp.fl.updates → job.

* DP-FedAvg over the pipeline ends in exactly the model of the in-process
  :func:`run_rounds` with the same seeds (bit for bit: same sampled clients,
  same device training, same float32 clipping, same aggregator stack and noise).
* SecAgg+ rounds with dropouts before and after masking: the unmasked sum the
  job computed equals the ring sum of the survivors' quantized updates.
* (SIGKILL of the job mid-round: tests/fl/test_fl_pipeline_crash.py; Kafka: tests/fl/test_fl_pipeline_kafka.py.)
* Bad uploads get the documented status at the collector and are counted;
  what reaches the topic anyway (replays, duplicates, stale or malformed
  records) is refused and counted by the job, visible on the status route.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from client_sdk.fl.device import FLDevice, HTTPResult
from estimator.fl.dp import ADVERSARIES
from ldp_core.fl.errors import UpdateRejected
from ldp_core.fl.protocol import (
    BINARY_CONTENT_TYPE,
    BINARY_MAGIC,
    RoundState,
    encode_upload,
    encode_upload_binary,
    encode_vector,
    make_upload,
    parse_upload,
    sign_upload,
)
from pipeline.transport import open_transport
from tests.support.fl_pipeline_support import (
    Topics,
    collector,
    devices_for,
    drive,
    enroll,
    final_params,
    make_data,
    reference_run,
    running_task,
    served_status,
    task_spec,
)


def _url(tmp: Path) -> str:
    return f"sqlite:///{tmp}/transport.sqlite3"


def _wait_round(url: str, task: str, timeout: float = 30.0) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = httpx.get(f"{url}/v1/fl/tasks/{task}/round", timeout=10)
        if r.status_code == 200:
            return r.json()
        time.sleep(0.05)
    raise AssertionError(f"no round of {task} was served within {timeout:g} s")


# -- protocol ------------------------------------------------------------------------------------------
def test_upload_encoding_round_trips_and_checks_sizes() -> None:
    v = np.array([0.5, -1.25, 3.0], np.float32)
    u = make_upload("t", 2, "update", "dev-1", {"vector": v, "num_examples": 7})
    assert u.upload_id != make_upload("t", 2, "update", "dev-1", {"vector": v, "num_examples": 8}).upload_id
    back = parse_upload(encode_upload(u), payload_size=3)
    assert back.upload_id == u.upload_id and back.payload["num_examples"] == 7
    assert back.payload["vector"].tobytes() == v.astype("<f4").tobytes()
    obj = json.loads(encode_upload(u))
    assert base64.b64decode(obj["payload"]["vector"]) == v.astype("<f4").tobytes()

    def reason(mutate: Any, size: int = 3) -> str:
        o = json.loads(encode_upload(u))
        mutate(o)
        with pytest.raises(UpdateRejected) as e:
            parse_upload(json.dumps(o).encode(), payload_size=size)
        return e.value.reason

    assert reason(lambda o: None, size=4) == "wrong_shape"
    assert reason(lambda o: o.update(version=2)) == "unsupported_version"
    assert reason(lambda o: o["payload"].update(vector="!!!!" * 4)) == "malformed"
    assert reason(lambda o: o["payload"].update(num_examples=-1)) == "bad_weight"
    assert reason(lambda o: o["payload"].update(num_examples=8)) == "upload_id_mismatch"
    assert reason(lambda o: o.update(round=3)) == "upload_id_mismatch"
    nan = make_upload("t", 2, "update", "dev-1", {"vector": np.array([np.nan, 0, 0], np.float32), "num_examples": 1})
    with pytest.raises(UpdateRejected) as e:
        parse_upload(encode_upload(nan), payload_size=3)
    assert e.value.reason == "non_finite"
    masked = make_upload("t", 0, "masked", "dev-1", {"vector": np.array([1, 2**32 - 1], np.uint32)})
    assert parse_upload(encode_upload(masked), payload_size=2).payload["vector"].tolist() == [1, 2**32 - 1]
    reveal = make_upload("t", 0, "reveal", "dev-1", {"shares": {3: ("b", 1, 2**520 + 5, 4)}})
    assert parse_upload(encode_upload(reveal)).payload["shares"] == {3: ("b", 1, 2**520 + 5, 4)}


def test_binary_upload_form_round_trips_checks_sizes_and_costs_one_float32_upload() -> None:
    """The binary form carries the same upload (same id) with the vector as raw little-endian bytes after a JSON
    header: for d = 10^5 the whole upload is at most 1.001× a plaintext float32 vector (4·d bytes; the issue's
    bound is 1.1×), where the JSON form's base64 costs 4/3. Every kind round-trips; a truncated vector, bytes
    after a vector-less kind, a vector inside the header, a header length past the body and a NaN are refused
    with their reasons."""
    d = 100_000
    v = np.linspace(-1, 1, d, dtype=np.float32)
    u = make_upload("t", 2, "update", "dev-1", {"vector": v, "num_examples": 7})
    body = encode_upload_binary(u)
    assert body.startswith(BINARY_MAGIC) and len(body) <= 1.001 * 4 * d
    assert len(encode_upload(u)) >= 4 / 3 * 4 * d
    back = parse_upload(body, payload_size=d)
    assert back.upload_id == u.upload_id and back.payload["num_examples"] == 7
    assert back.payload["vector"].tobytes() == v.astype("<f4").tobytes()
    masked = make_upload("t", 0, "masked", "dev-1", {"vector": np.array([1, 2**32 - 1], np.uint32)})
    assert parse_upload(encode_upload_binary(masked), payload_size=2).payload["vector"].tolist() == [1, 2**32 - 1]
    for kind, payload in (
        ("advert", {"share_key": b"k" * 32, "mask_key": b"m" * 32}),
        ("reveal", {"shares": {3: ("b", 1, 2**520 + 5, 4)}}),
    ):
        up = make_upload("t", 0, kind, "dev-1", payload)
        assert parse_upload(encode_upload_binary(up)).payload == up.payload

    def reason(data: bytes, size: int = d) -> str:
        with pytest.raises(UpdateRejected) as e:
            parse_upload(data, payload_size=size)
        return e.value.reason

    small = make_upload("t", 2, "update", "dev-1", {"vector": np.ones(3, np.float32), "num_examples": 1})
    sb = encode_upload_binary(small)
    head = int.from_bytes(sb[6:10], "little")
    assert reason(sb[:-4], 3) == "wrong_shape"
    assert reason(sb, 4) == "wrong_shape"
    assert (
        reason(
            encode_upload_binary(
                make_upload("t", 0, "advert", "dev-1", {"share_key": b"k" * 32, "mask_key": b"m" * 32})
            )
            + b"x"
        )
        == "malformed"
    )
    inner = json.loads(sb[10 : 10 + head])
    inner["payload"]["vector"] = encode_vector(np.ones(3, np.float32))
    hdr = json.dumps(inner).encode()
    assert reason(sb[:6] + len(hdr).to_bytes(4, "little") + hdr + sb[10 + head :], 3) == "malformed"
    assert reason(sb[:6] + (len(sb) * 2).to_bytes(4, "little") + sb[10:], 3) == "malformed"
    assert reason(sb[:5], 3) == "malformed"
    assert reason(BINARY_MAGIC + b"\x02" + sb[5:], 3) == "malformed"  # an unknown version
    nan = make_upload("t", 2, "update", "dev-1", {"vector": np.array([np.nan, 0, 0], np.float32), "num_examples": 1})
    assert reason(encode_upload_binary(nan), 3) == "non_finite"


# -- DP-FedAvg ---------------------------------------------------------------------------------------
def test_dp_fedavg_over_the_pipeline_equals_the_in_process_run(tmp_path: Path) -> None:
    """Three rounds, 4 of 8 clients each, clip 0.5, σ = 0.8: the final model is bit-identical to
    run_rounds with the same seeds, ε is reported after every round and equals the reference's."""
    spec = task_spec("fedavg-e", 8)
    data = make_data(8)
    ref, history = reference_run(spec, data)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (tr, srv, jt):
        devices = devices_for(srv.url, spec, data)
        drive(devices, jt.finished, timeout=60)
        status = jt.result
        served = served_status(srv.url, spec.task, lambda st: st.get("phase") == "done")
    assert status is not None
    assert np.array_equal(final_params(status), ref), (final_params(status), ref)
    assert [h["epsilon"] for h in status["history"]] == [h.info["epsilon"] for h in history]
    assert [h["clients"] for h in status["history"]] == [h.sampled for h in history] == [4, 4, 4]
    assert status["accepted"] == {"update": 12} and status["rejected"] == {}
    assert served["phase"] == "done" and math.isclose(served["epsilon"], history[-1].info["epsilon"])
    assert sum(d.uploads for d in devices) == 12
    # ε per adversary (issue 13), in the operator's status and the public one alike: the accountant's
    # own figures for the rounds released; nothing against the operator, who adds the noise
    acc = spec.build_accountant()
    assert acc is not None
    for _ in range(spec.rounds):
        acc.record(spec.noise_multiplier)
    for view in (status, served):
        by = {a["adversary"]: a for a in view["epsilon_by_adversary"]}
        assert list(by) == list(ADVERSARIES)
        assert by["observer"]["epsilon"] == pytest.approx(acc.epsilon(), rel=1e-12) == view["epsilon"]
        assert by["knows_sample"]["epsilon"] == pytest.approx(acc.epsilon_known_sample(), rel=1e-12)
        assert by["observer"]["epsilon"] <= by["knows_sample"]["epsilon"]
        assert by["server_operator"]["epsilon"] is None and "updates" in by["server_operator"]["protection"]
        # fixed-count sampling: replace one client (a DP-FTRL task says add_or_remove): each ε names it
        assert acc.neighbors == "replace" and view["neighbors"] == acc.neighbors
        assert all(a["neighbors"] == acc.neighbors and a["neighbors_unit"] == "client" for a in by.values())
    assert served["epsilon_by_adversary"] == status["epsilon_by_adversary"]


# -- SecAgg --------------------------------------------------------------------------------------------
def test_secagg_rounds_with_dropouts_unmask_the_ring_sum(tmp_path: Path) -> None:
    """6 of 7 clients per round; dev-2 leaves after advertising keys (before sharing), dev-4 after sharing
    (before masking). The job's unmasked sum equals Σ of the survivors' quantized updates mod 2^32, and
    with σ = 0 the model moves by exactly decode(sum) / expected clients."""
    spec = task_spec(
        "secagg-e",
        7,
        secagg=True,
        sampling={"kind": "fixed", "count": 6},
        rounds=2,
        noise_multiplier=0.0,
        phase_timeout=2.0,
        # two dropouts on the complete graph of 6 (k = 5) need t = 3 (4 survivors sign): the default c = 1
        # would make t = 4, which tolerates one (docs/fl/SECAGG.md, "Colluding share holders")
        max_colluders=0,
    )
    data = make_data(7)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (tr, srv, jt):
        devices = devices_for(srv.url, spec, data, drop_at={"dev-2": "share", "dev-4": "masked"})
        first = _wait_round(srv.url, spec.task)
        x = np.frombuffer(base64.b64decode(first["params"]), "<f4").astype(np.float32)
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None and len(status["history"]) == 2
    for rec in status["history"]:
        r = rec["round"]
        masked = [d for d in devices if r in d.quantized]
        assert {"dev-2", "dev-4"}.isdisjoint(d.client_id for d in masked)
        assert len(rec["secagg_survivors"]) == len(masked) == rec["clients"]
        total = np.zeros(spec.build_model().num_params, np.uint32)
        for d in masked:
            total += d.quantized[r]
        # the integrity record stays in the job's checkpointed state, never in a published record
        assert hashlib.sha256(total.astype("<u4").tobytes()).hexdigest() == jt.job._st.audit[r]
        assert "sum_sha256" not in rec
        sa_scale = ((2**31 - 1) / 6 - 1) / spec.clip_norm * (1 - 1e-12)  # Quantizer.for_clients(6, C)
        x = (x + (total.view(np.int32).astype(np.float64) / sa_scale) / 6.0).astype(np.float32)
        dev4 = next(d for d in devices if d.client_id == "dev-4")
        assert len(rec["secagg_dropped"]) == (1 if (r, "share") in dev4._done else 0)
    assert np.array_equal(final_params(status), x)
    assert status["rejected"] == {}
    # σ = 0: no guarantee against anyone; the operator sees the un-noised SecAgg sum whatever σ is
    by = {a["adversary"]: a for a in status["epsilon_by_adversary"]}
    assert by["observer"]["epsilon"] == by["knows_sample"]["epsilon"] == "inf"
    assert by["server_operator"]["epsilon"] is None and "un-noised sum" in by["server_operator"]["sees"]


def test_secagg_round_with_too_many_dropouts_fails_without_release(tmp_path: Path) -> None:
    """5 of 5 clients on a complete graph (t = 3); two leave after sharing: a survivor's self-mask seed has
    only 2 surviving holders, so unmasking is impossible. Since the consistency round the job sees it one
    step earlier: 3 survivors cannot show any of them t = 3 signatures from *other* survivors. The round
    fails: the model stays, no ε is spent, and the task moves on."""
    spec = task_spec(
        "secagg-fail",
        5,
        secagg=True,
        sampling={"kind": "fixed", "count": 5},
        rounds=1,
        noise_multiplier=1.0,
        phase_timeout=1.5,
    )
    data = make_data(5)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (tr, srv, jt):
        devices = devices_for(srv.url, spec, data, drop_at={"dev-0": "masked", "dev-1": "masked"})
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None
    [rec] = status["history"]
    assert rec["round"] == 0 and rec["failed"] == "only 3 survivors signed the survivor set"
    assert np.array_equal(final_params(status), np.zeros(spec.build_model().num_params, np.float32))
    assert status["epsilon"] is None


# -- bad input ----------------------------------------------------------------------------------------
class _Recording(FLDevice):
    """A device that remembers the bodies it POSTed."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.bodies: list[bytes] = []
        self.answers: list[HTTPResult] = []

    def _request(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        content_type: str = "application/json",
        sign: bool = False,
    ) -> HTTPResult:
        if body is not None:
            self.bodies.append(body)
        res = super()._request(method, url, body, content_type, sign)
        if body is not None:
            self.answers.append(res)
        return res


def test_bad_uploads_are_rejected_with_their_status_and_counted(tmp_path: Path) -> None:
    spec = task_spec("bad-e", 6, rounds=3, sampling={"kind": "fixed", "count": 3}, noise_multiplier=0.5)
    data = make_data(6)
    with running_task(tmp_path, spec, checkpoint_interval=0.1) as (tr, srv, jt):
        view = _wait_round(srv.url, spec.task)
        signed_views = {c: FLDevice(srv.url, spec.task, c, *data[0], identity=enroll(c)).fetch() for c in spec.clients}
        selected = [c for c, v in signed_views.items() if v is not None and v["selected"]]
        assert len(selected) == 3
        outsider = next(c for c in spec.clients if c not in selected)
        assert "selected" not in view and "selected" not in json.dumps(view)  # the sample is never listed
        d = spec.build_model().num_params
        post = f"{srv.url}/v1/fl/tasks/{spec.task}/uploads"
        me = selected[0]

        def send(
            u: Any = None, *, body: bytes | None = None, ctype: str | None = None, path: str = post
        ) -> httpx.Response:
            content = encode_upload(u) if body is None else body
            if ctype is None:  # the type that matches the form
                ctype = BINARY_CONTENT_TYPE if content.startswith(BINARY_MAGIC) else "application/json"
            return httpx.post(path, content=content, headers={"Content-Type": ctype}, timeout=10)

        def update(vec: np.ndarray, client: str = me, rnd: int = 0, n: int = 5, signer: str | None = None) -> Any:
            u = make_upload(spec.task, rnd, "update", client, {"vector": vec, "num_examples": n})
            return sign_upload(u, enroll(signer or client))

        ok = np.full(d, 0.01, np.float32)
        cases = [
            (send(update(ok), ctype="text/plain"), 415, "unsupported_media_type"),
            (send(body=b"{not json"), 400, "malformed"),
            (send(body=b"x" * (5 << 20)), 413, "too_large"),
            (send(update(np.zeros(d + 1, np.float32))), 422, "wrong_shape"),
            (send(update(np.array([np.inf] + [0.0] * (d - 1), np.float32))), 422, "non_finite"),
            (send(update(ok, rnd=5)), 503, "round_not_open"),
            (send(update(ok, client=outsider)), 403, "not_selected"),
            (send(make_upload(spec.task, 0, "update", me, {"vector": ok, "num_examples": 5})), 401, "unauthenticated"),
            (send(update(ok, signer=outsider)), 401, "unauthenticated"),
            (
                send(
                    sign_upload(
                        make_upload(spec.task, 0, "advert", me, {"share_key": bytes(32), "mask_key": bytes(32)}),
                        enroll(me),
                    )
                ),
                409,
                "wrong_phase",
            ),
            (send(update(ok), path=f"{srv.url}/v1/fl/tasks/nope/uploads"), 404, "unknown_task"),
            (send(body=encode_upload_binary(update(ok)), ctype="application/json"), 400, "malformed"),
            (send(update(ok), ctype=BINARY_CONTENT_TYPE), 400, "malformed"),
            (send(body=encode_upload_binary(update(np.zeros(d - 1, np.float32)))), 422, "wrong_shape"),
        ]
        tampered = json.loads(encode_upload(update(ok)))
        tampered["payload"]["vector"] = encode_vector(ok * 2)
        cases.append((send(body=json.dumps(tampered).encode()), 400, "upload_id_mismatch"))
        for resp, status, reason in cases:
            assert (resp.status_code, resp.json()["error"]) == (status, reason), resp.text
            assert resp.json()["message"]

        # a retry of an accepted upload is a duplicate: answered like the first, not published again; a copy
        # on the topic (as a second collector would publish it) is counted by the job as a duplicate, once.
        # A second, different upload of the same client in the round goes through the collector and is
        # refused by the job
        devices = [
            _Recording(srv.url, spec.task, c, X, y, backoff=0.05, identity=enroll(c))
            for c, (X, y) in zip(spec.clients, data)
        ]
        first = next(x for x in devices if x.client_id == me)
        assert first.step() == "update"
        retry = send(body=first.bodies[-1])
        assert first.answers[-1] == HTTPResult(202, retry.json()) and retry.status_code == 202
        tr.publish(jt.topics.updates, spec.task.encode(), first.bodies[-1])
        assert send(update(ok)).status_code == 202
        drive(devices, lambda: jt.job.status()["round"] >= 1, timeout=30)
        served_status(srv.url, spec.task, lambda st: st.get("round", 0) >= 1)  # the collector's view trails the job
        # round 0 is closed: its accepted upload re-sent is replayed (409 at the collector that published it;
        # on the topic, refused by the job); a round-0 upload never accepted is stale. Records written to the
        # topic directly (a buggy or compromised publisher) are refused by the job
        replay = send(body=first.bodies[-1])
        assert (replay.status_code, replay.json()["error"]) == (409, "replayed")
        late = update(ok * 3)
        stale = send(late)
        assert (stale.status_code, stale.json()["error"]) == (409, "stale_round")
        tr.publish(jt.topics.updates, spec.task.encode(), first.bodies[-1])
        tr.publish(jt.topics.updates, spec.task.encode(), encode_upload(late))
        tr.publish(jt.topics.updates, spec.task.encode(), encode_upload(update(ok * 4, rnd=1, signer=outsider)))
        tr.publish(jt.topics.updates, spec.task.encode(), b"\x00garbage")
        bad = json.loads(encode_upload(update(np.zeros(d, np.float32), rnd=1)))
        bad["payload"]["vector"] = encode_vector(np.zeros(d + 2, np.float32))
        tr.publish(jt.topics.updates, spec.task.encode(), json.dumps(bad).encode())
        drive(devices, jt.finished, timeout=30)
        status = jt.result
        served = httpx.get(f"{srv.url}/v1/fl/tasks/{spec.task}/status", timeout=10).json()
        prom = httpx.get(f"{srv.url}/metrics", timeout=10).text
    assert status is not None
    expected = {
        "replayed": 1,
        "duplicate_client": 1,
        "stale_round": 1,
        "malformed": 1,
        "wrong_shape": 1,
        "unauthenticated": 1,  # a forged record written to the topic directly: the job verifies too
    }
    assert status["rejected"] == expected
    assert status["accepted"] == {"update": 9}
    assert status["duplicates"] == {"update": 1}
    # the counters are the operator's (the job's status): the public /status carries nothing sample-dependent
    assert not {"rejected", "accepted", "duplicates"} & set(served), served
    for reason in (
        "unsupported_media_type",
        "malformed",
        "too_large",
        "wrong_shape",
        "non_finite",
        "not_selected",
        "wrong_phase",
        "upload_id_mismatch",
        "stale_round",
        "replayed",
        "unauthenticated",
    ):
        assert f'outcome="rejected",reason="{reason}"' in prom, reason
    assert 'kind="update",outcome="duplicate",reason="same_upload_id"} 1' in prom
    assert 'kind="update",outcome="accepted",reason="ok"} 10' in prom  # 9 accepted by the job + duplicate_client


def test_task_spec_refuses_inconsistent_settings() -> None:
    from ldp_core.fl.errors import FLError

    with pytest.raises(FLError, match="secagg needs clip_norm"):
        task_spec("x", 4, clip_norm=None, noise_multiplier=0.0, secagg=True)
    with pytest.raises(FLError, match="noise_multiplier needs clip_norm"):
        task_spec("x", 4, clip_norm=None)
    with pytest.raises(FLError, match="exceeds"):
        task_spec("x", 3, sampling={"kind": "fixed", "count": 4})
    with pytest.raises(FLError, match="unknown task fields"):
        from estimator.fl.task import FLTaskSpec

        FLTaskSpec.from_dict({**task_spec("x", 4).to_dict(), "colour": "blue"})


def test_round_state_view_hides_the_sample_and_other_inboxes() -> None:
    st = RoundState(
        task="t",
        seq=3,
        round=1,
        phase="masked",
        rounds=2,
        model={"kind": "logistic", "n_features": 1},
        params=np.zeros(2, np.float32),
        selected=("a", "b"),
        indices={"a": 1, "b": 2},
        inbox={1: {2: b"x" * 176}, 2: {1: b"y" * 176}},
    )
    st = dataclasses.replace(
        st, secagg={"num_clients": 2, "neighbors": {"1": [2], "2": [1]}, "threshold": 2, "vector_length": 2}
    )
    back = RoundState.from_json(st.to_json())
    assert back.selected == ("a", "b") and back.inbox == st.inbox
    va, vz = st.view_for("a"), st.view_for("zz")
    assert va["selected"] is True and va["index"] == 1 and list(va["inbox"]) == ["2"]
    assert vz["selected"] is False and vz["index"] is None and vz["inbox"] == {} and "secagg" not in vz
    assert "b" not in json.dumps(va["inbox"]) and "indices" not in va
    public = st.public_view()
    assert not {"selected", "index", "inbox", "secagg", "adverts", "survivors", "dropped"} & set(public)


def test_device_side_imports_stay_light() -> None:
    """The device client and the protocol load neither server packages nor `cryptography` (SecAgg is
    imported only when a round asks for it)."""
    import subprocess
    import sys

    probe = (
        "import sys, client_sdk.fl.device, ldp_core.fl.protocol; "
        "print(sorted(m for m in ('numba', 'pandas', 'pyarrow', 'fastapi', 'kafka', 'scipy', 'cryptography', "
        "'httpx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_job_refuses_to_restart_a_task_whose_checkpoints_are_gone(tmp_path: Path) -> None:
    """Offsets committed for the job's group but no checkpoint in the state topic (truncated, or another
    deployment's): restarting the task from round 0 would double-count, so the job stops with JobStateError."""
    from estimator.fl.job import AggregationJob, JobSettings, JobStateError

    spec = task_spec("lost-e", 4, sampling={"kind": "fixed", "count": 2})
    topics = Topics.fresh()
    with open_transport(_url(tmp_path)) as tr:
        tr.create_topic(topics.updates, 1)
        tr.publish(topics.updates, spec.task.encode(), b"{}")
        with tr.consume([topics.updates], topics.group, member="fl-job-0") as c:
            while not c.poll(timeout=0.5):
                pass
            c.commit()
        job = AggregationJob(
            tr,
            spec,
            JobSettings(
                group=topics.group, rounds_topic=topics.rounds, updates_topic=topics.updates, state_topic=topics.state
            ),
        )
        with pytest.raises(JobStateError, match="no checkpoint"):
            job.open()
        job.close()


# -- the deployed shape: `ldp collector --fl` and `ldp fl job` as processes ------------------------------
def test_ldp_collector_fl_flag_serves_the_rounds_of_an_ldp_fl_job_process(tmp_path: Path) -> None:
    """What an operator runs: the collector process with ``--fl`` (and the FL topic flags), the job process;
    devices train through it and the final model equals the in-process reference. Without ``--fl`` the
    collector has no FL routes (404)."""
    import os
    import re
    import subprocess
    import sys

    from tests.support.collector_support import write_metrics
    from tests.support.fl_pipeline_support import ROOT, JobProcess

    spec = task_spec("procs", 6, rounds=2, sampling={"kind": "fixed", "count": 3})
    data = make_data(6)
    ref, _ = reference_run(spec, data)
    topics = Topics.fresh()
    url = _url(tmp_path)
    metrics = tmp_path / "metrics.json"
    write_metrics(metrics)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_COLLECTOR_")}

    def start_collector(*flags: str) -> tuple[subprocess.Popen[str], str]:
        argv = [
            sys.executable,
            "-m",
            "ldp_cli.main",
            "collector",
            "--transport",
            url,
            "--metrics",
            str(metrics),
            "--dedup",
            str(tmp_path / f"ids{len(flags)}.sqlite3"),
            "--port",
            "0",
            "--raw-topic",
            f"ldp.reports.raw.{topics.group}",
            *flags,
        ]
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        line = proc.stdout.readline() if proc.stdout else ""
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert found, f"ldp collector did not start: {line!r}"
        return proc, found.group(1)

    plain, plain_url = start_collector()
    try:
        assert httpx.get(f"{plain_url}/v1/fl/tasks", timeout=10).status_code == 404
    finally:
        plain.terminate()
        plain.wait(20)
    job = JobProcess(tmp_path, url, spec, topics)
    proc, srv_url = start_collector("--fl", "--fl-rounds-topic", topics.rounds, "--fl-updates-topic", topics.updates)
    try:
        job.start()
        devices = devices_for(srv_url, spec, data)
        drive(devices, job.finished, timeout=90)
        status = job.wait()
    finally:
        job.stop()
        proc.terminate()
        proc.wait(20)
    assert np.array_equal(final_params(status), ref)
    assert status["accepted"] == {"update": 6} and status["rejected"] == {}


def test_an_unseeded_task_draws_sampling_and_noise_from_the_os_csprng(tmp_path: Path) -> None:
    """Production tasks have no seed: the job's generator is the OS CSPRNG (UrandomBitGenerator), not a
    seeded PCG64 an observer of the models could predict; such a task runs its rounds with DP noise."""
    from ldp_core.randomness import UrandomBitGenerator

    spec = task_spec("unseeded", 6, rounds=2, sampling={"kind": "fixed", "count": 3}, seed=None)
    data = make_data(6)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (tr, srv, jt):
        assert isinstance(jt.job._rng.bit_generator, UrandomBitGenerator)
        drive(devices_for(srv.url, spec, data), jt.finished, timeout=60)
        status = jt.result
    assert status is not None and status["accepted"] == {"update": 6}
    assert [h["clients"] for h in status["history"]] == [3, 3]
    assert status["history"][-1]["epsilon"] > status["history"][0]["epsilon"] > 0


def test_a_collector_started_before_the_job_keeps_round_states_for_ever(tmp_path: Path) -> None:
    """Whoever creates the rounds topic first (here the collector) gives it unlimited retention, as the job
    would: a task idle for longer than a retention must still have its current round to serve."""
    from pipeline.transport.base import TopicError

    topics = Topics.fresh()
    url = _url(tmp_path)
    with open_transport(url) as tr, collector(tmp_path, url, topics):
        end = time.monotonic() + 30
        while True:
            try:
                tr.partitions(topics.rounds)
                tr.partitions(topics.updates)
                break
            except TopicError:
                assert time.monotonic() < end, "the collector never created the FL topics"
                time.sleep(0.05)
        assert tr.retention_of(topics.rounds) == math.inf
        assert tr.retention_of(topics.updates) == tr.retention
