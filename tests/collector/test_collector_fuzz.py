"""Fuzzing the collector: hypothesis-made bodies and headers against the ASGI app, raw-socket abuse against uvicorn.

Properties: never a 5xx, never a crash (the app keeps answering), every
error is the documented JSON body, and the transport receives only whole,
valid, re-encoded batches, exactly one per accepted batch id.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from collector.dedup import BatchIdStore
from collector.http.app import create_app
from collector.settings import CollectorSettings
from ldp_core.errors import FrameError
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import ReportBatch, batch_to_json_obj, decode_frame, decode_json, encode_frame
from tests.support.collector_support import TODAY, MemoryTransport, ServerThread, write_metrics

# 409: a drawn body that reuses an accepted batch id with other records (batch_id_conflict)
ERROR_STATUSES = {400, 409, 413, 415, 422}
FRAME_TYPES = ["application/vnd.ldp.frame", "application/octet-stream"]


class Harness:
    """The app on an in-memory transport, driven through httpx's ASGI transport on one event loop."""

    def __init__(self, tmp: Path) -> None:
        self.metrics = write_metrics(tmp / "metrics.json")
        self.specs = {m.spec.spec_id: m.spec for m in self.metrics.values()}
        self.transport = MemoryTransport()
        settings = CollectorSettings(
            metrics_path=str(tmp / "metrics.json"),
            transport_url="memory://x",
            max_body_bytes=64 * 1024,
            max_records=2000,
            dedup_path=":memory:",
        )
        self.app = create_app(settings, transport=self.transport, dedup=BatchIdStore(":memory:"))
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://collector")
        self._lifespan = self.app.router.lifespan_context(self.app)
        self.loop.run_until_complete(self._lifespan.__aenter__())
        self.accepted: set[bytes] = set()

    def post(self, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return self.loop.run_until_complete(self.client.post("/v1/reports", content=body, headers=headers))

    def close(self) -> None:
        self.loop.run_until_complete(self._lifespan.__aexit__(None, None, None))
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    h = Harness(tmp_path_factory.mktemp("fuzz"))
    yield h
    h.close()


# -- strategies ------------------------------------------------------------------------------------


@st.composite
def valid_batches(draw: Callable[..., Any], metrics: MetricSet) -> ReportBatch:
    name = draw(st.sampled_from(sorted(metrics)))
    spec = metrics[name].spec
    if draw(st.integers(0, 9)) == 0:  # a name the collector does not know, or another metric's spec
        name = draw(st.sampled_from(["unknown_metric", *sorted(metrics)]))
    n = draw(st.integers(0, 40) | st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    records = spec.encode(rng.integers(0, spec.domain_size, n), rng) if n else np.zeros(0, spec.record_dtype)
    day = draw(
        st.one_of(
            st.just(TODAY),
            st.just(TODAY),
            st.just(TODAY - 1),
            st.sampled_from([TODAY + 1, TODAY + 5, TODAY - 400, 0, 2**32 - 1]),
        )
    )
    return ReportBatch(name, spec, day, records, rng.bytes(16))


def _refresh_crc(frame: bytearray) -> bytes:
    body = bytes(frame[:-4])
    return body + struct.pack("<I", zlib.crc32(body))


@st.composite
def frame_bodies(draw: Callable[..., Any], metrics: MetricSet) -> bytes:
    frame = bytearray(encode_frame(draw(valid_batches(metrics))))
    kind = draw(st.sampled_from(["intact"] * 5 + ["flip", "truncate", "append", "field", "field_crc_fixed", "random"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(frame) - 1))
            frame[i] ^= draw(st.integers(1, 255))
    elif kind == "truncate":
        frame = frame[: draw(st.integers(0, len(frame) - 1))]
    elif kind == "append":
        frame += draw(st.binary(min_size=1, max_size=64))
    elif kind in ("field", "field_crc_fixed"):
        offset, fmt = draw(st.sampled_from([(4, "<B"), (5, "<B"), (6, "<H"), (16, "<I"), (20, "<I"), (24, "<I")]))
        struct.pack_into(fmt, frame, offset, draw(st.integers(0, 2 ** (8 * struct.calcsize(fmt)) - 1)))
        if kind == "field_crc_fixed":
            return _refresh_crc(frame)
    elif kind == "random":
        return draw(st.binary(max_size=512))
    return bytes(frame)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)


@st.composite
def json_bodies(draw: Callable[..., Any], metrics: MetricSet) -> bytes:
    obj: Any = batch_to_json_obj(draw(valid_batches(metrics)))
    kind = draw(st.sampled_from(["intact"] * 4 + ["replace_field", "drop_field", "bad_record", "random", "bytes"]))
    if kind == "replace_field":
        obj[draw(st.sampled_from(sorted(obj)))] = draw(json_values)
    elif kind == "drop_field":
        del obj[draw(st.sampled_from(sorted(obj)))]
    elif kind == "bad_record" and obj["records"]:
        i = draw(st.integers(0, len(obj["records"]) - 1))
        obj["records"][i] = draw(json_values)
    elif kind == "random":
        obj = draw(json_values)
    elif kind == "bytes":
        return draw(st.binary(max_size=256))
    return json.dumps(obj, allow_nan=True).encode()


def content_types() -> st.SearchStrategy[str | None]:
    return st.one_of(
        st.sampled_from(FRAME_TYPES + ["application/json", "application/JSON; charset=utf-8"]),
        st.none(),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
    )


@st.composite
def requests(draw: Callable[..., Any], metrics: MetricSet) -> tuple[bytes, dict[str, str]]:
    as_json = draw(st.booleans())
    body = draw(json_bodies(metrics) if as_json else frame_bodies(metrics))
    headers: dict[str, str] = {}
    if draw(st.integers(0, 4)) == 0:
        ctype = draw(content_types())
    else:
        ctype = "application/json" if as_json else draw(st.sampled_from(FRAME_TYPES))
    if ctype is not None:
        headers["content-type"] = ctype
    if draw(st.integers(0, 3)) == 0:
        headers["idempotency-key"] = draw(
            st.one_of(
                st.text(alphabet="0123456789abcdefABCDEF", min_size=0, max_size=40),
                st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
            )
        )
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(["user-agent", "x-forwarded-for", "cookie", "accept", "x-anything", "forwarded"]))
        headers[name] = draw(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40))
    return body, headers


