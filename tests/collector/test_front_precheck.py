"""The native front's frame pre-check (native/front/src/frames.rs) against Python's decoder.

The pre-check may only let Python skip work: a frame it passes must be one :func:`decode_frame` accepts, with the
same header fields, and the records a pre-checked decode gives must be the full decode's. Checked here for a
frame of every registered mechanism (made by the device code), sealed frames, and thousands of corrupted frames
(bit flips anywhere, cut or grown bodies, records pushed out of their bounds under a recomputed CRC): for each,
either the pre-check refuses it (Python then decodes in full, as without a front) or both decoders accept it
alike. Needs ``ldp_front`` (scripts/bootstrap builds it; never skipped)."""

from __future__ import annotations

import http.client
import socket
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from collector.errors import RejectedBatch
from collector.http.decode import decode_body, frame_specs, spec_entries
from ldp_core.errors import FrameError
from ldp_core.mechanisms import MECHANISMS, NUMERIC_MECHANISMS, ReportSpec, make_spec
from ldp_core.metrics import load_metrics
from ldp_core.wire.frames import (
    HEADER_SIZE,
    ReportBatch,
    VerifiedSpecs,
    decode_frame,
    decode_verified,
    encode_frame,
    read_header,
)
from ldp_core.wire.sealed import KEY_ID_SIZE, SealedSpec
from simulator.prio3.stack import new_deployment

try:
    import ldp_front
except ImportError as exc:  # pragma: no cover - CI builds it through scripts/bootstrap
    raise ImportError("ldp_front is not installed: run scripts/bootstrap (or scripts/build-front)") from exc

DAY = 20_400


@pytest.fixture
def served() -> Iterator[tuple[Any, int]]:
    """A front serving a 127.0.0.1 port-0 socket (no upstream), and its port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    f = ldp_front.Front(sock.fileno(), None)
    try:
        yield f, sock.getsockname()[1]
    finally:
        f.close(0.0)
        sock.close()


@pytest.fixture
def front(served: tuple[Any, int]) -> Any:
    return served[0]


def spec_of(name: str) -> ReportSpec:
    if name in NUMERIC_MECHANISMS:
        multi = name in ("duchi", "pm", "hm")
        return make_spec(name, epsilon=2.0, low=0, high=9, **({"dims": 5, "sample": 2} if multi else {}))
    if name in ("pem", "sfp"):
        return make_spec(name, epsilon=1.0, length=6, **({"num_hashes": 4, "width": 64} if name == "sfp" else {}))
    return make_spec(name, epsilon=1.0, domain_size=2 if name == "rr" else 70)


def records_of(spec: ReportSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    name = next(k for k, v in MECHANISMS.items() if v.endswith(":" + type(spec).__name__))
    if name in NUMERIC_MECHANISMS:
        multi = name in ("duchi", "pm", "hm")
        return spec.encode(rng.random((n, 5)) * 9 if multi else rng.random(n) * 9, rng)
    if name in ("pem", "sfp"):
        return spec.encode([f"w{i % 13}" for i in range(n)], rng)
    return spec.encode(rng.integers(0, spec.domain_size, n), rng)  # type: ignore[attr-defined]


def fields_of(batch: ReportBatch) -> tuple[Any, ...]:
    return batch.metric, batch.spec.spec_id, batch.day, len(batch), batch.batch_id, batch.sealed


def full_decode(body: bytes, spec: ReportSpec) -> ReportBatch | None:
    """Python's decoder alone (as with no front): the batch, or None if it refuses the frame."""
    resolver = spec if isinstance(spec, SealedSpec) else (lambda m, s: spec)
    try:
        return decode_frame(body, resolver)
    except FrameError:
        return None


