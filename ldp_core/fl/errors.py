"""Errors of federated learning, on both sides (they extend :mod:`ldp_core.errors`).

LDPError
└── FLError
    ├── ModelError(ValueError)       parameters of the wrong size or a bad model spec
    ├── UpdateRejected(ValueError)   a client update failed validation (shape, NaN/inf, stale, replay)
    └── SecAggError                  secure aggregation cannot proceed (too few shares, a protocol violation)
"""

from __future__ import annotations

from ldp_core.errors import LDPError

__all__ = ["FLError", "ModelError", "UpdateRejected", "SecAggError"]


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
