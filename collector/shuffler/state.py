"""What the shuffler holds for one raw partition (:class:`_Partition`), and how it is written to a checkpoint
and restored from one (the format is :mod:`collector.shuffler.checkpoint`'s)."""

from __future__ import annotations

import collections
import json
import secrets
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from collector.shuffler.checkpoint import (
    CheckpointHeader,
    OpenedChunk,
    Piece,
    _Keys,
    encode_checkpoint_body,
    encode_checkpoint_chunk,
)
from collector.shuffler.groups import _gather, _Group, _GroupKey, _IdWindow
from collector.shuffler.permute import WordSource, csprng_permutation
from collector.shuffler.stats import _TOTALS
from ldp_core.mechanisms import spec_from_dict
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.wire.sealing import SealedSpec
from pipeline.transport import Record


class _Partition:
    """What the shuffler holds for one raw partition (and its state partition of the same number)."""

    def __init__(self, index: int, committed: int | None, dedup_window: int) -> None:
        self.index = index
        self.live = committed is None
        self.committed = committed  # raw offset the restore looks for
        self.restore_since = time.monotonic()
        #: snapshot -> chunk -> (header, payload, state offset)
        self.assembling: dict[str, dict[int, tuple[CheckpointHeader, memoryview, int]]] = {}
        self.held: list[Record] = []
        self.groups: dict[_GroupKey, _Group] = {}
        self.ids = _IdWindow(dedup_window)
        self.raw_next: int | None = committed
        self.dirty = False
        self.pending_reports = 0
        self.delta: collections.Counter[str] = collections.Counter()  # stats, counted once committed
        self.writing: str | None = None  # snapshot id of the checkpoint in the open transaction
        self.latest: str | None = None  # snapshot id of the latest committed checkpoint (written or restored)
        self.foreign = False  # another group's chunks share this state partition: delete nothing
        self.totals: collections.Counter[str] = collections.Counter()  # committed counters since the first record

    def buffered(self) -> int:
        return sum(g.n for g in self.groups.values())

    def checkpoint_chunks(self, group: str, budget: int, keys: _Keys, words: WordSource) -> Iterator[bytes]:
        """The checkpoint of this partition for consumer group ``group``, as chunks of at most about ``budget``
        bytes of records: each group's buffer freshly permuted (so the stored order says nothing of the arrival
        order), no upload numbers, the batch-id window as keyed digests in no order, everything but the clear
        header sealed with ``keys``. Marks the snapshot as the one being written (:attr:`writing`)."""
        snapshot = secrets.token_hex(8)
        self.writing = snapshot
        digests, previous = self.ids.serialized()
        pieces: list[list[tuple[Piece, bytes]]] = [[]]
        sizes = [16 * len(digests)]
        for (metric, _, day), buffered in sorted(self.groups.items()):
            recs = buffered.records()
            recs = _gather(recs, csprng_permutation(recs.size, words))
            spec_dict = buffered.spec.to_dict()
            if isinstance(buffered.spec, SealedSpec):  # the records are sealed: restored as such
                spec_dict = {**spec_dict, "sealed": True}
            per = buffered.spec.record_size
            pos = 0
            while pos < recs.size:
                if sizes[-1] >= budget:
                    pieces.append([])
                    sizes.append(0)
                take = min(max(1, (budget - sizes[-1]) // per), recs.size - pos)
                pieces[-1].append(((metric, spec_dict, day, take), recs[pos : pos + take].tobytes()))
                sizes[-1] += take * per
                pos += take
        total = len(pieces)
        for i, chunk in enumerate(pieces):
            header = CheckpointHeader(
                group=group,
                partition=self.index,
                raw_offset=int(self.raw_next or 0),
                snapshot=snapshot,
                chunk=i,
                chunks=total,
                key_id=keys.key_id,
            )
            body = encode_checkpoint_body(
                [p for p, _ in chunk],
                digests if i == 0 else [],
                previous if i == 0 else 0,
                [b for _, b in chunk],
                {k: int(v) for k, v in (self.totals + self.delta).items() if k in _TOTALS} if i == 0 else None,
            )
            yield encode_checkpoint_chunk(header, body, keys)

    def restore(self, snapshot: str, chunks: Sequence[OpenedChunk]) -> None:
        """Replace the buffered groups, the id window and the totals by those of the opened chunks (in order) of
        checkpoint ``snapshot``, the one at the committed raw offset; the partition is live again."""
        self.groups.clear()
        self.ids.clear()
        specs: dict[str, ReportSpec] = {}
        digests: list[bytes] = []
        previous = 0
        for i, (pieces, ids, prev, rest, totals) in enumerate(chunks):
            if i == 0:
                self.totals = collections.Counter({k: v for k, v in totals.items() if k in _TOTALS})
            digests.extend(ids)
            previous += prev
            pos = 0
            for metric, spec_dict, day, count in pieces:
                spec = _spec_of(spec_dict, specs)
                recs = np.frombuffer(rest, dtype=spec.record_dtype, count=count, offset=pos).copy()
                pos += count * spec.record_size
                key = (metric, spec.spec_id, int(day))
                buffered = self.groups.get(key)
                if buffered is None:
                    buffered = self.groups[key] = _Group(spec)
                buffered.add_restored(recs)
        self.ids.restore(digests, previous)
        self.live = True
        self.assembling.clear()
        self.raw_next = self.committed
        self.latest = snapshot


def _spec_of(spec_dict: dict[str, Any], cache: dict[str, ReportSpec]) -> ReportSpec:
    """The spec a checkpoint piece names (sealed records keep a :class:`~ldp_core.wire.sealing.SealedSpec`)."""
    key_id = json.dumps(spec_dict, sort_keys=True)
    spec = cache.get(key_id)
    if spec is None:
        plain = {k: v for k, v in spec_dict.items() if k != "sealed"}
        spec = spec_from_dict(plain)
        spec = cache[key_id] = SealedSpec.of(spec) if spec_dict.get("sealed") else spec
    return spec
