"""The compiled batch opener (``ldp_opener``, native/opener) against the Python one, record by record.

Every test here needs the compiled opener and fails (never skips) without it: ``native=True`` raises a
:class:`SealingError` that says to run scripts/bootstrap.
"""

from __future__ import annotations

import numpy as np
import pytest

from ldp_core.mechanisms import spec_from_dict
from ldp_core.wire import hpke
from ldp_core.wire.frames import ReportBatch
from ldp_core.wire.sealing import (
    OPEN_STATUS,
    SEALED_OVERHEAD,
    AnalyzerKey,
    BatchOpener,
    KeyRing,
    SealedSpec,
    _key_table,
    _Opener,
    seal_records,
    sealed_info,
)

SPEC = spec_from_dict({"mechanism": "olh", "epsilon": 1.0, "domain_size": 1024})
P = 2**255 - 19
# u-coordinates X25519 maps to the all-zero shared secret whatever the private key (RFC 7748 §6.1's check,
# RFC 9180 §7.1.4): 0, 1, the two points of order 8, and p-1, p, p+1 (the same points, unreduced)
LOW_ORDER = [
    0,
    1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
    P - 1,
    P,
    P + 1,
]


def _openers(ring: KeyRing) -> tuple[_Opener, _Opener]:
    table = _key_table(ring)
    return _Opener(table, native=True), _Opener(table, native=False)


def _seal_deterministic(
    rng: np.random.Generator, key: AnalyzerKey, plain: bytes, metric: str, day: int, kid: str | None = None
) -> bytes:
    """One sealed record from the Python HPKE suite with an ephemeral key drawn from ``rng`` (reproducible)."""
    kid = key.key_id if kid is None else kid
    enc, ctx = hpke.Suite().setup_sender(key.public_key, sealed_info(metric, SPEC.spec_id, day, kid), rng.bytes(32))
    return bytes.fromhex(kid) + enc + ctx.seal(plain)


def _fuzz_batch(rng: np.random.Generator, ring_keys: list[AnalyzerKey], n: int) -> bytes:
    """``n`` sealed records of SPEC for ("m", day 20000): most good, some to a key outside the ring, for
    another metric or day, under another key's id, with a low-order enc, or with random bytes flipped."""
    outsider = AnalyzerKey(rng.bytes(32))
    recs = SPEC.encode(rng.integers(0, 1024, n), rng).view(np.uint8).reshape(n, -1)
    out = []
    for i in range(n):
        key = ring_keys[int(rng.integers(len(ring_keys)))]
        plain = recs[i].tobytes()
        kind = rng.random()
        if kind < 0.5:
            rec = _seal_deterministic(rng, key, plain, "m", 20_000)
        elif kind < 0.6:
            rec = _seal_deterministic(rng, outsider, plain, "m", 20_000)
        elif kind < 0.65:
            rec = _seal_deterministic(rng, key, plain, "other", 20_000)
        elif kind < 0.7:
            rec = _seal_deterministic(rng, key, plain, "m", 20_001)
        elif kind < 0.75:  # sealed to one key, labelled with the other's id
            other = ring_keys[(ring_keys.index(key) + 1) % len(ring_keys)]
            rec = _seal_deterministic(rng, key, plain, "m", 20_000, kid=other.key_id)
        elif kind < 0.8:
            u = LOW_ORDER[int(rng.integers(len(LOW_ORDER)))] + (1 << 255) * int(rng.integers(2))  # high bit too
            good = _seal_deterministic(rng, key, plain, "m", 20_000)
            rec = good[:4] + (u % (1 << 256)).to_bytes(32, "little") + good[36:]
        else:
            rec = bytearray(_seal_deterministic(rng, key, plain, "m", 20_000))
            for _ in range(int(rng.integers(0, 3))):  # 0 flips: a good record; else anywhere, key id included
                rec[int(rng.integers(len(rec)))] ^= 1 << int(rng.integers(8))
            rec = bytes(rec)
        out.append(rec)
    return b"".join(out)


def test_the_compiled_opener_is_installed_and_the_default() -> None:
    ring = KeyRing([AnalyzerKey(bytes(range(32)))])
    assert BatchOpener(ring, native=True).native
    assert BatchOpener(ring).native  # what the sink and the estimator use
    assert not BatchOpener(ring, native=False).native


def test_both_openers_agree_on_fuzzed_batches_record_by_record() -> None:
    """Plaintexts, encapsulated keys and the status of every record are identical, and every refusal
    category is hit with the records planted for it."""
    rng = np.random.default_rng(31)
    keys = [AnalyzerKey(rng.bytes(32)), AnalyzerKey(rng.bytes(32))]
    native, python = _openers(KeyRing(keys))
    seen: set[int] = set()
    for _ in range(4):
        data = _fuzz_batch(rng, keys, 150)
        raw = np.frombuffer(data, dtype=np.uint8).reshape(150, -1)
        a = native.open_raw_status(raw, "m", SPEC.spec_id, 20_000, SPEC.record_size)
        b = python.open_raw_status(raw, "m", SPEC.spec_id, 20_000, SPEC.record_size)
        assert a == b
        seen |= set(a[2])
        assert len(a[0]) == a[2].count(0) * SPEC.record_size and len(a[1]) == a[2].count(0) * 32
    assert {OPEN_STATUS[s] for s in seen} == {"opened", "unknown_key", "bad_point", "not_authentic"}


