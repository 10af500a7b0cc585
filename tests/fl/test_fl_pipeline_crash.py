"""SIGKILL of the FL aggregation job (`ldp fl job`, a subprocess) mid-round on the embedded log.

After each restart the job loads its newest checkpoint and re-reads the uploads after it; devices do
not upload again. The final model must equal the in-process run bit for bit, and each sampled client's
update must be accepted exactly once.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from tests.support.fl_pipeline_support import (
    JobProcess,
    Topics,
    collector,
    devices_for,
    drive_rounds,
    final_params,
    make_data,
    reference_run,
    task_spec,
)


def test_sigkill_of_the_job_mid_round_resumes_without_loss_or_double_count(tmp_path: Path) -> None:
    """The job runs as `ldp fl job`; it is SIGKILLed in round 1 holding two uploads it has not committed,
    and in round 2 after a mid-phase checkpoint of one upload, and restarted each time. The final model is
    bit-identical to the in-process run, and the job accepted exactly one update per sampled client per round."""
    spec = task_spec("crash-e", 8, rounds=4)
    data = make_data(8)
    ref, history = reference_run(spec, data)
    topics = Topics.fresh()
    url = f"sqlite:///{tmp_path}/transport.sqlite3"
    job = JobProcess(tmp_path, url, spec, topics, checkpoint_interval=0.3)
    # round -> (uploads the job must have received, seconds to wait after that) before the SIGKILL:
    # 2 uploads not yet checkpointed; 1 upload after a mid-phase checkpoint
    plan = {1: (2, 0.0), 2: (1, 0.8)}

    def before(r: int, i: int) -> None:
        k, pause = plan.get(r, (None, 0.0))
        if i == k:
            job.wait_status(lambda st: st["round"] == r and st["received_this_round"] >= i)
            time.sleep(pause)
            job.kill9()
            job.start()

    with collector(tmp_path, url, topics) as srv:
        job.start()
        try:
            drive_rounds(job, devices_for(srv.url, spec, data), spec.rounds, before=before)
            status = job.wait()
        finally:
            job.stop()
    assert job.kills == 2, job.kills
    assert np.array_equal(final_params(status), ref), (final_params(status), ref)
    assert status["accepted"] == {"update": 16} and status["rejected"] == {}
    assert [h["clients"] for h in status["history"]] == [h.sampled for h in history]
    assert [h["epsilon"] for h in status["history"]] == [h.info["epsilon"] for h in history]
