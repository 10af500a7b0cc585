"""The uploader: outcomes by status, Retry-After, full-jitter backoff, the urllib transport."""

from __future__ import annotations

import email.utils
import random
import socket
import time
import urllib.request

import numpy as np
import pytest

from client_sdk.outbox import Outbox
from client_sdk.store import Store
from client_sdk.upload.backoff import BackoffPolicy
from client_sdk.upload.uploader import HttpRequest, HttpResponse, Uploader, parse_retry_after, urllib_transport
from ldp_core.days import utc_day
from ldp_core.mechanisms.grr import GRRSpec
from ldp_core.metrics import parse_metrics
from ldp_core.wire.frames import decode_frame, read_header
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)

SPEC = GRRSpec(epsilon=1.0, domain_size=16)
T = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T

    def __call__(self) -> float:
        return self.t


class Scripted:
    """Answers each request with the next scripted response (or raises it)."""

    def __init__(self, *script: HttpResponse | Exception) -> None:
        self.script = list(script)
        self.requests: list[HttpRequest] = []

    def __call__(self, req: HttpRequest) -> HttpResponse:
        self.requests.append(req)
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def setup(tmp_path, *script, n: int = 3, **kw):
    store = Store(tmp_path)
    ob = Outbox(store)
    recs = np.zeros(n, dtype=SPEC.record_dtype)
    recs["value"] = np.arange(n) % 16
    ob.put("m", SPEC, 100, recs, now=T)
    clock = Clock()
    transport = Scripted(*script)
    up = Uploader(ob, "http://collector.invalid/", transport=transport, clock=clock, max_age=0.0, **kw)
    return up, ob, clock, transport


def ok() -> HttpResponse:
    return HttpResponse(202, {})


def test_delivered_on_2xx(tmp_path) -> None:
    up, ob, _, tr = setup(tmp_path, ok())
    assert up.upload_one() == "delivered"
    assert ob.size() == 0 and ob.store.counters()["uploaded_reports"] == 3
    req = tr.requests[0]
    assert req.method == "POST" and req.url == "http://collector.invalid/v1/reports"
    assert read_header(req.body).batch_id.hex() == req.headers["Idempotency-Key"]
    assert up.upload_one() == "idle"


def test_503_with_retry_after_is_honored_and_the_retry_reuses_the_batch(tmp_path) -> None:
    up, ob, clock, tr = setup(tmp_path, HttpResponse(503, {"Retry-After": "120"}), ok())
    assert up.upload_one() == "retry"
    assert T + 120 <= up.blocked_until <= T + 132  # at least what was asked, at most 10 % jitter
    clock.t = T + 119
    assert up.upload_one() == "idle" and len(tr.requests) == 1
    clock.t = up.blocked_until
    assert up.upload_one() == "delivered"
    first, second = tr.requests
    assert first.body == second.body and first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]
    assert ob.size() == 0


def test_429_and_http_date_retry_after(tmp_path) -> None:
    date = email.utils.formatdate(T + 600, usegmt=True)
    up, _, _, _ = setup(tmp_path, HttpResponse(429, {"retry-after": date}))
    assert up.upload_one() == "retry"
    assert T + 600 <= up.blocked_until <= T + 660
    assert parse_retry_after(date, T) == pytest.approx(600)
    assert parse_retry_after("soon", T) is None and parse_retry_after(None, T) is None


def test_retry_after_is_capped(tmp_path) -> None:
    up, _, _, _ = setup(tmp_path, HttpResponse(503, {"Retry-After": "999999"}), backoff=BackoffPolicy(1.0, 50.0))
    assert up.upload_one() == "retry"
    assert T + 50 <= up.blocked_until <= T + 55


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 413, 422])
def test_permanent_4xx_drops_and_counts(tmp_path, status: int) -> None:
    up, ob, _, _ = setup(tmp_path, HttpResponse(status, {}))
    assert up.upload_one() == "rejected"
    assert ob.size() == 0
    assert ob.store.counters() == {"upload_rejected_batches": 1, "upload_rejected_reports": 3}
    assert up.blocked_until == 0.0  # not a reason to back off


@pytest.mark.parametrize(
    "failure",
    [
        HttpResponse(500, {}),
        HttpResponse(502, {}),
        HttpResponse(408, {}),
        HttpResponse(301, {}),
        ConnectionRefusedError("refused"),
        TimeoutError("timed out"),
        OSError("unreachable"),
    ],
)
def test_transient_failures_keep_the_batch(tmp_path, failure) -> None:
    up, ob, clock, tr = setup(tmp_path, failure, ok())
    assert up.upload_one() == "retry"
    assert ob.size() == 3 and ob.pending_batches() == 1
    assert up.failures_total == 1 and T <= up.blocked_until <= T + 2.0  # first failure: U(0, 2 * base)
    clock.t = up.blocked_until
    assert up.upload_one() == "delivered"
    assert tr.requests[0].body == tr.requests[1].body