# -- the properties ------------------------------------------------------------------------------------


def _expected_value(body: bytes, ctype: str, h: Harness) -> bytes:
    """What the collector must have published for an accepted body: the canonical frame of its decoding."""
    batch = decode_frame(body, h.specs) if ctype in FRAME_TYPES else decode_json(body, h.specs)
    return encode_frame(batch)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_uploads_never_5xx_and_publish_only_whole_batches(harness: Harness, data: st.DataObject) -> None:
    body, headers = data.draw(requests(harness.metrics))
    before = len(harness.transport.records)
    r = harness.post(body, headers)
    event(f"status {r.status_code} {r.json().get('status', r.json().get('error')) if r.content else ''}")
    assert r.status_code == 202 or r.status_code in ERROR_STATUSES, (r.status_code, r.text)
    published = harness.transport.records[before:]
    if r.status_code != 202:
        err = r.json()
        assert set(err) == {"error", "message"} and err["message"]
        if r.status_code == 409:
            assert err["error"] == "batch_id_conflict"
        assert published == []
        return
    answer = r.json()
    bid = bytes.fromhex(answer["batch_id"])
    if answer["status"] == "accepted":
        assert bid not in harness.accepted
        harness.accepted.add(bid)
        assert len(published) == 1
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        assert published[0][2] == _expected_value(body, ctype, harness)
    else:
        assert answer["status"] == "duplicate" and bid in harness.accepted and published == []


def test_after_fuzzing_the_log_holds_exactly_the_accepted_batches(harness: Harness) -> None:
    # runs after the fuzz test in this module; also meaningful alone (then both sides are empty)
    ids = []
    for _, key, value in harness.transport.records:
        batch = decode_frame(value, harness.specs)  # every record decodes whole
        assert key == f"{batch.metric}/{batch.day}".encode()
        ids.append(batch.batch_id)
    assert len(ids) == len(set(ids)) == len(harness.accepted)
    assert set(ids) == harness.accepted
    assert harness.post(b"", {"content-type": FRAME_TYPES[0]}).status_code == 400  # still answering


