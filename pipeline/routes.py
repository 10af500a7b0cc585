"""The partition a sealed record must be read from, checked by the consumers of the shuffled topic (issue 31).

The shuffler splits a released sealed batch by its records' encapsulated keys: record r goes under the
metric-day's sub-key ``spread_keys(metric, day, N, P)[sealed_route(r, N)]`` (:mod:`pipeline.topics`), so a
replayed ciphertext, which keeps its encapsulated key, lands on the partition of its original and meets the
replay guard of the member that counted it. That holds only if the shuffler routes honestly: a hostile shuffler
could publish a copy of a counted record under another sub-key, or in a batch "released whole", and reach a
member whose replay set does not hold it. So the sink and the streaming estimator recompute, for every sealed
record, the partition it must be read from, and drop (counting ``sealed_misrouted``) a record read from any
other: :class:`SealedRoutes`.

N is the consumer's own, from its settings, never from the envelope: ``shuffled_spread`` (the shuffler's
``--shuffled-spread``), else the shuffled topic's partition count P, at most P (what the shuffler uses); with
``shuffled_key="metric-day"`` every sealed release is published whole under ``"<metric>/<day>"``, the partition
of the metric-day's one sub-key, which is the same rule with N = 1. P is the topic's, read from the transport
when the consumer joins. Both transports place a key by :func:`~pipeline.transport.base.partition_for`, so the
embedded log checks the same way as Kafka.

**N must agree.** A consumer whose N (or P) differs from the shuffler's sees most honest records on the "wrong"
partition. It cannot tell an honest shuffler run under another N from a hostile one imitating it, so it drops
them all the same, and says so: a part whose records all route, under the N its envelope names (``parts``; 1
for a batch released whole), to the partition it was read from is counted in ``sealed_route_mismatch`` and
:attr:`SealedRoutes.mismatch` holds an actionable message (the consumer logs it as an ERROR, puts it in its
status and is not ready). Change N, ``--shuffled-key`` or the partition count on the shuffler and every member
of the sink's and the estimator's groups together, with the shuffled topic drained (docs/COLLECTOR.md).

**One setting for the deployment.** The keying is a property of the shuffled topic, so it is read, by the
shuffler and by every consumer alike, from the deployment-wide ``$LDP_SHUFFLED_KEY`` and ``$LDP_SHUFFLED_SPREAD``
(:data:`SHUFFLED_KEYING_ENV`; the shuffler's own ``$LDP_SHUFFLER_SHUFFLED_KEY`` / ``_SPREAD`` are still read
first, so an older environment keeps working): :func:`keying_from_env`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from ldp_core.wire.frames import SpecResolver
from ldp_core.wire.sealing import BatchOpener
from pipeline.envelope import ShuffledBatch, decode_envelope, open_sealed
from pipeline.errors import ConfigError
from pipeline.topics import SHUFFLED_KEYING_ENV, SHUFFLED_KEYINGS, sealed_route, spread_keys
from pipeline.transport.base import Record, Transport, partition_for

__all__ = [
    "SHUFFLED_KEYING_ENV",
    "SealedRoutes",
    "RouteCheck",
    "check_shuffled_key",
    "keying_from_env",
    "sealed_spread",
    "open_routed",
    "route_status",
]

#: the shuffler's own spellings, read before :data:`SHUFFLED_KEYING_ENV` (as the shuffler's settings read them)
_SHUFFLER_ENV = {"shuffled_key": "LDP_SHUFFLER_SHUFFLED_KEY", "shuffled_spread": "LDP_SHUFFLER_SHUFFLED_SPREAD"}


def check_shuffled_key(value: str) -> str:
    """``value`` if it is one of :data:`~pipeline.topics.SHUFFLED_KEYINGS`, else a clear :class:`ConfigError`."""
    if value not in SHUFFLED_KEYINGS:
        raise ConfigError(f"shuffled_key must be one of {', '.join(SHUFFLED_KEYINGS)}, got {value!r}")
    return value


def keying_from_env(
    key: str | None = None, spread: int | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A consumer's ``shuffled_key`` and ``shuffled_spread``: as given, else from the environment in the order the
    shuffler reads it (``$LDP_SHUFFLER_SHUFFLED_*``, then ``$LDP_SHUFFLED_*``), else ``batch`` and 0; a clear
    :class:`ConfigError` for a bad value."""
    env = os.environ if environ is None else environ

    def read(field: str) -> tuple[str, str] | None:
        for var in (_SHUFFLER_ENV[field], SHUFFLED_KEYING_ENV[field]):
            raw = env.get(var, "").strip()
            if raw:
                return var, raw
        return None

    if key is None and (found := read("shuffled_key")) is not None:
        var, key = found
        if key not in SHUFFLED_KEYINGS:
            raise ConfigError(f"${var} must be one of {', '.join(SHUFFLED_KEYINGS)}, got {key!r}")
    if spread is None and (found := read("shuffled_spread")) is not None:
        var, raw = found
        try:
            spread = int(raw)
        except ValueError:
            raise ConfigError(f"${var} must be an integer, got {raw!r}") from None
    return {"shuffled_key": key or "batch", "shuffled_spread": 0 if spread is None else spread}


