"""The native front's Python half (:mod:`collector.http.front_bridge`) answers as the ASGI app does.

Each test runs two collector apps on one event loop, with the same settings and metrics and stores of their
own (the embedded sqlite log transport): the ASGI app, driven through httpx's ASGI transport, and an app whose
uploads arrive through :class:`~collector.http.front_bridge.FrontBridge` from the in-process stand-in of the
Rust front (tests/support/loopback_front.py). The same requests go to both, in the same order; the answers
(status, JSON body, headers besides the ``Content-Type`` and ``Content-Length`` the front adds itself) must be
equal, except that a refusal sent by the ASGI path before the body was read closes the connection
(``Connection: close``) and the bridge's never does (the front read the whole body). The Prometheus counters
of both apps must be equal too."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import generate_latest

from collector.http.app import CollectorApp, create_app
from collector.http.front_bridge import FrontBridge
from collector.settings import CollectorSettings
from ldp_core.metrics import MetricSet, load_metrics
from ldp_core.tokens import privacy_pass as tokens
from ldp_core.tokens.enrollment import EnrollmentAuthority
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, ReportBatch, encode_frame, encode_json
from ldp_core.wire.sealing import AnalyzerKey, seal_batch
from pipeline.transport import Health, Transport
from tests.collector.test_app_transport_down import OutageTransport
from tests.collector.test_tokens import authority, issuer  # noqa: F401  (fixtures)
from tests.collector.test_tokens import client as token_client
from tests.collector.test_tokens import collector_settings as token_settings
from tests.sdk.test_sealed_attacks import SPEC as SEALED_SPEC
from tests.sdk.test_sealed_attacks import _metrics_doc as sealed_metrics_doc
from tests.support.collector_support import TODAY, ServerThread, olh_batch, write_metrics
from tests.support.loopback_front import LoopbackFront, native_checker

APP = "https://app.example.com"
OTHER = "https://evil.example.net"
CLOSE = (b"connection", b"close")

AnswerParts = tuple[int, bytes, list[tuple[bytes, bytes]]]


@pytest.fixture
def metrics(tmp_path: Path) -> MetricSet:
    return write_metrics(tmp_path / "metrics.json", emoji_reports_per_day=5)


def settings(tmp_path: Path, name: str, **kw: Any) -> CollectorSettings:
    base: dict[str, Any] = dict(metrics_path=str(tmp_path / "metrics.json"), raw_partitions=1)
    base.update(kw)
    base.update(transport_url=f"sqlite:///{tmp_path}/{name}.log.sqlite3", dedup_path=str(tmp_path / f"{name}.ids"))
    return CollectorSettings(**base)


class Twins:
    """The ASGI app and the bridged app, running (their lifespans entered) on the current loop."""

    def __init__(self, asgi: CollectorApp, bridged: CollectorApp) -> None:
        self.asgi, self.bridged = asgi, bridged
        self.checker = native_checker()  # the Rust front's frame pre-check, as in production
        self.front = LoopbackFront(precheck=self.checker.__enter__())
        self.bridge = FrontBridge.for_app(bridged)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://collector")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Twins]:
        async with contextlib.AsyncExitStack() as stack:
            for app in (self.asgi, self.bridged):
                await stack.enter_async_context(app.fastapi.router.lifespan_context(app.fastapi))
            stack.push_async_callback(self.http.aclose)
            stack.callback(self.front.close)
            stack.callback(self.checker.__exit__, None, None, None)
            self.bridge.attach(self.front)
            stack.callback(self.bridge.detach)
            yield self

    async def via_asgi(
        self, body: bytes, ctype: str, key: str | None = None, auth: str | None = None, origin: str | None = None
    ) -> AnswerParts:
        headers = {"content-type": ctype}
        for name, value in (("idempotency-key", key), ("authorization", auth), ("origin", origin)):
            if value is not None:
                headers[name] = value
        r = await self.http.post("/v1/reports", content=body, headers=headers)
        own = (b"content-type", b"content-length")  # the native front adds these itself
        return r.status_code, r.content, [(k.lower(), v) for k, v in r.headers.raw if k.lower() not in own]

    async def both(
        self,
        body: bytes,
        ctype: str = FRAME_CONTENT_TYPE,
        *,
        key: str | None = None,
        auth: str | None = None,
        origin: str | None = None,
        early: bool = False,
    ) -> AnswerParts:
        """Send one upload to both apps; assert the answers are the same; the bridged one."""
        asgi = await self.via_asgi(body, ctype, key, auth, origin)
        ticket = self.front.put(body, ctype, key=key, authorization=auth, origin=origin)
        (bridged,) = await self.front.wait([ticket])
        status, content, headers = asgi
        if early:  # refused before its body was read: the ASGI path closes the connection, the front need not
            assert CLOSE in headers
            headers = [h for h in headers if h != CLOSE]
        assert CLOSE not in bridged[2]
        assert bridged == (status, content, headers), (asgi, bridged)
        return bridged

    def assert_same_counts(self) -> None:
        """The apps' Prometheus upload counters are equal, and both have no upload in flight."""
        assert _counters(self.asgi) == _counters(self.bridged)
        assert self.asgi.state.runtime["in_flight"] == self.bridged.state.runtime["in_flight"] == 0
        assert self.bridged.state.runtime["reading"] == 0


