"""The batch-id store's in-memory index (collector/dedup_index.py) against a dict, on both of its paths.

Keys are looked up and placed one by one up to ``_SCALAR`` at a time and in numpy rounds above that (and
always when the table grows); each test runs its operations in sizes on both sides of that line, and
with keys made to share their home slot, so that probe paths are long and several new keys race for one
empty slot in the same round.
"""

from __future__ import annotations

import numpy as np
import pytest

from collector import dedup_index
from collector.dedup_index import FingerprintTable, fingerprint

TOP = 1 << 63


def _random_keys(rng: np.random.Generator, n: int) -> list[int]:
    return [int(k) | TOP for k in rng.integers(0, 1 << 63, size=n, dtype=np.uint64)]


def _check(table: FingerprintTable, model: dict[int, int], absent: list[int]) -> None:
    keys = list(model)
    for part in (keys[:7], keys[:300], keys):  # both lookup paths
        assert table.get(part) == [model[k] for k in part]
    missing = [k for k in absent if k not in model]
    assert table.get(missing) == [-1] * len(missing)
    assert len(table) == len(model)
    assert 2 * len(table) <= table.capacity


@pytest.mark.parametrize("sizes", [[1] * 50 + [3] * 40, [300, 5000, 2, 700], [20000]])
def test_puts_and_gets_agree_with_a_dict_through_growth_and_updates(sizes: list[int]) -> None:
    rng = np.random.default_rng(20261207)
    table = FingerprintTable()
    model: dict[int, int] = {}
    row = 0
    for n in sizes:
        fresh = _random_keys(rng, n)
        old = list(model)
        again = [old[i] for i in rng.choice(len(old), size=min(len(old), n // 3), replace=False)] if old else []
        keys = fresh + again + fresh[:2]  # new keys, keys that take a later row, and keys given twice
        rows = list(range(row + 1, row + 1 + len(keys)))
        row += len(keys)
        table.put(keys, rows)
        model.update(zip(keys, rows, strict=True))
        _check(table, model, _random_keys(rng, 100))


@pytest.mark.parametrize("n", [5, 40, 600])
def test_keys_of_one_home_slot_race_for_empty_slots_and_all_are_placed(n: int) -> None:
    """Every key has home slot 7: in a numpy round all of them reach the same empty slot, one wins, the rest
    probe on; one by one, each probes past the ones before it."""
    table = FingerprintTable(4 * n)
    mask = table.capacity - 1
    rng = np.random.default_rng(n)
    keys = [(k & ~mask) | 7 for k in _random_keys(rng, n)]
    table.put(keys, list(range(n)))
    model = dict(zip(keys, range(n), strict=True))
    _check(table, model, [(k & ~mask) | 7 for k in _random_keys(rng, 50)])
    occupied = np.flatnonzero(table._keys)
    assert occupied.tolist() == list(range(7, 7 + n))  # one run of slots from the home slot on


def test_the_scalar_and_numpy_paths_find_the_same_keys() -> None:
    rng = np.random.default_rng(7)
    keys = _random_keys(rng, 200)
    a, b = FingerprintTable(), FingerprintTable()
    a.put(keys, range(200))
    saved = dedup_index._SCALAR
    dedup_index._SCALAR = 0
    try:
        b.put(keys, range(200))
        vector = b.get(keys)
    finally:
        dedup_index._SCALAR = saved
    assert len(a) == len(b) == 200
    assert a.get(keys) == b.get(keys) == vector == list(range(200))


def test_a_fingerprint_is_the_first_eight_bytes_little_endian_with_the_top_bit_set() -> None:
    assert fingerprint(bytes(range(16))) == int.from_bytes(bytes(range(8)), "little") | TOP
    assert fingerprint(b"\0" * 8) == TOP
    with pytest.raises(ValueError, match="at least 8 bytes"):
        fingerprint(b"x" * 7)


def test_a_key_without_its_top_bit_or_keys_and_rows_of_two_lengths_are_refused() -> None:
    table = FingerprintTable()
    with pytest.raises(ValueError, match="top bit"):
        table.put([5], [1])
    with pytest.raises(ValueError, match="top bit"):
        table.put([1 << 64 | TOP], [1])
    with pytest.raises(ValueError, match="row ids"):
        table.put([TOP | 5], [1, 2])
    assert len(table) == 0