def test_valid_uploads_are_accepted(harness: Harness) -> None:
    """The fuzzer's valid branch really is valid (so the property test exercises the 202 path)."""
    rng = np.random.default_rng(5)
    spec = harness.metrics["settings_tab"].spec
    batch = ReportBatch("settings_tab", spec, TODAY, spec.encode(rng.integers(0, 4, 10), rng))
    r = harness.post(encode_frame(batch), {"content-type": FRAME_TYPES[0]})
    assert r.status_code == 202 and r.json()["status"] == "accepted"
    harness.accepted.add(batch.batch_id)
    with pytest.raises(FrameError):
        decode_frame(encode_frame(batch)[:-1], harness.specs)


# -- raw HTTP abuse against the real server ----------------------------------------------------------------


def _raw(port: int, payload: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_lying_and_malformed_http_never_5xx(tmp_path: Path) -> None:
    write_metrics(tmp_path / "metrics.json")
    transport = MemoryTransport()
    settings = CollectorSettings(
        metrics_path=str(tmp_path / "metrics.json"),
        transport_url="memory://x",
        max_body_bytes=4096,
        dedup_path=":memory:",
    )
    head = b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/vnd.ldp.frame\r\n"
    cases = [
        head + b"Content-Length: abc\r\n\r\n",
        head + b"Content-Length: -5\r\n\r\nxxxxx",
        head + b"Content-Length: 99999999999999999999\r\n\r\n",
        head + b"Content-Length: 100\r\n\r\nshort",  # the client closes before the declared length
        head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nbad\r\n0\r\n\r\n",
        head
        + b"Transfer-Encoding: chunked\r\n\r\n"
        + b"1000\r\n"
        + b"a" * 4096
        + b"\r\n1000\r\n"
        + b"a" * 4096
        + b"\r\n0\r\n\r\n",
        head + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        b"GARBAGE\r\n\r\n",
        b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: " + b"a" * 20000 + b"\r\nContent-Length: 0\r\n\r\n",
    ]
    with ServerThread(create_app(settings, transport=transport, dedup=BatchIdStore(":memory:"))) as srv:
        for payload in cases:
            reply = _raw(srv.port, payload)
            if reply:
                status = int(reply.split(b" ", 2)[1])
                assert status < 500, (payload[:120], reply[:300])
        assert httpx.get(srv.url + "/healthz").status_code == 200
    assert transport.records == []


# -- schemathesis on the OpenAPI document ---------------------------------------------------------------

import schemathesis  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402


@schemathesis.serializer(*FRAME_TYPES[:2])
def _frame_serializer(ctx: Any, value: Any) -> bytes:  # the documented binary body is passed through as bytes
    return value if isinstance(value, bytes) else str(value).encode()


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, MemoryTransport, dict]]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    metrics = write_metrics(tmp / "metrics.json")
    transport = MemoryTransport()
    settings = CollectorSettings(
        metrics_path=str(tmp / "metrics.json"), transport_url="memory://x", dedup_path=":memory:"
    )
    with ServerThread(create_app(settings, transport=transport, dedup=BatchIdStore(":memory:"))) as srv:
        yield srv, transport, {m.spec.spec_id: m.spec for m in metrics.values()}


def test_openapi_operations_never_5xx(api_server: tuple[ServerThread, MemoryTransport, dict]) -> None:
    """Every operation of the collector's own OpenAPI document, with schemathesis-generated requests
    (positive and negative): no 5xx, and whatever reached the transport decodes whole."""
    srv, transport, specs = api_server
    api = schemathesis.openapi.from_url(srv.url + "/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/reports", "/v1/metrics", "/healthz", "/readyz", "/metrics"}
    for op in operations:

        @given(case=op.as_strategy())
        @settings(
            max_examples=40 if op.path == "/v1/reports" else 5, deadline=None, suppress_health_check=list(HealthCheck)
        )
        def run(case: Any) -> None:
            case.call_and_validate(base_url=srv.url, checks=[not_a_server_error])

        run()
    for _, _, value in transport.records:
        decode_frame(value, specs)
