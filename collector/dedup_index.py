"""An in-memory index of one day's batch ids: 64-bit fingerprint -> row id, open addressing in numpy arrays.

:class:`~collector.dedup.BatchIdStore` keeps each day's ids in an append-only SQLite table (rows in
insertion order, no index on the id) and finds them through this table, which every process builds from
the file and keeps up to date by reading the rows appended since it last looked.

**Layout.** Two parallel arrays of ``capacity`` slots (a power of two): ``keys`` (``uint64``, 0 = empty)
and ``rows`` (``int64``, the SQLite row id of the id's latest record). A key is the first 8 bytes of the
id's keyed digest (uniform: an HMAC output) with the top bit set, so no key is 0; its home slot is its
low bits, and a collision moves on to the next slot (linear probing). The load stays at most one half
(the table doubles past it): an unsuccessful search then probes 2.5 slots on average, a successful one 1.5
(Knuth's estimates for linear probing, TAOCP vol. 3, 6.4). That is 16 bytes per slot, 32-64 bytes per id.

**Two paths.** Keys come and go as Python ints. A group commit's few dozen keys are probed one by one
through memoryviews of the arrays (a few hundred ns per key); more than ``_SCALAR`` at once (a day's ids
read when the store opens, the table's growth) are probed all at once in numpy rounds, one round per
probe step, so a day of a million ids loads in well under a second. There, inserts claim empty slots by
rounds: where two new keys want one empty slot, one takes it and the other probes on.

**Fingerprints, not ids.** Two distinct ids share a fingerprint with probability about n^2 / 2^64 over n
ids of a day (5e-6 at n = 10^7). The store reads each hit's full digest back from its row and compares
it, so a collision can never make a new batch look like a known one; at worst the second id of the pair
is not found on a retry, which is then published again and dropped by the shuffler's window of batch
ids, as any retry through another collector is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["FingerprintTable", "fingerprint"]

_TOP = 1 << 63
_MIN_CAPACITY = 1024
#: at most this many keys are looked up or placed one by one (through memoryviews of the arrays, a few hundred ns
#: each) rather than in numpy rounds (a few µs per round: the longest probe path sets the number of rounds)
_SCALAR = 256


def fingerprint(digest: bytes) -> int:
    """The key of a digest of at least 8 bytes: its first 8 bytes, little-endian, with the top bit set (so never
    0, the empty slot)."""
    if len(digest) < 8:
        raise ValueError(f"a digest of at least 8 bytes is needed, got {len(digest)}")
    return int.from_bytes(digest[:8], "little") | _TOP


class FingerprintTable:
    """A map from fingerprint (:func:`fingerprint`) to row id; a key put again takes the new row id."""

    def __init__(self, capacity: int = _MIN_CAPACITY) -> None:
        cap = _MIN_CAPACITY
        while cap < capacity:
            cap *= 2
        self._keys = np.zeros(cap, dtype=np.uint64)
        self._rows = np.zeros(cap, dtype=np.int64)
        self._count = 0
        self._views()

    def _views(self) -> None:
        self._kv = self._keys.data  # a memoryview: element access gives Python ints, the scalar paths' speed
        self._rv = self._rows.data

    def __len__(self) -> int:
        return self._count

    @property
    def capacity(self) -> int:
        return int(self._keys.size)

    @property
    def nbytes(self) -> int:
        return int(self._keys.nbytes + self._rows.nbytes)

    def get(self, keys: Sequence[int]) -> list[int]:
        """The row id of each key, -1 where the key is absent."""
        if not self._count:
            return [-1] * len(keys)
        if len(keys) <= _SCALAR:
            return [self._get_one(k) for k in keys]
        arr = np.array(keys, dtype=np.uint64)
        slots = self._probe(arr)
        return np.where(self._keys[slots] == arr, self._rows[slots], -1).tolist()

    def put(self, keys: Sequence[int], rows: Sequence[int]) -> None:
        """Map each key to its row id (a key already present, or given twice, keeps the last row id given)."""
        if len(keys) != len(rows):
            raise ValueError(f"{len(keys)} keys but {len(rows)} row ids")
        if not keys:
            return
        if not all(k >> 63 == 1 and k < 1 << 64 for k in keys):
            raise ValueError("keys must be 64-bit with their top bit set (0 marks an empty slot): use fingerprint()")
        if 2 * (self._count + len(keys)) > self._keys.size:
            self._grow(self._count + len(keys))
        if len(keys) <= _SCALAR:
            for k, r in zip(keys, rows, strict=True):
                self._put_one(k, r)
            return
        latest = dict(zip(keys, rows, strict=True))  # the numpy rounds want distinct keys: the last row id wins
        self._place(np.array(list(latest), dtype=np.uint64), np.array(list(latest.values()), dtype=np.int64))

    def _get_one(self, key: int) -> int:
        kv, mask = self._kv, len(self._kv) - 1
        slot = key & mask
        while True:
            found = kv[slot]
            if found == key:
                return int(self._rv[slot])
            if found == 0:
                return -1
            slot = (slot + 1) & mask

    def _put_one(self, key: int, row: int) -> None:
        kv, mask = self._kv, len(self._kv) - 1
        slot = key & mask
        while True:
            found = kv[slot]
            if found == 0:
                kv[slot] = key
                self._count += 1
                break
            if found == key:
                break
            slot = (slot + 1) & mask
        self._rv[slot] = row

    def _probe(self, keys: np.ndarray) -> np.ndarray:
        """For each key, the slot that holds it or the first empty slot on its probe path."""
        mask = self._keys.size - 1
        slots = (keys & np.uint64(mask)).astype(np.int64)
        todo = np.arange(keys.size)
        table = self._keys
        while todo.size:
            found = table[slots[todo]]
            done = (found == keys[todo]) | (found == 0)
            todo = todo[~done]
            slots[todo] = (slots[todo] + 1) & mask
        return slots

    def _place(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Insert distinct ``keys`` (room for all of them assured). Where several keys reach one empty slot in a
        round, each writes its key there and reads it back: the one that reads its own key took the slot (numpy
        keeps the last of repeated assignments), the others probe on from it."""
        table = self._keys
        mask = table.size - 1
        slots = (keys & np.uint64(mask)).astype(np.int64)
        todo = np.arange(keys.size)
        while todo.size:
            at = slots[todo]
            want = keys[todo]
            found = table[at]
            empty = found == 0
            if empty.any():
                table[at[empty]] = want[empty]
                found = np.where(empty, table[at], found)
                self._count += int(np.count_nonzero(empty & (found == want)))
            mine = found == want  # an empty slot it claimed, or its own key already there
            self._rows[at[mine]] = rows[todo[mine]]
            todo = todo[~mine]
            slots[todo] = (slots[todo] + 1) & mask

    def _grow(self, need: int) -> None:
        cap = self._keys.size
        while 2 * need > cap:
            cap *= 2
        used = self._keys != 0
        keys, rows = self._keys[used], self._rows[used]
        self._keys = np.zeros(cap, dtype=np.uint64)
        self._rows = np.zeros(cap, dtype=np.int64)
        self._count = 0
        self._views()
        self._place(keys, rows)
