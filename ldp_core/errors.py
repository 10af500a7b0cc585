"""The exception hierarchy of the device side.

Every error the SDK raises derives from :class:`LDPError`. Errors about bad
arguments also derive from :class:`ValueError`, so callers that already catch
``ValueError`` keep working.

    LDPError
    ├── SpecError(ValueError)        a mechanism's parameters are invalid
    ├── DomainError(ValueError)      a value is outside its declared domain
    ├── FrameError(ValueError)       a wire frame is malformed
    │   └── SpecMismatchError        a frame's spec does not match the expected one
    ├── BudgetError                  a privacy policy refuses a spend or a spec
    └── ConfigError(ValueError)      a setting is invalid (a service's, or a day window's)
"""

from __future__ import annotations

__all__ = [
    "LDPError",
    "SpecError",
    "DomainError",
    "FrameError",
    "SpecMismatchError",
    "BudgetError",
    "ConfigError",
]


class LDPError(Exception):
    """Base class of every error raised by this project."""


class SpecError(LDPError, ValueError):
    """A mechanism specification is invalid; the message says how to fix it."""


class DomainError(LDPError, ValueError):
    """A value does not belong to the mechanism's or metric's domain."""


class FrameError(LDPError, ValueError):
    """A wire frame (binary or JSON) is malformed; the message names the part."""


class SpecMismatchError(FrameError):
    """A frame was produced under a different spec than the one expected."""


class BudgetError(LDPError):
    """A local privacy policy refuses a spend or a server-provided spec."""


class ConfigError(LDPError, ValueError):
    """A setting is invalid: the message names the setting and its valid range."""
