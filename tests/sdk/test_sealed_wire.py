"""Sealed frames, sealed records, analyzer key files and the metrics file's sealed fields."""

from __future__ import annotations

import json
import os
import pathlib
import stat
from typing import Any

import numpy as np
import pytest

from ldp_core.errors import FrameError, SpecMismatchError
from ldp_core.mechanisms import spec_from_dict
from ldp_core.metrics import MetricsFileError, parse_metrics
from ldp_core.wire import hpke
from ldp_core.wire.frames import FLAG_SEALED, ReportBatch, decode_frame, encode_frame, encode_json, read_header
from ldp_core.wire.sealing import (
    SEALED_OVERHEAD,
    AnalyzerKey,
    BatchOpener,
    KeyRing,
    ReplayGuard,
    SealedSpec,
    SealingError,
    load_key_file,
    new_key_file,
    open_batch,
    seal_batch,
    sealed_info,
)
from tests.support.vectors import load_vectors

VECTOR = load_vectors("sealed_frame.json")
SPEC = spec_from_dict({"mechanism": "olh", "epsilon": 1.0, "domain_size": 1024})


def _batch(n: int = 50, day: int = 20_000, metric: str = "m") -> ReportBatch:
    recs = SPEC.encode(np.arange(n) % 1024, np.random.default_rng(1))
    return ReportBatch(metric, SPEC, day, recs)


def _keys(tmp_path: pathlib.Path) -> tuple[KeyRing, AnalyzerKey]:
    _, key = new_key_file(tmp_path / "keys")
    return KeyRing.load(tmp_path / "keys"), key


def test_the_sealed_frame_vector_decodes_and_opens() -> None:
    frame = bytes.fromhex(VECTOR["frame_hex"])
    spec = spec_from_dict(VECTOR["spec"])
    assert spec.spec_id == VECTOR["spec_id"]
    h = read_header(frame)
    assert h.sealed and frame[5] == FLAG_SEALED
    assert (h.metric, h.day, h.spec_id, h.batch_id.hex()) == (
        VECTOR["metric"],
        VECTOR["day"],
        spec.spec_id,
        VECTOR["batch_id"],
    )
    assert h.record_size == VECTOR["sealed_record_size"] == spec.record_size + SEALED_OVERHEAD
    key = AnalyzerKey(bytes.fromhex(VECTOR["private_key"]))
    assert (key.key_id, key.public_key.hex()) == (VECTOR["key_id"], VECTOR["public_key"])
    assert hpke.derive_key_pair(bytes.fromhex(VECTOR["ikm"]))[0].hex() == VECTOR["private_key"]
    assert sealed_info(h.metric, h.spec_id, h.day, key.key_id).hex() == VECTOR["info_hex"]
    batch = decode_frame(frame, spec)
    assert batch.sealed and isinstance(batch.spec, SealedSpec)
    res = open_batch(batch, KeyRing([key]))
    assert res.failed == 0
    assert res.batch.records.tobytes().hex() == VECTOR["plain_records_hex"]
    assert res.batch.spec == spec and not res.batch.sealed
    # each record by hand: key id || enc || ct, single-shot HPKE with the documented info
    raw = batch.records.view(np.uint8).reshape(len(batch), -1)
    suite = hpke.Suite()
    for i, row in enumerate(raw):
        rec = row.tobytes()
        assert rec[:4].hex() == key.key_id
        pt = suite.open(key.private, key.public_key, bytes.fromhex(VECTOR["info_hex"]), rec[4:])
        assert pt.hex() == VECTOR["plain_records_hex"][2 * i : 2 * i + 2]


def test_seal_frame_open_round_trip_with_52_bytes_overhead(tmp_path: pathlib.Path) -> None:
    ring, key = _keys(tmp_path)
    b = _batch()
    sb = seal_batch(b, key.public)
    frame = encode_frame(sb)
    assert len(frame) - len(encode_frame(b)) == len(b) * SEALED_OVERHEAD == len(b) * 52
    got = decode_frame(frame, SPEC)  # a plain resolver: the sealed frame decodes to the SealedSpec of it
    assert got.sealed and got.spec.spec_id == SPEC.spec_id and got.batch_id == b.batch_id
    res = open_batch(got, ring)
    assert res.failed == 0
    np.testing.assert_array_equal(res.batch.records, b.records)
    # no plaintext record appears in the sealed frame's record area
    assert b.records.tobytes() not in frame


def test_plain_frames_are_unchanged_and_a_sealed_resolver_refuses_them() -> None:
    b = _batch()
    frame = encode_frame(b)
    assert frame[5] == 0 and not read_header(frame).sealed
    with pytest.raises(SpecMismatchError, match="is sealed"):
        decode_frame(frame, SealedSpec.of(SPEC))
    with pytest.raises(FrameError, match="binary frames only"):
        encode_json(seal_batch(b, AnalyzerKey(os.urandom(32)).public))
    bad = bytearray(frame)
    bad[5] = 0x02
    with pytest.raises(FrameError, match="unknown flags"):
        read_header(bytes(bad))


