"""The collector over real HTTP: a uvicorn server on 127.0.0.1 in a thread (and once as ``ldp collector``), httpx as client.

Every answer path is exercised; what reaches the transport is read back from
the embedded log (and, in the Kafka test, from the broker).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from client_sdk.upload import uploader
from collector.dedup import BatchIdStore
from collector.http.app import create_app
from collector.http.upload import FRAME_CONTENT_TYPES
from collector.settings import CollectorSettings
from ldp_core.mechanisms import make_spec
from ldp_core.metrics import MetricSet, parse_metrics
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, ReportBatch, decode_frame, encode_frame, encode_json
from pipeline.topics import RAW_TOPIC, metric_day_key
from pipeline.transport import Record, Transport, open_transport
from tests.support.collector_support import (
    TODAY,
    BlockingTransport,
    FailingTransport,
    ServerThread,
    olh_batch,
    start_collector_command,
    write_metrics,
)

ROOT = Path(__file__).resolve().parents[2]
FRAME = {"content-type": FRAME_CONTENT_TYPE}


def read_all(transport: Transport, topic: str = RAW_TOPIC) -> list[Record]:
    """Every record of ``topic`` (the embedded log: durable before the 202, so one pass finds them)."""
    try:
        transport.partitions(topic)
    except ValueError:
        return []
    out: list[Record] = []
    with transport.consume(topic, f"reader-{uuid.uuid4().hex[:8]}", session_timeout=2.0) as c:
        while True:
            got = c.poll(max_records=1000, timeout=0.3)
            if not got:
                return out
            out.extend(got)


@pytest.fixture
def metrics(tmp_path: Path) -> MetricSet:
    return write_metrics(tmp_path / "metrics.json")


@pytest.fixture
def transport(tmp_path: Path) -> Iterator[Transport]:
    tr = open_transport(f"sqlite:///{tmp_path}/log.sqlite3")
    yield tr
    tr.close()


def make_settings(tmp_path: Path, **kw: object) -> CollectorSettings:
    base = dict(
        metrics_path=str(tmp_path / "metrics.json"),
        transport_url=f"sqlite:///{tmp_path}/log.sqlite3",
        dedup_path=str(tmp_path / "ids.sqlite3"),
        raw_partitions=2,
    )
    base.update(kw)
    return CollectorSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
def server(tmp_path: Path, metrics: MetricSet, transport: Transport) -> Iterator[ServerThread]:
    with ServerThread(create_app(make_settings(tmp_path), transport=transport)) as srv:
        yield srv


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(url + "/v1/reports", content=body, headers=FRAME if headers is None else headers, timeout=30)


# -- accepted uploads ----------------------------------------------------------------------


def test_frame_is_published_reencoded_with_metric_day_key(
    server: ServerThread, metrics: MetricSet, transport: Transport
) -> None:
    batch = olh_batch(metrics, 1000)
    r = post(server.url, encode_frame(batch))
    assert r.status_code == 202, r.text
    assert r.json() == {"status": "accepted", "batch_id": batch.batch_id.hex(), "reports": 1000}
    recs = read_all(transport)
    assert len(recs) == 1
    assert recs[0].key == metric_day_key("emoji_used", TODAY) == f"emoji_used/{TODAY}".encode()
    got = decode_frame(recs[0].value, metrics["emoji_used"].spec)
    assert (got.metric, got.day, got.batch_id) == ("emoji_used", TODAY, batch.batch_id)
    assert np.array_equal(got.records, batch.records)


def test_json_form_is_published_as_the_same_binary_frame(
    server: ServerThread, metrics: MetricSet, transport: Transport
) -> None:
    batch = olh_batch(metrics, 50)
    r = post(server.url, encode_json(batch).encode(), {"content-type": "application/json"})
    assert r.status_code == 202, r.text
    (rec,) = read_all(transport)
    assert rec.value == encode_frame(batch)


def test_the_frame_has_one_content_type_shared_by_the_sdk_and_the_collector() -> None:
    assert FRAME_CONTENT_TYPE == "application/vnd.ldp.frame"
    assert uploader.FRAME_CONTENT_TYPE == FRAME_CONTENT_TYPE and FRAME_CONTENT_TYPES[0] == FRAME_CONTENT_TYPE


@pytest.mark.parametrize("ctype", ["application/octet-stream", "Application/VND.LDP.Frame; charset=binary"])
def test_generic_and_parametrized_frame_content_types_are_accepted(
    server: ServerThread, metrics: MetricSet, transport: Transport, ctype: str
) -> None:
    """A generic binary type is taken as a frame too; the media type's case and parameters do not matter."""
    batch = olh_batch(metrics, 10)
    r = post(server.url, encode_frame(batch), {"content-type": ctype})
    assert r.status_code == 202, r.text
    (rec,) = read_all(transport)
    assert rec.value == encode_frame(batch)


