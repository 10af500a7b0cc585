"""The packages import one another in one direction only.

    client_sdk -> pipeline -> collector, estimator -> simulator -> ldp_cli

A package may import the packages to its left, never one to its right, and
``collector`` and ``estimator`` never import each other. The check walks
every module's syntax tree, so imports inside functions (the lazy ones that
keep ``ldp --help`` light) count as much as those at the top.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: each package and the project packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "client_sdk": set(),
    "pipeline": {"client_sdk"},
    "collector": {"client_sdk", "pipeline"},
    "estimator": {"client_sdk", "pipeline"},
    "simulator": {"client_sdk", "pipeline", "collector", "estimator"},
    "ldp_cli": {"client_sdk", "pipeline", "collector", "estimator", "simulator"},
}


def imported_packages(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, top-level name) of every absolute import in the module at ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value.split(".")[0]))
    return out


def module_files(package: str) -> list[pathlib.Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_every_package_is_in_the_order() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "tests_torch", "benchmarks"}
    assert packages == set(ALLOWED), f"packages without a place in the layer order: {packages ^ set(ALLOWED)}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_layer_order(package: str) -> None:
    forbidden = set(ALLOWED) - ALLOWED[package] - {package}
    edges = [
        f"{f.relative_to(ROOT)}:{line} imports {name}"
        for f in module_files(package)
        for line, name in imported_packages(f)
        if name in forbidden
    ]
    assert not edges, "\n".join(edges)


def test_the_walk_sees_lazy_and_dynamic_imports(tmp_path: pathlib.Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\n\ndef f():\n    from collector.http.app import create_app\n    import estimator.jobs.batch\n"
        "    importlib.import_module('simulator.run')\n"
    )
    assert {name for _, name in imported_packages(probe)} == {"os", "collector", "estimator", "simulator"}
