"""``ldp pate --budget-session`` and ``run_pate(budget_session=...)``: the planned queries are debited (kind
``pate``) before any teacher trains, at the cost of PATE's own data-independent RDP; a refusal exits 3 and
trains nothing; a debited run withholds the figures the debit does not pay for."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from estimator.accounting.ledger import BudgetLedger, LedgerRefusal
from estimator.accounting.odometer import zcdp_rho
from estimator.pate import experiment
from estimator.pate.accounting import rdp_gnmax, rdp_lnmax, rdp_threshold
from estimator.pate.budget import WITHHELD, config_event, planned_event
from ldp_cli.main import main

SMALL = (experiment.Config("gnmax", 8.0, 60), experiment.Config("confident", 8.0, 120, 20.0, 12.5))


def _session(tmp_path: pathlib.Path, epsilon: float = 4.0, approve: bool = True) -> str:
    s = str(tmp_path / "s.db")
    with BudgetLedger.create(s, "digits", epsilon, 1e-6, owner="dpo") as ledger:
        ledger.allocate("lab", 0.5, by="dpo")
        if approve:
            ledger.approve("pate", by="dpo")
    return s


def test_the_planned_event_costs_what_pates_own_rdp_says() -> None:
    # ρ-zCDP is (λ, ρλ)-RDP at every order: the ledger's ρ times λ must equal estimator.pate.accounting's RDP
    lam = np.array([2.0, 8.0, 32.0])
    gn, conf = SMALL
    assert np.allclose(zcdp_rho(config_event(gn)) * lam, gn.queries * rdp_gnmax(gn.sigma, lam))
    want = conf.queries * (rdp_threshold(12.5, lam) + rdp_gnmax(conf.sigma, lam))  # every query checked and answered
    assert np.allclose(zcdp_rho(config_event(conf)) * lam, want)
    ln = experiment.Config("lnmax", 4.0, 10)
    # LNMax is pure (2/b)-DP per query: ρ = ε²/2, which is at least the RDP accounting's min(ε, λε²/2)/λ
    assert zcdp_rho(config_event(ln)) == pytest.approx(10 * (2 / 4.0) ** 2 / 2)
    assert np.all(zcdp_rho(config_event(ln)) * lam >= 10 * rdp_lnmax(4.0, lam) - 1e-12)
    assert zcdp_rho(planned_event(SMALL)) == pytest.approx(zcdp_rho(config_event(gn)) + zcdp_rho(config_event(conf)))
    with pytest.raises(ValueError, match="nothing to debit"):
        planned_event(())


def test_a_debited_run_pays_before_training_and_withholds_what_it_does_not_pay_for(tmp_path: pathlib.Path) -> None:
    s = _session(tmp_path, epsilon=40.0)  # ρ ≈ 12.6, half of it pays for SMALL's 3.2
    r = experiment.run_pate(seed=3, configs=SMALL, compare_dpsgd=True, budget_session=s, partner="lab")
    assert r["budget"]["kind"] == "pate" and r["budget"]["partner"] == "lab"
    assert r["budget"]["cost"]["rho"] == pytest.approx(zcdp_rho(planned_event(SMALL)))
    for key in WITHHELD:
        assert r[key] is None
    assert all(row["epsilon_data_dependent"] is None for row in r["tradeoff"])
    assert r["student_accuracy"] > 0.5  # the released figures are still there (chance is 0.1)
    with BudgetLedger(s) as ledger:
        rep = ledger.report()
    assert rep["by_kind"]["pate"]["rho"] == pytest.approx(r["budget"]["cost"]["rho"])
    with pytest.raises(ValueError, match="federated"):
        experiment.run_pate(seed=3, configs=SMALL, federated=True, budget_session=s, partner="lab")


def test_a_refused_run_trains_no_teacher(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _session(tmp_path, approve=False)

    def no_training(*_a: object, **_k: object) -> None:
        raise AssertionError("a teacher was trained after the ledger refused")

    monkeypatch.setattr(experiment, "train_teachers", no_training)
    with pytest.raises(LedgerRefusal) as exc:
        experiment.run_pate(seed=3, configs=SMALL, budget_session=s, partner="lab")
    assert exc.value.reason == "unapproved"


def test_ldp_pate_budget_session_and_exit_3(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the share is half of ρ = 0.311 (the zCDP budget of (4, 1e-6)): 0.156. These settings cost
    # 60/40² + 120/(2·60²) + 120/40² = 0.129: one run fits the share, a second does not
    cheap = (experiment.Config("gnmax", 40.0, 60), experiment.Config("confident", 40.0, 120, 20.0, 60.0))
    real = experiment.run_pate
    monkeypatch.setattr(experiment, "run_pate", lambda *a, **k: real(*a, **{**k, "configs": cheap}))
    rho = zcdp_rho(planned_event(cheap))
    assert rho == pytest.approx(60 / 40**2 + 120 / (2 * 60**2) + 120 / 40**2)
    s = _session(tmp_path)
    argv = ["pate", "--seed", "1", "--no-dpsgd", "--budget-session", s, "--partner", "lab"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"debited to lab in {s}" in out and "withheld (not paid for)" in out and "non-private model" not in out
    assert main([*argv, "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["refused"] is True
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "refused by the budget session (exhausted)" in err and "nothing was spent" in err
    assert main([*argv[:-1], "eve"]) == 3
    assert "unknown_partner" in capsys.readouterr().err
    assert main([*argv, "--federated"]) == 2
    assert "cannot be --federated" in capsys.readouterr().err
    with BudgetLedger(s) as ledger:
        rep = ledger.report()
    assert rep["partners"]["lab"]["debits"] == 1 and rep["partners"]["lab"]["refused"] == 2
    assert rep["by_kind"]["pate"]["rho"] == pytest.approx(rho)


def test_one_setting_of_the_table_is_run_and_debited_alone(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = _session(tmp_path, epsilon=40.0)
    argv = ["pate", "--setting", "4", "--no-dpsgd", "--seed", "2", "--budget-session", s, "--partner", "lab"]
    assert main([*argv, "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert [(r["setting"], r["queries"]) for r in obj["tradeoff"]] == [("GNMax σ=8", 200)]
    assert obj["budget"]["cost"]["rho"] == pytest.approx(200 / 8.0**2)  # 200 GNMax queries at ρ = 1/σ² each
    assert main(["pate", "--setting", "10", "--no-dpsgd"]) == 2
    assert "rows 1 to 9" in capsys.readouterr().err
