"""The estimator package's exceptions (all derive from :class:`ldp_core.errors.LDPError`).

    LDPError
    └── EstimatorError
        ├── BatchError(ValueError)       no data for a batch request, or a choice (spec, days) the user must make
        │   └── SpecChoiceError          the metric has reports under several specs: the caller must choose one
        ├── AccountingError(ValueError)  an event cannot be accounted as asked
        ├── DatasetError(ValueError)     a training data file is missing arrays or has bad shapes or labels
        ├── StateError(ProcessorError)   a streaming snapshot is unreadable, foreign, or states do not merge
        └── JobStateError(ProcessorError) an FL job cannot restore its state without losing or double-counting

:class:`StateError` and :class:`JobStateError` are also :class:`pipeline.errors.ProcessorError` subclasses
(fatal: the streaming estimator's and the FL job's runners stop on them instead of rejoining).
:class:`JobStateError` is also an :class:`ldp_core.fl.errors.FLError`, so FL callers that catch
the FL tree keep catching it.
"""

from __future__ import annotations

from ldp_core.errors import LDPError
from ldp_core.fl.errors import FLError
from pipeline.errors import ProcessorError

__all__ = [
    "EstimatorError",
    "BatchError",
    "SpecChoiceError",
    "AccountingError",
    "DatasetError",
    "StateError",
    "JobStateError",
]


class EstimatorError(LDPError):
    """Base class of the estimator package's errors."""


class BatchError(EstimatorError, ValueError):
    """No data for the request, or a choice (spec, days) the user must make."""


class SpecChoiceError(BatchError):
    """The metric has reports under several specs in the range asked for, whose estimates do not add:
    the caller must choose one (``--spec-id``, or ``?spec_id=`` on the API, which answers 409)."""


class AccountingError(EstimatorError, ValueError):
    """An event cannot be accounted as asked; the message says why and what to do."""


class DatasetError(EstimatorError, ValueError):
    """A training data file (``ldp dpsgd --data``) is unreadable, lacks an array, or
    has arrays of the wrong shape, type or label range; the message names which."""


class StateError(EstimatorError, ProcessorError):
    """A snapshot is unreadable, belongs to another topic or group, or states do not merge."""


class JobStateError(EstimatorError, FLError, ProcessorError):
    """The job cannot restore its state without risking a lost or double-counted update."""
