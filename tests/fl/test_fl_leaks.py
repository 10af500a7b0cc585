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

from pipeline.transport import open_transport
from tests.support.fl_pipeline_support import (
    JobThread,
    Topics,
    collector,
    devices_for,
    drive,
    make_data,
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
    topics = Topics.fresh()
    url = _url(tmp_path)
    with (
        open_transport(url) as tr,
        collector(tmp_path, url, topics) as srv,
        JobThread(tr, spec, topics, checkpoint_interval=0.2) as jt,
    ):
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