def agree(front: Any, body: bytes, spec: ReportSpec) -> bool:
    """Assert the pre-check is sound for ``body``; whether it passed it."""
    checked = front.check_frame(body)
    full = full_decode(body, spec)
    if checked is None:
        return False
    assert full is not None, f"the pre-check passed a frame Python refuses: {body[:60].hex()}..."
    header = read_header(body)
    metric, spec_id, day, rsize, n, batch_id, sealed, _ = checked
    assert (metric, spec_id, day, rsize, n, batch_id, sealed) == (
        header.metric,
        header.spec_id,
        header.day,
        header.record_size,
        header.n_records,
        header.batch_id,
        header.sealed,
    )
    return True


def corruptions(body: bytes, rng: np.random.Generator, k: int) -> Iterator[bytes]:
    """``k`` bodies from ``body``: one to three flipped bits anywhere (header, name, records, CRC), or cut or
    grown by a few bytes."""
    for _ in range(k):
        b = bytearray(body)
        if rng.random() < 0.2:
            cut = int(rng.integers(1, 6))
            yield bytes(b[:-cut]) if rng.random() < 0.5 else bytes(b) + bytes(cut)
            continue
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(0, len(b)))
            b[i] ^= 1 << int(rng.integers(0, 8))
        yield bytes(b)