def sealed_spread(shuffled_key: str, shuffled_spread: int, partitions: int) -> int:
    """N, the sub-keys a sealed metric-day is routed over: 1 with ``shuffled_key="metric-day"``, else
    ``shuffled_spread`` (0: ``partitions``), at most ``partitions`` (as :func:`~pipeline.topics.spread_keys`)."""
    if shuffled_key == "metric-day":
        return 1
    return max(1, min(shuffled_spread or partitions, partitions))


@dataclasses.dataclass(frozen=True)
class RouteCheck:
    """What :meth:`SealedRoutes.check` leaves of a batch: the batch with its misrouted records removed, how many
    were removed, and of those how many came in a part consistent with another N (``mismatch``, the message)."""

    sb: ShuffledBatch
    misrouted: int = 0
    other_n: int = 0
    mismatch: str | None = None


class SealedRoutes:
    """The route check of one consumer: ``shuffled_key`` and ``shuffled_spread`` as given to the shuffler;
    :attr:`partitions` (the shuffled topic's count) is set by the consumer when it joins."""

    def __init__(self, shuffled_key: str = "batch", shuffled_spread: int = 0) -> None:
        self.shuffled_key = check_shuffled_key(shuffled_key)
        self.shuffled_spread = int(shuffled_spread)
        self.partitions: int | None = None
        #: the last disagreement seen (an actionable message), ``None`` while N agrees
        self.mismatch: str | None = None
        self.logged: str | None = None  # the last mismatch logged as an ERROR (each new one is)
        self._targets: dict[tuple[str, int, int, int], np.ndarray] = {}

    def spread(self, partitions: int) -> int:
        """This consumer's N over a topic of ``partitions`` partitions."""
        return sealed_spread(self.shuffled_key, self.shuffled_spread, partitions)

    def _partitions_of(self, metric: str, day: int, n: int, partitions: int) -> np.ndarray:
        """Per sub-key index ``j < n``: the partition the metric-day's sub-key ``j`` lands on."""
        k = (metric, day, n, partitions)
        out = self._targets.get(k)
        if out is None:
            if len(self._targets) >= 4096:  # metric-days come and go (and a hostile envelope can name any day)
                self._targets.clear()
            keys = spread_keys(metric, day, n, partitions)
            out = self._targets[k] = np.array([partition_for(key, partitions) for key in keys], dtype=np.int64)
        return out

    def expected(self, sb: ShuffledBatch, n: int, partitions: int) -> np.ndarray:
        """The partition each record of the sealed batch ``sb`` must be read from, routed over ``n`` sub-keys."""
        b = sb.batch
        targets = self._partitions_of(b.metric, int(b.day), n, partitions)
        return targets[sealed_route(b.records, b.spec.record_size, len(targets))]

    def check(self, sb: ShuffledBatch, partition: int) -> RouteCheck:
        """``sb`` (read from ``partition``) without its sealed records that must be read from another partition.
        A plain batch comes back as is."""
        if not sb.batch.sealed or len(sb.batch) == 0:
            return RouteCheck(sb)
        if self.partitions is None:
            raise RuntimeError("SealedRoutes.partitions is not set: the consumer sets it when it joins")
        p = self.partitions
        n = self.spread(p)
        ok = self.expected(sb, n, p) == partition
        bad = int(ok.size - np.count_nonzero(ok))
        if bad == 0:
            return RouteCheck(sb)
        kept = dataclasses.replace(sb.batch, records=np.ascontiguousarray(sb.batch.records[ok]))
        out = ShuffledBatch(dataclasses.replace(sb.meta, n=len(kept)), kept)
        # what the envelope says the shuffler routed over (1: released whole); not trusted, only compared
        parts = sb.meta.parts
        claimed = 1 if parts is None else parts if isinstance(parts, int) and not isinstance(parts, bool) else 0
        if not 1 <= claimed <= p or claimed == n or not np.all(self.expected(sb, claimed, p) == partition):
            return RouteCheck(out, bad)
        b = sb.batch
        mine = (
            "--shuffled-key metric-day (N = 1)"
            if self.shuffled_key == "metric-day"
            else f"N = {n} (--shuffled-spread {self.shuffled_spread}"
            + (f" over {p} partitions)" if self.shuffled_spread else f": the topic's {p} partitions)")
        )
        self.mismatch = (
            f"sealed records of {b.metric}/{b.day} on partition {partition} are routed over N = {claimed} "
            f"sub-keys (their envelope's parts; 1: released whole), this member routes over {mine}: the shuffler "
            "and this group disagree (or a hostile shuffler imitates one that does); they are dropped. Give the "
            "shuffler and every member of the sink's and the estimator's groups the same --shuffled-key and "
            "--shuffled-spread, and change them or the partition count only with the shuffled topic drained "
            "(docs/COLLECTOR.md)"
        )
        return RouteCheck(out, bad, bad, self.mismatch)


