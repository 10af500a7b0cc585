"""The accuracy–ε sweep (``ldp pate --sweep``): a small sweep's curves are consistent (ε ordered as σ and the
query count say, data-dependent never above data-independent, frontiers monotone) and every ε is the
accountant's figure recomputed on the same votes."""

from __future__ import annotations

import json

import pytest

from estimator.pate.accounting import data_dependent, data_independent
from estimator.pate.sweep import GRIDS, epsilon_at, frontier, run_sweep


@pytest.fixture(scope="module")
def sweep() -> dict:  # type: ignore[type-arg]
    return run_sweep(7, "small", keep_arrays=True)


def test_every_epsilon_is_the_accountants(sweep: dict) -> None:  # type: ignore[type-arg]
    votes = sweep["votes"]
    for r in sweep["rows"]:
        q, mask = r["queries"], r["answered_mask"]
        assert mask.sum() == r["answered"]
        if r["aggregator"] == "gnmax":
            di = data_independent(r["sigma"], q, 1e-5)["epsilon"]
            dd = data_dependent(votes[:q], r["sigma"], 1e-5)["epsilon"]
        else:
            di = data_independent(r["sigma"], r["answered"], 1e-5, queries=q, sigma1=r["sigma1"])["epsilon"]
            dd = data_dependent(votes[:q], r["sigma"], 1e-5, mask, r["threshold"], r["sigma1"])["epsilon"]
        assert r["epsilon"] == pytest.approx(di, rel=1e-12)
        assert r["epsilon_data_dependent"] == pytest.approx(dd, rel=1e-12)
        assert r["epsilon_data_dependent"] <= r["epsilon"] * (1 + 1e-9)


def test_the_curves_are_monotone_consistent(sweep: dict) -> None:  # type: ignore[type-arg]
    g = GRIDS["small"]
    gn = {(r["sigma"], r["queries"]): r for r in sweep["rows"] if r["aggregator"] == "gnmax"}
    for q in g.gnmax_queries:  # more noise, less ε; more queries, more ε
        eps = [gn[(s, q)]["epsilon"] for s in sorted(g.gnmax_sigmas)]
        assert all(a > b for a, b in zip(eps, eps[1:]))
    for s in g.gnmax_sigmas:
        eps = [gn[(s, q)]["epsilon"] for q in sorted(g.gnmax_queries)]
        dd = [gn[(s, q)]["epsilon_data_dependent"] for q in sorted(g.gnmax_queries)]
        assert all(a < b for a, b in zip(eps, eps[1:])) and all(a < b for a, b in zip(dd, dd[1:]))
    for name in ("frontier_gnmax", "frontier_confident"):
        f = sweep[name]
        assert f, name
        assert all(a["epsilon_data_dependent"] <= b["epsilon_data_dependent"] for a, b in zip(f, f[1:]))
        assert all(a["student_accuracy"] < b["student_accuracy"] for a, b in zip(f, f[1:]))
    for key in ("epsilon_gnmax", "epsilon_confident"):
        m = [c[key] for c in sweep["matched_accuracy"]]
        assert all(a <= b + 1e-12 for a, b in zip(m, m[1:]))
    for c in sweep["matched_accuracy"]:
        assert c["reduction"] == pytest.approx(1 - c["epsilon_confident"] / c["epsilon_gnmax"])
    assert sweep["holds"] == all(c["reduction"] > 0 for c in sweep["matched_accuracy"])


def test_frontier_and_interpolation() -> None:
    rows = [
        {"student_accuracy": 0.6, "epsilon_data_dependent": 1.0},
        {"student_accuracy": 0.5, "epsilon_data_dependent": 2.0},  # dominated: dearer and worse
        {"student_accuracy": 0.8, "epsilon_data_dependent": 3.0},
        {"student_accuracy": None, "epsilon_data_dependent": 0.1},
    ]
    f = frontier(rows)
    assert [r["epsilon_data_dependent"] for r in f] == [1.0, 3.0]
    # linear between (0.6, 1) and (0.8, 3): a quarter of the way in accuracy is a quarter of the way in ε
    assert epsilon_at(f, 0.65) == pytest.approx(1.0 + 0.25 * 2.0)
    assert epsilon_at(f, 0.5) == 1.0 and epsilon_at(f, 0.81) is None


def test_the_cli_prints_the_sweep_as_json(sweep: dict, tmp_path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def,type-arg]
    """The command's wiring and printing (the sweep itself is the fixture's, computed once for this file)."""
    import estimator.pate.sweep as sweep_module
    from ldp_cli.main import main

    def strip(v):  # type: ignore[no-untyped-def]  # what run_sweep returns without keep_arrays
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in ("votes", "answered_mask")}
        return [strip(x) for x in v] if isinstance(v, list) else v

    plain = strip(sweep)
    asked: list[tuple] = []  # type: ignore[type-arg]

    def fake(seed, grid, delta, progress=None):  # type: ignore[no-untyped-def]
        asked.append((seed, grid, delta))
        return plain

    monkeypatch.setattr(sweep_module, "run_sweep", fake)
    plot = tmp_path / "sweep.png"
    assert main(["pate", "--sweep", "small", "--seed", "7", "--json", "--plot", str(plot)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert asked == [(7, "small", 1e-5)]
    assert {"rows", "frontier_gnmax", "frontier_confident", "matched_accuracy", "holds"} <= set(doc)
    assert doc["plot"] == str(plot) and plot.stat().st_size > 1000
    assert main(["pate", "--sweep", "small", "--seed", "7"]) == 0
    assert "Confident-GNMax cheaper at every matched accuracy" in capsys.readouterr().out
