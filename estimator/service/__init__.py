"""The streaming estimator: live estimates from the shuffled topic, exact across restarts and instances.

The streaming estimator: live estimates from the shuffled topic, exact across restarts and instances.

One accumulator per (metric, spec, day) sums the reports of every shuffled
batch consumed (accumulators are linear: :mod:`estimator.oracles.base`), and
a small HTTP service serves the current estimates with confidence intervals
and the shuffle's central ε. A metric-day's batches are spread over the
shuffled partitions (the shuffler keys them per batch), so members of a group
each hold part of it and every read merges the parts
(:mod:`estimator.service.peers`).

===========================================  =================================================
:mod:`estimator.service.state`             per-key state, tallies, tails; :func:`merge_states`
:mod:`estimator.service.snapshots`         :class:`SnapshotStore` (SQLite)
:mod:`estimator.service.engine`            :class:`StreamingEstimator`: exactly-once counting
:mod:`estimator.service.app`               :func:`create_app`: the HTTP API
===========================================  =================================================
"""

from __future__ import annotations

from estimator.errors import StateError
from estimator.service.app import DEFAULT_PORT, create_app, estimate_json
from estimator.service.engine import EstimatorSettings, EstimatorStats, StreamingEstimator
from estimator.service.snapshots import SnapshotStore
from estimator.service.state import DEFAULT_GROUP, EstimatorState, Key, KeyState, Tail, Tally, merge_states
from pipeline.topics import SHUFFLED_TOPIC

__all__ = [
    "SHUFFLED_TOPIC",
    "DEFAULT_GROUP",
    "DEFAULT_PORT",
    "Key",
    "KeyState",
    "Tally",
    "Tail",
    "EstimatorState",
    "StateError",
    "EstimatorSettings",
    "EstimatorStats",
    "SnapshotStore",
    "StreamingEstimator",
    "merge_states",
    "estimate_json",
    "create_app",
]