def test_sdk_content_type_and_idempotency_key(server: ServerThread, metrics: MetricSet, transport: Transport) -> None:
    batch = olh_batch(metrics, 10)
    r = post(
        server.url,
        encode_frame(batch),
        {"content-type": "application/vnd.ldp.frame", "idempotency-key": batch.batch_id.hex().upper()},
    )
    assert r.status_code == 202, r.text
    other = olh_batch(metrics, 10)
    r = post(server.url, encode_frame(other), {**FRAME, "idempotency-key": batch.batch_id.hex()})
    assert r.status_code == 400 and r.json()["error"] == "idempotency_key_mismatch"
    assert len(read_all(transport)) == 1


def test_nothing_that_identifies_the_sender_reaches_the_transport(
    server: ServerThread, metrics: MetricSet, transport: Transport, tmp_path: Path
) -> None:
    """The stored record is exactly the canonical frame of (metric, spec, day, batch id, records), built
    here independently; no header value sent with the upload appears anywhere in the log's file."""
    spec = metrics["emoji_used"].spec
    rec = np.zeros(20, dtype=spec.record_dtype)
    rec["seed"] = np.arange(20) * 7919
    bid = bytes(range(16))
    body = encode_frame(ReportBatch("emoji_used", spec, TODAY, rec, bid))
    markers = {
        "user-agent": "agent-7f3a9c-marker",
        "x-forwarded-for": "203.0.113.77",
        "cookie": "session=cookie-55d1e2-marker",
        "x-device-id": "device-0b4c8e-marker",
    }
    r = post(server.url, body, {**FRAME, **markers})
    assert r.status_code == 202
    (stored,) = read_all(transport)
    assert stored.value == encode_frame(ReportBatch("emoji_used", spec, TODAY, rec.copy(), bid))
    assert stored.key == f"emoji_used/{TODAY}".encode()
    blob = b"".join(p.read_bytes() for p in tmp_path.glob("log.sqlite3*"))
    for value in [*markers.values(), "127.0.0.1"]:
        assert value.encode() not in blob


