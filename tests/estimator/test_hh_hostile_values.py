"""Devices that type hostile strings: the outputs escape them where printed and keep them inert in CSV.

The adversary runs the real device encoder (PEM, a version-0 spec, which accepts control characters;
a modified device can send any bytes anyway) with values made to attack a reader: a terminal escape
sequence, a carriage return that would split a CSV row, a right-to-left override that reverses the
text after it, and a spreadsheet formula. The reports go through the real sink into the Parquet dataset,
and ``ldp heavy-hitters`` runs as a subprocess: its printed table must hold no raw control or bidi
character (each shown as a visible escape), its CSV must parse back to the same values with the formula
made text, and its JSON must keep the raw values.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from collector.sinks.parquet import ParquetSink
from ldp_core.mechanisms.heavy_hitters import PEMSpec, pad_values
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.text import printable
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import open_transport
from tests.support.shuffled_data import publish

HOSTILE = {"\x1b[2Jab": 9000, "ok\rno": 7000, "a\u202eevil": 6000, "=1+2": 5000}
SPEC = PEMSpec(epsilon=8.0, length=8, start_bits=12, step_bits=4)
DAY = 20400


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(23)
    values = np.repeat(pad_values(list(HOSTILE), 8), list(HOSTILE.values()), axis=0)
    recs = SPEC.encode(values[rng.permutation(values.shape[0])], rng)
    batches = [ReportBatch("q", SPEC, DAY, chunk, rng.bytes(16)) for chunk in np.array_split(recs, 4)]
    t = open_transport(f"sqlite:///{tmp}/log.sqlite3", synchronous="NORMAL")
    t.create_topic(SHUFFLED_TOPIC, 1)
    publish(t, SHUFFLED_TOPIC, batches)
    out = tmp / "ds"
    sink = ParquetSink(t, out, SpecCatalog(specs=[("q", SPEC)]), flush_seconds=0.0)
    sink.run(idle_timeout=0.6)
    sink.close()
    t.close()
    return out


def _ldp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ldp_cli", "heavy-hitters", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )


def test_printed_table_escapes_csv_is_inert_json_is_raw(root: Path, tmp_path: Path) -> None:
    run = _ldp("--dataset", str(root), "--metric", "q", "--top", "4")
    assert run.returncode == 0, run.stderr
    table = run.stdout.split("\n", 1)[1]  # after the JSON summary line
    for bad in ("\x1b", "\r", "\u202e"):
        assert bad not in table, repr(table)
    for value in HOSTILE:
        assert printable(value) in table, (value, table)
    assert "\\x1b[2Jab" in table and "ok\\x0dno" in table and "a\\u202eevil" in table

    out = tmp_path / "q.csv"
    assert _ldp("--dataset", str(root), "--metric", "q", "--top", "4", "--out", str(out)).returncode == 0
    with out.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    got = [r["value"] for r in rows]
    assert sorted(got) == sorted("'" + v if v.startswith("=") else v for v in HOSTILE), got  # no row split
    assert all(not v.startswith(("=", "+", "-", "@")) for v in got)

    js = _ldp("--dataset", str(root), "--metric", "q", "--top", "4", "--json")
    assert js.returncode == 0, js.stderr
    assert {r["value"] for r in json.loads(js.stdout)["rows"]} == set(HOSTILE)


def test_printable_escapes_what_moves_or_hides_text() -> None:
    assert printable("weather\n") == "weather\\x0a"
    assert printable("a\\b") == "a\\\\b"
    assert printable("x\u200by\u2028") == "x\\u200by\\u2028"
    assert printable("\U000e0041") == "\\U000e0041"  # a tag character (format, invisible)
    assert printable("café 😀 日本 -=") == "café 😀 日本 -="
