"""``ldp synth --budget-session`` and ``generate(budget_session=...)``: a run is debited (kind ``synth``) at the
cost it then spends, before anything is synthesised; a refusal exits 3 and writes nothing; the methods with
no finite ε, and zCDP-only methods in a ``basic`` session, are refused as bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from estimator.accounting.ledger import BudgetLedger, LedgerRefusal
from estimator.accounting.odometer import zcdp_rho
from estimator.synth import runner
from estimator.synth.budget import synth_event
from estimator.synth.data import SynthError, population
from estimator.synth.dpgan import gan_epsilon
from estimator.synth.io import write_table
from estimator.synth.zcdp import rho_for_epsilon
from ldp_cli.main import main


def _session(tmp_path: Path, epsilon: float = 4.0, filter: str = "zcdp", approve: bool = True) -> str:
    s = str(tmp_path / f"{filter}.db")
    with BudgetLedger.create(s, "population", epsilon, 1e-6, filter=filter, per_release_delta=1e-8) as ledger:  # type: ignore[arg-type]
        ledger.allocate("lab", 0.5, by="dpo")
        if approve:
            ledger.approve("synth", by="dpo")
    return s


def test_the_events_cost_what_the_generators_spend() -> None:
    ev, settings = synth_event("mst", 1.0, 1e-6, 400)
    assert zcdp_rho(ev) == pytest.approx(rho_for_epsilon(1.0, 1e-6)) == pytest.approx(settings["rho"])
    ev, settings = synth_event("dpgan", 2.0, 1e-6, 400, gan_steps=40)
    assert settings["sample_rate"] == pytest.approx(64 / 400)
    # the charged event is the run's: its PLD ε (the generator's own accountant) meets the target
    eps = gan_epsilon(settings["noise_multiplier"], settings["sample_rate"], 40, 1e-6)
    assert 0.98 * 2.0 <= eps <= 2.0
    assert ev.to_dict()["count"] == 40 and math.isclose(ev.event.sampling_probability, 64 / 400)  # type: ignore[attr-defined]
    for method in ("copy", "gan-nodp", "exact-marginals"):
        with pytest.raises(SynthError, match="no finite ε"):
            synth_event(method, 1.0, 1e-6, 400)


def test_generate_debits_first_and_refuses_before_synthesising(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = population(300, 1).select(["platform", "network", "crashes"])
    s = _session(tmp_path)
    syn, info = runner.generate("mst", table, 1.0, 1e-6, np.random.default_rng(0), budget_session=s, partner="lab")
    assert syn.rows == 300 and info["budget"]["kind"] == "synth"
    assert info["budget"]["cost"]["rho"] == pytest.approx(info["rho"])  # charged = spent by MST's own ledger
    from estimator.synth import marginal

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("synthesised after a refusal")

    monkeypatch.setattr(marginal, "mst", boom)
    # the share is ρ(4, 1e-6)/2 = 0.156; ε = 1 spent 0.024, ε = 3 costs 0.185 more: refused
    with pytest.raises(LedgerRefusal) as exc:
        runner.generate("mst", table, 3.0, 1e-6, np.random.default_rng(0), budget_session=s, partner="lab")
    assert exc.value.reason == "exhausted"
    basic = _session(tmp_path, filter="basic")
    with pytest.raises(SynthError, match="zCDP only"):
        runner.generate("aim", table, 1.0, 1e-6, np.random.default_rng(0), budget_session=basic, partner="lab")


def test_ldp_synth_budget_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "in.csv"
    write_table(population(400, 2).select(["platform", "network", "crashes"]), csv)
    # the zcdp filter does not credit Poisson sampling (a 30-step DP-GAN at ε = 1 would cost ρ = 0.91), so the
    # DP-GAN goes to a basic session of ε = 3: each run is charged its PLD ε at δᵢ = 1e-8, 1.24 of the 1.5 share
    s = _session(tmp_path, epsilon=3.0, filter="basic")
    out = tmp_path / "gan.csv"
    argv = ["synth", "--method", "dpgan", "--input", str(csv), "--steps", "30", "--epsilon", "1", "--seed", "1"]
    argv += ["--budget-session", s, "--partner", "lab", "--out", str(out), "--json"]
    assert main(argv) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["budget"]["settings"]["noise_multiplier"] == pytest.approx(body["noise_multiplier"])
    assert out.exists()
    out.unlink()
    assert body["budget"]["cost"]["epsilon"] == pytest.approx(1.2413, abs=1e-3)
    assert main(argv) == 3  # a second run does not fit what is left of the share
    assert json.loads(capsys.readouterr().out)["refused"] is True and not out.exists()
    assert main([*argv[:-5], "--partner", "eve", "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["reason"] == "unknown_partner"
    assert main(["synth", "--method", "copy", "--input", str(csv), "--budget-session", s, "--partner", "lab"]) == 2
    assert "no finite ε" in capsys.readouterr().err
    assert main(["synth", "--method", "all", "--budget-session", s, "--partner", "lab"]) == 2
    with BudgetLedger(s) as ledger:
        rep = ledger.report()
    assert rep["partners"]["lab"]["debits"] == 1 and rep["partners"]["lab"]["refused"] == 1
    assert [e["detail"]["reason"] for e in rep["entries"] if e["action"] == "refused"] == [
        "exhausted",
        "unknown_partner",
    ]
