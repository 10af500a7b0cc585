"""FLDevice's HTTP: the SDK uploader's transport, backoff and ``Retry-After`` parsing.

The device's rounds end to end are in tests/fl/test_fl_pipeline.py; here a scripted
:data:`~client_sdk.upload.uploader.HttpTransport` checks what is retried, how long the device waits and what
reaches the transport.
"""

from __future__ import annotations

import email.utils
import json
import random
from collections.abc import Iterator

import numpy as np
import pytest

from client_sdk.fl.device import MAX_RETRY_WAIT, FLDevice
from client_sdk.upload import uploader
from client_sdk.upload.backoff import BackoffPolicy
from client_sdk.upload.uploader import USER_AGENT, HttpRequest, HttpResponse, HttpTransport
from client_sdk.urls import ClientConfigError

NOW = 1_700_000_000.0


class Script:
    """A transport answering from a list (an exception instance is raised), recording every request."""

    def __init__(self, answers: list[HttpResponse | Exception]) -> None:
        self.answers: Iterator[HttpResponse | Exception] = iter(answers)
        self.requests: list[HttpRequest] = []

    def __call__(self, request: HttpRequest) -> HttpResponse:
        self.requests.append(request)
        answer = next(self.answers)
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(body: object, status: int = 200) -> HttpResponse:
    return HttpResponse(status, {"Content-Type": "application/json"}, json.dumps(body).encode())


def device(transport: HttpTransport, sleeps: list[float], **kw: object) -> FLDevice:
    X, y = np.zeros((4, 2)), np.zeros(4, dtype=np.int64)
    return FLDevice(
        "http://127.0.0.1:8/",
        "task/1",
        "c1",
        X,
        y,
        transport=transport,
        sleep=sleeps.append,
        clock=lambda: NOW,
        **kw,
    )  # type: ignore[arg-type]


def test_requests_go_through_the_transport_with_the_sdk_headers() -> None:
    script, sleeps = Script([ok({"phase": "done", "round": 3})]), []
    d = device(script, sleeps, timeout=7.0)
    assert d.fetch() == {"phase": "done", "round": 3}
    (req,) = script.requests
    assert req.method == "GET" and req.body is None and req.timeout == 7.0
    assert req.url == "http://127.0.0.1:8/v1/fl/tasks/task%2F1/round?client_id=c1"
    assert req.headers["User-Agent"] == USER_AGENT and req.headers["Accept"] == "application/json"
    assert sleeps == [] and d.retries == 0


def test_network_errors_and_5xx_are_retried_with_full_jitter_backoff() -> None:
    answers: list[HttpResponse | Exception] = [
        ConnectionRefusedError("refused"),
        ok({"error": "x"}, 503),
        TimeoutError("slow"),
        ok({"phase": "done"}),
    ]
    script, sleeps = Script(answers), []
    d = device(script, sleeps, backoff=0.5)
    assert d.fetch() == {"phase": "done"}
    assert len(script.requests) == 4 and d.retries == 3
    for k, wait in enumerate(sleeps):  # the k-th retry waits U(0, base * 2**k), as BackoffPolicy.delay(k)
        assert 0.0 <= wait <= 0.5 * 2**k
    assert isinstance(d.backoff, BackoffPolicy) and d.backoff.max_delay == MAX_RETRY_WAIT


def test_retry_after_in_seconds_or_as_an_http_date_is_honoured_and_capped() -> None:
    date = email.utils.formatdate(NOW + 3, usegmt=True)
    answers: list[HttpResponse | Exception] = [
        HttpResponse(429, {"Retry-After": "2"}),
        HttpResponse(503, {"retry-after": date}),
        HttpResponse(503, {"Retry-After": "3600"}),
        ok({"phase": "done"}),
    ]
    sleeps: list[float] = []
    d = device(Script(answers), sleeps)
    assert d.fetch() == {"phase": "done"}
    assert 2.0 <= sleeps[0] <= 2.2
    assert 3.0 <= sleeps[1] <= 3.3
    assert MAX_RETRY_WAIT <= sleeps[2] <= MAX_RETRY_WAIT * 1.1  # asked for an hour: capped


def test_4xx_is_not_retried_and_counted_by_its_reason() -> None:
    script, sleeps = Script([ok({"error": "not_selected", "message": "no"}, 403)]), []
    d = device(script, sleeps)
    assert d._upload(0, "update", {"vector": np.zeros(3, np.float32), "num_examples": 1}) is False
    assert d.errors["not_selected"] == 1 and sleeps == [] and len(script.requests) == 1
    req = script.requests[0]
    assert req.method == "POST" and req.url.endswith("/v1/fl/tasks/task%2F1/uploads")
    assert req.headers["Content-Type"] == "application/vnd.ldp.fl-upload" and req.body


def test_giving_up_returns_the_last_answer() -> None:
    sleeps: list[float] = []
    d = device(Script([OSError("down")] * 3), sleeps, max_attempts=3)
    assert d.fetch() is None and d.errors["fetch_0"] == 1 and len(sleeps) == 2
    d = device(Script([HttpResponse(502, {}, b"<html>")] * 2), sleeps, max_attempts=2)
    assert d.fetch() is None and d.errors["fetch_502"] == 1


def test_a_backoff_policy_can_be_given_whole() -> None:
    policy = BackoffPolicy(base=0.01, max_delay=0.02)
    sleeps: list[float] = []
    d = device(Script([HttpResponse(500, {})] * 6), sleeps, backoff=policy)
    d._jitter = random.Random(1)
    d.fetch()
    assert d.backoff is policy and len(sleeps) == 5 and max(sleeps) <= 0.02


def test_the_http_transport_has_one_name() -> None:
    assert not hasattr(uploader, "Transport")
    assert "Transport" not in uploader.__all__ and "HttpTransport" in uploader.__all__


@pytest.mark.parametrize("url", ["http://collector.example.org", "http://10.1.2.3:8080", "http://127.example.org"])
def test_plain_http_off_loopback_is_refused(url: str) -> None:
    """A network observer on a plain-http path reads every update and round view (and can change the view):
    the device refuses such a URL when made, before anything is sent, as the telemetry client does."""
    script = Script([ok({"phase": "done", "round": 3})])
    X, y = np.zeros((4, 2)), np.zeros(4, dtype=np.int64)
    with pytest.raises(ClientConfigError, match="https"):
        dev = FLDevice(url, "task/1", "c1", X, y, transport=script, sleep=lambda s: None)
        dev.fetch()  # what an observer on the path would read, if the device were made
    assert script.requests == []


@pytest.mark.parametrize(
    "url", ["https://collector.example.org", "http://127.0.0.1:8080", "http://[::1]:9", "http://localhost:8080"]
)
def test_https_and_loopback_http_are_accepted(url: str) -> None:
    script = Script([ok({"phase": "done", "round": 3})])
    X, y = np.zeros((4, 2)), np.zeros(4, dtype=np.int64)
    FLDevice(url, "task/1", "c1", X, y, transport=script, sleep=lambda s: None).fetch()
    assert script.requests[0].url.startswith(url.rstrip("/") + "/v1/fl/tasks/task%2F1/round")
