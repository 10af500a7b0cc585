"""The shared privacy budget: shares, approvals, debits before the run, refusals, the report, durability,
and two real processes debiting one session at once never overspending."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from estimator.accounting.ledger import BudgetLedger, LedgerError, LedgerRefusal, debit_before_run
from estimator.accounting.odometer import ZCDPFilter
from ldp_core.privacy_events import GaussianEvent, PureDPEvent

ROOT = Path(__file__).resolve().parents[2]


def _session(tmp_path: Path, epsilon: float = 1.0) -> BudgetLedger:
    return BudgetLedger.create(tmp_path / "s.db", "clinic-visits", epsilon, 0.0, filter="basic", owner="dpo")


def test_shares_approvals_refusals_and_the_report(tmp_path: Path) -> None:
    led = _session(tmp_path)
    led.allocate("alice", 0.6, by="dpo")
    led.allocate("bob", 0.4, by="dpo")
    with pytest.raises(LedgerError, match="does not fit"):
        led.allocate("carol", 0.1)
    with pytest.raises(LedgerRefusal) as no_share:
        led.debit("carol", "central", PureDPEvent(0.1))
    assert no_share.value.reason == "unknown_partner"
    with pytest.raises(LedgerRefusal) as unapproved:
        led.debit("alice", "central", PureDPEvent(0.1))
    assert unapproved.value.reason == "unapproved" and "approve" in str(unapproved.value)
    led.approve("central", by="dpo", note="counts per ward")
    led.approve("pate", by="dpo", partner="bob")
    assert led.debit("alice", "central", PureDPEvent(0.25), "q1")["cost"]["epsilon"] == 0.25
    assert led.debit("alice", "central", PureDPEvent(0.35), "q2")["cost"]["epsilon"] == 0.35  # 0.6: the share
    with pytest.raises(LedgerRefusal) as spent:
        led.debit("alice", "central", PureDPEvent(0.01))
    assert spent.value.reason == "exhausted" and "nothing was spent" in str(spent.value)
    with pytest.raises(LedgerRefusal, match="not approved"):
        led.debit("alice", "pate", PureDPEvent(0.01))  # approved for bob only
    led.debit("bob", "pate", PureDPEvent(0.3))
    led.close()

    with BudgetLedger(tmp_path / "s.db") as again:  # durable: a new process would read the same
        r = again.report()
    assert r["partners"]["alice"]["spent"]["epsilon"] == pytest.approx(0.6)
    assert r["partners"]["alice"]["debits"] == 2 and r["partners"]["alice"]["refused"] == 3
    assert r["partners"]["bob"]["remaining"]["epsilon"] == pytest.approx(0.1)
    assert r["by_kind"] == {
        "central": {"epsilon": pytest.approx(0.6), "delta": 0.0},
        "pate": {"epsilon": 0.3, "delta": 0.0},
    }
    assert r["status"]["spent"]["epsilon"] == pytest.approx(0.9)
    assert {(a["kind"], a["partner"], a["approved_by"]) for a in r["approvals"]} == {
        ("central", "*", "dpo"),
        ("pate", "bob", "dpo"),
    }
    refusals = [e["detail"]["reason"] for e in r["entries"] if e["action"] == "refused"]
    assert refusals == ["unknown_partner", "unapproved", "exhausted", "unapproved"]
    with pytest.raises(LedgerError, match="already exists"):
        BudgetLedger.create(tmp_path / "s.db", "x", 1.0, 0.0, filter="basic")


def test_the_zcdp_session_is_the_odometer_filter(tmp_path: Path) -> None:
    """A zCDP session admits exactly what one ZCDPFilter with the same budget admits, in order."""
    led = BudgetLedger.create(tmp_path / "z.db", "fl-task-7", 3.0, 1e-6)
    led.allocate("lab", 1.0)
    led.approve("dpsgd", by="owner")
    flt = ZCDPFilter(3.0, 1e-6)
    events = [GaussianEvent(2.0), GaussianEvent(1.5), GaussianEvent(1.0), GaussianEvent(3.0), GaussianEvent(0.9)]
    for ev in events:
        expected = flt.try_spend(ev)
        try:
            led.debit("lab", "dpsgd", ev)
            got = True
        except LedgerRefusal:
            got = False
        assert got == expected
    assert led.report()["status"]["spent"]["rho"] == pytest.approx(flt.spent[0])
    assert debit_before_run(None, None, "dpsgd", GaussianEvent(1.0)) is None  # no session: nothing to do


_WORKER = """
import sys, time, os
from estimator.accounting.ledger import BudgetLedger, LedgerRefusal
from ldp_core.privacy_events import PureDPEvent
path, start, name = sys.argv[1], sys.argv[2], sys.argv[3]
check = BudgetLedger._check
def slow_check(self, *a):  # widen the window between the check and the write, as a loaded machine would
    out = check(self, *a)
    time.sleep(0.02)
    return out
BudgetLedger._check = slow_check
led = BudgetLedger(path)
open(start + "." + name, "w").close()  # ready
while not os.path.exists(start):
    time.sleep(0.001)
ok = 0
for i in range(12):
    try:
        led.debit("alice", "central", PureDPEvent(0.1), f"{name}-{i}")
        ok += 1
    except LedgerRefusal:
        pass
print(ok)
"""


def test_two_processes_debiting_at_once_never_overspend(tmp_path: Path) -> None:
    """Two processes each try 12 debits of ε = 0.1 against a share of ε = 1 at the same moment: exactly
    10 are admitted in all (the read-check-write is one BEGIN IMMEDIATE transaction), the ledger holds 10
    debits and 14 refusals, and the spend is 1. Each worker sleeps 20 ms between its check and its write:
    without the transaction (checked once by replacing it with a no-op) the two overspend."""
    led = _session(tmp_path)
    led.allocate("alice", 1.0)
    led.approve("central", by="dpo")
    led.close()
    start = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(tmp_path / "s.db"), str(start), n],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in ("p1", "p2")
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"go.{n}").exists() for n in ("p1", "p2")):  # both imported and waiting
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a worker did not start"
        time.sleep(0.01)
    start.touch()
    admitted = [int(p.communicate(timeout=60)[0].strip()) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(admitted) == 10
    with BudgetLedger(tmp_path / "s.db") as again:
        r = again.report()
    assert r["partners"]["alice"]["debits"] == 10 and r["partners"]["alice"]["refused"] == 14
    assert r["status"]["spent"]["epsilon"] <= 1.0