def test_a_sealed_frame_of_the_wrong_width_is_refused() -> None:
    sb = seal_batch(_batch(4), AnalyzerKey(os.urandom(32)).public)
    other = spec_from_dict({"mechanism": "grr", "epsilon": 1.0, "domain_size": 300})  # record size 2, not 8
    frame = encode_frame(sb)
    with pytest.raises(SpecMismatchError, match="record size"):
        decode_frame(frame, lambda m, s: _as(other, s))


def _as(spec: Any, spec_id: str) -> Any:
    # a resolver that claims the frame's id for another layout (what a stale metrics file would do)
    class Claim(type(spec)):  # type: ignore[misc]
        @property
        def spec_id(self) -> str:
            return spec_id

    return Claim(**spec.params())


def test_records_moved_to_another_metric_day_or_key_do_not_open_and_are_counted(tmp_path: pathlib.Path) -> None:
    ring, key = _keys(tmp_path)
    sb = seal_batch(_batch(20), key.public)
    for moved in [
        ReportBatch("other", sb.spec, sb.day, sb.records),
        ReportBatch("m", sb.spec, sb.day + 1, sb.records),
    ]:
        res = open_batch(moved, ring)
        assert (res.failed, len(res.batch)) == (20, 0)
    # another analyzer's key: the key id is unknown
    res = open_batch(sb, KeyRing([AnalyzerKey(os.urandom(32))]))
    assert res.failed == 20
    # one altered byte spoils exactly one record
    raw = sb.records.copy().view(np.uint8).reshape(20, -1)
    raw[3, -1] ^= 1
    res = open_batch(ReportBatch("m", sb.spec, sb.day, raw.reshape(-1).view(sb.spec.record_dtype)), ring)
    assert (res.failed, len(res.batch)) == (1, 19)


def test_parallel_opening_gives_the_inline_result(tmp_path: pathlib.Path) -> None:
    ring, key = _keys(tmp_path)
    b = _batch(300)
    sb = seal_batch(b, key.public)
    with BatchOpener(ring, processes=2, chunk=64) as opener:
        res = opener.open_batch(sb)
    assert res.failed == 0
    np.testing.assert_array_equal(res.batch.records, b.records)


def test_parallel_opening_matches_serial_with_failures_and_replays(tmp_path: pathlib.Path) -> None:
    """Across processes, a batch mixing good records, records to an unknown key, altered records and a
    replayed record opens to exactly what the inline opener gives: records, failures, replays, in order."""
    ring, key = _keys(tmp_path)
    other = AnalyzerKey(os.urandom(32))
    good = seal_batch(_batch(300), key.public).records.copy()
    foreign = seal_batch(_batch(40), other.public).records
    raw = good.view(np.uint8).reshape(good.size, -1)
    raw[7, -1] ^= 1  # altered tag
    raw[150, 40] ^= 0x80  # altered ciphertext
    records = np.concatenate([good[:100], foreign, good[100:], good[5:6]])  # the last one replays record 5
    sb = ReportBatch("m", SealedSpec.of(SPEC), 20_000, records)
    with BatchOpener(ring, native=False) as serial, BatchOpener(ring, processes=2, chunk=64, native=False) as parallel:
        a, b = serial.open_batch(sb, source="s"), parallel.open_batch(sb, source="s")
        assert parallel._pool is not None  # the batch (441 records > chunk) went to the workers
    assert (a.failed, a.replayed, len(a.batch)) == (42, 1, 298)
    assert (b.failed, b.replayed) == (a.failed, a.replayed)
    np.testing.assert_array_equal(b.batch.records, a.batch.records)
    # the compiled opener releases the GIL: its workers are threads, and parts of 2 * thread_part records or
    # more are split among them, in order, with the same failures and replays
    with BatchOpener(ring, processes=3, thread_part=50, native=True) as threaded:
        c = threaded.open_batch(sb, source="s")
        assert threaded._threads is not None and threaded._pool is None
    assert (c.failed, c.replayed) == (a.failed, a.replayed)
    np.testing.assert_array_equal(c.batch.records, a.batch.records)


def test_large_sealed_batches_open_in_parallel_by_default_where_cores_allow(tmp_path: pathlib.Path) -> None:
    from ldp_cli.main import build_parser
    from ldp_cli.options import analyzer_opener
    from ldp_core.wire.sealing import default_open_processes

    _keys(tmp_path)
    (tmp_path / "metrics.json").write_text("{}")
    for argv, want in (([], default_open_processes()), (["--serial-open"], 1), (["--open-processes", "3"], 3)):
        args = build_parser().parse_args(["estimator", "--state", str(tmp_path / "st"), *argv])
        opener = analyzer_opener(str(tmp_path / "keys"), [], processes=args.open_processes)
        assert opener.processes == want
    assert default_open_processes() == max(1, len(os.sched_getaffinity(0)))


