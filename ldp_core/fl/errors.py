"""Errors of federated learning, on both sides (they extend :mod:`ldp_core.errors`).

LDPError
└── FLError
    ├── ModelError(ValueError)       parameters of the wrong size or a bad model spec
    ├── UpdateRejected(ValueError)   a client update failed validation (shape, NaN/inf, stale, replay)
    └── SecAggError                  secure aggregation cannot proceed (too few shares, a protocol violation)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ldp_core.errors import LDPError

__all__ = ["FLError", "ModelError", "UpdateRejected", "SecAggError", "build_from_fields"]


class FLError(LDPError):
    """Base class of federated-learning errors."""


class ModelError(FLError, ValueError):
    """A model spec is invalid or a parameter vector does not fit the model."""


class UpdateRejected(FLError, ValueError):
    """A client update was refused; ``reason`` is one of the counted rejection reasons."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SecAggError(FLError):
    """Secure aggregation cannot proceed: too few shares or survivors, or a peer broke the protocol."""


def build_from_fields(what: str, factory: Any, options: Mapping[str, Any], error: type[FLError] = FLError) -> Any:
    """``factory(**options)`` after checking the option names against the factory's keyword parameters: an
    unknown or missing name is ``error`` naming it and every accepted name (what a task file's author needs),
    never Python's ``TypeError`` about ``__init__``. ``what`` names the object in the message."""
    import inspect

    params = inspect.signature(factory).parameters
    accepted = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise error(f"{what}: unknown field {', '.join(map(repr, unknown))}; accepted fields: {', '.join(accepted)}")
    missing = [n for n in accepted if params[n].default is inspect.Parameter.empty and n not in options]
    if missing:
        raise error(f"{what}: missing field {', '.join(map(repr, missing))}; accepted fields: {', '.join(accepted)}")
    return factory(**options)
