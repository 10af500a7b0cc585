"""``ldp fl job --budget-session FILE --partner NAME``: the whole plan debited once before round 1, under the task
id, with its relation recorded; a SIGKILLed and restarted job is not charged again; an exhausted share or a
changed plan is refused with exit 3 before anything runs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from estimator.accounting.ledger import BudgetLedger
from estimator.fl.budget import BUDGET_KIND, planned_epsilon, task_event, task_ref
from ldp_cli.main import main
from tests.support.fl_pipeline_support import (
    JobProcess,
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


def _ledger(tmp_path: Path, epsilon: float = 80.0, neighbors: str = "add_or_remove", share: float = 0.5) -> Path:
    path = tmp_path / "budget.db"
    with BudgetLedger.create(path, "fl-task", epsilon, 1e-6, neighbors=neighbors, owner="dpo") as led:  # type: ignore[arg-type]
        led.allocate("lab", share, by="dpo")
        led.approve(BUDGET_KIND, by="dpo")
    return path


def _last_json(log: str) -> dict:
    return json.loads([line for line in log.splitlines() if line.startswith("{")][-1])


def test_a_job_killed_and_restarted_is_charged_once_for_its_whole_plan(tmp_path: Path) -> None:
    """Fixed-count sampling (replace-one ε) in an add/remove session: the job debits SelfComposed(Gaussian(z/2), T)
    stated add/remove (ρ = T · 2/z², the replace price: see estimator/fl/budget.py). It is SIGKILLed in round 1
    and restarted: the ledger holds one debit and one repeat, and the model equals the in-process run."""
    spec = task_spec("budget-a", 8, rounds=3)
    data = make_data(8)
    ref, _ = reference_run(spec, data)
    session = _ledger(tmp_path)
    topics = Topics.fresh()
    url = f"sqlite:///{tmp_path}/transport.sqlite3"
    job = JobProcess(
        tmp_path, url, spec, topics, checkpoint_interval=0.3,
        extra_args=["--budget-session", str(session), "--partner", "lab"],
    )  # fmt: skip

    def before(r: int, i: int) -> None:
        if (r, i) == (1, 1):
            job.wait_status(lambda st: st["round"] == 1 and st["received_this_round"] >= 1)
            job.kill9()
            job.start()

    with collector(tmp_path, url, topics) as srv:
        job.start()
        try:
            drive_rounds(job, devices_for(srv.url, spec, data), spec.rounds, before=before)
            status = job.wait()
        finally:
            job.stop()
    assert job.kills == 1
    assert np.array_equal(final_params(status), ref)
    printed = _last_json(job.log.read_text())
    assert printed["budget"]["repeat"] is True and printed["budget"]["ref"] == task_ref(spec)
    with BudgetLedger(session) as led:
        report = led.report()
    rows = [e for e in report["entries"] if e["ref"] == task_ref(spec)]
    assert [e["action"] for e in rows] == ["debit", "repeat"]
    assert rows[0]["neighbors"] == "add_or_remove" and rows[0]["kind"] == BUDGET_KIND
    z, t = spec.noise_multiplier, spec.rounds
    assert report["partners"]["lab"]["spent"]["rho"] == pytest.approx(t * 2 / z**2, rel=1e-12)
    # the job's own figure is replace-one (fixed count), printed beside the debit's relation
    assert planned_epsilon(spec)["neighbors"] == "replace"
    assert status["epsilon"] == pytest.approx(planned_epsilon(spec)["epsilon"], rel=1e-9)


def test_an_exhausted_share_refuses_before_any_round_and_spends_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = task_spec("budget-b", 8, rounds=3)
    task = tmp_path / "task.json"
    task.write_text(json.dumps(spec.to_dict()))
    session = _ledger(tmp_path, epsilon=2.0, share=0.1)
    transport = tmp_path / "transport.sqlite3"
    argv = ["fl", "job", "--task", str(task), "--transport", f"sqlite:///{transport}", "--no-progress"]
    rc = main([*argv, "--budget-session", str(session), "--partner", "lab"])
    out = capsys.readouterr()
    assert rc == 3
    assert json.loads(out.out.strip().splitlines()[-1])["reason"] == "exhausted"
    assert "refused by the budget session (exhausted)" in out.err and "nothing was spent" in out.err
    assert "running" not in out.out and not transport.exists()  # no transport opened, no round published
    with BudgetLedger(session) as led:
        report = led.report()
    assert report["partners"]["lab"]["spent"]["rho"] == 0.0
    (refused,) = [e for e in report["entries"] if e["action"] == "refused"]
    assert refused["ref"] == task_ref(spec) and refused["neighbors"] == "add_or_remove"
    with pytest.raises(SystemExit, match="--budget-session needs --partner"):  # bad input, nothing debited
        main([*argv, "--budget-session", str(session)])


def test_a_resumed_job_with_a_changed_plan_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first run debited σ = 0.8 for 3 rounds under the task id (as the job does, before round 1); the
    same task id with σ = 1.2 is refused (changed_plan), exit 3, before any transport is opened."""
    spec = task_spec("budget-c", 8, rounds=3, sampling={"kind": "poisson", "rate": 0.5})
    session = _ledger(tmp_path, neighbors="replace")
    with BudgetLedger(session) as led:
        event, rel = task_event(spec, "replace")
        assert rel == "add_or_remove"  # Poisson: stated add/remove, priced under the replace session
        led.debit("lab", BUDGET_KIND, event, "first run", neighbors=rel, ref=task_ref(spec))
    task = tmp_path / "task.json"
    task.write_text(json.dumps(dataclasses.replace(spec, noise_multiplier=1.2).to_dict()))
    transport = tmp_path / "transport.sqlite3"
    argv = ["fl", "job", "--task", str(task), "--transport", f"sqlite:///{transport}", "--no-progress"]
    assert main([*argv, "--budget-session", str(session), "--partner", "lab"]) == 3
    assert "changed_plan" in capsys.readouterr().err and not transport.exists()
    with BudgetLedger(session) as led:
        report = led.report()
    # charged once, at the replace price of the Poisson rounds (zCDP credits no sampling): 3 · (2/z)²/2
    assert report["partners"]["lab"]["spent"]["rho"] == pytest.approx(3 * 2 / 0.8**2, rel=1e-12)