def _counters(app: CollectorApp) -> dict[str, float]:
    text = generate_latest(app.state.prometheus.registry).decode()
    keep = ("ldp_collector_batches_total{", "ldp_collector_reports_total{", "ldp_collector_upload_seconds_count")
    out = {}
    for line in text.splitlines():
        if line.startswith(keep):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    assert any(k.startswith("ldp_collector_batches_total{") for k in out), text
    return out


def twins(tmp_path: Path, metrics: MetricSet, **kw: Any) -> Twins:
    transports: list[Transport | None] = kw.pop("transports", [None, None])
    make = kw.pop("make_settings", settings)
    apps = [
        create_app(make(tmp_path, name, **kw), metrics=metrics, transport=tr)
        for name, tr in zip(("asgi", "bridged"), transports, strict=True)
    ]
    return Twins(*apps)


def _unknown_metric(metrics: MetricSet) -> bytes:
    good = olh_batch(metrics, 3)
    return encode_frame(ReportBatch("no_such_metric", good.spec, good.day, good.records))


def test_uploads_are_answered_as_the_asgi_app_answers(tmp_path: Path, metrics: MetricSet) -> None:
    async def scenario() -> None:
        async with twins(tmp_path, metrics).running() as t:
            batch = olh_batch(metrics, 10)
            frame = encode_frame(batch)
            ok = await t.both(frame, key=batch.batch_id.hex())
            assert ok[0] == 202 and json.loads(ok[1]) == {
                "status": "accepted",
                "batch_id": batch.batch_id.hex(),
                "reports": 10,
            }
            assert json.loads((await t.both(frame))[1])["status"] == "duplicate"
            other = encode_frame(olh_batch(metrics, 10, first_seed=50, batch_id=batch.batch_id))
            conflict = await t.both(other)
            assert conflict[0] == 409 and json.loads(conflict[1])["error"] == "batch_id_conflict"
            assert (
                json.loads((await t.both(b"hello", "text/plain", early=True))[1])["error"] == "unsupported_media_type"
            )
            unknown = await t.both(_unknown_metric(metrics))
            assert unknown[0] == 422 and json.loads(unknown[1])["error"] == "unknown_metric"
            old = metrics["old_metric"].spec
            expired = await t.both(
                encode_frame(ReportBatch("old_metric", old, batch.day, np.zeros(2, old.record_dtype)))
            )
            assert expired[0] == 422 and json.loads(expired[1])["error"] == "expired_metric"
            bad_crc = bytearray(encode_frame(olh_batch(metrics, 4)))
            bad_crc[-1] ^= 0xFF
            r = await t.both(bytes(bad_crc), "application/octet-stream; charset=x")
            assert r[0] == 400 and "crc" in json.loads(r[1])["message"].lower()
            r = await t.both(encode_frame(olh_batch(metrics, 3)), key="00" * 16)
            assert r[0] == 400 and json.loads(r[1])["error"] == "idempotency_key_mismatch"
            too_old = await t.both(encode_frame(olh_batch(metrics, 3, day=batch.day - 400)))
            assert too_old[0] == 422 and json.loads(too_old[1])["error"] == "bad_day"
            form = olh_batch(metrics, 3, first_seed=90)
            r = await t.both(encode_json(form).encode(), "application/json")
            assert r[0] == 202 and json.loads(r[1])["batch_id"] == form.batch_id.hex()
            t.assert_same_counts()

    asyncio.run(scenario())


