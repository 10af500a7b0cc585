"""The shuffler: batches raw uploads per metric, spec and day, permutes them, and releases crowds.

It reads ``ldp.reports.raw`` as a member of a consumer group and writes
``ldp.reports.shuffled`` (:mod:`pipeline.envelope`). For each group
``(metric, spec_id, day)`` it buffers the reports of many uploads; once the
group holds at least ``min_batch`` reports (the crowd threshold) it permutes
all of them with a CSPRNG (:mod:`collector.shuffler.permute`) and releases them as
batches of at most ``max_batch`` reports, each of at least ``min_batch``,
under fresh random batch ids. A group below the threshold stays buffered;
one whose day left the day window it shares with the collector
(:class:`ldp_core.days.DayWindow`: older than ``today - max_day_age -
expiry_grace_days`` by the UTC clock, never by the newest day seen) is
dropped (it never reached a crowd; counted as ``expired_groups`` and
logged).
Nothing of the input survives but the records themselves: not the upload
grouping (uploads are mixed, then re-chunked), not the order (permuted), not
the arrival time (released at checkpoints), not the upload batch ids.

Exactly once, with buffered reports that must survive a crash
-------------------------------------------------------------
A transaction of the transport (:meth:`~pipeline.transport.base.Consumer.transaction`)
commits the outputs together with the offsets just past *every* record
delivered so far. Reports buffered below the threshold have been delivered,
so their offsets get committed too: the buffer itself must therefore be
committed in the same transaction, as data. The shuffler keeps a
**checkpoint** per raw partition ``p`` in the internal topic
``ldp.shuffler.state``, partition ``p`` (it has as many partitions as the
raw topic, and the consumer subscribes to both, so the group assigns raw
``p`` and state ``p`` to the same member; the shuffler checks this). A
checkpoint holds the partition's buffered reports, its window of recent
upload batch ids, and ``raw_offset``: the raw offset up to which it accounts
for the input. Every ``checkpoint_interval`` seconds, one
transaction publishes the released batches, a new checkpoint of every
partition that changed, and commits all input offsets. Hence the invariant:

    for every raw partition ``p`` whose committed offset is ``C``, a checkpoint
    of ``p`` with ``raw_offset == C`` lies beyond state ``p``'s committed offset.

(A checkpoint that was delivered back to the shuffler is rewritten in the next
transaction, since that transaction commits past it.) A partition's buffer
and window change only when a raw record of that partition is applied or a
day leaves the window, so two checkpoints with the same ``raw_offset`` hold
the same state up to expiry, which a restore applies again.

**What a checkpoint does not hold** (format 2,
:data:`~collector.shuffler.checkpoint.CHECKPOINT_VERSION`): the arrival
order or any upload number. Each group's buffer is freshly permuted with the
CSPRNG for every checkpoint; the id window is kept as HMAC-SHA-256 digests
(16 bytes) in two unordered sets (:class:`~collector.shuffler.groups._IdWindow`);
and the whole body is sealed with AES-256-GCM under a subkey of the
shuffler's secret (``key_file``, created 0600 if missing, never written to
a topic), the clear header (group, partition, raw offset, snapshot, chunk,
key id) as associated data. So whoever reads the state topic, even as it is
written, cannot tell which upload a released report came from, nor which
checkpoint interval it arrived in. In memory a group keeps per-record
upload numbers to count a released batch's sources; restored records count
as one, so ``ShuffleMeta.sources`` is a lower bound. Only this format is
read: a chunk of format 1 (written in the clear by early shufflers) is
ignored as malformed.

**Superseded checkpoints are deleted.** When the shuffler reads back chunk
0 of the latest checkpoint it committed (or restored) for a partition,
every state record before it in that partition is superseded: it calls
:meth:`~pipeline.transport.base.Transport.delete_before` (Kafka:
DeleteRecords; embedded: an overwriting DELETE). Nothing a restore needs is
lost: the checkpoint a restore looks for is the latest committed one.

Released batches go into the open transaction as soon as they are cut (on
Kafka they travel to the broker while the shuffler works on) and become
visible only when it commits.

**Restoring.** A partition is restored when the shuffler starts and whenever
the group moves partitions: its raw records are held back until the
checkpoint with ``raw_offset`` equal to the group's committed offset
arrives, which then replaces the partition's state; the held records are
applied after it. No checkpoint is written while a partition is restoring.
After a rebalance both transports restart *every* owned partition from the
committed offsets and forget what they delivered; the shuffler notices it
because the consumer's delivered positions (``Consumer.positions()``) no
longer match the records it received since its last commit. It then aborts
its open transaction (whose outputs came from records that will be
delivered again) and restores every partition. So after a crash, a
rebalance or an aborted transaction, every report is released exactly once
or is still buffered, and no upload is counted twice.

Keys: a released batch of a plain metric is keyed ``"<metric>/<day>/<shuffle id>"`` (``shuffled_key="batch"``,
the default), so one metric-day's batches spread over the shuffled topic's partitions and the sink's and
estimator's members share it (issue 31); a sealed metric's batches, and all of them under
``shuffled_key="metric-day"``, are keyed ``"<metric>/<day>"`` (:func:`pipeline.topics.shuffled_key`). The raw
topic stays keyed per metric-day: the crowd of a metric-day is counted in one partition.

Duplicates: the collector publishes a retried upload again if it crashed
between publishing and recording the batch id (:mod:`collector.dedup`).
The retry has the same batch id and key, so it lands in the same partition
soon after; the shuffler drops a batch whose id's digest is among the
recent ones of its partition (at least the last ``dedup_window / 2``, at
most ``dedup_window``). The window is part of the checkpoint, so it
survives crashes.

The central guarantee of each released batch comes from an injected
``guarantee(n, epsilon0) -> (epsilon, delta, bound_name)`` (the ``ldp
shuffler`` command wires :func:`estimator.accounting.shuffle.shuffler_guarantee`;
this package does not import the estimator). It is asked per person: for a
batch of ``n`` reports of a metric whose devices send up to ``r`` a day, at
``n = ⌈n / r⌉`` people, each an ``r·ε₀``-LDP randomizer
(:meth:`~collector.shuffler.processor.Shuffler._central`).

The modules
-----------
:mod:`~collector.shuffler.settings` holds :class:`ShufflerSettings`;
:mod:`~collector.shuffler.groups` the buffered groups, the window of batch-id
digests and the release plan (:func:`~collector.shuffler.groups.plan_release`);
:mod:`~collector.shuffler.checkpoint` the checkpoint format and its sealing
under the shuffler's secret; :mod:`~collector.shuffler.state` one partition's
state, written to and restored from checkpoints;
:mod:`~collector.shuffler.permute` the CSPRNG permutation;
:mod:`~collector.shuffler.stats` the counters (:class:`ShufflerStats`); and
:mod:`~collector.shuffler.processor` the stream processor, :class:`Shuffler`.
"""

from __future__ import annotations

from collector.shuffler.processor import Guarantee, Shuffler
from collector.shuffler.settings import DeviceCaps, ShufflerSettings
from collector.shuffler.stats import ShufflerStats

__all__ = ["Shuffler", "ShufflerSettings", "DeviceCaps", "ShufflerStats", "Guarantee"]
