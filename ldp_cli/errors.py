"""The command line's exceptions (all derive from :class:`ldp_core.errors.LDPError`).

    LDPError
    └── CLIError
        └── BrokerError(RuntimeError)   the local Kafka broker could not be provisioned, started, reached or stopped

``ldp`` exits 2 with ``ldp <command>: error: <message>`` on any
:class:`ValueError` or :class:`OSError` a sub-command lets through (bad
arguments, settings, files: the project's ``ValueError`` subclasses such as
:class:`~pipeline.errors.ConfigError` among them); ``ldp kafka`` reports a
:class:`BrokerError` itself and exits 1.
"""

from __future__ import annotations

from ldp_core.errors import LDPError

__all__ = ["CLIError", "BrokerError"]


class CLIError(LDPError):
    """Base class of the command line's own errors."""


class BrokerError(CLIError, RuntimeError):
    """The local Kafka broker could not be provisioned, started, reached or stopped."""