def test_low_order_encs_are_refused_as_bad_points_by_both() -> None:
    rng = np.random.default_rng(7)
    key = AnalyzerKey(rng.bytes(32))
    good = _seal_deterministic(rng, key, bytes(SPEC.record_size), "m", 20_000)
    data = b"".join(good[:4] + u.to_bytes(32, "little") + good[36:] for u in LOW_ORDER)
    for op in _openers(KeyRing([key])):
        plain, encs, status = op.open_raw_status(data, "m", SPEC.spec_id, 20_000, SPEC.record_size)
        assert (plain, encs, [OPEN_STATUS[s] for s in status]) == (b"", b"", ["bad_point"] * len(LOW_ORDER))


@pytest.mark.parametrize("cut", [1, 2, 3, 4, 5, 20, 47, 48, 49, 51, 52, 56])
def test_a_cut_last_record_gets_the_same_refusal_from_both(cut: int) -> None:
    """Bytes input whose last record is cut to ``cut`` bytes: under 4 no key id (unknown key), under
    52 no room for enc and tag (short), else the tag fails (not authentic); the whole records open."""
    rng = np.random.default_rng(cut)
    key = AnalyzerKey(rng.bytes(32))
    recs = [_seal_deterministic(rng, key, rng.bytes(SPEC.record_size), "m", 20_000) for _ in range(3)]
    data = b"".join(recs)[: 2 * len(recs[0]) + cut]
    native, python = _openers(KeyRing([key]))
    a = native.open_raw_status(data, "m", SPEC.spec_id, 20_000, SPEC.record_size)
    assert a == python.open_raw_status(data, "m", SPEC.spec_id, 20_000, SPEC.record_size)
    want = "unknown_key" if cut < 4 else "short" if cut < 4 + 48 else "not_authentic"
    assert [OPEN_STATUS[s] for s in a[2]] == ["opened", "opened", want]
    assert a[0] == b"".join(_plain_of(key, r) for r in recs[:2])


def _plain_of(key: AnalyzerKey, rec: bytes) -> bytes:
    info = sealed_info("m", SPEC.spec_id, 20_000, rec[:4].hex())
    return hpke.Suite().open(key.private, key.public_key, info, rec[4:])


def test_a_record_wider_than_its_spec_opens_to_a_wrong_size_for_both() -> None:
    rng = np.random.default_rng(3)
    key = AnalyzerKey(rng.bytes(32))
    data = b"".join(_seal_deterministic(rng, key, rng.bytes(SPEC.record_size), "m", 20_000) for _ in range(4))
    raw = np.frombuffer(data, dtype=np.uint8).reshape(4, -1)
    for op in _openers(KeyRing([key])):
        plain, _, status = op.open_raw_status(raw, "m", SPEC.spec_id, 20_000, SPEC.record_size - 1)
        assert (plain, [OPEN_STATUS[s] for s in status]) == (b"", ["wrong_size"] * 4)


def test_records_sealed_by_cryptography_open_the_same_in_both_and_in_parallel() -> None:
    """The device's sealer (``cryptography``'s HPKE where present), a batch with altered records, opened
    inline and across two worker processes by both openers: the same records, failures and replays."""
    rng = np.random.default_rng(5)
    key = AnalyzerKey(rng.bytes(32))
    plain = SPEC.encode(rng.integers(0, 1024, 400), rng)
    sealed = seal_records(plain, "m", SPEC, 20_000, key.public).copy()
    raw = sealed.view(np.uint8).reshape(400, SPEC.record_size + SEALED_OVERHEAD)
    altered = rng.choice(np.arange(20, 400), 25, replace=False)
    for i in altered:  # any bit, key id included: each such record fails (unknown key or not authentic)
        raw[i, int(rng.integers(raw.shape[1]))] ^= 1 << int(rng.integers(8))
    records = np.concatenate([sealed, sealed[10:12]])  # two replays at the end
    batch = ReportBatch("m", SealedSpec.of(SPEC), 20_000, records)
    results = []
    for native in (True, False):
        with BatchOpener(KeyRing([key]), native=native) as inline:
            results.append(inline.open_batch(batch, source="s"))
        with BatchOpener(KeyRing([key]), processes=2, chunk=64, native=native) as parallel:
            results.append(parallel.open_batch(batch, source="s"))
            assert parallel._pool is not None
    kept = np.ones(400, dtype=bool)
    kept[altered] = False
    for r in results:
        assert (r.failed, r.replayed) == (25, 2)
        np.testing.assert_array_equal(r.batch.records, plain[kept])