def test_bodies_above_the_offload_sizes_take_the_task_path(tmp_path: Path, metrics: MetricSet) -> None:
    """Above ``offload_*_bytes`` a body is decoded off the loop (frames on a thread, JSON in a decode process)."""

    async def scenario() -> None:
        async with twins(tmp_path, metrics, offload_frame_bytes=64, offload_json_bytes=64).running() as t:
            big = olh_batch(metrics, 40)
            frame = encode_frame(big)
            assert len(frame) > 64
            assert (await t.both(frame))[0] == 202
            assert json.loads((await t.both(frame))[1])["status"] == "duplicate"
            bad = bytearray(frame)
            bad[-2] ^= 1
            assert (await t.both(bytes(bad)))[0] == 400
            form = olh_batch(metrics, 20, first_seed=500)
            assert (await t.both(encode_json(form).encode(), "application/json"))[0] == 202
            small = encode_frame(olh_batch(metrics, 1))
            assert len(small) <= 64  # decoded on the loop
            assert (await t.both(small))[0] == 202
            assert t.bridge.stats["offloaded"] == 4
            t.assert_same_counts()

    asyncio.run(scenario())


def _token_app_settings(tmp: Path, name: str, **kw: Any) -> CollectorSettings:
    """``--require-tokens`` settings (the token tests' issuer keys) with a log and stores of ``name``'s own."""
    return dataclasses.replace(
        token_settings(tmp, **kw),
        transport_url=f"sqlite:///{tmp}/{name}.log.sqlite3",
        dedup_path=str(tmp / f"{name}.ids"),
        spent_path=str(tmp / f"{name}.spent"),
    )


def test_token_answers_match_with_require_tokens(
    tmp_path: Path,
    issuer: ServerThread,  # noqa: F811
    authority: EnrollmentAuthority,  # noqa: F811
    metrics: MetricSet,
) -> None:
    """``--require-tokens``: each app has its own spent-token store, so one token can be played against both."""
    t1, t2 = token_client(issuer.url, authority.enroll("device-bridge")).fetch(2)

    async def scenario() -> None:
        async with twins(tmp_path, metrics, make_settings=_token_app_settings).running() as t:
            frame = encode_frame(olh_batch(metrics, 5))
            r = await t.both(frame, early=True)
            assert r[0] == 401 and json.loads(r[1])["error"] == "token_missing"
            forged = bytearray(t1.to_bytes())
            forged[-1] ^= 1
            r = await t.both(frame, auth=tokens.authorization_header(bytes(forged)), early=True)
            assert r[0] == 401 and json.loads(r[1])["error"] == "token_bad_signature"
            auth1, auth2 = tokens.authorization_header(t1), tokens.authorization_header(t2)
            assert (await t.both(frame, auth=auth1))[0] == 202
            assert json.loads((await t.both(frame, auth=auth1))[1])["status"] == "duplicate"
            r = await t.both(encode_frame(olh_batch(metrics, 5, first_seed=9)), auth=auth1)
            assert r[0] == 409 and json.loads(r[1])["error"] == "token_spent"
            r = await t.both(encode_frame(olh_batch(metrics, 6, first_seed=9)), auth=auth2)
            assert r[0] == 422 and json.loads(r[1])["error"] == "too_many_reports"
            t.assert_same_counts()

    asyncio.run(scenario())


