"""The spent-token store (collector/spent_tokens.py): one spend per token, atomic across processes.

The store decides a group of spends in one write transaction over rows of concatenated digests and an index in
memory. Played here: the verdicts of one call are those of the spends one after the other; processes racing on
one file accept each token for one batch only (each process on its own connection and index, catching up with
the others' rows inside its write transaction); two tokens sharing the 8 bytes the index keys on are both kept
(the test fails if the full-digest check or the overflow dict goes); a file of the first layout is rewritten,
and a collector of the first layout can no longer spend on it; old token days are dropped.
"""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from collector.spent_tokens import SpentTokens

DAY = "2026-12-07"


def _tokens(rng: np.random.Generator, n: int) -> list[bytes]:
    return [rng.bytes(32) for _ in range(n)]


def test_the_verdicts_of_one_call_are_those_of_the_spends_in_order(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    t1, t2 = _tokens(rng, 2)
    b1, b2 = rng.bytes(16), rng.bytes(16)
    store = SpentTokens(tmp_path / "spent.sqlite3")
    # new, its retry, a double spend in the same call; then a retry and a double spend in a later call
    assert store.spend_many([(t1, b1, DAY), (t1, b1, DAY), (t1, b2, DAY), (t2, b2, DAY)]) == [True, True, False, True]
    assert store.spend_many([(t2, b2, DAY), (t2, b1, DAY), (t1, b1, DAY)]) == [True, False, True]
    assert store.spend(t1, b2, DAY) is False
    assert sorted(store.records()) == sorted([(t1, b1, DAY), (t2, b2, DAY)])
    store.close()
    again = SpentTokens(tmp_path / "spent.sqlite3")  # a restart reads the file into its index
    assert again.spend_many([(t1, b2, DAY), (t2, b2, DAY)]) == [False, True]
    assert len(again) == 2
    again.close()


def _race(args: tuple[str, int, list[bytes]]) -> list[bool]:
    path, worker, tokens = args
    store = SpentTokens(path)
    rng = np.random.default_rng(worker)
    out: list[bool] = []
    for k in range(0, len(tokens), 7):  # groups of 7, each token with this worker's own batch id
        out += store.spend_many([(t, bytes([worker]) * 16, DAY) for t in tokens[k : k + 7]])
        if rng.random() < 0.3:  # one more transaction in the race (its verdict is that of the first spend)
            store.spend(tokens[k], bytes([worker]) * 16, DAY)
    store.close()
    return out


def test_processes_racing_on_one_file_accept_each_token_once(tmp_path: Path) -> None:
    tokens = _tokens(np.random.default_rng(2), 300)
    path = str(tmp_path / "spent.sqlite3")
    SpentTokens(path).close()  # the file exists in WAL mode before the race
    orders = [tokens, tokens[::-1], tokens[100:] + tokens[:100]]
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        verdicts = pool.map(_race, [(path, w, orders[w]) for w in range(3)])
    accepted: dict[bytes, int] = {}
    for order, got in zip(orders, verdicts, strict=True):
        for token, ok in zip(order, got, strict=True):
            if ok:
                accepted[token] = accepted.get(token, 0) + 1
    assert sorted(accepted) == sorted(tokens) and set(accepted.values()) == {1}  # each token: one worker's batch
    store = SpentTokens(path)
    paid = {d: b for d, b, _ in store.records()}
    assert len(store.records()) == len(tokens) == len(paid)
    for w, (order, got) in enumerate(zip(orders, verdicts, strict=True)):
        for token, ok in zip(order, got, strict=True):
            assert ok == (paid[token] == bytes([w]) * 16)  # the store's record names the worker that was told yes
    store.close()


def test_a_rolled_back_spend_leaves_nothing_in_memory_that_hides_another_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that fails after its row went into memory is rolled back; that row id is then another
    process's next row. If memory still took that row as read, this process would never read the other's
    spend, and would accept its token again (a double spend)."""
    rng = np.random.default_rng(6)
    t1, t2 = _tokens(rng, 2)
    a = SpentTokens(tmp_path / "spent.sqlite3")
    b = SpentTokens(tmp_path / "spent.sqlite3")
    assert a.spend_many([(rng.bytes(32), rng.bytes(16), DAY)]) == [True]  # row 1, and a is current
    real = SpentTokens._decide

    def fail_after(self: SpentTokens, *args: object) -> None:
        real(self, *args)  # t1 appended (row 2) and put into memory
        raise OSError("disk full")

    monkeypatch.setattr(SpentTokens, "_decide", fail_after)
    with pytest.raises(OSError):
        a.spend_many([(t1, rng.bytes(16), DAY)])
    monkeypatch.undo()
    paid = rng.bytes(16)
    assert b.spend_many([(t2, paid, DAY)]) == [True]  # row 2 again, b's
    assert a.spend_many([(t2, rng.bytes(16), DAY), (t2, paid, DAY), (t1, paid, DAY)]) == [False, True, True]
    a.close()
    b.close()


def test_two_tokens_sharing_the_indexed_bytes_are_both_kept(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    head = rng.bytes(8)
    a, b, c = (head + rng.bytes(24) for _ in range(3))  # the index keys on the first 8 bytes
    ba, bb, bc = (rng.bytes(16) for _ in range(3))
    store = SpentTokens(tmp_path / "spent.sqlite3")
    assert store.spend_many([(a, ba, DAY)]) == [True]
    assert store.spend_many([(b, bb, DAY), (c, bc, DAY)]) == [True, True]  # not taken for a
    assert store.spend_many([(a, bb, DAY), (b, ba, DAY), (c, ba, DAY)]) == [False, False, False]
    assert store.spend_many([(a, ba, DAY), (b, bb, DAY), (c, bc, DAY)]) == [True, True, True]
    store.close()
    other = SpentTokens(tmp_path / "spent.sqlite3")  # loaded from the file, the same
    assert other.spend_many([(c, ba, DAY), (b, bc, DAY), (a, ba, DAY)]) == [False, False, True]
    other.close()


def test_a_first_layout_file_is_rewritten_and_its_collector_cannot_spend_on_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    path = tmp_path / "spent.sqlite3"
    old = [(t, rng.bytes(16), day) for t, day in zip(_tokens(rng, 5), [DAY, DAY, DAY, "2026-12-06", "2026-12-06"])]
    with sqlite3.connect(path) as conn:  # the first layout, as its collector made it
        conn.execute(
            "CREATE TABLE spent(digest BLOB PRIMARY KEY, batch_id BLOB NOT NULL, day TEXT NOT NULL) WITHOUT ROWID"
        )
        conn.executemany("INSERT INTO spent VALUES (?, ?, ?)", old)
    store = SpentTokens(path)
    assert sorted(store.records()) == sorted(old)
    assert store.spend_many([(old[0][0], old[0][1], DAY), (old[3][0], rng.bytes(16), old[3][2])]) == [True, False]
    store.close()
    with sqlite3.connect(path) as conn, pytest.raises(sqlite3.OperationalError, match="view"):
        # what a first-layout collector does to spend: refused, instead of a second record of a spent token
        conn.execute(
            "INSERT INTO spent(digest, batch_id, day) VALUES (?, ?, ?) ON CONFLICT(digest) DO NOTHING",
            (old[1][0], rng.bytes(16), DAY),
        )
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 3")
    with pytest.raises(Exception, match="schema 3"):
        SpentTokens(path)


def test_token_days_older_than_keep_days_are_dropped(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    store = SpentTokens(tmp_path / "spent.sqlite3", keep_days=3)
    t_old, t_new = _tokens(rng, 2)
    assert store.spend(t_old, rng.bytes(16), "2026-12-01")
    assert store.spend(t_new, rng.bytes(16), "2026-12-04")  # 3 days later: the old day is kept
    assert len(store) == 2
    assert store.spend(rng.bytes(32), rng.bytes(16), "2026-11-30")  # an older day than the newest: no purge
    assert store.spend(rng.bytes(32), rng.bytes(16), "2026-12-05")  # 4 days after the first: it is dropped
    assert t_old not in {d for d, _, _ in store.records()}
    assert t_new in {d for d, _, _ in store.records()}
    store.close()
    assert os.path.exists(tmp_path / "spent.sqlite3")
