"""``ldp collector --front native``: the real command, over sockets, with the native front on its port.

The front (``ldp_front``) must be installed (scripts/bootstrap builds it): these tests fail, not skip, without it.
What they check where the front meets the rest of the collector: the fast path's answers are the app's
(accepted, the app's own refusals), everything else reaches the app through the proxy, the operational metrics
count the front's work, a SIGTERM under load loses no upload answered 202 and stores no batch twice, and a
configuration the front cannot serve is a clear error.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import ldp_front  # noqa: F401  (fails loudly when the front is not built)

from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, decode_frame, encode_frame, encode_json
from pipeline.transport import open_transport
from tests.support.collector_support import olh_batch, start_collector_command, write_metrics

ROOT = Path(__file__).resolve().parents[2]
FRAME = {"content-type": FRAME_CONTENT_TYPE}


def start(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str, str]:
    """``ldp collector`` on a free port; its URL and its operational-metrics URL."""
    return start_collector_command(tmp_path, *flags, env=env)


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM; the command must exit 0. Its standard error."""
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.communicate()[1]


def raw_batches(tmp_path: Path, metrics: MetricSet) -> list[bytes]:
    """The batch ids of every record on the raw topic."""
    specs = {m.spec.spec_id: m.spec for m in metrics.values()}
    out = []
    with open_transport(f"sqlite:///{tmp_path}/log.sqlite3") as tr:
        with tr.consume("ldp.reports.raw", "check", session_timeout=2.0) as c:
            while got := c.poll(max_records=1000, timeout=0.3):
                out += [decode_frame(r.value, specs).batch_id for r in got]
    return out


def front_events(metrics_url: str) -> dict[str, float]:
    text = httpx.get(metrics_url, timeout=30).text
    found = re.findall(r'^ldp_collector_front_events_total\{event="(\w+)"\} (\S+)$', text, re.M)
    return {event: float(value) for event, value in found}


