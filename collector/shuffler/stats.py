"""The shuffler's counters: :class:`ShufflerStats` (this process's, since it started) and which of them each
partition keeps, sealed, in its checkpoints (``_TOTALS``: durable across restarts, they reconcile with the
collector's)."""

from __future__ import annotations

import dataclasses

__all__ = ["ShufflerStats"]


@dataclasses.dataclass
class ShufflerStats:
    """Counters since the process started."""

    input_batches: int = 0
    input_reports: int = 0
    duplicate_batches: int = 0
    duplicate_reports: int = 0
    undecodable_batches: int = 0
    #: batches whose day was already out of the window when they were read (their reports are in expired_reports)
    expired_batches: int = 0
    #: buffered groups dropped because their day left the window before they reached a crowd
    expired_groups: int = 0
    expired_reports: int = 0
    superseded_deletes: int = 0
    released_batches: int = 0
    released_reports: int = 0
    #: records published to the shuffled topic: one per released batch, or its parts when a sealed one is split
    #: by its records' encapsulated keys (issue 31)
    released_parts: int = 0
    checkpoints: int = 0
    restores: int = 0
    aborted_transactions: int = 0
    buffered_reports: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


#: the counters kept per partition in its checkpoints (:meth:`~collector.shuffler.processor.Shuffler.totals`)
_TOTALS = (
    "input_batches",
    "input_reports",
    "duplicate_batches",
    "duplicate_reports",
    "undecodable_batches",
    "expired_batches",
    "expired_groups",
    "expired_reports",
    "released_batches",
    "released_reports",
)