def _reference(sigmas: list[float], q: float, rounds: int, eps_sel: float, delta: float) -> float:
    """dp_accounting's own PLDs (add/remove): every candidate's Poisson-sampled Gaussian rounds and the choice."""
    from dp_accounting.pld import common as pld_common
    from dp_accounting.pld import privacy_loss_distribution as pld

    total = pld.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(eps_sel, 0.0), 1e-4)
    for z in sigmas:
        total = total.compose(
            pld.from_gaussian_mechanism(z, sampling_prob=q, value_discretization_interval=1e-4).self_compose(rounds)
        )
    return float(total.get_epsilon_for_delta(delta))


def test_select_em_over_the_pipeline_composes_every_candidate_and_the_choice(tmp_path: Path) -> None:
    """`ldp fl job --select em` runs the candidate tasks <task>.c0 (σ = 4) and <task>.c1 (σ = 2) over the
    pipeline with real devices, scores each on the operator's validation rows and chooses one; the printed
    total equals dp_accounting's composition of both candidates' rounds and the choice, and the whole search
    was debited once (Σ T/(2σ²) + ε_select²/2 in the add/remove zCDP session)."""
    from estimator.selection.fl_job import candidate_specs

    spec = task_spec("select-a", 8, rounds=2, sampling={"kind": "poisson", "rate": 0.5})
    data = make_data(8)
    vx, vy = make_data(1, per_client=60, seed=99)[0]
    validation = tmp_path / "validation.npz"
    np.savez(validation, x=vx, y=vy)
    session = _ledger(tmp_path)
    topics = Topics.fresh()
    url = f"sqlite:///{tmp_path}/transport.sqlite3"
    args = ["--select", "em", "--candidate-noise-multipliers", "4,2", "--validation", str(validation)]
    job = JobProcess(
        tmp_path, url, spec, topics, extra_args=[*args, "--budget-session", str(session), "--partner", "lab"]
    )
    candidates = candidate_specs(spec, (4.0, 2.0))
    with collector(tmp_path, url, topics) as srv:
        devices = [d for c in candidates for d in devices_for(srv.url, c, data)]
        job.start()
        try:
            drive(devices, job.finished, timeout=150)
            job.wait()
        finally:
            job.stop()
    out = _last_json(job.log.read_text())
    sel = out["selection"]
    assert [c["task"] for c in sel["candidates"]] == ["select-a.c0", "select-a.c1"]
    assert sel["chosen"] in (0, 1) and out["task"] == sel["chosen_task"] and out["done"] is True
    assert sel["candidates_scored_now"] == 2 and sel["validation_rows"] == 60
    assert sel["epsilon"] == pytest.approx(_reference([4.0, 2.0], 0.5, 2, 1.0, spec.delta), rel=5e-3)
    assert sel["epsilon"] > sel["epsilon_training_all_candidates"] > max(sel["epsilon_each_candidate"])
    assert sel["neighbors"] == "add_or_remove" and out["budget"]["repeat"] is False
    with BudgetLedger(session) as led:
        spent = led.report()["partners"]["lab"]["spent"]["rho"]
    assert spent == pytest.approx(2 / (2 * 16) + 2 / (2 * 4) + 1.0**2 / 2, rel=1e-12)