def test_409_means_already_accepted(tmp_path) -> None:
    up, ob, _, _ = setup(tmp_path, HttpResponse(409, {}))
    assert up.upload_one() == "delivered" and ob.size() == 0


def test_backoff_grows_then_resets(tmp_path) -> None:
    up, _, clock, _ = setup(
        tmp_path, *[HttpResponse(500, {})] * 6, ok(), HttpResponse(500, {}), n=2, backoff=BackoffPolicy(1.0, 20.0)
    )
    ceilings = []
    for k in range(1, 7):
        assert up.upload_one() == "retry"
        ceilings.append(min(20.0, 2.0**k))
        assert clock.t <= up.blocked_until <= clock.t + ceilings[-1]
        clock.t = up.blocked_until
    assert up.upload_one() == "delivered"
    # success resets the failure count: the next ceiling is 2 again
    up.outbox.put("m", SPEC, 100, np.zeros(1, dtype=SPEC.record_dtype), now=clock.t)
    assert up.upload_one() == "retry"
    assert up.blocked_until <= clock.t + 2.0


class _TopOfRange(random.Random):
    """A jitter source that always draws the top of the range: uniform(0, c) = c exactly."""

    def random(self) -> float:
        return 1.0 - 2.0**-53

    def uniform(self, a: float, b: float) -> float:
        return b


def test_backoff_sequence_is_pinned_growth_ceiling_reset(tmp_path) -> None:
    """With the jitter draw fixed at the top of its range the waits are the ceilings themselves:
    base·2^k (1 s base: 2, 4, 8, 16), then max_delay (20, 20), and after a success the count restarts
    (2 again). A backoff that never grows, never caps or never resets fails here."""
    up, _, clock, _ = setup(
        tmp_path,
        *[HttpResponse(500, {})] * 6,
        ok(),
        HttpResponse(500, {}),
        n=2,
        backoff=BackoffPolicy(1.0, 20.0),
        jitter_rng=_TopOfRange(),
    )
    waits = []
    for _ in range(6):
        assert up.upload_one() == "retry"
        waits.append(up.blocked_until - clock.t)
        clock.t = up.blocked_until
    assert waits == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0]
    assert up.upload_one() == "delivered"
    up.outbox.put("m", SPEC, 100, np.zeros(1, dtype=SPEC.record_dtype), now=clock.t)
    assert up.upload_one() == "retry"
    assert up.blocked_until - clock.t == 2.0


def test_full_jitter_distribution() -> None:
    """Full jitter: delay ~ U(0, c) with c = min(max, base 2^k). Over 20,000 draws the mean is
    c/2 with standard error c / sqrt(12 * 20000); we allow 5 standard errors. A wrong scheme
    (no jitter: always c; "equal jitter": U(c/2, c)) fails by far."""
    rng = random.Random(1234)
    pol = BackoffPolicy(base=0.5, max_delay=30.0)
    for k, c in [(1, 1.0), (3, 4.0), (6, 30.0), (200, 30.0)]:
        draws = np.array([pol.delay(k, rng) for _ in range(20_000)])
        assert draws.min() >= 0.0 and draws.max() <= c
        assert abs(draws.mean() - c / 2) < 5 * c / np.sqrt(12 * 20_000)
        assert np.quantile(draws, 0.1) < 0.15 * c  # mass near 0, as U(0, c) has
    with pytest.raises(ValueError):
        BackoffPolicy(base=0.0)


def m_metrics_doc() -> dict:
    """A metrics file declaring metric ``m`` under :data:`SPEC`."""
    return {
        "format": "ldp-metrics/1",
        "metrics": {
            "m": {
                "description": "uploader test metric",
                "owner": "sdk-tests@example.org",
                "expires": "2099-12-31",
                "mechanism": {"mechanism": "grr", "epsilon": SPEC.epsilon},
                "domain": {"kind": "dictionary", "values": list(range(SPEC.domain_size))},
                "max_reports_per_day": 100,
            }
        },
    }


