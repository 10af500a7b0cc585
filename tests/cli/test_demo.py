"""``ldp demo``, the README's main command: the whole pipeline on the embedded log, and ``--offline``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ldp_cli.main import main


def test_demo_runs_the_pipeline_and_checks_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "demo",
            "--devices",
            "4000",
            "--sdk-devices",
            "2",
            "--frame-reports",
            "500",
            "--min-batch",
            "500",
            "--out",
            str(out),
            "--workdir",
            str(tmp_path / "work"),
            "--seed",
            "5",
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "every uploaded report counted exactly once: yes" in text
    assert "streaming estimates equal the batch job over the Parquet dataset: yes" in text
    assert (out / "demo.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((out / "demo.json").read_text())
    assert summary["held_by_shuffler"] == 0 and summary["transport"] == "embedded"
    kinds = {name: m.get("kind", "frequency") for name, m in summary["metrics"].items()}
    assert {"mean", "distribution"} <= set(kinds.values())  # the example metrics include numeric ones
    for name, m in summary["metrics"].items():
        assert m["counted"] == m["uploaded"] == m["n"] == 4000, name
        assert m["batch_equals_streaming"]
        if kinds[name] == "mean":
            # the mean within 5 of its own standard errors (CI half-width / 1.96) of the devices' true mean
            se = (m["ci_high"] - m["ci_low"]) / (2 * 1.959963984540054)
            assert abs(m["mean"] - m["true_mean"]) < 5 * se, m
        elif kinds[name] == "heavy_hitters":  # search_word: words discovered by name, none listed in advance
            found = [f[0] for f in m["found"]]
            assert "weather" in found[:3] and m["true_top"][0] == ["weather", m["true_top"][0][1]], m["found"]
            assert 0 < m["recall"] <= 1
        elif kinds[name] == "distribution":
            assert abs(sum(m["hist"]) - 1) < 1e-9 and abs(sum(m["true_hist"]) - 1) < 1e-9
            assert set(m["quantiles"]) == {"p50", "p90", "p99"}
        else:
            truth = np.array(m["truth"])
            assert truth.sum() == 4000
        # the central ε is per person (a device's day of up to r reports) and must beat that person's local r·ε
        assert m["person_epsilon"] == m["reports_per_day"] * m["epsilon"]
        assert m["central_epsilon"] is not None and m["central_epsilon"] < m["person_epsilon"]
    assert (tmp_path / "work" / "dataset").is_dir()


def test_demo_offline_keeps_the_all_oracles_simulation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "demo",
            "--offline",
            "--mechanisms",
            "grr,oue",
            "--users",
            "20000",
            "--domain",
            "32",
            "--out",
            str(tmp_path),
            "--no-plot",
        ]
    )
    assert code == 0
    rows = json.loads((tmp_path / "demo.json").read_text())
    assert [r["mechanism"] for r in rows] == ["grr", "oue"]
    assert all(r["users"] == 20000 and sum(r["true"]) == 20000 for r in rows)


def test_demo_refuses_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--devices", "0", "--out", str(tmp_path)]) == 2
    assert "must be positive" in capsys.readouterr().err
