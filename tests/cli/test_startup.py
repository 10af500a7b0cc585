"""``ldp --help`` and a small job load only what they run (issue 31, "Speed": start-up).

No timing here (benchmarks/bench_startup.py measures it): each check runs the command in a fresh
interpreter and looks at ``sys.modules`` afterwards, so a module imported eagerly again fails the
test on any machine, loaded or not.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys

import pytest

from ldp_cli.main import COMMAND_TABLE, build_parser

#: what neither ``ldp --help`` nor a small frequency-oracle job needs
HEAVY = (
    "numba",
    "scipy",
    "pandas",
    "pyarrow",
    "fastapi",
    "dp_accounting",
    "cryptography",
    "estimator.kernels.sketch",
    "estimator.kernels.candidates",
    "estimator.mechanisms.heavy_hitters",
    "simulator.heavy_hitters",
    "simulator.numeric",
    "ldp_core.fl.training",
)

_PROBE = """
import contextlib, io, json, sys
from ldp_cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main(json.loads(sys.argv[1]))
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules), "stdout": out.getvalue()}))
"""


def _loaded(argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(argv)], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(proc.stdout.splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_help_imports_no_command_module_and_nothing_heavy() -> None:
    run = _loaded(["--help"])
    assert run["code"] == 0
    for name in COMMAND_TABLE:  # every command is listed ...
        assert name in run["stdout"]
    # ... and none of their modules (nor numpy) is loaded to list them
    assert [m for m in run["modules"] if m.startswith("ldp_cli.commands.")] == []
    assert _heavy(run["modules"]) == []
    assert "numpy" not in run["modules"]


@pytest.mark.parametrize("mechanism", ["olh", "oue", "grr"])
def test_small_simulate_job_loads_neither_numba_nor_heavy_hitters(mechanism: str) -> None:
    argv = ["simulate", "--mechanism", mechanism, "--epsilon", "2", "--domain", "1024", "--users", "1000"]
    run = _loaded([*argv, "--json", "--seed", "1"])
    assert run["code"] == 0
    assert json.loads(run["stdout"])["users"] == 1000
    assert _heavy(run["modules"]) == []
    # only the command that runs is imported
    assert [m for m in run["modules"] if m.startswith("ldp_cli.commands.")] == ["ldp_cli.commands.simulate"]


def test_help_lines_are_those_the_commands_register() -> None:
    for name, (module, line) in COMMAND_TABLE.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        assert [(a.dest, a.help) for a in sub._choices_actions] == [(name, line)]


def test_a_command_parses_the_same_alone_as_in_the_full_parser() -> None:
    argv = ["simulate", "--mechanism", "olh", "--epsilon", "2", "--domain", "64", "--users", "10", "--json"]
    alone, full = vars(build_parser("simulate").parse_args(argv)), vars(build_parser().parse_args(argv))
    assert alone == full
    # a mistyped command is refused by the light parser as by the full one
    with pytest.raises(SystemExit):
        build_parser("simulat").parse_args(["simulat"])