def test_key_files_are_0600_and_unsafe_or_missing_ones_are_clear_errors(tmp_path: pathlib.Path) -> None:
    path, key = new_key_file(tmp_path / "k")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key.private_bytes().hex() not in repr(key) + repr(KeyRing([key]))
    assert load_key_file(path).key_id == key.key_id
    pub = json.loads((tmp_path / "k" / f"analyzer-{key.key_id}.pub.json").read_text())
    assert pub == {"key_id": key.key_id, "public_key": key.public_key.hex()}
    os.chmod(path, 0o644)
    with pytest.raises(SealingError, match="chmod 600"):
        KeyRing.load(tmp_path / "k")
    with pytest.raises(SealingError, match="does not exist"):
        KeyRing.load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SealingError, match="no \\*.key file"):
        KeyRing.load(tmp_path / "empty")
    os.chmod(path, 0o600)
    with pytest.raises(SealingError, match="names analyzer key"):
        KeyRing.load(tmp_path / "k").require(["00000000"])


def _doc(sealed: Any = True, keys: Any = None) -> dict[str, Any]:
    m: dict[str, Any] = {
        "description": "d",
        "owner": "o@example.org",
        "expires": "2099-12-31",
        "mechanism": {"mechanism": "olh", "epsilon": 1.0},
        "domain": {"kind": "hashed", "size": 1024, "seed": 0},
        "max_reports_per_day": 1,
    }
    if sealed is not None:
        m["sealed"] = sealed
    doc: dict[str, Any] = {"format": "ldp-metrics/1", "metrics": {"m": m}}
    if keys is not None:
        doc["analyzer_keys"] = keys
    return doc


def test_metrics_file_sealed_field_and_analyzer_keys() -> None:
    k1, k2 = AnalyzerKey(os.urandom(32)), AnalyzerKey(os.urandom(32))
    ms = parse_metrics(_doc(True, [k1.public.to_dict(), k2.public.to_dict()]))
    assert ms["m"].sealed and ms.analyzer_key == k1.public and ms.analyzer_keys[1] == k2.public
    assert isinstance(ms["m"].wire_spec, SealedSpec)
    again = parse_metrics(ms.to_json())
    assert again.analyzer_keys == ms.analyzer_keys and again["m"].sealed
    plain = parse_metrics(_doc(None))
    assert not plain["m"].sealed and "sealed" not in plain.to_json() and "analyzer_keys" not in plain.to_json()
    with pytest.raises(MetricsFileError, match="no 'analyzer_keys'"):
        parse_metrics(_doc(True))
    with pytest.raises(MetricsFileError, match="true or false"):
        parse_metrics(_doc("yes", [k1.public.to_dict()]))
    with pytest.raises(MetricsFileError, match="does not match"):
        parse_metrics(_doc(True, [{"key_id": "00000000", "public_key": k1.public_key.hex()}]))
    with pytest.raises(MetricsFileError, match="private keys never"):
        parse_metrics(_doc(True, [{**k1.public.to_dict(), "private_key": k1.private_bytes().hex()}]))


def test_the_replay_guard_drops_copies_inside_a_batch_and_across_sources_and_forgets_old_days(
    tmp_path: pathlib.Path,
) -> None:
    ring, key = _keys(tmp_path)
    sealed = seal_batch(_batch(20), key.public)
    doubled = ReportBatch("m", sealed.spec, sealed.day, np.concatenate([sealed.records, sealed.records[:5]]))
    opener = BatchOpener(ring, replays=ReplayGuard(max_day_age=2))
    res = opener.open_batch(doubled, ("t", 0, 1))
    assert (len(res.batch), res.failed, res.replayed) == (20, 0, 5)  # a copy inside one frame counts once
    assert opener.open_batch(sealed, ("t", 0, 2)).replayed == 20  # another log record: all replays
    assert len(opener.open_batch(sealed, ("t", 0, 1)).batch) == 20  # the same log record read again
    later = seal_batch(_batch(3, day=sealed.day + 3), key.public)
    assert len(opener.open_batch(later, ("t", 0, 3)).batch) == 3
    assert len(opener.replays) == 3  # day - 3 fell out of the 2-day window
    assert opener.replays.dropped == 25


def test_a_durable_replay_guard_remembers_across_a_restart(tmp_path: pathlib.Path) -> None:
    ring, key = _keys(tmp_path)
    sealed = seal_batch(_batch(12), key.public)
    first = BatchOpener(ring, replays=ReplayGuard(path=tmp_path / "seen.sqlite3"))
    assert len(first.open_batch(sealed, ("t", 0, 7)).batch) == 12
    first.replays.close()
    again = BatchOpener(ring, replays=ReplayGuard(path=tmp_path / "seen.sqlite3"))  # a restarted process
    res = again.open_batch(sealed, ("t", 1, 3))  # the replay, on another log record
    assert (len(res.batch), res.replayed) == (0, 12)
    assert len(again.open_batch(sealed, ("t", 0, 7)).batch) == 12  # the original, read again after the restart
    again.replays.close()
