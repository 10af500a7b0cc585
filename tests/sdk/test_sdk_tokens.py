"""The SDK pays each upload with an anonymous token: a real ``ldp issuer`` process and a real ``ldp collector
--require-tokens`` process (docs/TOKENS.md, "The SDK side").

Each test plays what would go wrong without the SDK's token handling: an upload without a token is refused
401 by the collector and dropped by the SDK, so ``invalid == 0`` on the collector is the check that nothing
left without one; a token of two days ago would be refused 401 ``token_expired`` the same way."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client_sdk.client import TelemetryClient
from client_sdk.config import ClientConfig, ClientConfigError
from client_sdk.outbox import Outbox
from client_sdk.policy import LocalPolicy
from client_sdk.store import SCHEMA_VERSION, Store
from client_sdk.upload.backoff import BackoffPolicy
from client_sdk.upload.token_wallet import TokenWallet
from client_sdk.upload.uploader import HttpRequest, HttpResponse, Uploader
from collector.issuer import IssuerSettings, create_issuer_app
from collector.spent_tokens import SpentTokens
from ldp_core.mechanisms.grr import GRRSpec
from ldp_core.tokens import privacy_pass as tokens
from ldp_core.tokens.enrollment import EnrollmentAuthority
from tests.support.collector_support import ServerThread
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]
ORIGIN = "sdk-token-tests"
METRICS = {
    "format": "ldp-metrics/1",
    "metrics": {
        "m": {
            "description": "token test metric",
            "owner": "sdk-tests@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "grr", "epsilon": 0.5},
            "domain": {"kind": "dictionary", "values": ["a", "b", "c", "d"]},
            "max_reports_per_day": 10,
        }
    },
}
SPEC = GRRSpec(epsilon=1.0, domain_size=4)
POLICY = LocalPolicy(per_metric_daily=5.0, total_daily=5.0)


def free_port() -> int:
    """A free port below the kernel's ephemeral range, so that no outgoing connection (Kafka clients open
    many) can take it while the issuer is stopped and restarted on it. Scanned from a start that depends on
    the process id, so parallel test workers do not contend for one port."""
    low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    start = 20_000 + (os.getpid() * 37) % 8_000
    for port in range(start, min(low, start + 4_000)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{start}, {min(low, start + 4_000)}) below the ephemeral range")


class IssuerProcess:
    """``ldp issuer serve`` on a fixed port (so that a restarted issuer is at the same URL)."""

    def __init__(self, state: Path, authority: Path, k: int, port: int) -> None:
        self.args = [
            sys.executable, "-m", "ldp_cli.main", "issuer", "serve", "--state", str(state),
            "--authority", str(authority), "--tokens-per-day", str(k), "--port", str(port),
        ]  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        assert "listening on" in line, (line, self.proc.stderr.read() if self.proc.stderr else "")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc.communicate()
        self.proc = None


@pytest.fixture
def setup(tmp_path: Path, collector_factory: Callable[..., Any]) -> Iterator[dict[str, Any]]:  # noqa: F811
    authority = EnrollmentAuthority.generate()
    authority.save(tmp_path / "authority.key")
    authority.enroll("device-1").save(tmp_path / "device-1.json")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    keys = [sys.executable, "-m", "ldp_cli.main", "issuer", "keys", "--state", str(tmp_path / "issuer"), "--days", "2"]
    subprocess.run(keys, check=True, env=env, cwd=ROOT, capture_output=True)  # the collector reads them at start
    issuer = IssuerProcess(tmp_path / "issuer", tmp_path / "authority.key", k=20, port=free_port())
    col = collector_factory(
        metrics=METRICS,
        require_tokens=True,
        token_keys=tmp_path / "issuer" / "public",
        token_origin=ORIGIN,
        spent_tokens=tmp_path / "spent.sqlite3",
    )
    yield {"issuer": issuer, "collector": col, "authority": authority, "dir": tmp_path}
    issuer.stop()


def config(s: dict[str, Any], **kw: Any) -> ClientConfig:
    base: dict[str, Any] = dict(
        issuer_url=s["issuer"].url,
        enrollment_path=str(s["dir"] / "device-1.json"),
        token_origin=ORIGIN,
        batch_max_age=3600.0,
        backoff=BackoffPolicy(base=0.05, max_delay=0.2),
    )
    base.update(kw)
    return ClientConfig(**base)


def spent(s: dict[str, Any]) -> list[tuple[bytes, str]]:
    store = SpentTokens(s["dir"] / "spent.sqlite3")
    try:
        return [(batch_id, day) for _, batch_id, day in store.records()]
    finally:
        store.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_each_upload_pays_with_one_token_fetched_off_the_app_thread(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    original = tokens.IssuerClient.fetch

    def fetch(self: tokens.IssuerClient, n: int, *, day: str | None = None) -> list[tokens.Token]:
        threads.append(threading.current_thread().name)
        return original(self, n, day=day)

    monkeypatch.setattr(tokens.IssuerClient, "fetch", fetch)
    col = setup["collector"]
    with TelemetryClient(setup["dir"] / "sdk", col.url, POLICY, METRICS, config(setup, token_stock=4)) as c:
        for i in range(6):
            c.record("m", "abcd"[i % 4])
            assert c.flush(30), (c.errors(), c.stats())
        stats = c.stats()
    st = col.stats()
    assert st["accepted"] == 6 and st["invalid"] == 0 and st["requests"] == 6
    rows = spent(setup)
    assert len(rows) == 6 and len({b for b, _ in rows}) == 6  # one token per batch, each batch its own
    assert stats["uploaded_batches"] == 6 and stats["tokens_fetched"] >= 6
    assert threads and set(threads) == {"ldp-uploader"}  # never the app's (this) thread


def test_uploads_go_on_while_the_issuer_is_down_then_wait_without_a_token(setup: dict[str, Any]) -> None:
    col, issuer = setup["collector"], setup["issuer"]
    with TelemetryClient(setup["dir"] / "sdk", col.url, POLICY, METRICS, config(setup, token_stock=3)) as c:
        wait_until(lambda: c.stats()["tokens_fetched"] >= 3)  # the stock, fetched in the background
        issuer.stop()
        for i in range(3):  # the stock pays for three uploads
            c.record("m", "abcd"[i])
            assert c.flush(30), (c.errors(), c.stats())
        assert col.stats()["accepted"] == 3
        c.record("m", "d")
        assert not c.flush(3)  # no token: the batch waits
        assert c.pending_reports() == 1
        errors = c.errors()
        assert errors["tokens_exhausted"] >= 1 and errors["token_fetch_failed"] >= 1
        st = col.stats()
        assert st["requests"] == 3 and st["invalid"] == 0  # nothing was sent without a token
        issuer.start()
        wait_until(lambda: c.flush(5), timeout=60)
        assert c.pending_reports() == 0
    st = col.stats()
    assert st["accepted"] == 4 and st["invalid"] == 0
    assert len(spent(setup)) == 4


def test_tokens_older_than_yesterday_are_dropped(setup: dict[str, Any]) -> None:
    """Tokens of two days ago (minted by the same issuer state with its clock two days back, so the collector
    knows their key) sit in the store; today the SDK drops them and fetches today's for today's batch. Sent,
    they would be refused 401 ``token_expired`` (and, being of another day than the batch, ``token_wrong_day``)."""
    now = time.time()
    yesterday = now - 2 * 86400.0  # the grace keeps yesterday's: two days back is the first day dropped
    settings = IssuerSettings(str(setup["dir"] / "issuer"), (setup["authority"].public_key,), tokens_per_day=20)
    store = Store(setup["dir"] / "sdk")
    ident = setup["authority"].enroll("device-1", now=yesterday - 60)  # the same device, a day back
    with ServerThread(create_issuer_app(settings, clock=lambda: yesterday)) as old:
        wallet = TokenWallet(
            store,
            tokens.IssuerClient(old.url, ident, origin=ORIGIN, clock=lambda: yesterday),
            stock=5,
            clock=lambda: yesterday,
        )
        assert wallet.refill() and wallet.available() == 5, wallet.last_error
    store.close()
    col = setup["collector"]
    with TelemetryClient(setup["dir"] / "sdk", col.url, POLICY, METRICS, config(setup, token_stock=2)) as c:
        c.record("m", "a")
        assert c.flush(30), (c.errors(), c.stats())
        stats = c.stats()
    assert stats["tokens_expired"] == 5 and stats["tokens_fetched"] >= 1
    st = col.stats()
    assert st["accepted"] == 1 and st["invalid"] == 0 and st["requests"] == 1
    ((_, day),) = spent(setup)
    assert day == time.strftime("%Y-%m-%d", time.gmtime(now))


def test_a_version_2_store_is_upgraded_in_place(tmp_path: Path) -> None:
    """A store written before tokens existed (schema 2, no ``tokens`` table) opens with its rows kept."""
    store = Store(tmp_path / "sdk")
    with store.transaction() as conn:
        Store.bump_counters(conn, {"uploaded_batches": 7})
        conn.execute("DROP TABLE tokens")
        conn.execute("PRAGMA user_version = 2")
    store.close()
    store = Store(tmp_path / "sdk")
    conn = store.connection()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.counters() == {"uploaded_batches": 7}
    assert conn.execute("SELECT COUNT(*) FROM tokens").fetchone()[0] == 0
    store.close()


# -- the uploader's token handling, against scripted answers --------------------------------------
class Scripted:
    def __init__(self, *statuses: tuple[int, bytes]) -> None:
        self.script = list(statuses)
        self.auth: list[str | None] = []

    def __call__(self, req: HttpRequest) -> HttpResponse:
        self.auth.append(dict(req.headers).get("Authorization"))
        status, body = self.script.pop(0)
        return HttpResponse(status, {}, body)


def uploader_with_stock(tmp_path: Path, n_tokens: int, *statuses: tuple[int, bytes]) -> tuple[Any, ...]:
    clock_t = [1_800_000_000.0]
    store = Store(tmp_path / "sdk")
    ident = EnrollmentAuthority.generate().enroll("device-u")
    nobody = tokens.IssuerClient("http://127.0.0.1:9", ident, origin=ORIGIN, timeout=2.0)  # nobody listens
    wallet = TokenWallet(store, nobody, stock=4, clock=lambda: clock_t[0], backoff=BackoffPolicy(1.0, 2.0))
    day = time.strftime("%Y-%m-%d", time.gmtime(clock_t[0]))
    with store.transaction() as conn:
        conn.executemany(
            "INSERT INTO tokens (token, day, batch_id, fetched) VALUES (?, ?, NULL, ?)",
            [(bytes([i]) * 354, day, float(i)) for i in range(n_tokens)],
        )
    ob = Outbox(store)
    recs = np.zeros(3, dtype=SPEC.record_dtype)
    ob.put("m", SPEC, int(clock_t[0] // 86400), recs, now=clock_t[0])
    transport = Scripted(*statuses)
    up = Uploader(ob, "http://collector.invalid/", transport=transport, clock=lambda: clock_t[0], max_age=0.0,
                  wallet=wallet)  # fmt: skip
    return up, ob, wallet, transport, clock_t


def test_a_retry_reuses_its_token_and_a_refused_token_is_replaced(tmp_path: Path) -> None:
    refused = b'{"error": "token_bad_signature", "message": "x"}'
    up, ob, wallet, transport, clock = uploader_with_stock(tmp_path, 3, (503, b""), (401, refused), (202, b""))
    assert up.upload_one() == "retry"  # 503: the same batch, with the same token, later
    clock[0] = up.blocked_until
    assert up.upload_one() == "retry"  # 401 token_*: the token is dropped, the batch kept
    assert ob.size() == 3 and wallet.take_tallies() == {"tokens_refused": 1}
    clock[0] = up.blocked_until
    assert up.upload_one() == "delivered"
    a, b, c = transport.auth
    assert a == b == tokens.authorization_header(bytes([0]) * 354)  # the retry after 503: the same token
    assert c == tokens.authorization_header(bytes([1]) * 354)  # after the refusal: the next one
    assert wallet.available() == 1 and ob.size() == 0  # the spent token is gone, one is left


def test_without_a_token_nothing_is_sent(tmp_path: Path) -> None:
    up, ob, wallet, transport, clock = uploader_with_stock(tmp_path, 0)
    assert up.upload_one() == "no_token" and up.token_waits == 1
    assert transport.auth == [] and ob.size() == 3  # no request at all; the batch waits
    assert up.blocked_until == wallet.next_fetch > clock[0]  # until the wallet may ask the issuer again
    assert wallet.take_tallies() == {"token_fetch_failed": 1}


def test_tokens_need_all_three_settings() -> None:
    with pytest.raises(ClientConfigError, match="together"):
        ClientConfig(issuer_url="https://issuer.example.org")
    with pytest.raises(ClientConfigError, match="plain http"):
        ClientConfig(issuer_url="http://issuer.example.org", enrollment_path="x.json", token_origin="c")