def test_the_tokens_of_one_turn_are_spent_in_one_transaction_in_order(
    tmp_path: Path,
    issuer: ServerThread,  # noqa: F811
    authority: EnrollmentAuthority,  # noqa: F811
    metrics: MetricSet,
) -> None:
    """Uploads taken in one turn of the loop spend their tokens in one call of the store, in the order taken: a
    token paying for two batches in the same turn pays for the first only (409 ``token_spent`` for the second),
    a retry of the same batch with the same token in the same turn is not refused."""
    t1, t2 = token_client(issuer.url, authority.enroll("device-turn")).fetch(2)
    settings = _token_app_settings(tmp_path, "turn")

    async def scenario() -> None:
        app = create_app(settings, metrics_route=False)
        front = LoopbackFront()
        async with app.fastapi.router.lifespan_context(app.fastapi):
            bridge = FrontBridge.for_app(app)
            bridge.attach(front)
            store = app.upload.spent
            assert store is not None
            calls: list[int] = []
            real = store.spend_many

            def counted(spends: Any) -> list[bool]:
                calls.append(len(spends))
                return real(spends)

            store.spend_many = counted  # type: ignore[method-assign]
            a, b, c = (encode_frame(olh_batch(metrics, 3, first_seed=s)) for s in (1, 20, 40))
            auth1, auth2 = tokens.authorization_header(t1), tokens.authorization_header(t2)
            tickets = [
                front.put(a, FRAME_CONTENT_TYPE, authorization=auth1),
                front.put(b, FRAME_CONTENT_TYPE, authorization=auth1),  # the same token, another batch
                front.put(c, FRAME_CONTENT_TYPE, authorization=auth2),
                front.put(c, FRAME_CONTENT_TYPE, authorization=auth2),  # a retry of that upload
            ]
            answers = await front.wait(tickets)
            bridge.detach()
        got = [(status, json.loads(body).get("status") or json.loads(body).get("error")) for status, body, _ in answers]
        assert got[:3] == [(202, "accepted"), (409, "token_spent"), (202, "accepted")], got
        assert got[3][0] == 202, got
        assert calls == [4], calls  # one transaction for the turn's four spends
        front.close()

    asyncio.run(scenario())


def test_transport_down_is_503_with_retry_after(tmp_path: Path, metrics: MetricSet) -> None:
    outages = [OutageTransport(), OutageTransport()]
    for tr in outages:
        tr.outage.set()

    async def scenario() -> None:
        async with twins(tmp_path, metrics, transports=outages, retry_after=7).running() as t:
            async with asyncio.timeout(30):
                while any(app.state.runtime["ingestor"].down is None for app in (t.asgi, t.bridged)):
                    await asyncio.sleep(0.01)
            r = await t.both(encode_frame(olh_batch(metrics, 3)))
            assert r[0] == 503 and (b"retry-after", b"7") in r[2]
            assert json.loads(r[1])["error"] == "transport_unavailable"
            t.assert_same_counts()

    asyncio.run(scenario())


class _Unacknowledged(OutageTransport):
    """Answers its probe, but holds every publish while ``outage`` is set."""

    def health(self, topic: str | None = None, *, timeout: float = 2.0) -> Health:
        return Health(True, "up")


def test_a_publish_not_acknowledged_in_time_is_503_timeout_then_duplicate(tmp_path: Path, metrics: MetricSet) -> None:
    """The publish deadline settles a bridged upload's outcome as it does the ASGI path's (the bridge's uploads
    wait on a :class:`~collector.ingest.SettleCall`, not an asyncio future)."""
    slow = [_Unacknowledged(), _Unacknowledged()]

    async def scenario() -> None:
        async with twins(
            tmp_path, metrics, transports=slow, publish_timeout=0.3, probe_after=30.0, retry_after=3
        ).running() as t:
            frame = encode_frame(olh_batch(metrics, 4))
            for tr in slow:
                tr.outage.set()
            r = await t.both(frame)
            assert r[0] == 503 and (b"retry-after", b"3") in r[2]
            assert json.loads(r[1])["error"] == "timeout"
            for tr in slow:
                tr.outage.clear()
            async with asyncio.timeout(30):  # the held publishes go through; the retries are duplicates
                while any(len(tr.records) < 1 for tr in slow):
                    await asyncio.sleep(0.01)
            r = await t.both(frame)
            assert r[0] == 202 and json.loads(r[1])["status"] == "duplicate"
            t.assert_same_counts()
        assert [len(tr.records) for tr in slow] == [1, 1]

    asyncio.run(scenario())


