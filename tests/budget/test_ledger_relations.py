"""The ledger records each debit's neighbouring relation and never mixes relations unsoundly; a debit with a
reference (an FL task id) is charged once, and a changed plan under the same reference is refused."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from estimator.accounting.ledger import BudgetLedger, LedgerRefusal
from estimator.accounting.odometer import zcdp_budget
from ldp_core.privacy_events import GaussianEvent, PureDPEvent, SelfComposedEvent


def _session(tmp_path: Path, neighbors: str, name: str = "s.db") -> BudgetLedger:
    led = BudgetLedger.create(tmp_path / name, "task", 30.0, 1e-6, neighbors=neighbors, owner="dpo")  # type: ignore[arg-type]
    led.allocate("lab", 0.5, by="dpo")
    led.approve("fl-job", by="dpo")
    return led


def _rho(led: BudgetLedger, partner: str = "lab") -> float:
    return float(led.report()["partners"][partner]["spent"]["rho"])


def test_each_debit_records_its_relation_and_replace_in_an_add_remove_session_is_refused(tmp_path: Path) -> None:
    led = _session(tmp_path, "add_or_remove")
    ev = SelfComposedEvent(GaussianEvent(4.0), 3)
    d = led.debit("lab", "fl-job", ev, "stated add/remove")
    assert d["neighbors"] == "add_or_remove"
    # 3 rounds of z = 4 under add/remove: ρ = 3 · 1/(2 z²)
    assert _rho(led) == pytest.approx(3 / (2 * 16.0), rel=1e-12)
    with pytest.raises(LedgerRefusal) as refused:
        led.debit("lab", "fl-job", ev, "stated replace", neighbors="replace")
    assert refused.value.reason == "relation" and "no sound conversion" in str(refused.value)
    assert _rho(led) == pytest.approx(3 / 32.0, rel=1e-12)  # nothing spent
    entries = [e for e in led.report()["entries"] if e["action"] in ("debit", "refused")]
    assert [(e["action"], e["neighbors"]) for e in entries] == [("debit", "add_or_remove"), ("refused", "replace")]


def test_an_add_remove_event_in_a_replace_session_is_priced_by_group_privacy(tmp_path: Path) -> None:
    led = _session(tmp_path, "replace")
    led.debit("lab", "fl-job", SelfComposedEvent(GaussianEvent(4.0), 3), "add/remove", neighbors="add_or_remove")
    # a replacement is a removal and an addition: the sensitivity doubles, ρ = 3 · (2/z)²/2 = 4x the add/remove ρ
    assert _rho(led) == pytest.approx(3 * 4 / (2 * 16.0), rel=1e-12)
    led.debit("lab", "fl-job", PureDPEvent(0.5), "pure", neighbors="add_or_remove")
    assert _rho(led) == pytest.approx(3 * 4 / 32.0 + (2 * 0.5) ** 2 / 2, rel=1e-12)  # ε doubles: ρ = (2ε)²/2
    rows = [e for e in led.report()["entries"] if e["action"] == "debit"]
    assert {e["neighbors"] for e in rows} == {"add_or_remove"}
    assert all(e["detail"]["priced_under"] == "replace" and "group privacy" in e["detail"]["conversion"] for e in rows)


def test_a_reference_is_charged_once_and_a_changed_plan_is_refused(tmp_path: Path) -> None:
    led = _session(tmp_path, "add_or_remove")
    ev = SelfComposedEvent(GaussianEvent(2.0), 5)
    first = led.debit("lab", "fl-job", ev, "job", ref="fl-job:t1")
    again = led.debit("lab", "fl-job", SelfComposedEvent(GaussianEvent(2.0), 5), "job (resumed)", ref="fl-job:t1")
    assert first["repeat"] is False and again["repeat"] is True and again["cost"] == first["cost"]
    assert _rho(led) == pytest.approx(5 / 8.0, rel=1e-12)
    for changed in (SelfComposedEvent(GaussianEvent(2.0), 6), SelfComposedEvent(GaussianEvent(1.5), 5)):
        with pytest.raises(LedgerRefusal) as refused:
            led.debit("lab", "fl-job", changed, "job, other plan", ref="fl-job:t1")
        assert refused.value.reason == "changed_plan"
    led.allocate("other", 0.5, by="dpo")
    with pytest.raises(LedgerRefusal, match="another plan"):
        led.debit("other", "fl-job", ev, "same plan, other partner", ref="fl-job:t1")
    assert _rho(led) == pytest.approx(5 / 8.0, rel=1e-12) and _rho(led, "other") == 0.0
    actions = [(e["action"], e["ref"]) for e in led.report()["entries"] if e["ref"]]
    assert actions == [("debit", "fl-job:t1"), ("repeat", "fl-job:t1")] + [("refused", "fl-job:t1")] * 3


def test_an_exhausted_share_refuses_a_referenced_debit_and_a_retry_is_still_checked(tmp_path: Path) -> None:
    led = _session(tmp_path, "add_or_remove")
    share = 0.5 * zcdp_budget(30.0, 1e-6)
    z = (1 / (2 * share)) ** 0.5 * 0.99  # one Gaussian release costing just over the share
    with pytest.raises(LedgerRefusal) as refused:
        led.debit("lab", "fl-job", GaussianEvent(z), "too much", ref="fl-job:big")
    assert refused.value.reason == "exhausted"
    with pytest.raises(LedgerRefusal):  # a refused debit is not a debit: the retry is checked again, and refused
        led.debit("lab", "fl-job", GaussianEvent(z), "too much", ref="fl-job:big")
    assert _rho(led) == 0.0


def test_an_older_session_file_gains_the_columns_on_open(tmp_path: Path) -> None:
    led = _session(tmp_path, "add_or_remove")
    led.debit("lab", "fl-job", PureDPEvent(0.1), "before")
    led.close()
    path = tmp_path / "s.db"
    conn = sqlite3.connect(path)  # make it look like a session written before debits had a relation
    conn.execute("ALTER TABLE ledger DROP COLUMN ref")
    conn.execute("ALTER TABLE ledger DROP COLUMN neighbors")
    conn.commit()
    conn.close()
    with BudgetLedger(path) as again:
        again.debit("lab", "fl-job", PureDPEvent(0.1), "after", ref="r")
        entries = [e for e in again.report()["entries"] if e["action"] == "debit"]
    assert [(e["label"], e["neighbors"], e["ref"]) for e in entries] == [
        ("before", "add_or_remove", None),
        ("after", "add_or_remove", "r"),
    ]
    assert json.loads(json.dumps(entries))  # the report stays JSON


def test_ldp_budget_debit_takes_the_relation_and_the_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ldp_cli.main import main

    _session(tmp_path, "add_or_remove").close()
    path = str(tmp_path / "s.db")
    base = ["budget", "debit", path, "--partner", "lab", "--kind", "fl-job", "--release", "laplace:0.5", "--json"]
    assert main([*base, "--ref", "x"]) == 0 and main([*base, "--ref", "x"]) == 0
    first, again = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert (first["repeat"], again["repeat"], again["neighbors"]) == (False, True, "add_or_remove")
    assert main([*base, "--event-neighbors", "replace"]) == 3
    assert json.loads(capsys.readouterr().out)["reason"] == "relation"
    assert main(["budget", "report", path]) == 0
    assert "debits stated under: 1 add_or_remove (session: add_or_remove); 1 repeats not charged" in (
        capsys.readouterr().out
    )