def test_concurrent_uploads_are_each_published_once(
    server: ServerThread, metrics: MetricSet, transport: Transport
) -> None:
    batches = [olh_batch(metrics, 30, first_seed=30 * i) for i in range(64)]
    results: list[int] = []

    def send(chunk: list[ReportBatch]) -> None:
        with httpx.Client(timeout=30) as c:
            for b in chunk:
                results.append(c.post(server.url + "/v1/reports", content=encode_frame(b), headers=FRAME).status_code)

    threads = [threading.Thread(target=send, args=(batches[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [202] * 64
    seeds = np.concatenate(
        [decode_frame(r.value, metrics["emoji_used"].spec).records["seed"] for r in read_all(transport)]
    )
    assert np.array_equal(np.sort(seeds), np.arange(30 * 64))


# -- idempotency -----------------------------------------------------------------------------


def test_retry_is_answered_202_without_republishing_even_after_restart(
    tmp_path: Path, metrics: MetricSet, transport: Transport
) -> None:
    batch = olh_batch(metrics, 100)
    with ServerThread(create_app(make_settings(tmp_path), transport=transport)) as srv:
        assert post(srv.url, encode_frame(batch)).json()["status"] == "accepted"
        assert post(srv.url, encode_frame(batch)).json()["status"] == "duplicate"
        r = post(srv.url, encode_json(batch).encode(), {"content-type": "application/json"})
        assert r.status_code == 202 and r.json()["status"] == "duplicate"
    with ServerThread(create_app(make_settings(tmp_path), transport=transport)) as srv:
        r = post(srv.url, encode_frame(batch))
        assert r.status_code == 202 and r.json()["status"] == "duplicate"
    assert len(read_all(transport)) == 1


def test_dedup_store_forgets_after_ttl(tmp_path: Path) -> None:
    """The store keeps days, not times: an id lives through day ``accept day + ceil(ttl / 86400)``, so at least
    ``ttl`` seconds, and is purged after."""
    now = [1000 * 86400.0 + 86380.0]
    store = BatchIdStore(tmp_path / "ids.sqlite3", ttl=60.0, clock=lambda: now[0])
    store.add([b"a" * 16, b"b" * 16])
    assert store.seen([b"a" * 16, b"c" * 16]) == {b"a" * 16}
    now[0] += 61.0  # the next UTC day: still kept (a day's granularity never forgets early)
    assert store.seen([b"a" * 16]) == {b"a" * 16}
    now[0] += 86400.0
    assert store.seen([b"a" * 16]) == set()
    store.add([b"c" * 16])  # purges the expired rows
    assert len(store) == 1
    store.close()


def _store_dump(path: Path) -> str:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return "\n".join(conn.iterdump())
    finally:
        conn.close()


def test_attacker_with_the_store_and_the_raw_topic_learns_only_the_day(
    tmp_path: Path, metrics: MetricSet, transport: Transport
) -> None:
    """Play the adversary who holds the dedup store's file and the raw topic. Uploads arrive at times spread over
    one UTC day (a fake clock). Everything the store holds, joined to the topic's batch ids, must be the same for
    every upload of that day apart from digests: no number in the store is a time finer than the day (before the
    fix, ``expires`` was accept time + TTL to the microsecond)."""
    import re

    day = TODAY
    times = [day * 86400.0 + s for s in (10.5, 3600.25, 40000.125, 86399.0)]
    clock = [times[0]]
    path = tmp_path / "ids.sqlite3"
    store = BatchIdStore(path, clock=lambda: clock[0])
    with ServerThread(
        create_app(make_settings(tmp_path), transport=transport, dedup=store, clock=lambda: clock[0])
    ) as srv:
        for k, t in enumerate(times):
            clock[0] = t
            assert post(srv.url, encode_frame(olh_batch(metrics, 5, first_seed=10 * k))).status_code == 202
    store.close()
    ids = [decode_frame(r.value, lambda m, s: metrics[m].spec).batch_id for r in read_all(transport)]
    assert len(ids) == len(times)
    dump = _store_dump(path)
    numbers = [float(x) for x in re.findall(r"(?<![0-9A-Fa-fxX'])-?[0-9]+(?:\.[0-9]+)?(?![0-9A-Fa-f'])", dump)]
    assert all(abs(n) < 10**6 for n in numbers), f"the store holds a time-like number: {sorted(numbers)[-3:]}"
    raw = path.read_bytes() + (
        path.with_name(path.name + "-wal").read_bytes() if path.with_name(path.name + "-wal").exists() else b""
    )
    import struct

    for t in times:  # nor as a binary REAL or a millisecond integer anywhere in the file
        for secs in (t, t + 3 * 86400.0):
            assert struct.pack(">d", secs) not in raw
            assert int(secs * 1000).to_bytes(8, "big") not in raw
    # the attacker can recompute the keyed digests (the key is in the file); each row then yields only the day
    import sqlite3

    conn = sqlite3.connect(path)
    key = bytes(conn.execute("SELECT value FROM meta WHERE name='id_key'").fetchone()[0])
    tables = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'ids_%'")]
    rows = {  # a table per accept day, a row per group commit (schema 6): the day is all its name says
        bytes(ds[k : k + 16]): {"content": c, "day": int(t[4:])}
        for t in tables
        for ds, c in conn.execute(f"SELECT id_digests, contents FROM {t}")
        for k in range(0, len(ds), 16)
    }
    conn.close()
    import hashlib
    import hmac

    joined = [rows[hmac.new(key, i, hashlib.sha256).digest()[:16]] for i in ids]
    assert {r["day"] for r in joined} == {day}


def test_same_batch_id_with_other_records_is_409_and_nothing_is_dropped_silently(
    tmp_path: Path, metrics: MetricSet, transport: Transport
) -> None:
    """A second upload under an accepted batch id but with other records is refused with 409 (before: ``202
    duplicate`` and its records silently dropped); the same content again is still a duplicate, also after a
    restart on the same store."""
    bid = uuid.uuid4().bytes
    first = olh_batch(metrics, 20, batch_id=bid)
    other = olh_batch(metrics, 20, first_seed=500, batch_id=bid)
    with ServerThread(create_app(make_settings(tmp_path), transport=transport)) as srv:
        assert post(srv.url, encode_frame(first)).json()["status"] == "accepted"
        r = post(srv.url, encode_frame(other))
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "batch_id_conflict" and bid.hex() in r.json()["message"]
        r = post(srv.url, encode_json(other).encode(), {"content-type": "application/json"})
        assert r.status_code == 409
        assert post(srv.url, encode_frame(first)).json()["status"] == "duplicate"
    with ServerThread(create_app(make_settings(tmp_path), transport=transport)) as srv:
        assert post(srv.url, encode_frame(other)).status_code == 409
        assert post(srv.url, encode_frame(first)).json()["status"] == "duplicate"
    assert len(read_all(transport)) == 1


def test_dedup_store_of_the_first_schema_is_upgraded_and_a_newer_one_refused(tmp_path: Path) -> None:
    """A file written by the previous collector (``batch_ids(id, expires)``) is upgraded in place: its ids stay
    known (answered as duplicates), its accept times are gone from the file; a newer schema is a clear error."""
    import sqlite3

    from collector.errors import DedupStoreError

    path = tmp_path / "old.sqlite3"
    now = 20000 * 86400.0 + 12345.678
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE batch_ids(id BLOB PRIMARY KEY, expires REAL NOT NULL) WITHOUT ROWID")
    conn.execute("INSERT INTO batch_ids VALUES (?, ?)", (b"x" * 16, now + 3 * 86400.0))
    conn.commit()
    conn.close()
    store = BatchIdStore(path, clock=lambda: now + 5.0)
    assert store.lookup([b"x" * 16, b"y" * 16]) == {b"x" * 16: None}
    store.close()
    assert "batch_ids" not in _store_dump(path)
    import struct

    assert struct.pack(">d", now + 3 * 86400.0) not in path.read_bytes()
    newer = tmp_path / "newer.sqlite3"
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(DedupStoreError, match="schema version 99"):
        BatchIdStore(newer)


# -- 202 only after a durable publish -----------------------------------------------------------------


def test_failed_publish_is_503_and_publishes_nothing_then_retry_succeeds(
    tmp_path: Path, metrics: MetricSet, transport: Transport
) -> None:
    failing = FailingTransport(transport)
    failing.failing.set()
    batch = olh_batch(metrics, 40)
    with ServerThread(create_app(make_settings(tmp_path, retry_after=7), transport=failing)) as srv:
        r = post(srv.url, encode_frame(batch))
        assert r.status_code == 503 and r.headers["retry-after"] == "7"
        assert r.json()["error"] == "transport_unavailable"
        assert read_all(transport) == []
        failing.failing.clear()
        r = post(srv.url, encode_frame(batch))
        assert r.status_code == 202 and r.json()["status"] == "accepted"
    assert len(read_all(transport)) == 1


def test_answer_waits_for_the_publish(tmp_path: Path, metrics: MetricSet, transport: Transport) -> None:
    blocking = BlockingTransport(transport)
    answers: list[httpx.Response] = []
    with ServerThread(create_app(make_settings(tmp_path), transport=blocking)) as srv:
        t = threading.Thread(target=lambda: answers.append(post(srv.url, encode_frame(olh_batch(metrics, 5)))))
        t.start()
        assert blocking.entered.wait(30)
        t.join(0.5)
        assert answers == [] and read_all(transport) == []
        blocking.release.set()
        t.join(30)
    assert answers[0].status_code == 202
    assert len(read_all(transport)) == 1


def test_a_retry_during_the_publish_is_not_published_again(
    tmp_path: Path, metrics: MetricSet, transport: Transport
) -> None:
    blocking = BlockingTransport(transport)
    batch = olh_batch(metrics, 5)
    answers: list[httpx.Response] = []
    with ServerThread(create_app(make_settings(tmp_path), transport=blocking)) as srv:
        threads = [
            threading.Thread(target=lambda: answers.append(post(srv.url, encode_frame(batch)))) for _ in range(2)
        ]
        threads[0].start()
        assert blocking.entered.wait(30)
        threads[1].start()
        for _ in range(3000):  # until the retry waits in the collector too
            if "ldp_collector_uploads_in_flight 2" in httpx.get(srv.url + "/metrics").text:
                break
            threading.Event().wait(0.01)
        blocking.release.set()
        for t in threads:
            t.join(30)
    assert sorted(a.json()["status"] for a in answers) == ["accepted", "duplicate"]
    assert len(read_all(transport)) == 1


def test_overload_is_503_with_retry_after(tmp_path: Path, metrics: MetricSet, transport: Transport) -> None:
    blocking = BlockingTransport(transport)
    first: list[httpx.Response] = []
    with ServerThread(create_app(make_settings(tmp_path, max_in_flight=1, retry_after=3), transport=blocking)) as srv:
        t = threading.Thread(target=lambda: first.append(post(srv.url, encode_frame(olh_batch(metrics, 5)))))
        t.start()
        assert blocking.entered.wait(30)
        r = post(srv.url, encode_frame(olh_batch(metrics, 5, first_seed=5)))
        assert r.status_code == 503 and r.headers["retry-after"] == "3" and r.json()["error"] == "overloaded"
        blocking.release.set()
        t.join(30)
        assert first[0].status_code == 202
        metrics_text = httpx.get(srv.url + "/metrics").text
    assert 'ldp_collector_batches_total{outcome="unavailable",reason="overloaded"} 1' in metrics_text
    assert len(read_all(transport)) == 1


# -- rejections ------------------------------------------------------------------------------------


def _corrupt(frame: bytes, pos: int) -> bytes:
    b = bytearray(frame)
    b[pos] ^= 0x40
    return bytes(b)


def test_malformed_bodies_are_400(server: ServerThread, metrics: MetricSet, transport: Transport) -> None:
    good = encode_frame(olh_batch(metrics, 10))
    spec = metrics["emoji_used"].spec
    bad_rec = np.zeros(3, dtype=spec.record_dtype)
    bad_rec["y"] = 200  # OLH with g=4 has y < 4
    body = encode_frame(ReportBatch("emoji_used", spec, TODAY, np.zeros(3, dtype=spec.record_dtype)))
    out_of_bounds = body[: 44 + len(b"emoji_used")] + bad_rec.tobytes()
    import zlib

    out_of_bounds += zlib.crc32(out_of_bounds).to_bytes(4, "little")
    cases = {
        "empty": (b"", FRAME),
        "truncated": (good[:-7], FRAME),
        "trailing": (good + b"\x00", FRAME),
        "bad crc": (_corrupt(good, 60), FRAME),
        "bad magic": (_corrupt(good, 0), FRAME),
        "record out of bounds": (out_of_bounds, FRAME),
        "json garbage": (b"{not json", {"content-type": "application/json"}),
        "json nesting bomb": (b"[" * 50_000, {"content-type": "application/json"}),
        "json wrong shape": (b'{"version": 1}', {"content-type": "application/json"}),
        "json frame as text": (good, {"content-type": "application/json"}),
    }
    for name, (body, headers) in cases.items():
        r = post(server.url, body, headers)
        assert r.status_code == 400, (name, r.status_code, r.text)
        assert r.json()["error"] == "malformed" and r.json()["message"], name
    assert read_all(transport) == []


def test_unsupported_content_type_is_415(server: ServerThread, metrics: MetricSet) -> None:
    r = post(server.url, encode_frame(olh_batch(metrics, 3)), {"content-type": "text/plain"})
    assert r.status_code == 415 and "application/vnd.ldp.frame" in r.json()["message"]
    r = post(server.url, encode_frame(olh_batch(metrics, 3)), {})
    assert r.status_code == 415


def test_well_formed_batches_the_collector_refuses_are_422(
    server: ServerThread, metrics: MetricSet, transport: Transport
) -> None:
    other_spec = make_spec("olh", epsilon=2.0, domain_size=1024)
    old = metrics["old_metric"].spec
    cases = {
        "unknown_metric": ReportBatch(
            "no_such_metric",
            metrics["emoji_used"].spec,
            TODAY,
            np.zeros(2, dtype=metrics["emoji_used"].spec.record_dtype),
        ),
        "spec_mismatch": ReportBatch("emoji_used", other_spec, TODAY, np.zeros(2, dtype=other_spec.record_dtype)),
        "expired_metric": ReportBatch("old_metric", old, TODAY, np.zeros(2, dtype=old.record_dtype)),
        "bad_day": olh_batch(metrics, 2, day=TODAY + 400),
        "bad_day ": ReportBatch("old_metric", old, 0xFFFFFFFF, np.zeros(2, dtype=old.record_dtype)),
        "empty": olh_batch(metrics, 0),
    }
    for reason, batch in cases.items():
        for body, headers in (
            (encode_frame(batch), FRAME),
            (encode_json(batch).encode(), {"content-type": "application/json"}),
        ):
            r = post(server.url, body, headers)
            assert r.status_code == 422, (reason, r.text)
            assert r.json()["error"] == reason.strip(), (reason, r.text)
    r = post(server.url, encode_frame(olh_batch(metrics, 2, day=TODAY - 40)))
    assert r.status_code == 422 and "days old" in r.json()["message"]
    assert read_all(transport) == []


def test_too_large_is_413_before_and_while_reading(tmp_path: Path, metrics: MetricSet, transport: Transport) -> None:
    settings = make_settings(tmp_path, max_body_bytes=4096, max_records=100)
    with ServerThread(create_app(settings, transport=transport)) as srv:
        big = encode_frame(olh_batch(metrics, 2000))  # 10 kB
        r = post(srv.url, big)
        assert r.status_code == 413 and r.json()["error"] == "too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        r = httpx.post(srv.url + "/v1/reports", content=chunks(), headers=FRAME, timeout=30)
        assert r.status_code == 413 and r.json()["error"] == "too_large"
        r = post(srv.url, encode_frame(olh_batch(metrics, 101)))
        assert r.status_code == 413 and r.json()["error"] == "too_many_records"
        r = post(srv.url, encode_json(olh_batch(metrics, 101)).encode(), {"content-type": "application/json"})
        assert r.status_code in (413,) and r.json()["error"] in ("too_large", "too_many_records")
        assert post(srv.url, encode_frame(olh_batch(metrics, 100))).status_code == 202
    assert len(read_all(transport)) == 1


def test_early_413_closes_the_connection_so_a_keep_alive_client_does_not_hang(
    tmp_path: Path, metrics: MetricSet, transport: Transport
) -> None:
    """A keep-alive client declares a too-large body and sends it whole. The collector answers 413 before reading
    it; before the fix the connection stayed open and the unread body was parsed as the next request, so the
    client's next upload on that connection hung. Now the 413 says ``Connection: close`` and the server closes."""
    import socket

    settings = make_settings(tmp_path, max_body_bytes=4096)
    with ServerThread(create_app(settings, transport=transport)) as srv:
        big = encode_frame(olh_batch(metrics, 2000))
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            sock.sendall(
                (
                    f"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: {FRAME_CONTENT_TYPE}\r\n"
                    f"Content-Length: {len(big)}\r\n\r\n"
                ).encode()
                + big
            )
            data = b""
            while True:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    pytest.fail(f"the connection stayed open after the 413: {data[:200]!r}")
                if not chunk:
                    break
                data += chunk
        head = data.split(b"\r\n\r\n", 1)[0].lower()
        assert head.startswith(b"http/1.1 413") and b"connection: close" in head
        assert post(srv.url, encode_frame(olh_batch(metrics, 5))).status_code == 202


# -- the other endpoints ---------------------------------------------------------------------------------


def test_404_and_405_have_the_documented_error_body(server: ServerThread) -> None:
    """Outside developers parse every non-2xx answer as ``{"error", "message"}``; the framework's own 404 and
    405 answered ``{"detail": ...}`` before."""
    r = httpx.get(server.url + "/v1/no-such-route", timeout=30)
    assert r.status_code == 404 and r.json()["error"] == "not_found" and r.json()["message"]
    r = httpx.get(server.url + "/v1/reports", timeout=30)
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed" and "POST" in r.headers["allow"]


def test_metrics_document_round_trips_with_etag(server: ServerThread, metrics: MetricSet) -> None:
    r = httpx.get(server.url + "/v1/metrics")
    assert r.status_code == 200
    served = parse_metrics(r.content, reject_expired=False)
    assert {n: m.spec.spec_id for n, m in served.items()} == {n: m.spec.spec_id for n, m in metrics.items()}
    r2 = httpx.get(server.url + "/v1/metrics", headers={"if-none-match": r.headers["etag"]})
    assert r2.status_code == 304 and r2.content == b""


def test_health_readiness_and_prometheus(tmp_path: Path, metrics: MetricSet, transport: Transport) -> None:
    flaky = FailingTransport(transport)
    app = create_app(make_settings(tmp_path), transport=flaky)
    with ServerThread(app) as srv:
        assert httpx.get(srv.url + "/healthz").status_code == 200
        ready = httpx.get(srv.url + "/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        assert post(srv.url, encode_frame(olh_batch(metrics, 7))).status_code == 202
        assert post(srv.url, b"junk").status_code == 400
        assert post(srv.url, encode_frame(olh_batch(metrics, 2, day=TODAY + 9))).status_code == 422
        text = httpx.get(srv.url + "/metrics")
        flaky.unreachable.set()
        app.state.runtime["readiness"].ttl = 0.0  # the probe's result is cached for 2 s otherwise
        not_ready = httpx.get(srv.url + "/readyz")
        assert httpx.get(srv.url + "/healthz").status_code == 200
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    types = {f.name: f.type for f in text_string_to_metric_families(text.text)}
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text.text)
        for s in f.samples
    }
    for name, labels, value in [
        ("ldp_collector_batches_total", {"outcome": "accepted", "reason": "ok"}, 1),
        ("ldp_collector_reports_total", {"outcome": "accepted", "reason": "ok"}, 7),
        ("ldp_collector_accepted_reports_total", {"metric": "emoji_used"}, 7),
        ("ldp_collector_batches_total", {"outcome": "rejected", "reason": "malformed"}, 1),
        ("ldp_collector_batches_total", {"outcome": "rejected", "reason": "bad_day"}, 1),
        ("ldp_collector_reports_total", {"outcome": "rejected", "reason": "bad_day"}, 2),
        ("ldp_collector_request_duration_seconds_count", {"route": "/v1/reports", "method": "POST"}, 3),
    ]:
        assert samples.get((name, frozenset(labels.items()))) == value, (name, labels)
    assert types == {
        "ldp_collector_batches": "counter",
        "ldp_collector_reports": "counter",
        "ldp_collector_accepted_reports": "counter",
        "ldp_collector_request_duration_seconds": "histogram",
        "ldp_collector_uploads_in_flight": "gauge",
        "ldp_collector_uploads_reading": "gauge",
        "ldp_collector_publish_duration_seconds": "histogram",
        "ldp_collector_publish_group_batches": "histogram",
        "ldp_collector_token_key_days_refused": "counter",  # days whose token keys were inconsistent (docs/TOKENS.md)
    }
    assert not_ready.status_code == 503 and not_ready.json()["ready"] is False


def test_openapi_documents_the_upload(server: ServerThread) -> None:
    spec = httpx.get(server.url + "/openapi.json").json()
    op = spec["paths"]["/v1/reports"]["post"]
    assert {"application/vnd.ldp.frame", "application/json"} <= set(op["requestBody"]["content"])
    assert {"202", "400", "413", "415", "422", "503"} <= set(op["responses"])
    assert httpx.get(server.url + "/docs").status_code == 200


# -- the command ------------------------------------------------------------------------------------


def test_ldp_collector_command_serves_and_stops_on_sigterm(tmp_path: Path, metrics: MetricSet) -> None:
    proc, url, _ = start_collector_command(tmp_path, env={"LDP_COLLECTOR_MAX_RECORDS": "500"})
    try:
        assert post(url, encode_frame(olh_batch(metrics, 500))).status_code == 202
        assert post(url, encode_frame(olh_batch(metrics, 501))).status_code == 413  # from the environment
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    with open_transport(f"sqlite:///{tmp_path}/log.sqlite3") as tr:
        assert len(read_all(tr)) == 1


def test_ldp_collector_command_rejects_a_bad_metrics_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "ldp-metrics/1", "metrics": {"x": {"owner": "o"}}}))
    out = subprocess.run(
        [sys.executable, "-m", "ldp_cli.main", "collector", "--metrics", str(bad), "--port", "0"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 2 and "missing field" in out.stderr


# -- Kafka ------------------------------------------------------------------------------------------


@pytest.mark.kafka
def test_upload_reaches_kafka(tmp_path: Path, metrics: MetricSet, kafka_bootstrap: str) -> None:
    topic = f"ldp.test.raw-{uuid.uuid4().hex[:8]}"
    settings = make_settings(tmp_path, transport_url=f"kafka://{kafka_bootstrap}", raw_topic=topic)
    batches = [olh_batch(metrics, 1000, first_seed=1000 * i) for i in range(20)]
    with ServerThread(create_app(settings)) as srv:
        with httpx.Client(timeout=60) as c:
            codes = [
                c.post(srv.url + "/v1/reports", content=encode_frame(b), headers=FRAME).status_code for b in batches
            ]
            codes.append(c.post(srv.url + "/v1/reports", content=encode_frame(batches[0]), headers=FRAME).status_code)
        assert httpx.get(srv.url + "/readyz", timeout=30).json()["ready"] is True
    assert codes == [202] * 21
    with open_transport(f"kafka://{kafka_bootstrap}") as tr:
        from tests.support.transport_contract import read_exactly

        recs = read_exactly(tr, topic, 20)
    assert len(recs) == 20
    assert sorted(r.value for r in recs) == sorted(encode_frame(b) for b in batches)


def test_metrics_document_serves_every_metric(tmp_path: Path, transport: Transport) -> None:
    """The document holds every declared metric, numeric and heavy-hitter ones included, and parses."""
    doc = json.loads((Path(__file__).resolve().parents[2] / "metrics" / "example.json").read_text())
    (tmp_path / "metrics.json").write_text(json.dumps(doc))
    with ServerThread(create_app(make_settings(tmp_path), transport=transport)) as srv:
        served = httpx.get(srv.url + "/v1/metrics", timeout=10).json()
    numeric = {n for n, m in doc["metrics"].items() if m["domain"]["kind"] in ("range", "string")}  # not frequency
    assert numeric and set(served["metrics"]) == set(doc["metrics"])
    assert set(parse_metrics(served)) == set(doc["metrics"])
