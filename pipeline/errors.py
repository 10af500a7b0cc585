"""The shared pipeline layer's exceptions (all derive from :class:`ldp_core.errors.LDPError`).

LDPError
├── ConfigError(ValueError)       (ldp_core.errors) a setting is invalid; the message names it and its valid range
└── PipelineError
    ├── TransportError            the log failed (pipeline.transport)
    │   ├── TopicError(ValueError)
    │   ├── CommitFailedError
    │   └── FencedError
    ├── DatasetError              a file is not a valid part of a Parquet dataset
    ├── ProcessorError            a stream processor cannot go on: stop it, do not retry the record
    └── ChunkError(ValueError)    a chunked record (pipeline.fl_records) is malformed or inconsistent
"""

from __future__ import annotations

from ldp_core.errors import ConfigError, LDPError

__all__ = ["PipelineError", "ConfigError", "DatasetError", "ProcessorError", "ChunkError"]


class PipelineError(LDPError):
    """Base class of the shared pipeline layer's errors."""


class DatasetError(PipelineError):
    """A dataset file cannot be read as a part file, or its columns do not match its spec."""


class ProcessorError(PipelineError):
    """Fatal for a stream processor: its state and the log disagree in a way a retry cannot mend.

    Command-line runners stop the processor and exit non-zero on it (and on
    :class:`~pipeline.transport.FencedError`); any other error while
    processing is retried after a rejoin.
    """


class ChunkError(PipelineError, ValueError):
    """A record or document that is not a well-formed chunk or document of :mod:`pipeline.fl_records`."""
