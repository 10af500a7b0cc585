"""Topic names and record keys shared by the pipeline's stages.

==========================  ======================================================  =========================
topic                       one record is                                           written by
==========================  ======================================================  =========================
``ldp.reports.raw``         one accepted upload, re-encoded as a wire frame         the collector
``ldp.reports.shuffled``    one shuffled batch (:mod:`pipeline.envelope`)          the shuffler
``ldp.shuffler.state``      one chunk of a shuffler checkpoint (internal)           the shuffler
``ldp.fl.rounds``           one published round state of a federated task           the FL aggregation job
``ldp.fl.updates``          one checked device upload (update or SecAgg step)       the collector
``ldp.fl.state``            one checkpoint of an FL aggregation job (internal)      the FL aggregation job
==========================  ======================================================  =========================

FL records are keyed by task name (:mod:`ldp_core.fl.protocol`, :mod:`estimator.fl.job`).

Raw and shuffled records are keyed ``"<metric>/<day>"``, so every batch of
one metric-day lands in one partition (:func:`~pipeline.transport.base.partition_for`)
and keeps its order there.
"""

from __future__ import annotations

__all__ = [
    "RAW_TOPIC",
    "SHUFFLED_TOPIC",
    "SHUFFLER_STATE_TOPIC",
    "FL_ROUNDS_TOPIC",
    "FL_UPDATES_TOPIC",
    "FL_STATE_TOPIC",
    "DEFAULT_PARTITIONS",
    "metric_day_key",
]

RAW_TOPIC = "ldp.reports.raw"
SHUFFLED_TOPIC = "ldp.reports.shuffled"
SHUFFLER_STATE_TOPIC = "ldp.shuffler.state"
FL_ROUNDS_TOPIC = "ldp.fl.rounds"
FL_UPDATES_TOPIC = "ldp.fl.updates"
FL_STATE_TOPIC = "ldp.fl.state"
#: partitions of a topic the pipeline creates when it is missing
DEFAULT_PARTITIONS = 8


def metric_day_key(metric: str, day: int) -> bytes:
    """The record key of a batch: ``b"<metric>/<day>"``."""
    return f"{metric}/{int(day)}".encode()
