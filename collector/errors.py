"""The collector package's exceptions (all derive from :class:`ldp_core.errors.LDPError`).

    LDPError
    ├── PipelineError (pipeline.errors)
    │   ├── ConfigError(ValueError)   a setting is invalid; the message names it and its valid range
    │   └── ProcessorError            a stream processor cannot go on (pipeline.processor)
    └── CollectorError
        ├── RejectedBatch             the collector refuses an upload (4xx); carries status and reason
        ├── UnavailableError          the collector cannot take an upload now (503); carries Retry-After
        ├── DedupStoreError           the collector's batch-id store has a schema this version cannot read
        ├── ShufflerStateError(ProcessorError)  the shuffler's checkpoint and its input offsets disagree
        └── SinkError(ProcessorError)           the Parquet sink's chunk logs and the dataset disagree

:class:`ConfigError` is the shared layer's (re-exported here). The two
processor errors derive from :class:`~pipeline.errors.ProcessorError` too:
they are fatal, so runners stop on them instead of rejoining.
"""

from __future__ import annotations

from ldp_core.errors import LDPError
from pipeline.errors import ConfigError, ProcessorError

__all__ = [
    "CollectorError",
    "ConfigError",
    "RejectedBatch",
    "UnavailableError",
    "DedupStoreError",
    "ShufflerStateError",
    "SinkError",
]


class CollectorError(LDPError):
    """Base class of the collector package's errors."""


class RejectedBatch(CollectorError):
    """An upload the collector refuses for good: ``status`` (4xx), a short ``reason`` and a message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = int(status)
        self.reason = reason
        self.message = message


class UnavailableError(CollectorError):
    """The collector cannot accept an upload now (overloaded, transport down); retry after ``retry_after`` s."""

    def __init__(self, reason: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after = int(retry_after)


class DedupStoreError(CollectorError):
    """The batch-id store (:mod:`collector.dedup`) is of a schema this collector cannot read or upgrade."""


class ShufflerStateError(CollectorError, ProcessorError):
    """The shuffler cannot find the checkpoint that matches its committed input offsets."""


class SinkError(CollectorError, ProcessorError):
    """The Parquet sink's chunk logs and the dataset disagree, or a chunk cannot be written as recorded."""
