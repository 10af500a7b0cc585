"""The packages import one another in one direction only, and no module imports itself back.

    ldp_core -> client_sdk
    ldp_core -> pipeline -> collector, estimator -> simulator -> ldp_cli

A package may import the packages to its left, never one to its right. ``pipeline``, ``collector`` and
``estimator`` never import ``client_sdk`` (the device SDK is the device only: what servers share with it
is in ``ldp_core``); ``collector`` and ``estimator`` never import each other. Inside ``estimator`` the
levels are ``kernels -> oracles -> mechanisms -> accounting -> {jobs, fl, graph, split, synth} -> {selection, pate} -> {service, he, psi, attacks}``: ``fl`` never
imports ``jobs`` or ``service``. And no import circle joins two product modules.

The check walks every module's syntax tree, so imports inside functions (the lazy ones that keep
``ldp --help`` light) and under ``TYPE_CHECKING`` count as much as those at the top: a circle through a
lazy import is still two modules that cannot be understood, or moved, one without the other.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: each package and the project packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "ldp_core": set(),
    "client_sdk": {"ldp_core"},
    "pipeline": {"ldp_core"},
    "collector": {"ldp_core", "pipeline"},
    "estimator": {"ldp_core", "pipeline"},
    "simulator": {"ldp_core", "client_sdk", "pipeline", "collector", "estimator"},
    "ldp_cli": {"ldp_core", "client_sdk", "pipeline", "collector", "estimator", "simulator"},
}

#: estimator's subpackages and modules by level: one may import only those of a lower level
ESTIMATOR_LEVELS: dict[str, int] = {
    "errors": 0,
    "result": 0,
    "kernels": 1,
    "oracles": 2,
    "mechanisms": 3,
    "accounting": 4,
    "jobs": 5,
    "fl": 5,
    "graph": 5,
    "split": 5,
    "synth": 5,
    "selection": 6,
    "pate": 6,
    "service": 7,
    "attacks": 7,
    "he": 7,  # compares threshold-CKKS aggregation with fl's SecAgg server
    "psi": 7,
}


def _import_nodes(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) of every import; ``import a.b`` gives (line, 'a.b', [])."""
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value, []))
    return out


def imported_packages(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, top-level name) of every absolute import in the module at ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(line, module.split(".")[0]) for line, module, _ in _import_nodes(tree)]


def module_files(package: str) -> list[pathlib.Path]:
    return sorted((ROOT / package).rglob("*.py"))


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def import_graph() -> dict[str, dict[str, int]]:
    """Every product module -> {product module it imports: line}. ``from p import x`` points at the
    module ``p.x`` when there is one, else at ``p``."""
    files = {module_name(f): f for package in ALLOWED for f in module_files(package)}
    graph: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        edges: dict[str, int] = {}
        for line, module, names in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in files]
            if len(targets) < len(names) or not names:
                targets.append(module)
            for t in targets:
                while t and t not in files:  # `import a.b.c` of a name, or a module outside the project
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.setdefault(t, line)
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


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


def test_estimator_levels() -> None:
    graph = import_graph()
    found = {m.split(".")[1] for m in graph if m.startswith("estimator.")}
    assert found <= set(ESTIMATOR_LEVELS), f"estimator parts without a level: {found - set(ESTIMATOR_LEVELS)}"
    bad = []
    for m, edges in graph.items():
        if not m.startswith("estimator."):
            continue
        a = m.split(".")[1]
        for t, line in edges.items():
            if t.startswith("estimator.") and (b := t.split(".")[1]) != a:
                if ESTIMATOR_LEVELS[b] >= ESTIMATOR_LEVELS[a]:
                    bad.append(
                        f"{m}:{line} imports {t} ({a} is level {ESTIMATOR_LEVELS[a]}, {b} {ESTIMATOR_LEVELS[b]})"
                    )
    assert not bad, "\n".join(bad)


def test_no_import_circles() -> None:
    graph = import_graph()
    found = circles(graph)
    lines = []
    for component in found:
        members = set(component)
        lines.append(
            " <-> ".join(component)
            + ": "
            + "; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in component for b in graph[a] if b in members)
        )
    assert not found, "import circles:\n" + "\n".join(lines)


#: the longest a product module may be, and a command module of the CLI (which only parses and wires)
MAX_MODULE_LINES = 900
MAX_COMMAND_LINES = 260


def test_no_module_does_several_jobs() -> None:
    """Size is a proxy, but a module of over 900 lines has always held several concerns here."""
    long = {
        str(f.relative_to(ROOT)): n
        for package in ALLOWED
        for f in module_files(package)
        if (n := len(f.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
    commands = {
        str(f.relative_to(ROOT)): n
        for f in sorted((ROOT / "ldp_cli" / "commands").rglob("*.py"))
        if (n := len(f.read_text().splitlines())) > MAX_COMMAND_LINES
    }
    assert not commands, f"command modules over {MAX_COMMAND_LINES} lines (move the logic out of ldp_cli): {commands}"


def test_the_walk_sees_lazy_and_dynamic_imports(tmp_path: pathlib.Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\n\ndef f():\n    from collector.http.app import create_app\n    import estimator.jobs.batch\n"
        "    importlib.import_module('simulator.run')\n"
    )
    assert {name for _, name in imported_packages(probe)} == {"os", "collector", "estimator", "simulator"}


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}, "e": {}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b": 1}, "b": {}}) == []
