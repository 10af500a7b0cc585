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

Raw records are keyed ``"<metric>/<day>"``, so every upload of one metric-day
lands in one partition (:func:`~pipeline.transport.base.partition_for`): the
shuffler's crowd of a metric-day is gathered by one member. Shuffled records
of a plain metric are keyed ``"<metric>/<day>/<shuffle id>"`` by default
(:func:`shuffled_key`), so the released batches of one hot metric-day spread
over the shuffled topic's partitions, hence over the sink's and the
estimator's members (whose accumulators merge). A sealed metric's released
batch is split by each record's encapsulated key (:func:`sealed_route`) into
sub-batches keyed by the metric-day's sub-keys (:func:`spread_keys`), so a
replayed ciphertext, which keeps its encapsulated key, lands on the
partition of the original whatever batch it travels in; the sink and the
estimator check that route for every sealed record (:mod:`pipeline.routes`).
Every batch under
the shuffler's ``shuffled_key="metric-day"`` keeps the ``"<metric>/<day>"``
key. Nothing downstream needs the batches of a metric-day in order or in one
partition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ldp_core.wire.sealed import KEY_ID_SIZE

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "RAW_TOPIC",
    "SHUFFLED_TOPIC",
    "SHUFFLER_STATE_TOPIC",
    "FL_ROUNDS_TOPIC",
    "FL_UPDATES_TOPIC",
    "FL_STATE_TOPIC",
    "DEFAULT_PARTITIONS",
    "metric_day_key",
    "shuffled_key",
    "key_metric_day",
    "spread_keys",
    "sealed_route",
    "SHUFFLED_KEYINGS",
    "SHUFFLED_KEYING_ENV",
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


#: how the shuffler keys its released batches: ``"batch"`` (a plain metric-day spreads over the partitions)
#: or ``"metric-day"`` (every batch of a metric-day in one partition, the keying before issue 31)
SHUFFLED_KEYINGS = ("batch", "metric-day")
#: the deployment-wide environment variables of the shuffled topic's keying (settings field: variable), read by the
#: shuffler and by every consumer of the shuffled topic (:func:`pipeline.routes.keying_from_env`)
SHUFFLED_KEYING_ENV = {"shuffled_key": "LDP_SHUFFLED_KEY", "shuffled_spread": "LDP_SHUFFLED_SPREAD"}


def shuffled_key(metric: str, day: int, shuffle_id: bytes | None = None) -> bytes:
    """The record key of a released batch: ``b"<metric>/<day>/<shuffle id hex>"`` when spread by batch, else
    (``shuffle_id`` ``None``) :func:`metric_day_key`."""
    base = metric_day_key(metric, day)
    return base if shuffle_id is None else base + b"/" + shuffle_id.hex().encode()


def key_metric_day(key: bytes) -> tuple[str, int]:
    """``(metric, day)`` of a raw or shuffled record key, either keying; :class:`ValueError` if it is neither."""
    parts = key.decode().split("/")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"{key!r} is not a <metric>/<day>[/<shuffle id>] key")
    return parts[0], int(parts[1])


def spread_keys(metric: str, day: int, count: int, partitions: int) -> list[bytes]:
    """``count`` sub-keys of one metric-day, ``b"<metric>/<day>/s<j>"``, that land on ``count`` distinct partitions
    spaced evenly around the one of :func:`metric_day_key` (so members that own ranges of partitions each get
    one; at most ``partitions``): for each target partition the smallest ``j`` whose key hashes there."""
    from pipeline.transport.base import partition_for

    count = max(1, min(count, partitions))
    home = partition_for(metric_day_key(metric, day), partitions)
    out = []
    for i in range(count):
        target = (home + i * partitions // count) % partitions
        j = 0
        while partition_for(f"{metric}/{int(day)}/s{j}".encode(), partitions) != target:
            j += 1
        out.append(f"{metric}/{int(day)}/s{j}".encode())
    return out


#: the bytes of a sealed record that pick its sub-key: the first 8 of its encapsulated key (its X25519 ephemeral
#: public key), which follows the analyzer key id (:mod:`ldp_core.wire.sealed`)
_ENC_ROUTE = slice(KEY_ID_SIZE, KEY_ID_SIZE + 8)


def sealed_route(records: np.ndarray, record_size: int, count: int) -> np.ndarray:
    """For each sealed record (``record_size`` bytes: key id, encapsulated key, ciphertext, tag) the index in
    ``range(count)`` of the sub-key it is published under: the first 8 bytes of its encapsulated key, read as
    a little-endian integer, modulo ``count``. A function of the encapsulated key alone, which a copy of the
    record must keep to open: a replayed record takes the sub-key of its original whatever batch carries it."""
    import numpy as np

    raw = np.ascontiguousarray(records).view(np.uint8).reshape(-1, record_size)
    words = np.ascontiguousarray(raw[:, _ENC_ROUTE]).view("<u8").ravel()
    return (words % np.uint64(max(1, int(count)))).astype(np.int64)
