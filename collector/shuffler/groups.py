"""What the shuffler buffers: a group's reports (:class:`_Group`), the window of recent upload batch ids
(:class:`_IdWindow`), how a group that reached its crowd is cut into released batches (:func:`plan_release`),
and the fast permuting of fixed-width records (:func:`_gather`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ldp_core.mechanisms.base import ReportSpec

__all__ = ["plan_release"]

_GroupKey = tuple[str, str, int]  # metric, spec_id, day


def plan_release(n: int, min_batch: int, cap: int) -> list[int]:
    """Sizes of the batches to release from a group of ``n >= min_batch`` reports (each in ``[min_batch, cap]``).

    Whole group in ``k = ceil(n / cap)`` near-equal batches if each holds at
    least ``min_batch``; otherwise ``n // cap`` batches of ``cap`` and the rest kept.
    """
    cap = max(cap, min_batch)
    if n < min_batch:
        return []
    k = -(-n // cap)
    if n // k >= min_batch:
        base, extra = divmod(n, k)
        return [base + 1] * extra + [base] * (k - extra)
    return [cap] * (n // cap)


class _Group:
    """Buffered reports of one (metric, spec, day): record arrays with per-record source (upload) numbers.

    Sources are numbered densely per group (0, 1, ...), so the distinct
    uploads in a released batch are counted with one ``bincount``. They live
    in memory only: a checkpoint holds no source numbers (nor any order), so
    the records restored from one count as a single source and
    :attr:`~pipeline.envelope.ShuffleMeta.sources` is a lower bound.
    """

    __slots__ = ("spec", "parts", "n", "next_source")

    def __init__(self, spec: ReportSpec) -> None:
        self.spec = spec
        self.parts: list[tuple[np.ndarray, np.ndarray | int]] = []
        self.n = 0
        self.next_source = 0

    def add_upload(self, records: np.ndarray) -> None:
        self.parts.append((records, self.next_source))
        self.next_source += 1
        self.n += int(records.size)

    def add_restored(self, records: np.ndarray) -> None:
        """Records read from a checkpoint (before any upload of this process): together, source 0."""
        self.parts.append((records, 0))
        self.n += int(records.size)
        self.next_source = max(self.next_source, 1)

    def records(self) -> np.ndarray:
        if len(self.parts) == 1:
            return self.parts[0][0]
        # as bytes: concatenating structured arrays field by field is ~20x slower
        dtype = self.parts[0][0].dtype
        return np.concatenate([np.ascontiguousarray(r).view(np.uint8) for r, _ in self.parts]).view(dtype)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        recs = self.records()
        if all(isinstance(s, int) for _, s in self.parts):
            src = np.repeat(np.array([s for _, s in self.parts], dtype=np.uint32), [r.size for r, _ in self.parts])
        else:
            src = np.concatenate(
                [np.full(r.size, s, dtype=np.uint32) if isinstance(s, int) else s for r, s in self.parts]
            )
        return recs, src

    def keep(self, records: np.ndarray, sources: np.ndarray) -> None:
        """Replace the buffer by ``records`` (a random remainder), renumbering their sources densely."""
        uniq, dense = np.unique(sources, return_inverse=True)
        self.parts = [(records, dense.astype(np.uint32).reshape(-1))]
        self.n = int(records.size)
        self.next_source = int(uniq.size)


class _IdWindow:
    """Digests of recent upload batch ids, in no order: two sets, the current one and the one before.

    An id goes into ``current``; once it holds ``half = ceil(limit / 2)``
    digests it becomes ``previous`` (the old ``previous`` is forgotten). So
    at least the last ``half`` and at most ``limit`` ids are remembered, and
    within each set nothing tells which id came first.
    """

    __slots__ = ("limit", "half", "current", "previous")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.half = max(1, -(-limit // 2))
        self.current: set[bytes] = set()
        self.previous: set[bytes] = set()

    def __contains__(self, digest: bytes) -> bool:
        return digest in self.current or digest in self.previous

    def __len__(self) -> int:
        return len(self.current) + len(self.previous)

    def add(self, digest: bytes) -> None:
        if not self.limit:
            return
        self.current.add(digest)
        if len(self.current) >= self.half:
            self.previous, self.current = self.current, set()

    def clear(self) -> None:
        self.current.clear()
        self.previous.clear()

    def serialized(self) -> tuple[list[bytes], int]:
        """Every digest, each set sorted by value (``previous`` first), and how many are ``previous``."""
        return sorted(self.previous) + sorted(self.current), len(self.previous)

    def restore(self, digests: Sequence[bytes], previous: int) -> None:
        self.previous = set(digests[:previous])
        self.current = set(digests[previous:])
        if len(self.current) >= self.half:  # a smaller window than the checkpoint's writer had
            self.previous, self.current = self.current, set()


def _gather(records: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """``records[perm]`` for fixed-width records, as a row gather over their bytes (several times faster
    than fancy indexing a structured dtype)."""
    raw = np.ascontiguousarray(records).view(np.uint8).reshape(records.size, records.dtype.itemsize)
    return np.take(raw, perm, axis=0).reshape(-1).view(records.dtype)
