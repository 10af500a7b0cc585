"""The FL job's private search resumes without drawing its noise twice: the sparse vector technique keeps its
noisy threshold and answers in the state file, the exponential mechanism its choice; another plan is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from estimator.selection.fl_job import SearchState, candidate_specs, select_task, selection_total
from estimator.selection.mechanisms import SelectionError
from tests.support.fl_pipeline_support import make_data, task_spec


class _Crash(Exception):
    pass


def _setup() -> tuple[list, tuple[np.ndarray, np.ndarray], np.ndarray]:
    spec = task_spec("sel-unit", 6, rounds=2, sampling={"kind": "poisson", "rate": 0.5})
    cands = candidate_specs(spec, (3.0, 2.0), (0.5, 1.0))
    x = make_data(1, per_client=60, seed=5)[0][0]
    params = np.array([1.0, -0.5, 0.25, 2.0, 0.1], np.float32)[: cands[0].build_model().num_params]
    y = cands[0].build_model().predict(params, x)  # every candidate's model classifies all 60 rows correctly
    return cands, (x, y), params


def test_svt_resumes_with_its_noisy_threshold_and_never_asks_an_answered_query_again(tmp_path: Path) -> None:
    """Threshold 0 with ε_select = 4 (monotone, c = 1: both Laplace scales 1/2): a score of 60 is answered ⊥
    only if ν − ρ < −60, which needs ν < −30 or ρ > 30, each with probability <= e^{-60}."""
    cands, validation, params = _setup()
    plan = {"t": "sel-unit", "method": "svt"}
    path = str(tmp_path / "state.json")
    calls: list[str] = []

    def crash(c: object) -> np.ndarray:
        raise _Crash()

    def run(c: object) -> np.ndarray:
        calls.append(c.task)  # type: ignore[attr-defined]
        return params

    with pytest.raises(_Crash):  # the job died while the first candidate ran
        select_task(cands, "svt", 4.0, validation, crash, SearchState(path, plan), threshold=0.0)
    saved = SearchState(path, plan).data["svt"]
    assert saved["answers"] == [] and isinstance(saved["rho"], int)
    r = select_task(cands, "svt", 4.0, validation, run, SearchState(path, plan), threshold=0.0)
    assert r["chosen"] == 0 and r["answers"] == [True] and calls == ["sel-unit.c0"]
    assert SearchState(path, plan).data["svt"]["rho"] == saved["rho"]  # the same noisy threshold
    again = select_task(cands, "svt", 4.0, validation, run, SearchState(path, plan), threshold=0.0)
    assert again["chosen"] == 0 and calls == ["sel-unit.c0"]  # answered: not asked (nor trained) again
    with pytest.raises(SelectionError, match="another plan"):
        SearchState(path, {**plan, "method": "em"})


def test_em_keeps_its_choice(tmp_path: Path) -> None:
    cands, validation, params = _setup()
    path = str(tmp_path / "state.json")
    calls: list[str] = []

    def run(c: object) -> np.ndarray:
        calls.append(c.task)  # type: ignore[attr-defined]
        return params

    first = select_task(cands, "em", 1.0, validation, run, SearchState(path, {"m": "em"}))
    assert len(calls) == 4 and first["candidates_scored_now"] == 4
    again = select_task(cands, "em", 1.0, validation, run, SearchState(path, {"m": "em"}))
    assert again["chosen"] == first["chosen"] and len(calls) == 4


def test_fixed_count_totals_are_replace_one_without_amplification() -> None:
    """Fixed count: each candidate's rounds unamplified under replace (Gaussian, sensitivity 2C) and the choice at
    2 ε_select (group privacy), checked against dp_accounting's PLD of exactly that."""
    from dp_accounting.pld import common as pld_common
    from dp_accounting.pld import privacy_loss_distribution as pld

    spec = task_spec("sel-fixed", 8, rounds=3)
    cands = candidate_specs(spec, (3.0, 2.0))
    got = selection_total(cands, 0.5, 1e-5)
    ref = pld.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(2 * 0.5, 0.0), 1e-4)
    for z in (3.0, 2.0):
        g = pld.from_gaussian_mechanism(z, sensitivity=2.0, value_discretization_interval=1e-4).self_compose(3)
        ref = ref.compose(g)
    assert got["neighbors"] == "replace" and got["amplification_credited"] is False
    assert got["epsilon"] == pytest.approx(float(ref.get_epsilon_for_delta(1e-5)), rel=5e-3)
