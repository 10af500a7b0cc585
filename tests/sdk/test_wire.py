"""The wire format v1: golden vectors, round trips, malformed frames, spec validation.

Golden vectors. The expected frames below were computed once, outside the
code under test, from the layout documented in ``ldp_core/wire/frames.py``: magic
``LDPB``, version 1, flags 0 (1 = sealed records, tests/sdk/test_sealed_wire.py), metric length (u16), spec id (8 bytes), day, record
size, record count (u32 each), 16-byte batch id, metric, records, CRC-32 (zlib)
of everything before it, all little-endian; the spec id is the first 16 hex
digits of SHA-256 over the spec's RFC 8785 canonical JSON (sorted keys, no
spaces, ECMAScript numbers: ``1``, not ``1.0``; the canonical strings and ids
come from ``ldp_core/vectors/spec_ids.json``, computed by node). The frames with
the same frames under the spec's memo derivation id (the pre-RFC 8785 hash that keys
memoized device state) are refused: a frame carries only ``spec_id``.
They are frozen as hex literals so that any change to the format, the spec id
or the record layout shows up here. ``test_golden_frames_follow_documented_layout``
rebuilds each literal with :mod:`struct`, :mod:`zlib` and :mod:`hashlib` from
that description, to show where every byte comes from.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ldp_core.errors import DomainError, FrameError, SpecError, SpecMismatchError
from ldp_core.mechanisms import FREQUENCY_MECHANISMS, make_spec, spec_from_dict
from ldp_core.mechanisms.base import MAX_EPSILON
from ldp_core.mechanisms.grr import GRRSpec
from ldp_core.mechanisms.rr import BinaryRRSpec
from ldp_core.wire.frames import (
    HEADER_SIZE,
    MAX_RECORDS,
    ReportBatch,
    decode_frame,
    decode_json,
    encode_frame,
    encode_json,
)

NAMES = sorted(FREQUENCY_MECHANISMS)
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# -- golden vectors (frozen; see the module docstring) ------------------------------
GOLDEN_SPEC_ID_GRR_2_1024 = "83bc72bce7d80e21"
MEMO_DERIVATION_ID_GRR_2_1024 = "1e432c2896943cfb"

GOLDEN_FRAMES: list[dict[str, Any]] = [
    {
        "spec": GRRSpec(epsilon=1.0, domain_size=4),
        "canonical": '{"domain_size":4,"epsilon":1,"mechanism":"grr"}',
        "spec_id": "9542bc7bcacd3a7f",
        "memo_derivation_canonical": '{"domain_size":4,"epsilon":1.0,"mechanism":"grr"}',
        "memo_derivation_id": "26c35ef1fe813001",
        "metric": "app.emoji",
        "day": 19723,
        "batch_id": bytes(range(16)),
        "values": [2, 0, 3, 1],
        "record_bytes": bytes([2, 0, 3, 1]),
        "hex": "4c445042010009009542bc7bcacd3a7f0b4d00000100000004000000000102030405060708090a0b0c0d0e0f"
        "6170702e656d6f6a6902000301f7d12e1d",
        "memo_id_hex": "4c4450420100090026c35ef1fe8130010b4d00000100000004000000000102030405060708090a0b0c0d0e0f"
        "6170702e656d6f6a690200030162bc0425",
    },
    {
        "spec": GRRSpec(epsilon=2.0, domain_size=1024),
        "canonical": '{"domain_size":1024,"epsilon":2,"mechanism":"grr"}',
        "spec_id": GOLDEN_SPEC_ID_GRR_2_1024,
        "memo_derivation_canonical": '{"domain_size":1024,"epsilon":2.0,"mechanism":"grr"}',
        "memo_derivation_id": MEMO_DERIVATION_ID_GRR_2_1024,
        "metric": "search.lang",
        "day": 20000,
        "batch_id": bytes(range(16, 32)),
        "values": [1023, 0, 513],
        "record_bytes": struct.pack("<3H", 1023, 0, 513),
        "hex": "4c44504201000b0083bc72bce7d80e21204e00000200000003000000101112131415161718191a1b1c1d1e1f"
        "7365617263682e6c616e67ff03000001024e9403ff",
        "memo_id_hex": "4c44504201000b001e432c2896943cfb204e00000200000003000000101112131415161718191a1b1c1d1e1f"
        "7365617263682e6c616e67ff03000001025a485fe4",
    },
    {
        "spec": BinaryRRSpec(epsilon=0.5),
        "canonical": '{"domain_size":2,"epsilon":0.5,"mechanism":"rr"}',
        "spec_id": "6bdd76e2ff273ccf",
        "memo_derivation_canonical": '{"domain_size":2,"epsilon":0.5,"mechanism":"rr"}',
        "memo_derivation_id": "6bdd76e2ff273ccf",  # no float with a ".0": equal to the spec id
        "metric": "flag",
        "day": 0,
        "batch_id": bytes(16),
        "values": [1],
        "record_bytes": bytes([1]),
        "hex": "4c445042010004006bdd76e2ff273ccf0000000001000000010000000000000000000000000000000000000066"
        "6c6167012c874d8d",
        "memo_id_hex": "4c445042010004006bdd76e2ff273ccf0000000001000000010000000000000000000000000000000000000066"
        "6c6167012c874d8d",
    },
]


def layout_frame(
    spec_id: str,
    metric: bytes,
    day: int,
    record_size: int,
    n_records: int,
    batch_id: bytes,
    records: bytes,
    *,
    magic: bytes = b"LDPB",
    version: int = 1,
    flags: int = 0,
    metric_len: int | None = None,
    crc: int | None = None,
) -> bytes:
    """A frame built field by field from the documented layout (independent of wire.py)."""
    body = (
        magic
        + bytes([version, flags])
        + struct.pack("<H", len(metric) if metric_len is None else metric_len)
        + bytes.fromhex(spec_id)
        + struct.pack("<III", day, record_size, n_records)
        + batch_id
        + metric
        + records
    )
    return body + struct.pack("<I", zlib.crc32(body) if crc is None else crc)


def golden_batch(g: dict[str, Any]) -> ReportBatch:
    spec = g["spec"]
    records = np.zeros(len(g["values"]), dtype=spec.record_dtype)
    records[spec.record_dtype.names[0]] = g["values"]
    return ReportBatch(g["metric"], spec, g["day"], records, g["batch_id"])


def default_spec(name: str, epsilon: float = 1.0, domain: int = 16) -> Any:
    if name == "rr":
        return make_spec("rr", epsilon=epsilon)
    return make_spec(name, epsilon=epsilon, domain_size=domain)


def records_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# -- spec ids ---------------------------------------------------------------------
def test_spec_id_golden() -> None:
    assert GRRSpec(2.0, 1024).spec_id == GOLDEN_SPEC_ID_GRR_2_1024
    assert GRRSpec(epsilon=2, domain_size=np.int64(1024)).spec_id == GOLDEN_SPEC_ID_GRR_2_1024  # normalized


@pytest.mark.parametrize("g", GOLDEN_FRAMES, ids=lambda g: g["metric"])
def test_spec_id_is_sha256_of_canonical_json(g: dict[str, Any]) -> None:
    assert g["spec"].canonical_bytes() == g["canonical"].encode()
    assert hashlib.sha256(g["canonical"].encode()).hexdigest()[:16] == g["spec_id"] == g["spec"].spec_id
    assert json.dumps(g["spec"].to_dict(), sort_keys=True, separators=(",", ":")) == g["memo_derivation_canonical"]
    assert hashlib.sha256(g["memo_derivation_canonical"].encode()).hexdigest()[:16] == g["memo_derivation_id"]
    assert g["spec"].memo_derivation_id == g["memo_derivation_id"]


@pytest.mark.parametrize("name", NAMES)
def test_spec_id_differs_across_parameters(name: str) -> None:
    specs = [default_spec(name, eps, d) for eps in (0.5, 1.0, 1.0000001, 4.0) for d in (8, 16, 100)]
    if name == "rr":
        specs = [default_spec(name, eps) for eps in (0.5, 1.0, 1.0000001, 4.0)]
    ids = [s.spec_id for s in specs]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    again = [spec_from_dict(s.to_dict()) for s in specs]
    assert [s.spec_id for s in again] == ids and again == specs


def test_spec_id_differs_across_mechanisms() -> None:
    assert BinaryRRSpec(1.0).spec_id != GRRSpec(1.0, 2).spec_id  # same ε and domain
    ids = [default_spec(name, 1.0, 16).spec_id for name in NAMES]
    assert len(set(ids)) == len(ids)


# -- golden frames ------------------------------------------------------------------
@pytest.mark.parametrize("g", GOLDEN_FRAMES, ids=lambda g: g["metric"])
def test_golden_frames(g: dict[str, Any]) -> None:
    frame = encode_frame(golden_batch(g))
    assert frame.hex() == g["hex"]
    back = decode_frame(bytes.fromhex(g["hex"]), g["spec"])
    assert back.metric == g["metric"] and back.day == g["day"] and back.batch_id == g["batch_id"]
    assert back.spec == g["spec"]
    assert back.records[back.records.dtype.names[0]].tolist() == g["values"]


@pytest.mark.parametrize("g", GOLDEN_FRAMES, ids=lambda g: g["metric"])
def test_golden_frames_follow_documented_layout(g: dict[str, Any]) -> None:
    spec_id = hashlib.sha256(g["canonical"].encode()).hexdigest()[:16]
    size = len(g["record_bytes"]) // len(g["values"])
    rebuilt = layout_frame(
        spec_id, g["metric"].encode(), g["day"], size, len(g["values"]), g["batch_id"], g["record_bytes"]
    )
    assert rebuilt.hex() == g["hex"]
    memo_id = hashlib.sha256(g["memo_derivation_canonical"].encode()).hexdigest()[:16]
    under_memo_id = layout_frame(
        memo_id, g["metric"].encode(), g["day"], size, len(g["values"]), g["batch_id"], g["record_bytes"]
    )
    assert under_memo_id.hex() == g["memo_id_hex"]
    assert HEADER_SIZE == 44


@pytest.mark.parametrize(
    "g", [g for g in GOLDEN_FRAMES if g["memo_derivation_id"] != g["spec_id"]], ids=lambda g: g["metric"]
)
def test_frames_under_the_memo_derivation_id_are_refused(g: dict[str, Any]) -> None:
    """The memo derivation id is no spec id: a frame carrying it decodes under no spec, catalog or resolver,
    binary or JSON."""
    from pipeline.catalog import SpecCatalog

    spec = g["spec"]
    catalog = SpecCatalog(specs=[(g["metric"], spec)])
    for resolver in (spec, catalog, lambda metric, spec_id: spec):
        with pytest.raises(SpecMismatchError):
            decode_frame(bytes.fromhex(g["memo_id_hex"]), resolver)
    obj = json.loads(encode_json(golden_batch(g)))
    obj["spec_id"] = g["memo_derivation_id"]
    with pytest.raises(SpecMismatchError):
        decode_json(json.dumps(obj).encode(), catalog)


def test_golden_json() -> None:
    g = GOLDEN_FRAMES[0]
    obj = json.loads(encode_json(golden_batch(g)))
    assert obj == {
        "version": 1,
        "metric": "app.emoji",
        "spec_id": "9542bc7bcacd3a7f",
        "day": 19723,
        "batch_id": "000102030405060708090a0b0c0d0e0f",
        "records": [[2], [0], [3], [1]],
    }


# -- round trips --------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_round_trip_every_mechanism(name: str) -> None:
    spec = default_spec(name, 1.5, 37)
    rng = np.random.default_rng(11)
    values = rng.integers(0, spec.domain_size, size=257)
    batch = ReportBatch("m.roundtrip", spec, 19999, spec.encode(values, rng), bytes(range(16)))
    for back in (decode_frame(encode_frame(batch), spec), decode_json(encode_json(batch), {spec.spec_id: spec})):
        assert records_equal(back.records, batch.records)
        assert (back.metric, back.day, back.batch_id, back.spec) == (batch.metric, batch.day, batch.batch_id, spec)
    empty = ReportBatch("m.empty", spec, 1, spec.encode([], rng), bytes(16))
    assert len(decode_frame(encode_frame(empty), spec)) == 0
    assert len(decode_json(encode_json(empty), spec)) == 0


@pytest.mark.parametrize("name", NAMES)
@PROPERTY
@given(
    epsilon=st.floats(0.05, MAX_EPSILON),
    domain=st.integers(2, 300),
    n=st.integers(0, 64),
    metric=st.from_regex(r"[A-Za-z0-9_.:\-]{1,40}", fullmatch=True),
    day=st.integers(0, 2**32 - 1),
    batch_id=st.binary(min_size=16, max_size=16),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_batches_round_trip(
    name: str, epsilon: float, domain: int, n: int, metric: str, day: int, batch_id: bytes, seed: int
) -> None:
    spec = default_spec(name, epsilon, domain)
    rng = np.random.default_rng(seed)
    records = spec.encode(rng.integers(0, spec.domain_size, size=n), rng)
    batch = ReportBatch(metric, spec, day, records, batch_id)
    frame = encode_frame(batch)
    assert len(frame) == HEADER_SIZE + len(metric) + n * spec.record_size + 4
    for back in (decode_frame(frame, spec), decode_json(encode_json(batch), spec)):
        assert records_equal(back.records, records)
        assert (back.metric, back.day, back.batch_id) == (metric, day, batch_id)


# -- malformed binary frames ----------------------------------------------------------
G = GOLDEN_FRAMES[0]
SPEC = G["spec"]
FRAME = bytes.fromhex(G["hex"])


def golden_layout(**overrides: Any) -> bytes:
    args: dict[str, Any] = {
        "spec_id": G["spec_id"],
        "metric": G["metric"].encode(),
        "day": G["day"],
        "record_size": 1,
        "n_records": 4,
        "batch_id": G["batch_id"],
        "records": G["record_bytes"],
    }
    args.update(overrides)
    return layout_frame(**args)


def test_layout_helper_reproduces_golden() -> None:
    assert golden_layout() == FRAME


def test_truncated_at_every_prefix() -> None:
    for cut in range(len(FRAME)):
        with pytest.raises(FrameError, match="truncated"):
            decode_frame(FRAME[:cut], SPEC)


@pytest.mark.parametrize(
    "frame,error,match",
    [
        (FRAME + b"\x00", FrameError, "trailing"),
        (FRAME + FRAME, FrameError, "trailing"),
        (golden_layout(magic=b"LDPX"), FrameError, "magic"),
        (b"PK\x03\x04" + FRAME[4:], FrameError, "magic"),
        (golden_layout(version=2), FrameError, "version"),
        (golden_layout(version=0), FrameError, "version"),
        (golden_layout(flags=2), FrameError, "flags"),
        (golden_layout(flags=1), SpecMismatchError, "record size 1 does not match spec sealed"),
        (golden_layout(flags=0x80), FrameError, "flags"),
        (golden_layout(metric_len=0), FrameError, "metric name length"),
        (golden_layout(metric_len=256), FrameError, "metric name length"),
        (golden_layout(metric_len=8), FrameError, "trailing"),
        (golden_layout(metric=b"app.emoj\xff"), FrameError, "UTF-8"),
        (golden_layout(metric=b"app emoji"), FrameError, "metric name"),
        (golden_layout(crc=0), FrameError, "CRC"),
        (FRAME[:-5] + bytes([FRAME[-5] ^ 1]) + FRAME[-4:], FrameError, "CRC"),
        (FRAME[:16] + bytes([FRAME[16] ^ 0x10]) + FRAME[17:], FrameError, "CRC"),
        (golden_layout(spec_id="0011223344556677"), SpecMismatchError, "spec"),
        (golden_layout(record_size=2, n_records=2), SpecMismatchError, "record size"),
        (golden_layout(record_size=0, n_records=0, records=b""), FrameError, "record size"),
        (golden_layout(records=bytes([2, 0, 4, 1])), FrameError, r"record 2 has value=4"),
        (golden_layout(records=bytes([255, 0, 3, 1])), FrameError, r"record 0 has value=255"),
        (golden_layout(n_records=MAX_RECORDS + 1), FrameError, "at most"),
    ],
    ids=[
        "trailing-1",
        "trailing-frame",
        "magic",
        "magic-zip",
        "version-2",
        "version-0",
        "flags-2",
        "sealed-flag-plain-width",
        "flags-80",
        "metric-len-0",
        "metric-len-256",
        "metric-len-wrong",
        "metric-not-utf8",
        "metric-bad-char",
        "crc-zero",
        "crc-record-flip",
        "crc-header-flip",
        "spec-id",
        "record-size-mismatch",
        "record-size-0",
        "value-out-of-bounds",
        "value-255",
        "too-many-records",
    ],
)
def test_malformed_frame(frame: bytes, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        decode_frame(frame, SPEC)


def test_spec_resolution_mismatch() -> None:
    with pytest.raises(SpecMismatchError, match="unknown spec_id"):
        decode_frame(FRAME, {GRRSpec(1.0, 5).spec_id: GRRSpec(1.0, 5)})
    with pytest.raises(SpecMismatchError, match="expected"):
        decode_frame(FRAME, GRRSpec(1.0, 5))
    with pytest.raises(SpecMismatchError, match="expected"):
        decode_frame(FRAME, lambda metric, spec_id: GRRSpec(1.0, 5))
    assert decode_frame(FRAME, {SPEC.spec_id: SPEC}).spec == SPEC
    with pytest.raises(SpecMismatchError, match="unknown spec_id"):
        decode_frame(bytes.fromhex(G["memo_id_hex"]), {SPEC.spec_id: SPEC})
    assert decode_frame(FRAME, lambda metric, spec_id: SPEC).spec == SPEC


def test_report_batch_validation() -> None:
    rec = SPEC.encode([0, 1], np.random.default_rng(0))
    with pytest.raises(SpecMismatchError, match="dtype"):
        ReportBatch("m", SPEC, 0, np.zeros(2, dtype=GRRSpec(1.0, 1024).record_dtype))
    with pytest.raises(SpecMismatchError, match="1-d"):
        ReportBatch("m", SPEC, 0, rec.reshape(1, 2))
    with pytest.raises(FrameError, match="metric name"):
        ReportBatch("", SPEC, 0, rec)
    with pytest.raises(FrameError, match="metric name"):
        ReportBatch("x" * 256, SPEC, 0, rec)
    with pytest.raises(FrameError, match="day"):
        ReportBatch("m", SPEC, -1, rec)
    with pytest.raises(FrameError, match="day"):
        ReportBatch("m", SPEC, 2**32, rec)
    with pytest.raises(FrameError, match="batch_id"):
        ReportBatch("m", SPEC, 0, rec, b"short")


# -- malformed JSON frames -------------------------------------------------------------
def _golden_json(**overrides: Any) -> dict[str, Any]:
    obj = json.loads(encode_json(golden_batch(G)))
    obj.update(overrides)
    return obj


@pytest.mark.parametrize(
    "data,error,match",
    [
        ("{not json", FrameError, "does not parse"),
        (b"\xff\xfe", FrameError, "does not parse"),
        ("[1, 2]", FrameError, "object"),
        ({"version": 1}, FrameError, "lacks"),
        (_golden_json(version=2), FrameError, "version"),
        (_golden_json(metric="a b"), FrameError, "metric name"),
        (_golden_json(metric=7), FrameError, "metric name"),
        (_golden_json(spec_id="26C35EF1FE813001"), FrameError, "spec_id"),
        (_golden_json(spec_id="0011223344556677"), SpecMismatchError, "spec"),
        (_golden_json(batch_id="zz"), FrameError, "batch_id"),
        (_golden_json(batch_id="00"), FrameError, "batch_id"),
        (_golden_json(day=-1), FrameError, "day"),
        (_golden_json(day="monday"), FrameError, "day"),
        (_golden_json(records={"a": 1}), FrameError, "records must be a list"),
        (_golden_json(records=[[1], [1, 2]]), FrameError, "record 1"),
        (_golden_json(records=[[1], 2]), FrameError, "record 1"),
        (_golden_json(records=[["1"]]), FrameError, "record 0 field value must be an integer"),
        (_golden_json(records=[[True]]), FrameError, "record 0 field value must be an integer"),
        (_golden_json(records=[[1.0]]), FrameError, "record 0 field value must be an integer"),
        (_golden_json(records=[[256]]), FrameError, "does not fit"),
        (_golden_json(records=[[-1]]), FrameError, "does not fit"),
        (_golden_json(records=[[0], [4]]), FrameError, "record 1 has value=4"),
    ],
)
def test_malformed_json(data: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        decode_json(data, SPEC)


# -- fuzzing: only FrameError ever escapes -------------------------------------------------
def _decode_or_frame_error(data: bytes, spec: Any) -> ReportBatch | None:
    try:
        return decode_frame(data, spec)
    except FrameError:
        return None


@PROPERTY
@given(st.binary(max_size=300))
def test_random_bytes_only_frame_exceptions(data: bytes) -> None:
    assert _decode_or_frame_error(data, SPEC) is None  # the chance of a valid frame is nil
    assert _decode_or_frame_error(b"LDPB\x01\x00" + data, SPEC) is None


@PROPERTY
@given(st.data())
def test_mutated_frames_only_frame_exceptions(data: st.DataObject) -> None:
    frame = bytearray(FRAME)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        pos = data.draw(st.integers(0, len(frame) - 1))
        if op == "flip":
            frame[pos] ^= data.draw(st.integers(1, 255))
        elif op == "delete":
            del frame[pos]
        else:
            frame.insert(pos, data.draw(st.integers(0, 255)))
    if data.draw(st.booleans()) and len(frame) >= 4:  # also reach the checks behind the CRC
        frame[-4:] = struct.pack("<I", zlib.crc32(bytes(frame[:-4])))
    back = _decode_or_frame_error(bytes(frame), SPEC)
    if back is not None:
        assert encode_frame(back) == bytes(frame)


@pytest.mark.parametrize("name", NAMES)
@PROPERTY
@given(n=st.integers(1, 8), data=st.data())
def test_random_records_behind_valid_header(name: str, n: int, data: st.DataObject) -> None:
    """Arbitrary record bytes in an otherwise valid frame: decoded exactly when the
    spec's record checks accept them (never when a field breaks record_bounds),
    otherwise FrameError."""
    spec = default_spec(name, 1.0, 13)
    raw = data.draw(st.binary(min_size=n * spec.record_size, max_size=n * spec.record_size))
    frame = layout_frame(spec.spec_id, b"fuzz", 1, spec.record_size, n, bytes(16), raw)
    back = _decode_or_frame_error(frame, spec)
    bounds = spec.record_bounds()
    records = np.frombuffer(raw, dtype=spec.record_dtype)
    in_bounds = all(int(records[f].max()) < b for f, b in bounds.items())
    try:
        spec.check_records(records)
        accepted = True
    except FrameError:
        accepted = False
    assert (back is not None) == accepted
    assert in_bounds or not accepted
    if back is not None:
        assert back.records.tobytes() == raw


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@PROPERTY
@given(
    base=st.fixed_dictionaries({}, optional={k: st.just(v) for k, v in _golden_json().items()}),
    extra=st.dictionaries(
        st.sampled_from(["version", "metric", "spec_id", "day", "batch_id", "records"]), _json_values
    ),
)
def test_random_json_only_frame_exceptions(base: dict[str, Any], extra: dict[str, Any]) -> None:
    obj = {**base, **extra}
    try:
        decode_json(obj, SPEC)
        decode_json(json.dumps(obj), SPEC)
    except FrameError:
        pass


@PROPERTY
@given(st.text(max_size=200) | _json_values.map(json.dumps))
def test_random_json_text_only_frame_exceptions(text: str) -> None:
    with pytest.raises(FrameError):
        decode_json(text, SPEC)


# -- spec validation and domains ----------------------------------------------------------
BAD_EPSILONS = [
    0,
    0.0,
    -1.0,
    -1e-9,
    math.nan,
    math.inf,
    -math.inf,
    MAX_EPSILON * 1.0001,
    1e9,
    True,
    False,
    "1.0",
    None,
    1j,
]
BAD_DOMAINS = [1, 0, -4, 16.0, "16", True, None, 2**31 + 1]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("epsilon", BAD_EPSILONS, ids=repr)
def test_bad_epsilon_rejected(name: str, epsilon: Any) -> None:
    with pytest.raises(SpecError, match="epsilon"):
        default_spec(name, epsilon)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("domain", BAD_DOMAINS, ids=repr)
def test_bad_domain_rejected(name: str, domain: Any) -> None:
    with pytest.raises(SpecError, match="domain"):
        make_spec(name, epsilon=1.0, domain_size=domain)


@pytest.mark.parametrize("name", NAMES)
@PROPERTY
@given(epsilon=st.floats(allow_nan=True, allow_infinity=True))
def test_epsilon_range_property(name: str, epsilon: float) -> None:
    """(0, MAX_EPSILON] is accepted, except that a mechanism may refuse a tiny ε
    (below 0.01) that leaves its reports no signal; anything else is refused."""
    if 0.01 <= epsilon <= MAX_EPSILON:
        assert default_spec(name, epsilon).epsilon == epsilon
    elif 0.0 < epsilon < 0.01:
        try:
            assert default_spec(name, epsilon).epsilon == epsilon
        except SpecError:
            pass
    else:
        with pytest.raises(SpecError):
            default_spec(name, epsilon)


def test_unknown_mechanism_and_parameters() -> None:
    with pytest.raises(SpecError, match="unknown mechanism"):
        make_spec("laplace", epsilon=1.0, domain_size=4)
    with pytest.raises(SpecError, match="grr"):
        make_spec("grr", epsilon=1.0, domain_size=4, colour="red")
    with pytest.raises(SpecError, match="rr"):
        make_spec("rr", epsilon=1.0, domain_size=3)
    with pytest.raises(SpecError, match="mechanism"):
        spec_from_dict({"epsilon": 1.0})


def test_specs_are_frozen() -> None:
    spec = GRRSpec(1.0, 4)
    with pytest.raises(AttributeError):
        spec.epsilon = 2.0  # type: ignore[misc]


@pytest.mark.parametrize("name", NAMES)
def test_values_outside_domain_rejected(name: str) -> None:
    spec = default_spec(name, 1.0, 10)
    rng = np.random.default_rng(0)
    d = spec.domain_size
    for bad in ([-1], [d], [0, d + 5], [1.5], [math.nan], ["a"]):
        with pytest.raises(DomainError):
            spec.encode(bad, rng)
    for bad_one in (-1, d, 2**40):
        with pytest.raises(DomainError):
            spec.encode_one(bad_one, rng)
    ok = spec.encode(np.arange(d), rng)
    assert ok.dtype == spec.record_dtype and ok.shape == (d,)
    assert spec.encode_one(d - 1, rng).shape == (1,)


@pytest.mark.parametrize("name", NAMES)
@PROPERTY
@given(values=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=20))
def test_domain_property(name: str, values: list[int]) -> None:
    spec = default_spec(name, 1.0, 10)
    rng = np.random.default_rng(0)
    if all(0 <= v < spec.domain_size for v in values):
        assert spec.encode(values, rng).shape == (len(values),)
    else:
        with pytest.raises(DomainError):
            spec.encode(values, rng)
