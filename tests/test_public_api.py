"""Every ``__all__`` names only what its module defines, and ``client_sdk`` exports what the docs promise.

``__all__`` is what ``from package import *`` and the documentation tools take as a module's public
surface; a stale name in it fails only when someone star-imports, so it is checked here for every
package's ``__init__`` and every module of ldp_core, client_sdk, client_sdk.fl, pipeline, collector, estimator,
simulator and ldp_cli (and their sub-packages). Modules are found on disk, so a new one is checked without
touching this file.
"""

from __future__ import annotations

import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("ldp_core", "client_sdk", "pipeline", "collector", "estimator", "simulator", "ldp_cli")


def module_names() -> list[str]:
    """Every importable module of the project's packages (``__main__`` is a script, not a module)."""
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__" or not (path.parent / "__init__.py").exists():
                continue
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


MODULES = module_names()
PACKAGE_INITS = [m for m in MODULES if (ROOT / m.replace(".", "/") / "__init__.py").exists()]

#: What docs/SDK.md, the README and the project's promises name as importable from ``client_sdk`` itself.
DOCUMENTED_CLIENT_SDK = {
    "TelemetryClient",
    "ClientConfig",
    "ClientConfigError",
    "LocalPolicy",
    "MetricSet",
    "load_metrics",
    "make_spec",
    "spec_from_dict",
    "MechanismSpec",
    "ReportBatch",
    "encode_frame",
    "decode_frame",
    "encode_json",
    "decode_json",
    "FRAME_CONTENT_TYPE",
    "LDPError",
}


def test_every_package_is_found() -> None:
    assert {
        "ldp_core",
        "ldp_core.mechanisms",
        "ldp_core.wire",
        "ldp_core.tokens",
        "ldp_core.fl",
        "client_sdk",
        "client_sdk.fl",
        "client_sdk.upload",
        "pipeline",
        "pipeline.transport",
        "collector",
        "collector.http",
        "collector.shuffler",
        "collector.sinks",
        "collector.fl",
        "estimator",
        "estimator.oracles",
        "estimator.mechanisms",
        "estimator.jobs",
        "estimator.service",
        "estimator.fl",
        "simulator",
        "ldp_cli",
        "ldp_cli.commands",
    } <= set(PACKAGE_INITS)


@pytest.mark.parametrize("name", MODULES)
def test_all_names_only_what_the_module_defines(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        return  # no declared surface (a module of private helpers, or a package that re-exports nothing)
    assert isinstance(exported, (list, tuple)) and all(isinstance(n, str) for n in exported), name
    repeated = sorted({n for n in exported if list(exported).count(n) > 1})
    assert not repeated, f"{name}.__all__ repeats {repeated}"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names {missing}, which {name} does not define"


def test_client_sdk_exports_its_documented_surface() -> None:
    import client_sdk
    import client_sdk.client
    import client_sdk.config
    import client_sdk.policy

    assert DOCUMENTED_CLIENT_SDK <= set(client_sdk.__all__), sorted(DOCUMENTED_CLIENT_SDK - set(client_sdk.__all__))
    assert client_sdk.TelemetryClient is client_sdk.client.TelemetryClient
    assert client_sdk.ClientConfig is client_sdk.config.ClientConfig
    assert client_sdk.LocalPolicy is client_sdk.policy.LocalPolicy


def test_star_import_of_every_package_works() -> None:
    for name in PACKAGE_INITS:
        namespace: dict[str, object] = {}
        exec(f"from {name} import *", namespace)  # noqa: S102 -- the statement under test
        module = importlib.import_module(name)
        assert set(getattr(module, "__all__", [])) <= set(namespace), name
