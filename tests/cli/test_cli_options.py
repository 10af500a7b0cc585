"""The ``ldp`` workers' shared options (ldp_cli/options.py): one metrics rule, one message, one exit code.

Every worker that reads reports (collector, shuffler, estimator, sink)
requires ``--metrics`` or ``$LDP_METRICS`` and, without either, exits 2
with the same message; none falls back to the example metrics file.
``ldp estimate`` takes metrics for labels only: without a file it still
estimates (and says the items are unlabelled), a given file must load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ldp_cli.main import build_parser, main
from ldp_cli.options import NO_METRICS, metrics_file, metrics_files, optional_metrics_files
from pipeline.catalog import SpecCatalog
from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "metrics" / "example.json")


def test_metrics_flag_over_environment_and_no_default() -> None:
    env = {"LDP_METRICS": "/env.json"}
    assert metrics_files(["a.json", "b.json"], env) == ["a.json", "b.json"]
    assert metrics_files("a.json", env) == ["a.json"]
    assert metrics_files(None, env) == ["/env.json"]
    assert metrics_file(None, env) == "/env.json"
    assert optional_metrics_files(None, {}) == []
    with pytest.raises(ConfigError, match=r"no metrics file: pass --metrics FILE or set \$LDP_METRICS"):
        metrics_files(None, {})
    with pytest.raises(ConfigError):
        metrics_files([], {"LDP_METRICS": ""})
    with pytest.raises(ConfigError, match="no metrics file"):
        SpecCatalog.from_files([])


@pytest.mark.parametrize(
    "argv",
    [
        ["shuffler", "--transport", "sqlite:///{tmp}/log.sqlite3"],
        ["sink", "--transport", "sqlite:///{tmp}/log.sqlite3", "--dataset", "{tmp}/dataset"],
        ["estimator", "--transport", "sqlite:///{tmp}/log.sqlite3", "--state", "{tmp}/state", "--no-http"],
        ["collector", "--transport", "sqlite:///{tmp}/log.sqlite3", "--port", "0"],
    ],
)
def test_every_worker_requires_the_metrics_file_the_same_way(
    argv: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("LDP_METRICS", raising=False)
    monkeypatch.delenv("LDP_COLLECTOR_METRICS_PATH", raising=False)
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"ldp {argv[0]}: error: {NO_METRICS}"
    assert not (tmp_path / "log.sqlite3").exists()  # refused before opening the log


def test_the_metrics_environment_variable_is_enough_for_a_worker(tmp_path: Path) -> None:
    env = {**os.environ, "LDP_METRICS": EXAMPLE}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ldp_cli.main",
            "sink",
            "--transport",
            f"sqlite:///{tmp_path}/log.sqlite3",
            "--dataset",
            str(tmp_path / "ds"),
            "--idle-exit",
            "0.2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["sink"]["records"] == 0


def test_worker_help_names_no_example_fallback() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("sink", "estimator", "estimate", "shuffler", "collector"):
        text = sub.choices[name].format_help()
        assert "$LDP_METRICS" in text and "example.json" not in text, name


def test_estimate_without_metrics_says_the_items_are_unlabelled(tmp_path: Path, monkeypatch, capsys) -> None:
    # type: ignore[no-untyped-def]
    monkeypatch.delenv("LDP_METRICS", raising=False)
    assert main(["estimate", "--dataset", str(tmp_path), "--metric", "nope", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "not labelled" in err and "no part files" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["estimate", "--dataset", str(tmp_path), "--metric", "nope", "--metrics", str(bad)]) == 2
    assert "ldp estimate: error:" in capsys.readouterr().err
