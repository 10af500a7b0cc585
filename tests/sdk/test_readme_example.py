"""README.md's "Embedding the SDK" example runs as written and prints what the README shows.

The block is taken from README.md itself (so the test follows every edit of it) and run in a fresh Python from
the repository root, with ``HOME`` in a temporary folder (the example stores under ``~/.myapp``). The one line
that depends on when it runs is the first: its day number must be the UTC day at the time of the run (read
before and after, so a run across midnight passes); every other line must be the README's, character for
character. Nothing in the output is random: the spending is the policy's arithmetic and the error counts are
the calls' (the upload to ``telemetry.example.org`` fails without a network and with one: no collector runs
there).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ldp_core.days import utc_day

ROOT = Path(__file__).resolve().parents[2]


def _blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block of ``text`` as (info string, body)."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S)]


def readme_example() -> tuple[str, list[str]]:
    """The SDK example's code and the lines the README says it prints."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Embedding the SDK", 1)[1]
    blocks = _blocks(section)
    code = next(body for info, body in blocks if info == "python" and "TelemetryClient(" in body)
    after = section.split(code, 1)[1].split("```", 1)[1]  # past the code block's closing fence
    assert "which prints" in after.split("```", 1)[0], "the README no longer says what the example prints"
    shown = _blocks(after)[0][1]
    return code, shown.rstrip("\n").splitlines()


def test_the_readme_sdk_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    code, want = readme_example()
    assert want and want[0].startswith("day ")
    env = {**os.environ, "HOME": str(tmp_path)}
    before = utc_day(time.time())
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    after = utc_day(time.time())
    assert run.returncode == 0, run.stderr
    got = run.stdout.rstrip("\n").splitlines()
    m = re.fullmatch(r"day (\d+)(: .*)", got[0]) if got else None
    assert m is not None, run.stdout
    assert before <= int(m.group(1)) <= after
    shown = re.fullmatch(r"day \d+(: .*)", want[0])
    assert shown is not None
    assert m.group(2) == shown.group(1)
    assert got[1:] == want[1:]
    assert (tmp_path / ".myapp" / "telemetry").is_dir()
