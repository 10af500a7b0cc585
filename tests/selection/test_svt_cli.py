"""``ldp privacy svt``: the contract's keys, the selection with --scores, the plot, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ldp_cli.main import main


def test_json_contract_and_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scores = ",".join(str(v) for v in [0, 1, 2, 500, 3])
    plot = tmp_path / "svt.png"
    argv = ["privacy", "svt", "--epsilon", "4", "--delta", "1e-6", "--threshold", "100", "--monotonic"]
    assert main([*argv, "--scores", scores, "--plot", str(plot), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epsilon"] == 4.0 and out["candidates"] == 5
    assert out["epsilon_threshold"] + out["epsilon_queries"] == pytest.approx(4.0)
    assert out["query_scale"] == pytest.approx(1 / out["epsilon_queries"], rel=1e-5)  # monotone: cΔ/ε₂
    assert out["naive"]["epsilon_basic"] == pytest.approx(5 * out["epsilon_queries"], rel=1e-5)
    # scores 400 above / 97+ below the threshold against noise of scale 0.5: P[wrong] < 1e-80
    assert out["selected"] == [3] and out["scored"] == 4
    assert plot.stat().st_size > 1000 and "protects" in out
    assert main(["privacy", "svt", "--epsilon", "1", "--delta", "1e-6"]) == 0
    assert "ε₁" in capsys.readouterr().out


def test_bad_input_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "svt", "--epsilon", "1", "--delta", "1e-6", "--candidates", "3", "--scores", "1,2"]) == 2
    assert "--scores has 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["privacy", "svt", "--epsilon", "1", "--delta", "1e-6", "--scores", "1,x"])


def test_a_run_is_debited_to_a_budget_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from estimator.accounting.ledger import BudgetLedger

    s = tmp_path / "s.db"
    led = BudgetLedger.create(s, "validation-set", 1.0, 0.0, filter="basic")
    led.allocate("ana", 1.0)
    led.approve("selection", by="dpo")
    led.close()
    argv = ["privacy", "svt", "--epsilon", "0.6", "--delta", "1e-6", "--scores", "1,2,3", "--json",
            "--budget-session", str(s), "--partner", "ana"]  # fmt: skip
    assert main(argv) == 0 and "selected" in json.loads(capsys.readouterr().out)
    assert main(argv) == 3  # 1.2 > 1: refused before any noise is drawn
    out = json.loads(capsys.readouterr().out)
    assert out["reason"] == "exhausted" and "selected" not in out


def test_c_answers_then_halt() -> None:
    import numpy as np

    from estimator.accounting.central import SparseVector
    from estimator.selection.mechanisms import AboveThreshold, svt_select

    svt = SparseVector(6.0, threshold=50, max_answers=2, monotonic=True)  # scales 0.5 and 1.0 rows
    # 950 above / 50 below the threshold: P[a wrong answer] < 1e-20
    sel = svt_select(lambda i: [0, 1000, 0, 1000, 1000][i], 5, svt, np.random.default_rng(7))
    assert sel.selected == (1, 3) and sel.scored == 4
    out = AboveThreshold.outcomes(svt, np.tile([1000, 0, 1000, 1000], (3, 1)), np.random.default_rng(8))
    assert out.tolist() == [[1, 0, 1, -1]] * 3