def test_sealed_uploads_are_answered_as_the_asgi_app_answers(tmp_path: Path) -> None:
    """Sealed frames: the front's pre-check verifies each record's analyzer key id (the bridged app then skips
    that scan); every answer, refusals included, is the ASGI app's."""
    rng = np.random.default_rng(12)
    key = AnalyzerKey(bytes(rng.integers(0, 256, 32, dtype=np.uint8)))
    (tmp_path / "metrics.json").write_text(json.dumps(sealed_metrics_doc(key)))
    metrics = load_metrics(tmp_path / "metrics.json")
    plain = ReportBatch("m", SEALED_SPEC, TODAY, SEALED_SPEC.encode(rng.integers(0, 256, 40), rng))

    async def scenario() -> None:
        async with twins(tmp_path, metrics).running() as t:
            sealed = encode_frame(seal_batch(plain, key.public))
            assert t.front.precheck.check_frame(sealed)[-1] is True  # its key ids checked by the front
            ok = await t.both(sealed)
            assert (ok[0], json.loads(ok[1])["status"]) == (202, "accepted")
            other_key = seal_batch(plain, AnalyzerKey(bytes(32 * [7])).public)
            r = await t.both(encode_frame(other_key))
            assert (r[0], json.loads(r[1])["error"]) == (422, "unknown_analyzer_key")
            r = await t.both(encode_frame(seal_batch(ReportBatch("p", SEALED_SPEC, TODAY, plain.records), key.public)))
            assert (r[0], json.loads(r[1])["error"]) == (422, "not_sealed_metric")
            r = await t.both(encode_frame(plain))
            assert (r[0], json.loads(r[1])["error"]) == (422, "spec_mismatch")
            t.assert_same_counts()

    asyncio.run(scenario())


def test_cors_headers_are_the_asgi_apps(tmp_path: Path, metrics: MetricSet) -> None:
    async def scenario() -> None:
        async with twins(tmp_path, metrics, allow_origins=(APP,)).running() as t:
            allowed = await t.both(encode_frame(olh_batch(metrics, 2)), origin=APP)
            assert (b"access-control-allow-origin", APP.encode()) in allowed[2]
            refused = await t.both(encode_frame(olh_batch(metrics, 2)), origin=OTHER)
            assert refused[0] == 202 and (b"vary", b"Origin") in refused[2]
            assert not any(k.startswith(b"access-control-") for k, _ in refused[2])
            assert (await t.both(encode_frame(olh_batch(metrics, 2))))[2] == [(b"vary", b"Origin")]
            bad = await t.both(b"x", "text/plain", origin=APP, early=True)
            assert (b"access-control-allow-origin", APP.encode()) in bad[2]
            bad = await t.both(_unknown_metric(metrics), origin=OTHER)
            assert bad[0] == 422 and (b"vary", b"Origin") in bad[2]

    asyncio.run(scenario())


def test_many_uploads_are_answered_in_few_batches(tmp_path: Path, metrics: MetricSet) -> None:
    """64 uploads queued at once: taken in one wake-up, published in group commits, answered in a few
    ``answer_many`` calls (not 64); an answer whose client left is counted, not an error."""
    n = 64

    async def scenario() -> None:
        async with twins(tmp_path, metrics).running() as t:
            batches = [olh_batch(metrics, 3, first_seed=10 * i) for i in range(n)]
            tickets = [t.front.put(encode_frame(b), FRAME_CONTENT_TYPE) for b in batches]
            t.front.gone.add(tickets[5])
            answers = await t.front.wait(tickets)
            for batch, (status, body, headers) in zip(batches, answers, strict=True):
                assert status == 202 and headers == []
                assert json.loads(body) == {"status": "accepted", "batch_id": batch.batch_id.hex(), "reports": 3}
            assert t.bridge.stats["taken"] == n and sum(t.front.calls) == n
            assert len(t.front.calls) <= 4, t.front.calls
            assert t.bridge.stats["client_gone"] == 1
            assert t.bridged.state.runtime["in_flight"] == 0

    asyncio.run(scenario())


