"""Federated rounds over the pipeline on the real Kafka broker (the `kafka_bootstrap` fixture fails, never
skips, without one): the same checks as tests/fl/test_fl_pipeline.py and tests/fl/test_fl_pipeline_crash.py,
with the collector, the job and the topics on Kafka (transactional checkpoints, read_committed)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

from pipeline.transport import open_transport
from tests.support.fl_pipeline_support import (
    JobProcess,
    JobThread,
    Topics,
    collector,
    devices_for,
    drive,
    drive_rounds,
    final_params,
    make_data,
    reference_run,
    task_spec,
)

pytestmark = pytest.mark.kafka


def test_dp_fedavg_and_secagg_over_kafka(tmp_path: Path, kafka_bootstrap: str) -> None:
    """Three DP-FedAvg rounds equal the in-process run bit for bit; then a SecAgg task with one client
    dropping after sharing keys unmasks exactly the survivors' ring sum."""
    url = f"kafka://{kafka_bootstrap}"
    spec = task_spec("fedavg-k", 8)
    data = make_data(8)
    ref, history = reference_run(spec, data)
    topics = Topics.fresh()
    with open_transport(url) as tr, collector(tmp_path, url, topics) as srv:
        with JobThread(tr, spec, topics, checkpoint_interval=0.3) as jt:
            devices = devices_for(srv.url, spec, data)
            drive(devices, jt.finished, timeout=90)
            status = jt.result
        assert status is not None
        assert np.array_equal(final_params(status), ref), (final_params(status), ref)
        assert [h["epsilon"] for h in status["history"]] == [h.info["epsilon"] for h in history]
        assert status["accepted"] == {"update": 12} and status["rejected"] == {}

        sa = task_spec(
            "secagg-k",
            6,
            secagg=True,
            sampling={"kind": "fixed", "count": 5},
            rounds=1,
            noise_multiplier=0.0,
            phase_timeout=2.0,
        )
        sdata = make_data(6, seed=3)
        sa_topics = dataclasses.replace(topics, group=topics.group + "-sa")  # one group per task
        with JobThread(tr, sa, sa_topics, checkpoint_interval=0.3) as jt:
            devices = devices_for(srv.url, sa, sdata, drop_at={sa.clients[0]: "masked"})
            drive(devices, jt.finished, timeout=90)
            sstatus = jt.result
            sa_audit = dict(jt.job._st.audit)
    assert sstatus is not None
    rec = sstatus["history"][0]
    masked = [d for d in devices if 0 in d.quantized]
    total = np.zeros(sa.build_model().num_params, np.uint32)
    for d in masked:
        total += d.quantized[0]
    leaver = next(d for d in devices if d.client_id == sa.clients[0])
    assert len(rec["secagg_survivors"]) == len(masked) >= 3
    assert len(rec["secagg_dropped"]) == (1 if (0, "share") in leaver._done else 0)
    assert hashlib.sha256(total.astype("<u4").tobytes()).hexdigest() == sa_audit[0]  # checkpointed, not published
    assert "sum_sha256" not in rec


def test_sigkill_of_the_job_on_kafka_resumes_exactly(tmp_path: Path, kafka_bootstrap: str) -> None:
    """`ldp fl job` on Kafka, SIGKILLed in round 1 with two uploads not yet committed and restarted
    (its transactional id fences the dead one's open transaction): the final model equals the
    in-process run's and every update is accepted once."""
    url = f"kafka://{kafka_bootstrap}"
    spec = task_spec("crash-k", 8, rounds=3)
    data = make_data(8)
    ref, history = reference_run(spec, data)
    topics = Topics.fresh()
    job = JobProcess(tmp_path, url, spec, topics, checkpoint_interval=5.0)

    def before(r: int, i: int) -> None:
        if (r, i) == (1, 2):
            job.wait_status(lambda st: st["round"] == 1 and st["received_this_round"] >= 2)
            job.kill9()
            job.start()

    with collector(tmp_path, url, topics) as srv:
        job.start()
        try:
            drive_rounds(job, devices_for(srv.url, spec, data), spec.rounds, before=before)
            status = job.wait(120)
        finally:
            job.stop()
    assert job.kills == 1
    assert np.array_equal(final_params(status), ref), (final_params(status), ref)
    assert status["accepted"] == {"update": 12} and status["rejected"] == {}
