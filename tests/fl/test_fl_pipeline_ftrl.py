"""The ``dp_ftrl`` task over the pipeline (embedded log), with the job stopped and restarted mid-tree:
the tree noise comes back from the checkpoint and the final model is bit-identical to run_rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from estimator.fl.ftrl import ftrl_epsilon
from tests.support.fl_pipeline_support import (
    JobThread,
    final_params,
    make_data,
    reference_run,
    run_with_restart,
    task_spec,
)


@pytest.mark.parametrize("efficient", [False, True])
def test_dp_ftrl_task_equals_run_rounds_across_a_restart(tmp_path: Path, efficient: bool) -> None:
    spec = task_spec(
        f"ftrl-{efficient}",
        8,
        rounds=5,
        clip_norm=0.5,
        noise_multiplier=0.8,
        aggregator={"kind": "dp_ftrl", "restart_every": 3, "efficient": efficient},
    )
    data = make_data(8)
    ref, history = reference_run(spec, data)

    def check(jt: JobThread, restored: dict[str, Any]) -> None:
        # the tree restored must be the one run_rounds had after that many rounds
        ftrl = jt.job._ftrl
        assert ftrl is not None and ftrl.tree is not None and ftrl.tree.efficient is efficient
        done = restored["round"]
        assert ftrl.tree.step == history[done - 1].info["tree_step"] == (done - 1) % 3 + 1

    status = run_with_restart(tmp_path, spec, data, check)
    assert np.array_equal(final_params(status), ref)
    assert [h["epsilon"] for h in status["history"]] == [h.info["epsilon"] for h in history]
    assert [h["tree_step"] for h in status["history"]] == [1, 2, 3, 1, 2]
    assert status["history"][-1]["epsilon"] == ftrl_epsilon(0.8, 5, 1e-5, 3)
    by = {a["adversary"]: a["epsilon"] for a in status["epsilon_by_adversary"]}
    assert by["observer"] == by["knows_sample"] == status["history"][-1]["epsilon"]
    # DP-FTRL's ε is add/remove one client (ftrl_epsilon's default), and the status says so next to each ε
    assert status["neighbors"] == "add_or_remove"
    assert {(a["neighbors"], a["neighbors_unit"]) for a in status["epsilon_by_adversary"]} == {
        ("add_or_remove", "client")
    }
