"""The README's and the docs' commands do what the docs say: docs that run.

Two checks, each over README.md, every ``docs/**/*.md`` and ``sdk-web/README.md``, read as they are now (a doc
edit is tested by the next run):

* **Fenced blocks run.** Every ``bash``/``sh``/``console``/unlabelled block holding commands (``ldp …``,
  ``.venv/bin/…``, ``python …``) and every ``python`` block runs as written, line by line, in a scratch folder
  that sees the repository's ``metrics/``, ``examples/``, ``benchmarks/`` and ``.venv`` (``docs/img`` and
  ``out`` are scratch folders there, so a command that writes a plot never touches the repository). Each line
  must exit 0; a line ending in ``--json`` must print one JSON value. Set-up lines (``scripts/bootstrap``,
  ``. .venv/bin/activate``) are what the test environment already did. A block that cannot run here is marked
  **visibly** in the doc, by an italic line right above it: ``*Not run by the docs test: <why>.*`` (a broker or
  another outside service, a server that runs until stopped, minutes of work that a named test runs smaller).
  The marked blocks' ``ldp`` lines still get the flag check below.
* **Every flag a doc names exists.** In every inline code span or marked block line that starts with ``ldp``,
  each ``--flag`` must be one the real argument parser of that (sub)command accepts (``ldp fl <scenario>`` and
  ``ldp study <scenario>`` included), so a renamed flag cannot linger in the docs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ldp_cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "sdk-web" / "README.md"]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
MARK = re.compile(r"^\*Not run by the docs test: (.+)\*\s*$")
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:ldp|\.venv/bin/\S+|python3?|scripts/\S+)(?:\s|$)")
SETUP = re.compile(r"^(?:scripts/bootstrap\b.*|\.\s+\.venv/bin/activate|source\s+\.venv/bin/activate)$")
#: what the scratch folder links from the repository (read-only use); docs/img and out are real scratch folders
LINKED = ("metrics", "examples", "benchmarks", ".venv", "sdk-web", "scripts")
PER_LINE_TIMEOUT = 300


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def blocks() -> list[tuple[Path, int, str, str, str | None]]:
    """Every fenced block: (doc, line of its fence, info, body, the reason it is marked not to run or None)."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            before = [ln for ln in text[: m.start()].splitlines() if ln.strip() and not ln.startswith("<!--")]
            mark = MARK.match(before[-1]) if before else None
            out.append(
                (doc, text[: m.start()].count("\n") + 1, m.group(1), m.group(2), mark.group(1) if mark else None)
            )
    return out


def command_lines(body: str) -> list[str]:
    """The block's lines with ``\\`` continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    lines = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        lines.append(line)
    return lines


def runnable(info: str, body: str) -> bool:
    if info == "python":
        return True
    if info not in ("bash", "sh", "console", "shell", ""):
        return False
    return any(COMMAND.match(ln) for ln in command_lines(body))


RUNNABLE = [b for b in blocks() if runnable(b[2], b[3])]


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    for name in LINKED:
        if (ROOT / name).exists():
            (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "docs" / "img").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "home").mkdir()
    return tmp_path


def _env(scratch: Path) -> dict[str, str]:
    venv_bin = str(ROOT / ".venv" / "bin")
    return {
        **os.environ,
        "HOME": str(scratch / "home"),
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "MPLBACKEND": "Agg",
        "PYTHONPATH": str(ROOT),
    }


@pytest.mark.parametrize(
    ("doc", "line", "info", "body", "mark"), RUNNABLE, ids=[f"{rel(b[0])}:{b[1]}" for b in RUNNABLE]
)
def test_a_doc_block_runs_as_written(
    scratch: Path, doc: Path, line: int, info: str, body: str, mark: str | None
) -> None:
    where = f"{rel(doc)}:{line}"
    if mark is not None:
        # marked in the doc, visibly, with its reason; its ldp lines still get the flag check
        assert len(mark) > 10, f"{where}: say why the block cannot run here"
        for cmd in command_lines(body):
            if cmd.startswith("ldp "):
                check_flags(cmd, where)
        return
    env = _env(scratch)
    if info == "python":
        run = subprocess.run(
            [sys.executable, "-c", body],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=PER_LINE_TIMEOUT,
            check=False,
        )
        assert run.returncode == 0, f"{where}: the python block failed:\n{run.stderr[-3000:]}"
        return
    ran = 0
    for cmd in command_lines(body):
        if SETUP.match(cmd):
            continue
        if cmd.startswith("ldp "):
            check_flags(cmd, where)
        run = subprocess.run(
            ["bash", "-o", "pipefail", "-c", cmd],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=PER_LINE_TIMEOUT,
            check=False,
        )
        assert run.returncode == 0, f"{where}: `{cmd}` exited {run.returncode}:\n{run.stderr[-3000:]}"
        if re.search(r"--json\s*$", cmd):
            json.loads(run.stdout)
        ran += 1
    assert ran, f"{where}: a command block with no command run: mark it or remove it"


# ---------------------------------------------------------------------------------------------- flags
def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _positional_choices(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if not action.option_strings and action.choices and not isinstance(action, argparse._SubParsersAction):
            return [str(c) for c in action.choices]
    return []


PARSER = build_parser()


def parser_for(words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The (sub)parser the words name, walking subcommands (and a scenario positional), and its path."""
    parser, path = PARSER, ["ldp"]
    for w in words:
        subs = _subparsers(parser)
        if w in subs:
            parser, path = subs[w], [*path, w]
            continue
        if w in _positional_choices(parser):
            path.append(w)
            continue
        break
    return parser, path


def check_flags(cmd: str, where: str) -> None:
    try:
        words = shlex.split(cmd.split("|", 1)[0].split("&", 1)[0])
    except ValueError:
        words = cmd.split()
    parser, path = parser_for(words[1:])
    known = {s for a in parser._actions for s in a.option_strings}
    # a scenario's own flags live on the scenario's parser when it has one, else on the shared parser
    for w in words[len(path) :]:
        flag = w.split("=", 1)[0].strip("[]()")
        if flag.startswith("--") and re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag):
            assert flag in known, f"{where}: `{cmd}` names {flag}, which `{' '.join(path)}` does not accept"


def inline_commands() -> list[tuple[str, str]]:
    """(doc:line, command) for every inline code span that starts with ``ldp`` outside fenced blocks."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        outside = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for m in re.finditer(r"`(ldp [^`]+)`", outside):
            out.append((f"{rel(doc)}:{outside[: m.start()].count(chr(10)) + 1}", " ".join(m.group(1).split())))
    return out


def test_every_flag_an_inline_command_names_exists() -> None:
    commands = inline_commands()
    assert len(commands) > 100  # the docs name ldp commands throughout; an empty scan is a broken scan
    problems = []
    for where, cmd in commands:
        try:
            check_flags(cmd, where)
        except AssertionError as exc:
            problems.append(str(exc))
    assert not problems, "\n".join(problems)
