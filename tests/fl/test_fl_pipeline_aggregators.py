"""The job's aggregator options over the pipeline (embedded log): adaptive clipping and robust aggregation.

* ``adaptive_clipping``: the task over the pipeline, with the job stopped and restarted after round 2
  (the clip norm comes back from the checkpoint), ends bit-identical to run_rounds with the same stack;
  ε and the clip norm of every round match.
* ``median`` / ``krum`` with one malicious device (it uploads −10× its honest update): the pipeline's
  model equals run_rounds with the same attack; in every round the robust aggregate stays inside the
  honest updates (derived below), while FedAvg's does not, and the final model stays near the honest-only
  FedAvg model while attacked FedAvg is far from it.
* Combinations that cannot work are refused with an error that says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from estimator.fl.aggregators import AggregateResult, RoundContext
from ldp_core.fl.errors import FLError
from ldp_core.fl.training import ClientUpdate
from tests.support.fl_pipeline_support import (
    JobThread,
    devices_for,
    drive,
    final_params,
    make_data,
    reference_run,
    run_with_restart,
    running_task,
    scaled_updates,
    task_spec,
)

ATTACKER = "dev-3"
SCALE = np.float32(-10.0)


def test_adaptive_clipping_task_equals_run_rounds_across_a_restart(tmp_path: Path) -> None:
    spec = task_spec(
        "adaptive",
        8,
        rounds=4,
        clip_norm=0.5,
        noise_multiplier=0.8,
        aggregator={
            "kind": "adaptive_clipping",
            "target_quantile": 0.5,
            "clip_learning_rate": 0.2,
            "count_stddev": 2.0,
        },
    )
    assert spec.device_clip_norm is None  # the server needs each update's norm against C
    data = make_data(8)
    ref, history = reference_run(spec, data)

    def check(jt: JobThread, restored: dict[str, Any]) -> None:
        # C must be the one run_rounds carried into the restored round
        assert restored["clip_norm"] == history[restored["round"] - 1].info["next_clip_norm"]

    status = run_with_restart(tmp_path, spec, data, check)
    assert np.array_equal(final_params(status), ref)
    assert [h["epsilon"] for h in status["history"]] == [h.info["epsilon"] for h in history]
    assert [h["clip_norm"] for h in status["history"]] == [h.info["clip_norm"] for h in history]
    clips = [h.info["clip_norm"] for h in history] + [history[-1].info["next_clip_norm"]]
    assert clips[0] == 0.5 and len(set(clips)) == len(clips)  # C moved every round
    assert status["accepted"] == {"update": 16} and status["rejected"] == {}


_attack = scaled_updates(SCALE, (ATTACKER,))


class _Recorder:
    """Delegates to ``inner`` and keeps each round's honest updates and aggregate (for the checks)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.linear = inner.linear
        self.honest: list[np.ndarray] = []
        self.aggregates: list[np.ndarray] = []

    def aggregate(self, updates: list[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        self.honest.append(np.stack([np.asarray(u.delta, np.float64) for u in updates if u.client_id != ATTACKER]))
        res = self.inner.aggregate(updates, ctx)
        self.aggregates.append(np.asarray(res.delta, np.float64))
        return res


def _robust_spec(kind: str, **agg: Any) -> Any:
    return task_spec(
        f"robust-{kind}",
        7,
        rounds=3,
        clip_norm=None,
        noise_multiplier=0.0,
        sampling={"kind": "fixed", "count": 7},
        aggregator={"kind": kind, **agg},
    )


@pytest.mark.parametrize("kind,agg", [("median", {"f": 1}), ("krum", {"f": 1})])
def test_robust_task_with_a_malicious_device_over_the_pipeline(tmp_path: Path, kind: str, agg: dict[str, Any]) -> None:
    """All 7 clients every round, one of them malicious: the job's model equals run_rounds with the same
    attack and the same robust stack, bit for bit."""
    spec = _robust_spec(kind, **agg)
    data = make_data(7)
    ref, _ = reference_run(spec, data, tamper=_attack)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (tr, srv, jt):
        # an enrolled device that misbehaves: authentication does not stop it
        devices = devices_for(srv.url, spec, data, scale={ATTACKER: SCALE})
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None
    assert np.array_equal(final_params(status), ref)
    assert status["accepted"] == {"update": 21} and status["rejected"] == {}
    assert all(h["clients"] == 7 for h in status["history"])
    if kind == "krum":  # the kept count is reported, never which clients were kept (the sample is private)
        assert all(h["kept"] == 1 and "selected" not in h for h in status["history"])


def test_robust_aggregates_stay_inside_the_honest_updates_and_fedavg_does_not() -> None:
    """Derived guarantee, f = 1, n = 7, one malicious update: per coordinate, the median of 7 values of
    which 6 are honest lies between the smallest and largest honest value (at least 3 honest values lie
    on each side of it); so does the trimmed mean (after dropping the largest and the smallest value,
    every remaining value is within the honest range). Krum with n − f − 2 = 4 neighbours keeps one of
    the honest updates here (the −10× update is far from all). Checked exactly, every round. FedAvg's
    weighted mean leaves the honest range in most coordinates. Final models: the robust ones lie within
    a quarter of attacked FedAvg's distance from the honest-only FedAvg model (the 6 honest clients)."""
    data = make_data(7)
    honest_spec = task_spec(
        "honest",
        6,
        rounds=3,
        clip_norm=None,
        noise_multiplier=0.0,
        clients=[c for c in _robust_spec("median", f=1).clients if c != ATTACKER],
        sampling={"kind": "fixed", "count": 6},
    )
    honest, _ = reference_run(honest_spec, [xy for i, xy in enumerate(data) if i != 3])
    dist: dict[str, float] = {}
    for kind, agg in (("median", {"f": 1}), ("trimmed_mean", {"f": 1}), ("krum", {"f": 1}), ("fedavg", {})):
        spec = _robust_spec(kind, **agg)
        rec = _Recorder(spec.build_aggregator(None))
        x, _ = reference_run(spec, data, tamper=_attack, aggregator=rec)
        dist[kind] = float(np.linalg.norm(x.astype(np.float64) - honest))
        for H, a in zip(rec.honest, rec.aggregates):
            assert H.shape[0] == 6
            inside = (a >= H.min(axis=0) - 1e-12) & (a <= H.max(axis=0) + 1e-12)
            if kind == "fedavg":
                assert inside.mean() < 0.5, (kind, inside)
            elif kind == "krum":
                assert any(np.array_equal(a, h) for h in H)
            else:
                assert inside.all(), (kind, a, H.min(axis=0), H.max(axis=0))
    for kind in ("median", "trimmed_mean", "krum"):
        assert dist[kind] < 0.25 * dist["fedavg"], dist


def test_task_spec_refuses_aggregators_that_cannot_work() -> None:
    with pytest.raises(FLError, match="not linear.*set clip_norm to null"):
        task_spec("x", 7, aggregator={"kind": "median", "f": 1})  # task_spec sets clip_norm 0.5 and σ 0.8
    with pytest.raises(FLError, match="individual update.*reveals only their sum"):
        task_spec("x", 7, clip_norm=None, noise_multiplier=0.0, secagg=True, aggregator={"kind": "krum", "f": 1})
    with pytest.raises(FLError, match="secagg needs clip_norm"):
        task_spec("x", 7, clip_norm=None, noise_multiplier=0.0, secagg=True)
    with pytest.raises(FLError, match="cannot run with secagg"):
        task_spec("x", 7, secagg=True, aggregator={"kind": "adaptive_clipping", "count_stddev": 2.0})
    with pytest.raises(FLError, match="noise_multiplier > 0"):
        task_spec("x", 7, noise_multiplier=0.0, aggregator={"kind": "adaptive_clipping"})
    with pytest.raises(FLError, match="σ_b = 0.2"):  # default σ_b = 4/20 = 0.2 must exceed z/2 = 0.4
        task_spec("x", 7, aggregator={"kind": "adaptive_clipping"})
    with pytest.raises(FLError, match="needs at least 5 updates per round; the task samples 4"):
        task_spec("x", 7, clip_norm=None, noise_multiplier=0.0, aggregator={"kind": "krum", "f": 1})
    with pytest.raises(FLError, match="has no options \\['g'\\]"):
        task_spec("x", 7, clip_norm=None, noise_multiplier=0.0, aggregator={"kind": "median", "g": 1})
    with pytest.raises(FLError, match="f must be an integer"):
        task_spec("x", 7, clip_norm=None, noise_multiplier=0.0, aggregator={"kind": "median"})
    with pytest.raises(FLError, match="aggregator kind must be one of"):
        task_spec("x", 7, aggregator={"kind": "mean"})
    ok = task_spec(
        "x",
        7,
        clip_norm=None,
        noise_multiplier=0.0,
        sampling={"kind": "fixed", "count": 5},
        aggregator={"kind": "krum", "f": 1, "multi": 2},
    )
    assert type(ok.from_dict(ok.to_dict()).build_aggregator(None).inner).__name__ == "Krum"
