"""Attacks on what the FL job publishes (issue 13, "Leaks that void DP today").

Each test plays the adversary against the public views (the collector's ``/status`` and the
unauthenticated ``/round``) and must fail on the code before the fix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ldp_core.fl.protocol import encode_upload, make_upload
from pipeline.transport import open_transport
from tests.support.fl_pipeline_support import (
    JobThread,
    Topics,
    collector,
    devices_for,
    drive,
    enroll,
    make_data,
    running_task,
    served_status,
    task_spec,
)


def _url(tmp: Path) -> str:
    return f"sqlite:///{tmp}/transport.sqlite3"


def _public_text(url: str, task: str) -> str:
    """Everything anyone can read about the task without credentials."""
    status = httpx.get(f"{url}/v1/fl/tasks/{task}/status", timeout=10).json()
    view = httpx.get(f"{url}/v1/fl/tasks/{task}/round", timeout=10).json()
    tasks = httpx.get(f"{url}/v1/fl/tasks", timeout=10).json()
    return json.dumps([status, view, tasks])


def test_the_unnoised_secagg_sum_cannot_be_tested_against_what_is_public(tmp_path: Path) -> None:
    """The attacker knows every survivor's input but the target's (its own fake clients) and has two
    hypotheses for the target: its true quantized update, or a zero update (the neighbouring world). It
    computes each hypothesis's un-noised ring sum and looks for anything derived from it (the SHA-256 the
    job used to publish, in hex) in every public view. On the old code the true hypothesis matched and the
    other did not (certainty at σ = 1, reported ε ≈ 10.7); now neither matches, and the public round
    records carry no field computed from the un-noised sum."""
    spec = task_spec(
        "leak-sum",
        5,
        secagg=True,
        sampling={"kind": "fixed", "count": 5},
        rounds=1,
        noise_multiplier=1.0,
        phase_timeout=2.0,
    )
    data = make_data(5)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (tr, srv, jt):
        devices = devices_for(srv.url, spec, data)
        drive(devices, jt.finished, timeout=60)
        served_status(srv.url, spec.task, lambda st: st.get("phase") == "done")
        public = _public_text(srv.url, spec.task)
        status = jt.result
    assert status is not None and len(status["history"]) == 1 and "failed" not in status["history"][0]
    masked = [d for d in devices if 0 in d.quantized]
    assert len(masked) == 5
    target, others = masked[0], masked[1:]
    rest = np.zeros_like(target.quantized[0])
    for d in others:
        rest += d.quantized[0]
    hypotheses: dict[str, Any] = {"true": target.quantized[0], "zero": np.zeros_like(rest)}
    found = {}
    for name, x in hypotheses.items():
        digest = hashlib.sha256((rest + x).astype("<u4").tobytes()).hexdigest()
        found[name] = digest in public or digest in json.dumps(status)
    assert found == {"true": False, "zero": False}, found
    for rec in status["history"]:
        assert not any("sha" in k or "digest" in k or "sum" in k for k in rec), rec


def test_an_outsider_cannot_recover_the_sample_and_public_views_do_not_depend_on_it(tmp_path: Path) -> None:
    """The accountant credits amplification by a *secret* Poisson sample. The outsider asks the round
    endpoint about every client id (unsigned, and signed with its own enrolled credential for another id)
    and probes the upload route with an unsigned upload per id. On the old code the round endpoint
    answered ``selected`` for any id and an upload got 403 ``not_selected`` only for unselected ids: the
    sample was recovered exactly. Now every probe gets 401 and nothing else; and the public views (round
    without a client id, ``/status``) are the same function of the job's state whatever the sample was:
    changing the sample, the realized count and every counter in the job's state changes no public byte."""
    spec = task_spec("leak-sample", 10, sampling={"kind": "poisson", "rate": 0.5}, rounds=2)
    data = make_data(10)
    topics = Topics.fresh()
    url = _url(tmp_path)
    outsider = enroll("outsider-1")  # enrolled by the same authority, but not one of the task's clients
    with (
        open_transport(url) as tr,
        collector(tmp_path, url, topics) as srv,
        JobThread(tr, spec, topics, checkpoint_interval=0.2) as jt,
    ):
        served_status(srv.url, spec.task, lambda st: st.get("phase") == "train")
        true_sample = set(jt.job._st.selected)
        recovered: set[str] = set()
        answers: list[int] = []
        round_url = f"{srv.url}/v1/fl/tasks/{spec.task}/round"
        for c in spec.clients:
            r = httpx.get(round_url, params={"client_id": c}, timeout=10)
            answers.append(r.status_code)
            if r.status_code == 200 and r.json().get("selected"):
                recovered.add(c)
            target = f"/v1/fl/tasks/{spec.task}/round?client_id={c}"
            r = httpx.get(f"{srv.url}{target}", headers=outsider.sign_request("GET", target), timeout=10)
            answers.append(r.status_code)
            probe = make_upload(spec.task, 0, "update", c, {"vector": np.zeros(5, np.float32), "num_examples": 1})
            r = httpx.post(
                f"{srv.url}/v1/fl/tasks/{spec.task}/uploads",
                content=encode_upload(probe),
                headers={"Content-Type": "application/json"},
                timeout=10,
            )
            answers.append(r.status_code)
            if r.status_code != 403:
                recovered.add(c)
        assert recovered != true_sample  # the attack's goal: on the old code recovered == true_sample
        assert set(answers) == {401}, answers
        drive(devices_for(srv.url, spec, data), jt.finished, timeout=60)
        job = jt.job
        before = json.dumps([job._round_state().public_view(), job._public_stats()], sort_keys=True)
        st = job._st
        st.selected = list(reversed(spec.clients))[:3]
        st.accepted["update"] += 7
        st.rejected["not_selected"] += 3
        st.duplicates["update"] += 2
        for rec in st.history:
            rec["clients"] = 1
        after = json.dumps([job._round_state().public_view(), job._public_stats()], sort_keys=True)
    assert before == after
