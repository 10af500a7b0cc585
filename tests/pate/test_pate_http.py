"""Federated teachers over the real FL pipeline: a PATE task's devices talk to the collector over HTTP, the
aggregation job unmasks only the sum of their votes and releases the labels; the released labels equal the
same release computed in one process on the same seeds; the server side receives no teacher's vote; a
teacher refuses a round that would carry anything but its masked votes."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest

from client_sdk.fl.device import FLDevice
from estimator.fl.task import FLTaskSpec
from estimator.pate.accounting import data_independent
from estimator.pate.federated import distributed_gnmax_epsilon
from ldp_core.fl.errors import FLError
from ldp_core.fl.pate import one_hot_votes, queries_digest
from ldp_core.fl.protocol import RoundState
from simulator.pate_fl import device_rng, pate_task, run_pate_http
from tests.support.fl_pipeline_support import AUTHORITY, enroll
from tests.support.secagg_adversary import _serve

MODEL = {"kind": "softmax", "n_features": 64, "n_classes": 10, "l2": 1e-3}
TRAINING = {"epochs": 8, "batch_size": 16, "learning_rate": 0.2}
TEACHERS = 6


def _digits() -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    X, y = (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)
    idx = np.random.default_rng(0).permutation(len(y))
    sens, pub = idx[:600], idx[600:660]
    parts = [(X[sens[i::TEACHERS]], y[sens[i::TEACHERS]]) for i in range(TEACHERS)]
    return parts, X[pub], y[pub]


@pytest.mark.parametrize(
    "pate",
    [
        {"aggregator": "gnmax", "sigma": 2.0},
        {"aggregator": "confident_gnmax", "sigma": 1.0, "threshold": 4.0, "sigma1": 1.0},
        {"aggregator": "gnmax", "sigma": 2.0, "noise": "distributed"},
    ],
    ids=["gnmax", "confident", "distributed"],
)
def test_labels_over_http_equal_the_in_process_release_and_the_server_sees_no_vote(pate: dict[str, Any]) -> None:
    parts, queries, truth = _digits()
    run = run_pate_http(parts, queries, MODEL, TRAINING, pate, seed=3)
    got, ref = run.record["pate"], run.in_process
    assert ref is not None
    assert got["labels"] == ref["labels"] and got["answered"] == ref["answered"]
    assert got["epsilon"] == pytest.approx(ref["epsilon"], rel=1e-12)
    assert run.record["clients"] == TEACHERS  # a fetch before the job's first round state is a benign 404
    assert all(set(d["errors"]) <= {"fetch_404"} for d in run.devices)
    q = len(queries)
    if pate.get("noise") == "distributed":
        assert got["epsilon"] == pytest.approx(distributed_gnmax_epsilon(2.0, TEACHERS, q, 1e-5, 10)["epsilon"])
    elif pate["aggregator"] == "gnmax":
        assert got["answered"] == q and got["epsilon"] == pytest.approx(data_independent(2.0, q, 1e-5)["epsilon"])
    else:
        assert 0 < got["answered"] < q and -1 in got["labels"]
        want = data_independent(1.0, got["answered"], 1e-5, queries=q, sigma1=1.0)["epsilon"]
        assert got["epsilon"] == pytest.approx(want)
    labels = np.array(got["labels"])
    assert np.mean(labels[labels >= 0] == truth[labels >= 0]) > 0.5  # the teachers' answers carry the signal
    # what the server side received of each teacher (the updates topic, read back): masked words only. A one-hot
    # vote is 0/1 in every word; a masked word is uniform on 2^32 values, so among the 6 × 600 words the chance
    # that 3 or more are 0 or 1 is below (3600·2/2^32)^3 < 1e-17
    assert sorted(o["client_id"] for o in run.observed) == sorted(f"teacher-{i:03d}" for i in range(TEACHERS))
    preds = ref["predictions"]
    low = 0
    for o in run.observed:
        i = int(o["client_id"].split("-")[1])
        assert not np.array_equal(o["vector"], one_hot_votes(preds[i], 10))
        low += int(np.count_nonzero(o["vector"] <= 1))
    assert low <= 2


def test_a_dropped_teacher_is_left_out_of_the_histograms() -> None:
    parts, queries, _ = _digits()
    run = run_pate_http(
        parts, queries, MODEL, TRAINING, {"aggregator": "gnmax", "sigma": 2.0}, seed=4, drop=[2], phase_timeout=4.0
    )
    assert run.record["clients"] == TEACHERS - 1 and run.record["secagg_dropped"]
    assert len(run.record["pate"]["labels"]) == len(queries)


def _train_round(spec: FLTaskSpec, client: str) -> RoundState:
    n = spec.build_model().num_params
    sig = AUTHORITY.sign_document(spec.signed_config())
    import base64

    return RoundState(
        task=spec.task,
        seq=0,
        round=0,
        phase="train",
        rounds=1,
        model=dict(spec.model),
        params=np.zeros(n, np.float32),
        training=dict(spec.training),
        selected=(client,),
        enrollment_key=AUTHORITY.public_key,
        task_config={"config": spec.signed_config(), "signature": base64.b64encode(sig).decode()},
    )


def test_a_teacher_refuses_a_plain_round_that_would_carry_its_model_in_the_clear() -> None:
    """The attack: the server opens the PATE task's round as a plain FedAvg round. A device without the teacher
    rule (the control) trains on its partition and uploads the model delta unmasked; a teacher uploads nothing."""
    parts, queries, _ = _digits()
    spec = pate_task("pate-attack", AUTHORITY, queries, TEACHERS, MODEL, TRAINING, {"sigma": 2.0}, seed=1)
    spec_plain = FLTaskSpec.from_dict({**spec.to_dict(), "pate": None, "secagg": False, "task_signature": None})
    with _serve(spec_plain) as (col, url):
        state = _train_round(spec, "teacher-000")
        with col.lock:
            col.views = {"teacher-000": json.loads(json.dumps(state.view_for("teacher-000")))}
        X, y = parts[0]
        kw: dict[str, Any] = dict(identity=enroll("teacher-000"), max_attempts=1, timeout=5.0)
        control = FLDevice(url, spec.task, "teacher-000", X, y, rng_for_round=lambda r: device_rng(1, 0, r), **kw)
        assert control.step() == "update"
        leaked = col.uploads[("update", "teacher-000")].payload["vector"]
        assert np.count_nonzero(leaked) > 0  # the teacher's trained model, in the clear
        col.uploads.clear()
        teacher = FLDevice(url, spec.task, "teacher-000", X, y, pate_queries=queries, **kw)
        assert teacher.step() == "failed"
        assert "masked votes" in (teacher.last_error or "")
        time.sleep(0.05)
        assert not col.uploads


def test_a_teacher_refuses_queries_other_than_the_signed_ones_and_bad_tasks() -> None:
    parts, queries, _ = _digits()
    spec = pate_task("pate-q", AUTHORITY, queries, TEACHERS, MODEL, TRAINING, {"sigma": 2.0}, seed=1)
    assert spec.signed_config()["pate"]["queries_sha256"] == queries_digest(queries)
    assert queries_digest(queries[::-1]) != queries_digest(queries)
    base = spec.to_dict()
    for bad, msg in [
        ({"secagg": False}, "needs secagg"),
        ({"rounds": 2}, "one round"),
        ({"pate": {**base["pate"], "classes": 3}}, "3 classes"),
        ({"pate": {**base["pate"], "aggregator": "confident_gnmax"}}, "threshold"),
        (
            {
                "pate": {
                    **base["pate"],
                    "noise": "distributed",
                    "aggregator": "confident_gnmax",
                    "threshold": 3,
                    "sigma1": 1,
                }
            },
            "second",
        ),
        ({"pate": {**base["pate"], "queries_sha256": "xyz"}}, "hex"),
        ({"clip_norm": 1.0}, "clip_norm"),
    ]:
        with pytest.raises(FLError, match=msg):
            FLTaskSpec.from_dict({**base, **bad})
    with pytest.raises(FLError, match="pate_queries"):
        FLDevice("http://127.0.0.1:1", "t", "c", parts[0][0], parts[0][1], pate_predict=lambda q: q)
