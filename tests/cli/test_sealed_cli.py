"""``ldp keys``, ``ldp demo --sealed``, and the analyzer processes' start-up checks of their keys."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ldp_cli.main import main
from ldp_core.metrics import load_metrics


def _plain_doc() -> dict[str, object]:
    return {
        "format": "ldp-metrics/1",
        "metrics": {
            "m": {
                "description": "d",
                "owner": "o@example.org",
                "expires": "2099-12-31",
                "mechanism": {"mechanism": "grr", "epsilon": 1.0},
                "domain": {"kind": "dictionary", "values": ["a", "b"]},
                "max_reports_per_day": 1,
            }
        },
    }


def test_keys_new_makes_a_0600_key_and_rotates_the_metrics_files_current_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(_plain_doc()))
    assert main(["keys", "new", "--dir", str(tmp_path / "keys"), "--metrics", str(path)]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["keys", "new", "--dir", str(tmp_path / "keys"), "--metrics", str(path)]) == 0
    second = json.loads(capsys.readouterr().out)
    ms = load_metrics(path)
    assert [k.key_id for k in ms.analyzer_keys] == [second["key_id"], first["key_id"]]  # current first
    for out in (first, second):
        assert stat.S_IMODE(os.stat(out["private_key_file"]).st_mode) == 0o600
        private = json.loads(Path(out["private_key_file"]).read_text())["private_key"]
        assert private not in path.read_text() and private not in json.dumps(out)
    assert main(["keys", "list", "--dir", str(tmp_path / "keys")]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(k["key_id"] for k in listed["keys"]) == sorted([first["key_id"], second["key_id"]])


def test_the_sink_and_estimator_refuse_to_start_without_usable_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _plain_doc()
    doc["metrics"]["m"]["sealed"] = True  # type: ignore[index]
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(doc))
    assert main(["keys", "new", "--dir", str(tmp_path / "keys"), "--metrics", str(path)]) == 0
    capsys.readouterr()
    transport = f"sqlite:///{tmp_path / 'log.sqlite3'}"
    sink = ["sink", "--transport", transport, "--dataset", str(tmp_path / "ds"), "--metrics", str(path)]
    est = ["estimator", "--transport", transport, "--state", str(tmp_path / "st"), "--metrics", str(path)]
    for argv in (sink, est):
        assert main(argv) == 2
        assert "are sealed: pass the analyzer's key folder" in capsys.readouterr().err
        assert main([*argv, "--analyzer-keys", str(tmp_path / "nowhere")]) == 2
        assert "does not exist" in capsys.readouterr().err
    key_file = next((tmp_path / "keys").glob("*.key"))
    os.chmod(key_file, 0o640)
    assert main([*sink, "--analyzer-keys", str(tmp_path / "keys")]) == 2
    assert "chmod 600" in capsys.readouterr().err
    os.chmod(key_file, 0o600)
    other = tmp_path / "other-keys"
    assert main(["keys", "new", "--dir", str(other)]) == 0
    capsys.readouterr()
    assert main([*sink, "--analyzer-keys", str(other)]) == 2  # the file's current key is not in this folder
    assert "names analyzer key(s)" in capsys.readouterr().err


def test_demo_sealed_runs_the_pipeline_on_sealed_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "demo",
            "--sealed",
            "--devices",
            "3000",
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
            "--no-plot",
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "sealed metrics: records sealed to analyzer key" in text
    assert "every uploaded report counted exactly once: yes" in text
    assert "streaming estimates equal the batch job over the Parquet dataset: yes" in text
    summary = json.loads((out / "demo.json").read_text())
    assert summary["sealed"] is True
    for name, m in summary["metrics"].items():
        assert m["counted"] == m["uploaded"] == 3000, name
    sealed = load_metrics(tmp_path / "work" / "metrics-sealed.json")
    assert all(m.sealed for m in sealed.values()) and sealed.analyzer_key is not None