def reading(url: str) -> float:
    """Uploads whose body the collector is reading."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return float(next(x for x in text.splitlines() if x.startswith("ldp_collector_uploads_reading ")).split()[1])


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_urllib_transport_against_the_real_collector(tmp_path, collector_factory) -> None:  # noqa: F811
    """The collector's own overload answer (503 + Retry-After): with ``--max-reading 1``, an upload
    stalled mid-body holds the only body-reading slot (uploads take a ``--max-in-flight`` slot only once
    their body is read); the SDK's upload is refused, then delivered once it is free. (``--min-body-rate 0``:
    by default the stalled upload, below the minimum rate, would give its slot to the SDK's.)"""
    assert parse_metrics(m_metrics_doc())["m"].spec.spec_id == SPEC.spec_id
    col = collector_factory(metrics=m_metrics_doc(), max_reading=1, min_body_rate=0, retry_after=7)
    host, port = col.url.removeprefix("http://").split(":")
    stalled = socket.create_connection((host, int(port)))
    stalled.sendall(
        b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/vnd.ldp.frame\r\n"
        b"Content-Length: 1000\r\n\r\n" + b"\0" * 10
    )
    wait_until(lambda: reading(col.metrics_url) == 1)
    store = Store(tmp_path / "sdk")
    ob = Outbox(store)
    now = time.time()
    recs = np.zeros(4, dtype=SPEC.record_dtype)
    recs["value"] = np.arange(4)
    ob.put("m", SPEC, utc_day(now), recs, now=now)
    clock = Clock()
    up = Uploader(ob, col.url, transport=urllib_transport, clock=clock, max_age=0.0)
    assert up.upload_one() == "retry" and up.last_status == 503
    assert clock.t + 7 <= up.blocked_until <= clock.t + 7.7
    stalled.close()  # the stalled upload ends (client disconnected) and frees the slot
    wait_until(lambda: reading(col.metrics_url) == 0)
    up.blocked_until = 0.0
    with store.transaction() as conn:
        conn.execute("UPDATE batches SET next_attempt = 0")
    assert up.upload_one() == "delivered" and ob.size() == 0
    stats = col.stats()
    assert (stats["accepted"], stats["failed"], stats["duplicates"]) == (1, 1, 0)
    assert stats["published"] == stats["stored"] == 1
    (frame,) = col.frames()
    assert decode_frame(frame, SPEC).records["value"].tolist() == [0, 1, 2, 3]
    resp = urllib_transport(HttpRequest("GET", col.url + "/nothing", None, {}, 5.0))
    assert resp.status == 404


def test_the_real_collectors_refusals_are_dropped_and_counted(tmp_path, collector_factory) -> None:  # noqa: F811
    """413 (body above ``--max-body-bytes``) and 422 (a metric the collector does not declare) are
    permanent: the SDK drops the batch, counts it, and does not back off; nothing is published."""
    col = collector_factory(metrics=m_metrics_doc(), max_body_bytes=200)
    store = Store(tmp_path / "sdk")
    ob = Outbox(store)
    now = time.time()
    up = Uploader(ob, col.url, transport=urllib_transport, clock=Clock(), max_age=0.0)
    ob.put("m", SPEC, utc_day(now), np.zeros(500, dtype=SPEC.record_dtype), now=now)  # 500 one-byte records
    assert up.upload_one() == "rejected" and up.last_status == 413
    ob.put("undeclared", SPEC, utc_day(now), np.zeros(3, dtype=SPEC.record_dtype), now=now)
    assert up.upload_one() == "rejected" and up.last_status == 422
    assert ob.size() == 0 and up.blocked_until == 0.0
    assert store.counters() == {"upload_rejected_batches": 2, "upload_rejected_reports": 503}
    recs = np.zeros(3, dtype=SPEC.record_dtype)
    recs["value"] = 1
    ob.put("m", SPEC, utc_day(now), recs, now=now)
    assert up.upload_one() == "delivered"
    stats = col.stats()
    assert (stats["invalid"], stats["accepted"], stats["published"]) == (2, 1, 1)
    (frame,) = col.frames()
    assert read_header(frame).metric == "m" and decode_frame(frame, SPEC).records["value"].tolist() == [1, 1, 1]


def test_urllib_transport_raises_oserror_when_nobody_listens() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    with pytest.raises(OSError):
        urllib_transport(HttpRequest("POST", f"http://127.0.0.1:{port}/v1/reports", b"x", {}, 5.0))


def test_upload_all_stops_at_a_transient_failure_and_releases_the_rest(tmp_path) -> None:
    up, ob, clock, tr = setup(tmp_path, ok(), HttpResponse(500, {}), ok(), ok(), ok(), n=12, batch_size=3)
    assert up.upload_all(force=True) == "retry"
    assert len(tr.requests) == 2 and ob.size() == 9  # one delivered, three batches still here
    clock.t = up.blocked_until
    assert up.upload_all() == "idle"  # released batches are due again; the failed one after its wait
    assert ob.size() == 0 and len(tr.requests) == 5
    assert tr.requests[1].body in [r.body for r in tr.requests[2:]]  # the failed batch, resent as it was
    assert len({r.headers["Idempotency-Key"] for r in tr.requests}) == 4
