"""CORS over real sockets: ``ldp collector`` and ``ldp issuer serve`` with ``--allow-origin``.

A browser page on another origin may call the collector only if the preflight answer names its origin,
method and headers; any other origin gets no ``Access-Control-Allow-Origin`` at all (so the browser hides
the answer), and every answer of those routes says ``Vary: Origin``. The headers asked for in the
preflights are exactly the web SDK's (sdk-web/src/client.ts, metrics.ts).
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.settings import CollectorSettings
from ldp_cli.main import build_parser
from ldp_core.tokens.enrollment import EnrollmentAuthority
from pipeline.errors import ConfigError
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)
from tests.web.test_web_browser import METRICS

ROOT = Path(__file__).resolve().parents[2]
APP = "http://127.0.0.1:20192"
OTHER = "http://127.0.0.1:20193"
SECOND = "https://app.example.com"
FRAME_TYPE = "application/vnd.ldp.frame"  # sdk-web/src/wire.ts FRAME_CONTENT_TYPE


def preflight(url: str, origin: str, method: str, headers: str | None) -> httpx.Response:
    h = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers is not None:
        h["Access-Control-Request-Headers"] = headers
    return httpx.request("OPTIONS", url, headers=h, timeout=10)


def assert_allowed(resp: httpx.Response, origin: str, method: str, headers: set[str]) -> None:
    assert resp.status_code == 204, resp.text
    assert resp.headers["access-control-allow-origin"] == origin
    assert method in {m.strip() for m in resp.headers["access-control-allow-methods"].split(",")}
    assert headers <= {h.strip().lower() for h in resp.headers["access-control-allow-headers"].split(",")}
    assert "origin" in resp.headers["vary"].lower()
    assert "access-control-allow-credentials" not in resp.headers  # the SDK sends none


def assert_refused(resp: httpx.Response) -> None:
    assert resp.status_code == 403
    assert resp.json()["error"] == "cors_refused"
    assert not any(k.startswith("access-control-allow") for k in resp.headers)
    assert "origin" in resp.headers["vary"].lower()


def test_collector_answers_preflights_for_the_listed_origins_only(collector_factory: Callable[..., Any]) -> None:  # noqa: F811
    c = collector_factory(metrics=METRICS, allow_origin=[APP, SECOND + "/"])
    for origin in (APP, SECOND):
        # the upload: the SDK's frame content type, batch id, and (with tokens) Authorization
        r = preflight(c.url + "/v1/reports", origin, "POST", "content-type,idempotency-key")
        assert_allowed(r, origin, "POST", {"content-type", "idempotency-key", "authorization"})
        r = preflight(c.url + "/v1/reports", origin, "POST", "Content-Type, Idempotency-Key, Authorization")
        assert_allowed(r, origin, "POST", {"authorization"})
        assert int(r.headers["access-control-max-age"]) > 0
        # the metrics document (fetchMetrics sends Accept only: no preflight, but a browser may still ask)
        assert_allowed(preflight(c.url + "/v1/metrics", origin, "GET", None), origin, "GET", set())
    assert_refused(preflight(c.url + "/v1/reports", OTHER, "POST", "content-type,idempotency-key"))
    assert_refused(preflight(c.url + "/v1/metrics", OTHER, "GET", None))
    assert_refused(preflight(c.url + "/v1/reports", "null", "POST", "content-type"))
    assert_refused(preflight(c.url + "/v1/reports", APP, "DELETE", None))
    assert_refused(preflight(c.url + "/v1/reports", APP, "POST", "content-type,x-custom"))


def test_collector_actual_answers_carry_the_origin_for_listed_origins_only(
    collector_factory: Callable[..., Any],
) -> None:  # noqa: F811
    c = collector_factory(metrics=METRICS, allow_origin=APP)
    ok = httpx.get(c.url + "/v1/metrics", headers={"Origin": APP}, timeout=10)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == APP
    assert "origin" in ok.headers["vary"].lower()
    # the SDK reads Retry-After (and the metrics ETag): a page can only see them if they are exposed
    assert {"retry-after", "etag"} <= {
        h.strip().lower() for h in ok.headers["access-control-expose-headers"].split(",")
    }
    other = httpx.get(c.url + "/v1/metrics", headers={"Origin": OTHER}, timeout=10)
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers
    assert "origin" in other.headers["vary"].lower()
    plain = httpx.get(c.url + "/v1/metrics", timeout=10)  # no Origin: a device, not a page
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers
    # the upload route, served outside FastAPI's stack: a bad body is answered, with CORS for the page
    bad = httpx.post(
        c.url + "/v1/reports",
        content=b"not a frame",
        headers={"Origin": APP, "Content-Type": FRAME_TYPE, "Idempotency-Key": "x" * 32},
        timeout=10,
    )
    assert 400 <= bad.status_code < 500 and bad.headers["access-control-allow-origin"] == APP
    assert "error" in bad.json()
    bad_other = httpx.post(c.url + "/v1/reports", content=b"x", headers={"Origin": OTHER, "Content-Type": FRAME_TYPE})
    assert "access-control-allow-origin" not in bad_other.headers and "origin" in bad_other.headers["vary"].lower()


def test_collector_without_the_flag_answers_no_cors(collector_factory: Callable[..., Any]) -> None:  # noqa: F811
    c = collector_factory(metrics=METRICS)
    r = preflight(c.url + "/v1/reports", APP, "POST", "content-type,idempotency-key")
    assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers
    ok = httpx.get(c.url + "/v1/metrics", headers={"Origin": APP}, timeout=10)
    assert "access-control-allow-origin" not in ok.headers


def test_star_allows_any_origin_only_when_listed(collector_factory: Callable[..., Any]) -> None:  # noqa: F811
    c = collector_factory(metrics=METRICS, allow_origin="*")
    r = preflight(c.url + "/v1/reports", OTHER, "POST", "content-type,idempotency-key,authorization")
    assert_allowed(r, "*", "POST", {"content-type", "idempotency-key", "authorization"})
    assert httpx.get(c.url + "/v1/metrics", headers={"Origin": OTHER}).headers["access-control-allow-origin"] == "*"


def test_allowed_origins_from_the_environment_and_bad_ones_refused() -> None:
    env = {"LDP_METRICS": "m.json", "LDP_COLLECTOR_ALLOW_ORIGINS": f" {APP}, HTTPS://App.Example.com/ ,"}
    assert CollectorSettings.from_env(env).allow_origins == (APP, SECOND)
    assert CollectorSettings.from_env(env, allow_origins=[OTHER]).allow_origins == (OTHER,)  # the flag wins
    s = CollectorSettings.from_env(env)
    assert CollectorSettings.from_json(s.to_json()) == s  # what --workers N hands its workers
    for bad in ("app.example.com", "https://app.example.com/path", "ftp://x", "https://u@x.com", "http://x:99999"):
        with pytest.raises(ConfigError, match="allow_origins"):
            CollectorSettings.from_env({"LDP_METRICS": "m.json", "LDP_COLLECTOR_ALLOW_ORIGINS": bad})
    args = build_parser().parse_args(["collector", "--allow-origin", APP, "--allow-origin", SECOND])
    assert args.allow_origins == [APP, SECOND]


def test_collector_refuses_to_start_with_a_bad_origin(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ldp_cli.main", "collector", "--metrics", "x.json", "--allow-origin", "example.com"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=60,
    )
    assert proc.returncode == 2 and "is not an origin" in proc.stderr


@pytest.fixture
def issuer_url(tmp_path: Path) -> Iterator[str]:
    key = base64.b64encode(EnrollmentAuthority.generate().public_key).decode()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_ISSUER_")}
    env.update(PYTHONPATH=str(ROOT), LDP_ISSUER_ALLOW_ORIGINS=f"{SECOND},{OTHER}")
    cmd = [sys.executable, "-m", "ldp_cli.main", "issuer", "serve", "--state", str(tmp_path / "iss")]
    cmd += ["--authority-key", key, "--port", "0", "--allow-origin", APP]  # the flag wins over the variable
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert found, f"the issuer did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_issuer_answers_cors_for_the_listed_origins_only(issuer_url: str) -> None:
    r = preflight(
        issuer_url + "/v1/token-requests", APP, "POST", "content-type,x-ldp-device-credential,x-ldp-device-signature"
    )
    assert_allowed(r, APP, "POST", {"content-type", "x-ldp-device-credential", "x-ldp-device-signature"})
    assert_allowed(preflight(issuer_url + "/v1/token-keys", APP, "GET", None), APP, "GET", set())
    for origin in (OTHER, SECOND):  # only in the environment, which the flag overrides
        assert_refused(preflight(issuer_url + "/v1/token-requests", origin, "POST", "content-type"))
    keys = httpx.get(issuer_url + "/v1/token-keys", headers={"Origin": APP}, timeout=30)
    assert keys.status_code == 200 and keys.headers["access-control-allow-origin"] == APP
    assert keys.json()["keys"]
    unsigned = httpx.post(issuer_url + "/v1/token-requests", content=b"{}", headers={"Origin": APP}, timeout=10)
    assert unsigned.status_code == 401 and unsigned.headers["access-control-allow-origin"] == APP
    other = httpx.get(issuer_url + "/v1/token-keys", headers={"Origin": OTHER}, timeout=10)
    assert "access-control-allow-origin" not in other.headers and "origin" in other.headers["vary"].lower()


def test_issuer_takes_its_origins_from_the_environment_without_the_flag(tmp_path: Path) -> None:
    key = base64.b64encode(EnrollmentAuthority.generate().public_key).decode()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_ISSUER_")}
    env.update(PYTHONPATH=str(ROOT), LDP_ISSUER_ALLOW_ORIGINS=f"{SECOND}, {OTHER}")
    cmd = [sys.executable, "-m", "ldp_cli.main", "issuer", "serve", "--state", str(tmp_path / "iss")]
    proc = subprocess.Popen([*cmd, "--authority-key", key, "--port", "0"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert found, line
        url = found.group(1)
        for origin in (SECOND, OTHER):
            assert_allowed(preflight(url + "/v1/token-keys", origin, "GET", "accept"), origin, "GET", {"accept"})
        assert_refused(preflight(url + "/v1/token-keys", APP, "GET", None))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        if proc.stdout:
            proc.stdout.close()
    bad = subprocess.run(
        [*cmd, "--authority-key", key, "--port", "0", "--allow-origin", "app.example.com"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2 and "is not an origin" in bad.stderr
