"""The FL job on the shared checkpointed loop (pipeline.processor): a failed commit restores the committed
state, and the records it had seen are counted exactly once (embedded log, no collector)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from estimator.fl.job import AggregationJob, JobSettings
from pipeline.transport import CommitFailedError, open_transport
from tests.support.fl_pipeline_support import Topics, task_spec


class _FailOnce:
    """The consumer's ``transaction`` whose first commit aborts and raises :class:`CommitFailedError`
    (what a rebalance racing the commit does); later transactions are the real ones."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.failed = 0

    def __call__(self) -> Any:
        if self.failed:
            return self.real()
        outer = self
        inner = self.real()

        class Ctx:
            def __enter__(self) -> Any:
                return inner.__enter__()

            def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
                if et is not None:
                    inner.__exit__(et, ev, tb)
                    return
                inner.__exit__(RuntimeError, RuntimeError("test abort"), None)  # nothing becomes visible
                outer.failed += 1
                raise CommitFailedError("the group rebalanced before the commit (test)")

        return Ctx()


def _job(tr: Any, spec: Any, topics: Topics) -> AggregationJob:
    return AggregationJob(
        tr,
        spec,
        JobSettings(
            group=topics.group,
            rounds_topic=topics.rounds,
            updates_topic=topics.updates,
            state_topic=topics.state,
            session_timeout=4.0,
            checkpoint_interval=0.0,
        ),
    )


def test_a_failed_commit_restores_the_committed_state_and_counts_each_upload_once(tmp_path: Path) -> None:
    spec = task_spec("loop", 4, sampling={"kind": "fixed", "count": 2})
    topics = Topics.fresh()
    with open_transport(f"sqlite:///{tmp_path}/t.sqlite3") as tr:
        job = _job(tr, spec, topics)
        job.open()
        assert job.restores == 0 and job.status()["committed_offsets"] == {}  # a fresh task, not a restore
        seq = job.status()["seq"]
        failing = _FailOnce(job._consumer.transaction)  # type: ignore[union-attr]
        job._consumer.transaction = failing  # type: ignore[method-assign,union-attr]
        tr.publish(topics.updates, spec.task.encode(), b"{}")  # an upload the job refuses (counted by reason)
        for _ in range(50):
            job.step(timeout=0.1)
            if failing.failed and job.status()["committed_offsets"]:
                break
        status = job.status()
        assert failing.failed == 1 and job.aborted == 1 and job.restores == 1
        assert sum(status["rejected"].values()) == 1, status["rejected"]  # re-read after the restore, once
        assert status["committed_offsets"] == {"0": 1} and not status["uncommitted"]
        assert status["round"] == 0 and status["seq"] == seq
        job.close()

        again = _job(tr, spec, topics)
        again.open()
        back = again.status()
        assert back["rejected"] == status["rejected"] and back["params"] == status["params"]
        assert back["committed_offsets"] == {"0": 1} and again.incomplete_checkpoints == 0
        again.close()
