"""The durable outbox: batching by size, age and day; batch ids fixed before the first
attempt; leases; the size cap drops the oldest and counts them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from client_sdk.outbox import Outbox
from client_sdk.store import Store
from ldp_core.mechanisms.grr import GRRSpec
from ldp_core.wire.frames import decode_frame

SPEC = GRRSpec(epsilon=1.0, domain_size=1000)
T = 1_800_000_000.0


def recs(values) -> np.ndarray:
    out = np.empty(len(values), dtype=SPEC.record_dtype)
    out["value"] = values
    return out


def values_of(frame: bytes) -> list[int]:
    return decode_frame(frame, SPEC).records["value"].tolist()


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_batches_form_by_size_age_or_force(tmp_path) -> None:
    ob = Outbox(Store(tmp_path))
    ob.put("m", SPEC, 100, recs(range(7)), now=T)
    assert ob.size() == 7
    assert ob.claim(T + 1, batch_size=10, max_age=60) is None  # too few, too young
    b = ob.claim(T + 1, batch_size=5, max_age=60)  # size reached: the 5 oldest
    assert b is not None and b.n == 5 and b.attempts == 0 and values_of(b.frame) == [0, 1, 2, 3, 4]
    assert ob.claim(T + 1, batch_size=5, max_age=60) is None  # 2 left, young; the batch is leased
    c = ob.claim(T + 61, batch_size=5, max_age=60)  # old enough
    assert c is not None and values_of(c.frame) == [5, 6]
    assert ob.size() == 7 and ob.pending_batches() == 2
    assert ob.ack(b.batch_id) and ob.ack(c.batch_id) and not ob.ack(c.batch_id)
    assert ob.size() == 0
    assert ob.store.counters() == {"uploaded_batches": 2, "uploaded_reports": 7}
    ob.put("m", SPEC, 100, recs([9]), now=T)
    assert ob.claim(T, batch_size=5, max_age=60, force=True) is not None


def test_one_batch_per_metric_spec_and_day(tmp_path) -> None:
    ob = Outbox(Store(tmp_path))
    other = GRRSpec(epsilon=2.0, domain_size=1000)
    ob.put("m", SPEC, 100, recs([1, 2]), now=T)
    ob.put("m", SPEC, 101, recs([3]), now=T)
    ob.put("n", SPEC, 100, recs([4]), now=T)
    ob.put("m", other, 100, recs([5]), now=T)
    seen = []
    while (b := ob.claim(T, batch_size=100, max_age=60, force=True)) is not None:
        resolver = {SPEC.spec_id: SPEC, other.spec_id: other}
        batch = decode_frame(b.frame, resolver)
        seen.append((batch.metric, batch.spec.epsilon, batch.day, batch.records["value"].tolist()))
    assert seen == [("m", 1.0, 100, [1, 2]), ("m", 1.0, 101, [3]), ("n", 1.0, 100, [4]), ("m", 2.0, 100, [5])]


def test_a_retried_batch_keeps_its_id_and_bytes_across_restarts(tmp_path) -> None:
    ob = Outbox(Store(tmp_path))
    ob.put("m", SPEC, 100, recs(range(3)), now=T)
    first = ob.claim(T, batch_size=10, max_age=0)
    assert first is not None
    ob.defer(first.batch_id, T + 30)  # a transient failure
    ob.put("m", SPEC, 100, recs([7]), now=T)  # newer reports do not join the formed batch
    assert ob.claim(T + 10, batch_size=10, max_age=1e9) is None  # not due yet
    ob.store.close()

    reopened = Outbox(Store(tmp_path))
    again = reopened.claim(T + 30, batch_size=10, max_age=1e9)
    assert again is not None
    assert (again.batch_id, again.frame, again.attempts) == (first.batch_id, first.frame, 1)
    assert reopened.size() == 4


def test_leases_block_other_claims_until_expiry_or_death(tmp_path) -> None:
    store = Store(tmp_path)
    ob = Outbox(store, lease_seconds=30)
    ob.put("m", SPEC, 100, recs([1]), now=T)
    b = ob.claim(T, batch_size=1, max_age=60)
    assert b is not None
    assert ob.claim(T + 29, batch_size=1, max_age=60) is None  # leased to a live process (us)
    again = ob.claim(T + 31, batch_size=1, max_age=60)  # the lease expired
    assert again is not None and again.batch_id == b.batch_id
    # a lease held by a process that no longer exists is taken over at once
    with store.transaction() as conn:
        conn.execute("UPDATE batches SET lease_until = ?, lease_pid = ?", (T + 1000, dead_pid()))
    taken = ob.claim(T + 32, batch_size=1, max_age=60)
    assert taken is not None and taken.batch_id == b.batch_id


def test_cap_drops_oldest_queued_reports_and_counts_them(tmp_path) -> None:
    ob = Outbox(Store(tmp_path), max_reports=10)
    assert ob.put("m", SPEC, 100, recs(range(8)), now=T) == 0
    assert ob.put("m", SPEC, 100, recs(range(8, 15)), now=T) == 5
    assert ob.size() == 10
    assert ob.store.counters()["outbox_dropped"] == 5
    b = ob.claim(T, batch_size=100, max_age=60, force=True)
    assert b is not None and values_of(b.frame) == list(range(5, 15))


def test_cap_drops_whole_old_batches_but_never_one_in_flight(tmp_path) -> None:
    ob = Outbox(Store(tmp_path), max_reports=6)
    ob.put("m", SPEC, 100, recs([0, 1, 2]), now=T)
    old = ob.claim(T, batch_size=3, max_age=60)
    assert old is not None
    ob.defer(old.batch_id, T + 100)  # waiting for a retry, not in flight
    ob.put("m", SPEC, 100, recs([3, 4, 5]), now=T)
    flying = ob.claim(T, batch_size=3, max_age=60)  # in flight (leased to us, alive)
    assert flying is not None and values_of(flying.frame) == [3, 4, 5]
    assert ob.put("m", SPEC, 100, recs([6]), now=T) == 3  # the oldest batch goes whole
    assert ob.pending_batches() == 1
    assert ob.put("m", SPEC, 100, recs([7, 8, 9]), now=T) == 1  # then the oldest queued report, not the flying batch
    assert ob.size() == 6 and ob.store.counters()["outbox_dropped"] == 4
    assert ob.ack(flying.batch_id)
    rest = ob.claim(T, batch_size=10, max_age=60, force=True)
    assert rest is not None and values_of(rest.frame) == [7, 8, 9]


def test_reject_and_unsendable_are_counted(tmp_path) -> None:
    store = Store(tmp_path)
    ob = Outbox(store)
    ob.put("m", SPEC, 100, recs([1, 2]), now=T)
    b = ob.claim(T, batch_size=2, max_age=60)
    assert b is not None and ob.reject(b.batch_id) == 2 and ob.reject(b.batch_id) == 0
    with store.transaction() as conn:  # a report under a spec this SDK cannot rebuild
        conn.execute("INSERT INTO specs VALUES ('00000000deadbeef', '{\"mechanism\": \"gone\"}')")
        conn.execute(
            "INSERT INTO outbox (metric, spec_id, day, record, enqueued) VALUES ('m', '00000000deadbeef', 1, x'01', 0)"
        )
    fresh = Outbox(store)
    assert fresh.claim(T, batch_size=1, max_age=60) is None
    assert store.counters() == {
        "upload_rejected_batches": 1,
        "upload_rejected_reports": 2,
        "outbox_unsendable": 1,
    }
    assert fresh.size() == 0


def test_invalid_construction() -> None:
    with pytest.raises(ValueError):
        Outbox(None, max_reports=0)  # type: ignore[arg-type]


def test_claim_batches_forms_several_at_once_and_release_returns_them(tmp_path) -> None:
    ob = Outbox(Store(tmp_path))
    ob.put("m", SPEC, 100, recs(range(23)), now=T)
    got = ob.claim_batches(T, batch_size=5, max_age=60, limit=3)  # only full batches: not old, no force
    assert [values_of(b.frame) for b in got] == [list(range(i, i + 5)) for i in (0, 5, 10)]
    assert len({b.batch_id for b in got}) == 3
    more = ob.claim_batches(T, batch_size=5, max_age=60, limit=10)
    assert [b.n for b in more] == [5]  # 15..19 full; 20..22 wait
    assert ob.claim_batches(T, batch_size=5, max_age=60, limit=10) == []  # the rest is leased or young
    ob.release([b.batch_id for b in got[1:]])
    back = ob.claim_batches(T, batch_size=5, max_age=60, force=True, limit=10)
    assert [b.batch_id for b in back[:2]] == [b.batch_id for b in got[1:]]  # released first, oldest first
    assert [values_of(b.frame) for b in back[2:]] == [[20, 21, 22]]  # forced: the partial batch too
