"""``ldp demo``, the README's main command: the whole pipeline on the embedded log, and ``--offline``."""

from __future__ import annotations

import argparse
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
            # no junk: every value listed is a word devices typed (the significance rule and the end marker)
            assert all(c > 0 for c in m["found_true_counts"]), list(zip(found, m["found_true_counts"]))
            assert m["candidates"] > len(found)
        elif kinds[name] == "distribution":
            assert abs(sum(m["hist"]) - 1) < 1e-9 and abs(sum(m["true_hist"]) - 1) < 1e-9
            assert set(m["quantiles"]) == {"p10", "p25", "p50", "p75", "p90", "p99"}
            assert all(q["ci_low"] <= q["value"] <= q["ci_high"] for q in m["quantiles"].values())
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


def test_demo_with_tokens_pays_every_upload_and_refuses_the_flood(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ldp demo --tokens``: the issuer beside a collector that requires tokens. Every device fetches one token
    per metric and spends it on that metric's upload; the flooding install gets its K tokens and no more, so of
    its 31 uploads exactly K are accepted and the other 29 refused, each for its own reason, and the issuer
    refuses it a second fetch. The counts are the issuer's and the collector's own (their databases)."""
    doc = json.loads((Path(__file__).parents[2] / "metrics" / "example.json").read_text())
    doc["metrics"] = {k: v for k, v in doc["metrics"].items() if k in ("emoji_used", "settings_tab")}
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    args = ["demo", "--tokens", "--metrics", str(metrics_path), "--devices", "120", "--sdk-devices", "1"]
    args += ["--min-batch", "40", "--flood", "30", "--out", str(out), "--workdir", str(tmp_path / "w"), "--no-plot"]
    code = main(args + ["--seed", "3"])
    captured = capsys.readouterr()
    text = captured.out
    assert code == 0, text
    assert "every uploaded report counted exactly once: yes" in text
    assert "enrolling" not in captured.err  # stderr is not a terminal: no enrollment bar
    tokens = json.loads((out / "demo.json").read_text())["tokens"]
    k = 2  # one token per metric and device by default
    flood = tokens["flood"]
    assert flood["metric"] == "emoji_used" and flood["tokens"] == k
    assert flood["outcomes"] == {
        "202 accepted": k,
        "401 token_missing": 14,  # beyond its K: every other upload without a token ...
        "409 token_spent": 14,  # ... and every other one with a token it spent before
        "422 too_many_reports": 1,  # one batch over max_reports_per_day (its token stays unspent)
    }
    assert flood["issuer_refusals"] == {"429 token_limit": 1}
    assert flood["accepted_reports"] == k * flood["reports_per_upload"]
    # 119 fleet devices and 1 SDK device each fetched k tokens, the flooder k: all issued, all spent
    assert tokens["issued"] == tokens["spent"] == 120 * k + k
    assert tokens["refused"] == 29
    assert f"tokens: {120 * k + k:,} issued" in text and "flood: one install sent 31 uploads" in text


def test_demo_token_options_are_checked_before_anything_starts(tmp_path: Path) -> None:
    from ldp_cli.commands.demo import run
    from ldp_cli.main import build_parser

    def args(*extra: str) -> argparse.Namespace:
        return build_parser().parse_args(["demo", "--workdir", str(tmp_path / "w"), "--no-plot", *extra])

    with pytest.raises(ValueError, match="K must be at least 6"):
        run(args("--tokens", "--tokens-per-day", "2"))
    with pytest.raises(ValueError, match="go with --tokens"):
        run(args("--flood", "10"))
    with pytest.raises(ValueError, match="--flood must be >= 0"):
        run(args("--tokens", "--flood", "-1"))
    assert not (tmp_path / "w" / "issuer").exists()  # no issuer was started for a refused configuration


def test_demo_removes_its_temporary_work_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``--workdir`` the demo works in a temporary folder (device credentials and stores, the analyzer's
    private key, the issuer's keys, logs, the dataset) and removes it when it ends: a private TMPDIR is as empty
    afterwards as before. With ``--workdir`` everything stays there."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    assert tempfile.gettempdir() == str(tmp)
    doc = json.loads((Path(__file__).parents[2] / "metrics" / "example.json").read_text())
    doc["metrics"] = {k: v for k, v in doc["metrics"].items() if k in ("emoji_used", "settings_tab")}
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(doc))
    args = ["demo", "--tokens", "--sealed", "--metrics", str(metrics_path), "--devices", "60", "--sdk-devices", "1"]
    args += ["--min-batch", "20", "--flood", "3", "--out", str(tmp_path / "out"), "--no-plot", "--seed", "4"]
    code = main(args)
    captured = capsys.readouterr()
    text = captured.out
    assert code == 0, text
    assert list(tmp.iterdir()) == []
    assert "removed at the end" in text
    assert "ldp demo: " not in captured.err  # stderr is not a terminal: no phase lines
    kept = tmp_path / "kept"
    assert main([*args, "--workdir", str(kept), "--progress"]) == 0
    err = capsys.readouterr().err  # forced: one line per phase on stderr, in order
    phases = [
        "starting the pipeline",
        "1 SDK devices",
        "simulating 59 devices",
        "sealing the reports",
        "one install floods",
        "59 devices enroll",
        "uploading",
        "waiting for the shuffler",
        "estimating every metric",
    ]
    at = [err.find(f"ldp demo: {p}") for p in phases]
    assert -1 not in at and at == sorted(at), err
    assert "enrolling" in err  # the token enrollment's bar, forced too
    assert (kept / "analyzer-keys").is_dir() and (kept / "sdk-devices").is_dir() and (kept / "issuer").is_dir()
    assert list(tmp.iterdir()) == []


def test_demo_stopped_by_sigterm_removes_its_temporary_work_folder(tmp_path: Path) -> None:
    """SIGTERM in the middle of a run (the pipeline up, devices uploading) stops the demo with exit 143 and still
    removes its temporary work folder: nothing is left in the private TMPDIR."""
    import os
    import signal
    import subprocess
    import sys

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    args = [sys.executable, "-m", "ldp_cli", "demo", "--devices", "20000", "--sdk-devices", "0", "--no-plot"]
    args += ["--out", str(tmp_path / "out"), "--seed", "6"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # the stack is up once the dashboard's address is printed
            seen.append(line)
            if "dashboard" in line:
                break
        assert any(p.name.startswith("ldp-demo-") for p in tmp.iterdir()), seen
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, "".join(seen) + rest
    assert list(tmp.iterdir()) == []