def route_status(body: dict[str, Any], routes: SealedRoutes) -> dict[str, Any]:
    """A consumer's run status (``body``) with ``route_mismatch`` (:attr:`SealedRoutes.mismatch`), not ready while
    there is one: sealed records arrive routed under another N than the consumer's (what to do is in the message)."""
    body["route_mismatch"] = routes.mismatch
    if routes.mismatch is not None:
        body["ready"] = False
    return body


class _RouteStats(Protocol):
    sealed_misrouted: int
    sealed_route_mismatch: int
    sealed_replays_dropped: int
    sealed_unopened: int


def open_routed(
    rec: Record,
    specs: SpecResolver,
    opener: BatchOpener | None,
    routes: SealedRoutes,
    transport: Transport,
    stats: _RouteStats,
    log: logging.Logger,
) -> ShuffledBatch:
    """The shuffled batch of ``rec`` as the sink and the estimator count it: decoded, its misrouted sealed records
    dropped (:meth:`SealedRoutes.check`, before the replay guard sees them), the rest opened (replays dropped);
    every drop counted in ``stats`` and logged. ``routes.partitions`` is read from ``transport`` if unset."""
    sb = decode_envelope(rec.value, specs)
    where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
    if sb.batch.sealed:
        if routes.partitions is None:
            routes.partitions = transport.partitions(rec.topic)
        chk = routes.check(sb, rec.partition)
        sb = chk.sb
        if chk.misrouted:  # a copy a shuffler routed elsewhere, or a shuffler routing under another N (issue 31)
            stats.sealed_misrouted += chk.misrouted
            stats.sealed_route_mismatch += chk.other_n
            if chk.mismatch is not None and chk.mismatch != routes.logged:
                routes.logged = chk.mismatch
                log.error("%s: %d sealed records dropped: %s", where, chk.misrouted, chk.mismatch)
            else:
                log.warning(
                    "%s: %d sealed records dropped: their encapsulated keys route them to another partition "
                    "(N = %d over %d partitions)",
                    where,
                    chk.misrouted,
                    routes.spread(routes.partitions),
                    routes.partitions,
                )
    sb, failed, replayed = open_sealed(sb, opener, (rec.topic, rec.partition, rec.offset))
    if replayed:  # records whose encapsulated key another log record already delivered (issue #28)
        stats.sealed_replays_dropped += replayed
        log.warning("%s: %d replayed sealed records dropped", where, replayed)
    if failed:  # sealed records that did not open (another key, altered bytes): counted, never fatal
        stats.sealed_unopened += failed
        log.warning("%s: %d sealed records did not open", where, failed)
    return sb
