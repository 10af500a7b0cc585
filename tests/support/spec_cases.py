"""Parametrization of the generic suites over every registered mechanism.

Profiles are imported at collection time. A mechanism whose profile (or
implementation) does not import yet still gets one test case, which fails
with the import error when it runs, so the rest of the suite is collected
and runs normally.
"""

from __future__ import annotations

from typing import Any

import pytest

from ldp_core.mechanisms import spec_class
from tests.support.profiles import NAMES, profile

__all__ = ["spec_cases", "profile_spec", "optional"]


def spec_cases() -> list[Any]:
    """``pytest.param(name, index)`` for every spec of every profile."""
    cases = []
    for name in NAMES:
        try:
            specs = profile(name).specs()
        except Exception:  # reported when the case runs
            cases.append(pytest.param(name, -1, id=f"{name}-unavailable"))
            continue
        for i, spec in enumerate(specs):
            cases.append(pytest.param(name, i, id=f"{name}-{i}-eps{spec.epsilon:g}-d{spec.domain_size}"))
    return cases


def profile_spec(name: str, index: int) -> tuple[Any, Any]:
    """The profile module of ``name`` and its spec number ``index``; re-raises a
    failed import so that an unavailable mechanism fails its case."""
    prof = profile(name)
    specs = prof.specs()
    assert len(specs) >= 1, f"profile {name} lists no specs"
    cls = spec_class(name)
    assert all(type(s) is cls for s in specs), f"profile {name} must list {cls.__name__} specs only"
    return prof, specs[index]


def optional(prof: Any, attr: str, default: Any) -> Any:
    """An optional profile hook, or ``default``."""
    return getattr(prof, attr, default)