def test_the_native_front_serves_uploads_through_the_app_and_proxies_the_rest(tmp_path: Path) -> None:
    metrics = write_metrics(tmp_path / "metrics.json")
    proc, url, metrics_url = start(tmp_path, "--front", "native", env={"LDP_COLLECTOR_MAX_RECORDS": "500"})
    try:
        first = olh_batch(metrics, 500)
        r = httpx.post(url + "/v1/reports", content=encode_frame(first), headers=FRAME, timeout=30)
        assert r.status_code == 202 and r.json() == {
            "status": "accepted",
            "batch_id": first.batch_id.hex(),
            "reports": 500,
        }
        again = httpx.post(url + "/v1/reports", content=encode_frame(first), headers=FRAME, timeout=30)
        assert again.status_code == 202 and again.json()["status"] == "duplicate"
        # the app's own refusals, on the fast path: too many records (from the environment), a bad CRC
        big = httpx.post(url + "/v1/reports", content=encode_frame(olh_batch(metrics, 501)), headers=FRAME, timeout=30)
        assert big.status_code == 413 and big.json()["error"] == "too_many_records", big.text
        body = bytearray(encode_frame(olh_batch(metrics, 10, first_seed=900)))
        body[-1] ^= 1
        bad = httpx.post(url + "/v1/reports", content=bytes(body), headers=FRAME, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"] == "malformed"
        # not the fast path: the JSON form and another media type reach the app through the proxy
        js = olh_batch(metrics, 20, first_seed=1000)
        r = httpx.post(
            url + "/v1/reports", content=encode_json(js), headers={"content-type": "application/json"}, timeout=30
        )
        assert r.status_code == 202 and r.json()["status"] == "accepted", r.text
        r = httpx.post(url + "/v1/reports", content=b"x", headers={"content-type": "text/plain"}, timeout=30)
        assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type"
        doc = httpx.get(url + "/v1/metrics", timeout=30)
        assert doc.status_code == 200 and "emoji_used" in doc.json()["metrics"]
        assert httpx.get(url + "/readyz", timeout=30).status_code == 200
        assert httpx.get(url + "/metrics", timeout=30).status_code == 404  # operator data stays off this port
        events = front_events(metrics_url)
        assert events["uploads"] == 4, events  # the four frames; the JSON and text/plain ones were proxied
        assert events["prechecked"] == 3, events  # all but the bad CRC: Python decoded that one in full
        assert events["proxied"] >= 5, events
        assert events["proxy_timeouts"] == 0 and events["proxy_errors"] == 0, events  # exported, none happened
        text = httpx.get(metrics_url, timeout=30).text
        assert 'ldp_collector_batches_total{outcome="accepted",reason="ok"} 2.0' in text
    finally:
        stop(proc)
    assert sorted(raw_batches(tmp_path, metrics)) == sorted([first.batch_id, js.batch_id])


def test_sigterm_under_load_loses_no_accepted_upload_and_stores_none_twice(tmp_path: Path) -> None:
    """64 devices upload while the collector is stopped: each upload is answered 202 (and is then on the raw
    topic), or 503, or its connection fails (the device retries it later under the same batch id). Nothing
    answered 202 is missing, nothing is on the topic twice."""
    metrics = write_metrics(tmp_path / "metrics.json")
    proc, url, _ = start(tmp_path, "--front", "native")
    batches = [olh_batch(metrics, 50, first_seed=50 * i) for i in range(600)]
    accepted: set[bytes] = set()
    statuses: dict[str, int] = {}

    def device(part: list) -> None:  # type: ignore[type-arg]
        with httpx.Client(timeout=30) as client:
            for b in part:
                try:
                    r = client.post(url + "/v1/reports", content=encode_frame(b), headers=FRAME)
                except httpx.HTTPError:
                    statuses["connection"] = statuses.get("connection", 0) + 1
                    continue
                statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
                if r.status_code == 202:
                    accepted.add(b.batch_id)
                else:
                    assert r.status_code == 503, r.text

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        futures = [pool.submit(device, batches[i::64]) for i in range(64)]
        while len(accepted) < 100:
            assert not any(f.done() and f.exception() for f in futures), [f.exception() for f in futures if f.done()]
        stop(proc)
        for f in futures:
            f.result()
    stored = raw_batches(tmp_path, metrics)
    assert len(stored) == len(set(stored)), "a batch was stored twice"
    assert accepted <= set(stored), f"{len(accepted - set(stored))} uploads answered 202 are missing"
    assert len(accepted) < len(batches), f"the stop came after every upload: {statuses}"


def test_trickling_bodies_cannot_take_the_places_of_honest_uploads(tmp_path: Path) -> None:
    """The availability attack of tests/collector/test_app_exhaustion.py against the native front: 100 sockets
    each send an upload's head announcing 100 kB and 10 bytes of it, then nothing, with only 32 reading places
    (``--max-reading 32``). The front counts what bodies hold in bytes as they arrive (32 x max_body_bytes in
    all), so the 1,000 bytes they hold leave every honest upload its place: 30 of 30 are accepted while they
    trickle. (With a count of 32 bodies instead, the honest ones were refused 503 ``overloaded``.)"""
    import socket

    metrics = write_metrics(tmp_path / "metrics.json")
    proc, url, _ = start(tmp_path, "--front", "native", "--max-reading", "32")
    host, port = url.removeprefix("http://").rsplit(":", 1)
    tricklers = []
    try:
        for _ in range(100):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(
                f"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: {FRAME_CONTENT_TYPE}\r\n"
                "Content-Length: 100000\r\n\r\n".encode()
                + b"0123456789"
            )
            tricklers.append(s)
        statuses = [
            httpx.post(
                url + "/v1/reports",
                content=encode_frame(olh_batch(metrics, 20, first_seed=20 * i)),
                headers=FRAME,
                timeout=30,
            ).status_code
            for i in range(30)
        ]
        assert statuses == [202] * 30, statuses
    finally:
        for s in tricklers:
            s.close()
        stop(proc)
    assert len(raw_batches(tmp_path, metrics)) == 30


def test_the_front_is_chosen_from_the_environment_and_refuses_what_it_cannot_serve(tmp_path: Path) -> None:
    write_metrics(tmp_path / "metrics.json")
    proc, url, metrics_url = start(tmp_path, env={"LDP_COLLECTOR_FRONT": "native"})
    try:
        assert httpx.get(url + "/readyz", timeout=30).status_code == 200
        assert front_events(metrics_url)["proxied"] == 1  # the native front answered it
    finally:
        stop(proc)
    base = [sys.executable, "-m", "ldp_cli.main", "collector", "--metrics", str(tmp_path / "metrics.json")]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([*base, "--front", "native", "--workers", "2"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "--front native serves one worker" in out.stderr, out.stderr
    out = subprocess.run(base, capture_output=True, text=True, env=dict(env, LDP_COLLECTOR_FRONT="rust"))
    assert out.returncode == 2 and "front must be python or native" in out.stderr, out.stderr
    # a machine without the front: a clear error, before anything listens
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "ldp_front.py").write_text("raise ImportError('not built here')\n")
    out = subprocess.run(
        [*base, "--front", "native", "--port", "0"],
        capture_output=True,
        text=True,
        env=dict(env, PYTHONPATH=f"{shadow}{os.pathsep}{ROOT}"),
        timeout=60,
    )
    assert out.returncode == 2 and "scripts/build-front" in out.stderr, out.stderr
    assert "listening" not in out.stdout
