"""``ldp budget`` and the commands that debit a session before they run (``ldp dpsgd``, ``--select``,
``ldp privacy central --counts``): exit 3 and nothing run on refusal, the debit equal to the run's event."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from estimator.accounting.ledger import BudgetLedger
from estimator.accounting.odometer import zcdp_rho
from ldp_cli.main import main
from ldp_core.privacy_events import ComposedEvent, PureDPEvent, sampled_gaussian_event


def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    return json.loads(capsys.readouterr().out)


def test_the_budget_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = str(tmp_path / "s.db")
    assert main(["budget", "create", s, "--subject", "visits", "--epsilon", "1", "--filter", "basic", "--json"]) == 0
    assert _json(capsys)["epsilon"] == 1.0
    assert main(["budget", "allocate", s, "--partner", "ana", "--share", "0.5", "--json"]) == 0
    capsys.readouterr()
    debit = ["budget", "debit", s, "--partner", "ana", "--kind", "central", "--release", "laplace:0.3", "--json"]
    assert main(debit) == 3
    out = _json(capsys)
    assert out["refused"] is True and out["reason"] == "unapproved"
    assert main(["budget", "approve", s, "--kind", "central", "--by", "dpo", "--note", "weekly counts"]) == 0
    assert "approved for * by dpo" in capsys.readouterr().out
    assert main(debit) == 0 and _json(capsys)["cost"]["epsilon"] == pytest.approx(0.3, rel=1e-6)  # type: ignore[index]
    assert main(debit) == 3 and _json(capsys)["reason"] == "exhausted"  # 0.6 > the share of 0.5
    event = json.dumps(PureDPEvent(0.2).to_dict())
    assert main(["budget", "debit", s, "--partner", "ana", "--kind", "central", "--event", event]) == 0
    capsys.readouterr()
    assert main(["budget", "report", s, "--json"]) == 0
    r = _json(capsys)
    assert r["partners"]["ana"]["spent"]["epsilon"] == pytest.approx(0.5)  # type: ignore[index]
    assert main(["budget", "report", s, "--plot", str(tmp_path / "r.png")]) == 0 and "ana" in capsys.readouterr().out
    assert (tmp_path / "r.png").stat().st_size > 1000
    # bad input: exit 2 with the reason
    assert main(["budget", "report", str(tmp_path / "none.db")]) == 2
    assert "no budget session" in capsys.readouterr().err
    assert main(["budget", "allocate", s, "--partner", "ben", "--share", "0.6"]) == 2
    assert "does not fit" in capsys.readouterr().err


def _blobs(path: Path) -> Path:
    rng = np.random.default_rng(5)
    means = rng.normal(scale=2.5, size=(3, 6))
    y = rng.integers(0, 3, 500)
    np.savez(path, x=means[y] + rng.normal(size=(500, 6)), y=y)
    return path


def test_dpsgd_is_debited_before_it_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s, data = tmp_path / "s.db", _blobs(tmp_path / "d.npz")
    led = BudgetLedger.create(s, "blobs", 10.0, 1e-5)  # zCDP: ρ ≈ 1.5, no credit for subsampling
    led.allocate("lab", 0.9)
    led.approve("dpsgd", by="owner")
    led.close()
    run = ["dpsgd", "--data", str(data), "--model", "softmax", "--noise-multiplier", "3", "--clip", "1",
           "--sample-rate", "0.2", "--epochs", "1", "--delta", "1e-5", "--seed", "1", "--json",
           "--budget-session", str(s), "--partner", "lab"]  # fmt: skip
    assert main(run) == 0
    assert "accuracy" in _json(capsys)
    with BudgetLedger(s) as again:
        r = again.report()
    assert r["partners"]["lab"]["spent"]["rho"] == pytest.approx(zcdp_rho(sampled_gaussian_event(3.0, 0.2, 5)))
    # the search: not approved yet, so refused before any candidate is trained
    search = [*run, "--select", "em", "--candidate-noise-multipliers", "3,4"]
    assert main(search) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out)["reason"] == "unapproved" and "candidate" not in captured.err
    with BudgetLedger(s) as again:
        again.approve("dpsgd-select", by="owner")
    assert main(search) == 0
    capsys.readouterr()
    with BudgetLedger(s) as again:
        r = again.report()
    steps = [sampled_gaussian_event(z, 0.2, 5) for z in (3.0, 4.0)]
    expected = zcdp_rho(ComposedEvent((*steps, PureDPEvent(1.0))))
    assert r["by_kind"]["dpsgd-select"]["rho"] == pytest.approx(expected)
    # the share is now too small for another search: exit 3, and the ledger says so
    assert main([*search, "--select-epsilon", "3"]) == 3
    assert _json(capsys)["reason"] == "exhausted"


def test_a_central_release_is_debited(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = tmp_path / "s.db"
    led = BudgetLedger.create(s, "wards", 1.0, 0.0, filter="basic")
    led.allocate("ana", 1.0)
    led.approve("central", by="dpo")
    led.close()
    rel = ["privacy", "central", "--mechanism", "laplace", "--target-epsilon", "0.6", "--counts", "5,9,2", "--json",
           "--budget-session", str(s), "--partner", "ana"]  # fmt: skip
    assert main(rel) == 0 and len(_json(capsys)["released"]) == 3  # type: ignore[arg-type]
    assert main(rel) == 3  # 1.2 > 1: refused, and no noisy counts printed
    out = _json(capsys)
    assert out["refused"] is True and "released" not in out
    with BudgetLedger(s) as again:
        assert again.report()["partners"]["ana"]["spent"]["epsilon"] == pytest.approx(0.6)