def with_crc(body: bytes) -> bytes:
    """``body`` with its CRC recomputed (a corruption the CRC cannot catch)."""
    return body[:-4] + struct.pack("<I", zlib.crc32(body[:-4]))


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_every_mechanism_s_frames_pass_and_corruptions_never_pass_wrongly(front: Any, name: str) -> None:
    rng = np.random.default_rng(sorted(MECHANISMS).index(name))
    spec = spec_of(name)
    front.set_frame_specs(spec_entries("m.x", spec))
    n = max(10, 9000 // spec.record_size)  # at most about 9 KB of records
    body = encode_frame(ReportBatch("m.x", spec, DAY, records_of(spec, n, rng), batch_id=rng.bytes(16)))
    assert len(body) * 8 < 91_607  # within CRC-32's Hamming distance 4 (Koopman): every 1-3 bit error shows
    assert agree(front, body, spec), "a valid frame of the device code passes the pre-check"

    # with the pre-check's fields, the decoder gives the same batch as the full decode
    checked = front.check_frame(body)
    records_checked = checked[-1]
    assert records_checked == (type(spec).check_records is ReportSpec.check_records), (
        "the front checks the records only for a spec whose check is the base class's bounds"
    )
    fast = decode_frame(body, lambda m, s: spec, None, crc_checked=True, records_checked=records_checked)
    slow = full_decode(body, spec)
    assert slow is not None and fields_of(fast) == fields_of(slow)
    assert np.array_equal(fast.records, slow.records)
    # and so does the collector's cached path (the spec resolved once per metric, spec id, sealing, record size)
    cache: VerifiedSpecs = {}
    for _ in range(2):  # filled, then used
        cached = decode_verified(body, lambda m, s: spec, checked, cache)
        assert fields_of(cached) == fields_of(slow) and np.array_equal(cached.records, slow.records)
    assert list(cache) == [("m.x", spec.spec_id, False, spec.record_size)]

    # flipped bits and changed lengths: never passed (the CRC and the length check see each one)
    assert sum(agree(front, b, spec) for b in corruptions(body, rng, 600)) == 0

    # a record pushed out of its bound under a recomputed CRC: refused by Python, and by the front when it
    # checks the records (else Python's own check refuses it after the front's header and CRC checks)
    head = HEADER_SIZE + len(b"m.x")
    for field, bound in spec.record_bounds().items():
        recs = np.array(slow.records)
        col = recs[field].reshape(len(recs), -1)
        top = int(np.iinfo(col.dtype).max)
        if top < bound:
            continue  # no value of the field's width reaches the bound
        col[7, -1] = top
        recs[field] = col.reshape(recs[field].shape)
        bad = with_crc(body[:head] + recs.tobytes() + body[-4:])
        assert full_decode(bad, spec) is None
        passed = front.check_frame(bad)
        assert passed is None if records_checked else passed is not None
        if passed is not None:
            with pytest.raises(FrameError):
                decode_frame(bad, lambda m, s: spec, None, crc_checked=True, records_checked=False)
            with pytest.raises(FrameError):  # the cached path checks the records as well
                decode_verified(bad, lambda m, s: spec, passed, cache)


def test_sealed_frames_pass_and_plain_frames_of_a_sealed_metric_do_not(front: Any) -> None:
    rng = np.random.default_rng(3)
    inner = spec_of("olh")
    sealed = SealedSpec.of(inner)
    entries = spec_entries("sealed.m", sealed)
    assert [(e[0], e[1]) for e in entries] == [("sealed.m", True)]
    front.set_frame_specs(entries)
    records = np.frombuffer(rng.bytes(40 * sealed.record_size), dtype=sealed.record_dtype)
    body = encode_frame(ReportBatch("sealed.m", sealed, DAY, records, batch_id=rng.bytes(16)))
    assert agree(front, body, sealed)
    plain = encode_frame(ReportBatch("sealed.m", inner, DAY, records_of(inner, 40, rng), batch_id=rng.bytes(16)))
    assert front.check_frame(plain) is None and full_decode(plain, sealed) is None
    assert sum(agree(front, b, sealed) for b in corruptions(body, rng, 300)) == 0


def test_sealed_records_pass_only_when_each_names_a_known_analyzer_key(front: Any) -> None:
    rng = np.random.default_rng(8)
    sealed = SealedSpec.of(spec_of("olh"))
    known, other = bytes.fromhex("0a0b0c0d"), bytes.fromhex("01020304")
    assert len(known) == KEY_ID_SIZE
    front.set_frame_specs(spec_entries("sealed.m", sealed, [known, bytes.fromhex("99999999")]))

    def frame(key_ids: list[bytes]) -> bytes:
        rows = np.frombuffer(rng.bytes(len(key_ids) * sealed.record_size), np.uint8).reshape(len(key_ids), -1).copy()
        rows[:, :KEY_ID_SIZE] = np.frombuffer(b"".join(key_ids), np.uint8).reshape(len(key_ids), -1)
        records = rows.view(sealed.record_dtype).ravel()
        return encode_frame(ReportBatch("sealed.m", sealed, DAY, records, batch_id=rng.bytes(16)))

    good = frame([known] * 30 + [bytes.fromhex("99999999")] + [known] * 9)
    checked = front.check_frame(good)
    assert checked is not None and checked[-1] is True  # the key ids were checked
    assert front.check_frame(frame([known] * 20 + [other] + [known] * 19)) is None  # Python decides, and refuses
    # without key ids registered, a sealed frame passes with its records unchecked (the scan stays in Python)
    front.set_frame_specs(spec_entries("sealed.m", sealed))
    assert front.check_frame(good)[-1] is False


def test_the_collector_s_metrics_decode_the_same_with_and_without_the_pre_check(front: Any) -> None:
    declared = load_metrics("metrics/example.json", reject_expired=False)
    front.set_frame_specs(frame_specs(declared))
    rng = np.random.default_rng(11)
    verified: VerifiedSpecs = {}
    for name in declared:
        spec = declared[name].wire_spec
        body = encode_frame(ReportBatch(name, spec, DAY, records_of(spec, 50, rng), batch_id=rng.bytes(16)))
        checked = front.check_frame(body)
        assert checked is not None, name
        a, b = decode_body(body, "frame", declared, 10_000), decode_body(body, "frame", declared, 10_000, checked)
        assert fields_of(a) == fields_of(b) and np.array_equal(a.records, b.records)
        for _ in range(2):  # the upload handler's cache, filled then used
            c = decode_body(body, "frame", declared, 10_000, checked, verified)
            assert fields_of(c) == fields_of(a) and np.array_equal(c.records, a.records) and c.spec == a.spec
        assert encode_frame(b) == body  # a pre-checked frame is canonical: the collector forwards it as it is
        # the collector's own refusals still apply to a pre-checked frame: the record limit
        with pytest.raises(RejectedBatch) as exc:
            decode_body(body, "frame", declared, 49, checked)
        assert exc.value.reason == "too_many_records"
    # metrics not declared are never pre-checked
    other = make_spec("grr", epsilon=1.0, domain_size=5)
    body = encode_frame(ReportBatch("undeclared", other, DAY, other.encode(np.zeros(3, int), rng)))
    assert front.check_frame(body) is None
    front.set_frame_specs([])
    assert front.check_frame(encode_frame(ReportBatch(name, spec, DAY, records_of(spec, 5, rng)))) is None


def test_a_collector_with_prio3_metrics_registers_them_and_checks_their_frames(front: Any, tmp_path: Any) -> None:
    """Prio3 metrics have no sealed form (their shares are encrypted already) and a record check of their own:
    registered plain only, their frames' headers and CRC checked by the front, their records by Python."""
    deployment = new_deployment(tmp_path, {"p.count": {"type": "count"}, "p.hist": {"type": "histogram", "length": 5}})
    declared = load_metrics(deployment.metrics_path, reject_expired=False)
    entries = frame_specs(declared)
    assert sorted((e[0], e[1], e[5]) for e in entries if e[0].startswith("p.")) == [
        ("p.count", False, False),
        ("p.hist", False, False),
    ]
    front.set_frame_specs(entries)
    rng = np.random.default_rng(2)
    spec = declared.prio3_spec("p.count")
    records = np.frombuffer(rng.bytes(3 * spec.record_size), dtype=spec.record_dtype)
    body = encode_frame(ReportBatch._checked("p.count", spec, DAY, records, rng.bytes(16)))
    checked = front.check_frame(body)
    assert checked is not None and checked[-1] is False  # the shares' own check stays in Python

    def outcome(fields: Any) -> tuple[Any, ...]:
        try:
            batch = decode_body(body, "frame", declared, 100, fields)
        except RejectedBatch as exc:
            return ("refused", exc.status, exc.reason)
        return ("decoded", *fields_of(batch), batch.records.tobytes())

    assert outcome(checked) == outcome(None)


def test_bad_entries_are_refused(front: Any) -> None:
    with pytest.raises(ValueError, match="8 bytes"):
        front.set_frame_specs([("m", False, b"\x00" * 7, 4, [], True, [])])
    with pytest.raises(ValueError, match="within the record"):
        front.set_frame_specs([("m", False, b"\x00" * 8, 4, [(2, 4, 1, 5)], True, [])])
    with pytest.raises(ValueError, match="8-byte"):
        front.set_frame_specs([("m", False, b"\x00" * 8, 4, [(0, 3, 1, 5)], True, [])])
    with pytest.raises(ValueError, match="key ids"):
        front.set_frame_specs([("m", True, b"\x00" * 8, 4, [], True, [b"ab", b"abc"])])


def test_an_upload_over_http_arrives_with_its_checked_fields(served: tuple[Any, int]) -> None:
    front, port = served
    declared = load_metrics("metrics/example.json", reject_expired=False)
    front.set_frame_specs(frame_specs(declared))
    spec = declared["emoji_used"].wire_spec
    rng = np.random.default_rng(5)
    good = encode_frame(ReportBatch("emoji_used", spec, DAY, records_of(spec, 100, rng), batch_id=rng.bytes(16)))
    bad = good[:-1] + bytes([good[-1] ^ 1])
    for body in (good, bad):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/v1/reports", body=body, headers={"Content-Type": "application/vnd.ldp.frame"})
        [(ticket, got, _, _, _, _, checked)] = front.take(10, 5.0)
        assert got == body
        if body is good:
            assert checked == ("emoji_used", spec.spec_id, DAY, spec.record_size, 100, good[28:44], False, True)
        else:
            assert checked is None  # a bad CRC: decoded in full by Python, which refuses it
        front.answer(ticket, 202, b"{}", [])
        assert conn.getresponse().status == 202
        conn.close()