@pytest.mark.kafka
def test_an_answered_upload_leaves_no_garbage_cycle(tmp_path: Path, metrics: MetricSet, kafka_bootstrap: str) -> None:
    """Issue 31: each bridged upload's outcome (a ``SettleCall``) and its ``Pending`` referred to each other, a
    cycle per upload that only the cyclic GC reclaimed (about 5 objects per upload, 6 µs of its CPU under load).
    Answered, an upload leaves nothing for the cyclic GC: its objects go when their last reference does."""
    import gc

    from collector.http.upload import Pending
    from collector.ingest import SettleCall

    n = 32
    run = uuid.uuid4().hex[:8]

    def on_kafka(tmp: Path, name: str, **kw: Any) -> CollectorSettings:  # group commits on the loop, as deployed
        url, topic = f"kafka://{kafka_bootstrap}", f"ldp.test.gc.{run}.{name}"
        return dataclasses.replace(settings(tmp, name, **kw), transport_url=url, raw_topic=topic)

    async def scenario() -> None:
        async with twins(tmp_path, metrics, make_settings=on_kafka).running() as t:
            for round_ in range(2):
                bodies = [encode_frame(olh_batch(metrics, 3, first_seed=7 * i + 1000 * round_)) for i in range(n)]
                answers = await t.front.wait([t.front.put(b, FRAME_CONTENT_TYPE) for b in bodies])
                assert [a[0] for a in answers] == [202] * n

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable stays in gc.garbage
    try:
        asyncio.run(scenario())  # the apps stopped: nothing holds an upload's objects any more
        gc.collect()
        found = [type(o).__name__ for o in gc.garbage if isinstance(o, SettleCall | Pending)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert found == [], f"{len(found)} objects of {2 * n} uploads were reclaimed by the cyclic GC only"


def test_beyond_max_in_flight_is_503_overloaded(tmp_path: Path, metrics: MetricSet) -> None:
    """The bridge admits uploads against ``max_in_flight`` as the ASGI path does: with 20 taken at once and 8
    places, 8 are published and 12 answered 503 ``overloaded`` with ``Retry-After``, counted as such."""

    async def scenario() -> None:
        async with twins(tmp_path, metrics, max_in_flight=8, retry_after=3).running() as t:
            tickets = [t.front.put(encode_frame(olh_batch(metrics, 2)), FRAME_CONTENT_TYPE) for _ in range(20)]
            answers = await t.front.wait(tickets)
            assert [a[0] for a in answers] == [202] * 8 + [503] * 12
            assert all(
                json.loads(a[1])["error"] == "overloaded" and (b"retry-after", b"3") in a[2] for a in answers[8:]
            )
            counts = _counters(t.bridged)
            assert counts['ldp_collector_batches_total{outcome="unavailable",reason="overloaded"}'] == 12
            assert t.bridged.state.runtime["in_flight"] == 0

    asyncio.run(scenario())


def test_detached_bridge_takes_nothing(tmp_path: Path, metrics: MetricSet) -> None:
    async def scenario() -> None:
        async with twins(tmp_path, metrics).running() as t:
            t.bridge.detach()
            t.front.put(encode_frame(olh_batch(metrics, 2)), FRAME_CONTENT_TYPE)
            await asyncio.sleep(0.05)
            assert t.bridge.stats["taken"] == 0 and t.front.answers == {}

    asyncio.run(scenario())


def test_loopback_front_eventfd() -> None:
    """Sanity of the stand-in: its eventfd is readable while uploads wait and cleared once they are all taken."""
    import select

    front = LoopbackFront()
    try:
        fd = front.notify_fd()
        assert select.select([fd], [], [], 0)[0] == []
        front.put(b"a", "x")
        front.put(b"b", "x")
        assert select.select([fd], [], [], 0)[0] == [fd]
        assert [u[1] for u in front.take_nowait(1)] == [b"a"]
        assert select.select([fd], [], [], 0)[0] == [fd]
        assert [u[1] for u in front.take_nowait(5)] == [b"b"]
        t0 = time.monotonic()
        assert select.select([fd], [], [], 0.05)[0] == []
        assert time.monotonic() - t0 >= 0.04
    finally:
        front.close()
