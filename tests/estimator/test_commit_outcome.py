"""Issue 31: a commit reported failed whose outcome the member cannot know must lose nothing and count nothing twice.

Seen in the three-broker chaos test (tests/e2e/test_scale_chaos.py): after a broker was killed, an estimator
member's offset commit failed with ``UnknownMemberIdError`` although the offsets reached the group a moment
later (the new group coordinator showed them only once the replicas caught up, after the member had checked).
The member dropped its tail, rejoined at the now committed offsets, and the tail's reports were never read
again. Here the embedded log plays that commit: the consumer reports the failure and rewinds, the offsets land
before the next poll (``late``), and the group restarts the partitions from what is committed then. In the
other case (``never``) the commit did not happen and the records come again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from estimator.service import StreamingEstimator, merge_states
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import open_transport
from pipeline.transport.base import CommitFailedError
from tests.estimator.test_streaming import DAYS, assert_exact, catalog
from tests.support.shuffled_data import default_specs, make_batches, publish


@pytest.fixture
def transport(tmp_path: Path):  # type: ignore[no-untyped-def]
    t = open_transport(f"sqlite:///{tmp_path}/log.sqlite3", synchronous="NORMAL")
    t.create_topic(SHUFFLED_TOPIC, 4)
    yield t
    t.close()


def _fail_one_commit(est: StreamingEstimator, lands: bool) -> dict[str, Any]:
    """The next commit is reported failed (the consumer rewinds, as after ``UnknownMemberIdError``); if
    ``lands``, its offsets reach the group before the next poll, which restarts every partition from them."""
    consumer = est.consumer
    real_commit, real_poll = consumer.commit, consumer.poll
    seen: dict[str, Any] = {}

    def commit(offsets=None):  # type: ignore[no-untyped-def]
        consumer.commit = real_commit  # type: ignore[method-assign]
        seen["offsets"] = dict(offsets or {})
        seen["bases"] = {tp: t.base for tp, t in est._flushing.items()}
        consumer._rewind()  # type: ignore[attr-defined]
        raise CommitFailedError("member unknown to the new group coordinator (injected)")

    def poll(*a, **kw):  # type: ignore[no-untyped-def]
        if "offsets" in seen and not seen.get("landed"):
            seen["landed"] = True
            if lands:
                real_commit(seen["offsets"])  # the write the old coordinator had made shows now
            consumer._rewind()  # type: ignore[attr-defined] # the rejoin: every partition from its committed offset
        return real_poll(*a, **kw)

    consumer.commit = commit  # type: ignore[method-assign]
    consumer.poll = poll  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("lands", [True, False], ids=["late", "never"])
def test_a_commit_reported_failed_loses_and_doubles_nothing(tmp_path: Path, transport, lands: bool) -> None:  # type: ignore[no-untyped-def]
    specs = default_specs()
    batches = make_batches(specs, DAYS, 30, np.random.default_rng(31))
    publish(transport, SHUFFLED_TOPIC, batches[:20])
    with StreamingEstimator(transport, tmp_path / "st", catalog(specs), checkpoint_seconds=1e9) as est:
        while est.poll_once(max_records=7, timeout=0.3):
            pass
        assert est.checkpoint()  # a first commit: the failed one's tails start above offset 0
        publish(transport, SHUFFLED_TOPIC, batches[20:])
        est.poll_once(max_records=5, timeout=0.3)
        seen = _fail_one_commit(est, lands)
        assert not est.checkpoint()
        assert est.stats.commit_failures == 1 and seen["offsets"]
        est.checkpoint_seconds = 0.05
        est.run(idle_timeout=0.5)
        assert seen.get("landed")
        committed = {tp: est.consumer.committed(tp) for tp in seen["offsets"]}
        assert all(committed[tp] >= off for tp, off in seen["offsets"].items())
        assert_exact(est.counted(), batches)
        assert_exact(merge_states([est.state()]), batches)
        assert not est.uncertain if not lands else len(est.uncertain) == len(seen["offsets"])
        for tp, base in seen["bases"].items():  # where the partition restarted begins a range of its own
            starts = [int(r[0]) for r in est.segments[tp]]
            assert (base in starts) == (not lands), (tp, base, starts)
    with StreamingEstimator(transport, tmp_path / "st", catalog(specs), checkpoint_seconds=0.05) as again:
        again.run(idle_timeout=0.3)  # the snapshot on disk says the same
        assert_exact(merge_states([again.state()]), batches)
