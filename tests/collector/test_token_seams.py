"""Issue 28, "Anonymous tokens must be anonymous and must bound what they claim": the attacks, played over HTTP
against a real ``ldp issuer`` app and a real collector app (uvicorn on 127.0.0.1), with the real device code.

* One install stockpiling several days' tokens for one metric-day gets at most K batches into it.
* An issuer that makes a fresh key per request (to link each upload to its device) links none: the device
  refuses a key the collector does not list, and the collector refuses a day with several keys.
* A token spent at one collector process is refused at another sharing the spent-token store (in
  tests/collector/test_tokens.py, beside the race of the same two processes).
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from client_sdk.client import TelemetryClient
from client_sdk.config import ClientConfig
from client_sdk.policy import LocalPolicy
from client_sdk.upload.backoff import BackoffPolicy
from collector.http.app import create_app
from collector.issuer import IssuerKeys, IssuerSettings, create_issuer_app
from collector.settings import CollectorSettings
from collector.spent_tokens import SpentTokens
from ldp_core.days import iso_day, utc_day
from ldp_core.metrics import MetricSet
from ldp_core.tokens import privacy_pass as tokens
from ldp_core.tokens.enrollment import EnrollmentAuthority
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, encode_frame
from tests.support.collector_support import ServerThread, olh_batch, write_metrics

K = 3
R = 5  # emoji_used's max_reports_per_day in these metrics: each paid batch holds at most R reports
ORIGIN = "seams-collector"
DAY0 = (int(time.time()) // 86400) * 86400 + 3 * 3600  # 03:00 UTC today: the injected clocks start here


@pytest.fixture(scope="module")
def authority() -> EnrollmentAuthority:
    return EnrollmentAuthority.generate()


def collector_settings(tmp_path: Path, keys: Path) -> CollectorSettings:
    return CollectorSettings(
        metrics_path=str(tmp_path / "metrics.json"),
        transport_url=f"sqlite:///{tmp_path}/log.sqlite3",
        dedup_path=str(tmp_path / "ids.sqlite3"),
        raw_partitions=1,
        require_tokens=True,
        token_keys=str(keys),
        token_origin=ORIGIN,
        spent_path=str(tmp_path / "spent.sqlite3"),
    )


def post(url: str, body: bytes, token: tokens.Token) -> httpx.Response:
    headers = {"content-type": FRAME_CONTENT_TYPE, "authorization": tokens.authorization_header(token)}
    return httpx.post(url + "/v1/reports", content=body, headers=headers, timeout=30)


# -- 1. the bound is per metric-day ------------------------------------------------------------------
def test_one_install_puts_at_most_k_batches_into_one_metric_day(tmp_path: Path, authority: EnrollmentAuthority) -> None:
    """The attacker (one enrolled install, the real IssuerClient) lives through 6 days of an injected clock
    shared by the issuer and the collector. Every day it asks for all the tokens it can get, of the target
    day (the grace) and of the day itself, and spends each on a batch of R reports dated the target day
    (the collector admits batch days back to today - 31). On the code before the fix, 6 x K = 18 batches
    (90 reports) got into the target metric-day; now K (15 reports = K x r): tokens of other days are
    refused 401 token_wrong_day, and the issuer signs no more than K of the target day."""
    metrics: MetricSet = write_metrics(tmp_path / "metrics.json", emoji_reports_per_day=R)
    now = [DAY0]
    clock = lambda: float(now[0])  # noqa: E731
    target = utc_day(DAY0)
    settings = IssuerSettings(str(tmp_path / "issuer"), (authority.public_key,), tokens_per_day=K)
    ident = authority.enroll("attacker", now=DAY0 - 60)
    accepted, refusals, issuer_refusals = 0, {}, {}  # type: ignore[var-annotated]
    for d in range(-1, 8):  # made ahead, as `ldp issuer keys --days N` does (the collector reads them at start)
        IssuerKeys(settings.state_dir, bits=settings.key_bits).key(iso_day(target + d))
    with (
        ServerThread(create_issuer_app(settings, clock=clock)) as issuer,
        ServerThread(create_app(collector_settings(tmp_path, tmp_path / "issuer" / "public"), clock=clock)) as col,
    ):
        seed = 0
        for d in range(6):
            now[0] = DAY0 + d * 86400
            cli = tokens.IssuerClient(issuer.url, ident, origin=ORIGIN, clock=clock)
            got: list[tokens.Token] = []
            for day in dict.fromkeys((iso_day(target), iso_day(target + d))):
                try:
                    got += cli.fetch(K, day=day)
                except tokens.TokenError as exc:
                    issuer_refusals[exc.reason] = issuer_refusals.get(exc.reason, 0) + 1
            for tok in got:
                r = post(col.url, encode_frame(olh_batch(metrics, R, first_seed=seed, day=target)), tok)
                seed += R
                if r.status_code == 202:
                    accepted += 1
                else:
                    refusals[r.json()["error"]] = refusals.get(r.json()["error"], 0) + 1
    print(f"accepted into the target metric-day: {accepted} batches, {accepted * R} reports; refused {refusals}")
    assert accepted <= K, (accepted, refusals)
    assert accepted == K  # the honest part of the bound: the install's own K of that day still count
    assert refusals.get("token_wrong_day", 0) == 5 * K, refusals  # each later day's K, refused
    assert issuer_refusals.get("limit", 0) >= 1  # the target day's K, already issued


def test_a_late_batch_is_paid_with_a_token_of_its_own_day(tmp_path: Path, authority: EnrollmentAuthority) -> None:
    """The grace, through the real SDK: a batch recorded just before midnight and uploaded after it takes a
    token of its own day (yesterday by then), fetched on demand, and is accepted; a batch two days old can no
    longer be paid and is dropped (counted), never sent."""
    write_metrics(tmp_path / "metrics.json", emoji_reports_per_day=R)
    now = [DAY0]
    clock = lambda: float(now[0])  # noqa: E731
    settings = IssuerSettings(str(tmp_path / "issuer"), (authority.public_key,), tokens_per_day=K)
    ident = authority.enroll("late-device", now=DAY0 - 60)
    ident.save(tmp_path / "device.json")
    metrics_doc = json.loads((tmp_path / "metrics.json").read_text())
    with (
        ServerThread(create_issuer_app(settings, clock=clock)) as issuer,
        ServerThread(create_app(collector_settings(tmp_path, tmp_path / "issuer" / "public"), clock=clock)) as col,
    ):
        cfg = ClientConfig(
            issuer_url=issuer.url,
            enrollment_path=str(tmp_path / "device.json"),
            token_origin=ORIGIN,
            clock=clock,
            backoff=BackoffPolicy(base=0.05, max_delay=0.2),
        )
        policy = LocalPolicy(per_metric_daily=50.0, total_daily=50.0)
        with TelemetryClient(tmp_path / "sdk", None, policy, metrics_doc, ClientConfig(upload=False, clock=clock)) as c:
            c.record("settings_tab", "a")  # recorded on day 0, not uploaded
            assert c.flush(30)
        now[0] = DAY0 + 86400  # the next day: the batch of day 0 is late
        with TelemetryClient(tmp_path / "sdk", col.url, policy, metrics_doc, cfg) as c:
            assert c.flush(30), _nonzero(c)
            stats, errors = c.stats(), c.errors()
        assert stats["uploaded_batches"] == 1 and errors["upload_rejected_batches"] == 0, (stats, errors)
        spent = [r[0] for r in _spent_days(tmp_path)]
        assert spent == [iso_day(utc_day(DAY0))], spent  # paid with a token of day 0
        with TelemetryClient(tmp_path / "sdk", None, policy, metrics_doc, ClientConfig(upload=False, clock=clock)) as c:
            c.record("settings_tab", "b")  # recorded on day 1 ...
            assert c.flush(30)
        now[0] = DAY0 + 3 * 86400  # ... uploaded on day 3: too late to be paid
        with TelemetryClient(tmp_path / "sdk", col.url, policy, metrics_doc, cfg) as c:
            assert c.flush(30), _nonzero(c)
            errors = c.errors()
        assert errors["upload_rejected_batches"] == 1 and errors["tokens_refused"] == 0, errors
        assert len(_spent_days(tmp_path)) == 1  # nothing more was sent


def _spent_days(tmp_path: Path) -> list[tuple[str]]:
    store = SpentTokens(tmp_path / "spent.sqlite3")
    try:
        return [(day,) for _, _, day in store.records()]
    finally:
        store.close()


# -- 2. key consistency ---------------------------------------------------------------------------------
class PerRequestKeyIssuer:
    """A hostile issuer: every ``GET /v1/token-keys`` is answered by a fresh real issuer app (a new state
    folder, so new day keys), whose public halves it also writes into the collector's key folder; a token
    request goes to the app whose key it names. Each device thus gets its own key, and each token redeemed
    names the device it was issued to."""

    def __init__(self, tmp: Path, authority: EnrollmentAuthority, collector_keys: Path) -> None:
        self.tmp, self.authority, self.collector_keys = tmp, authority, collector_keys
        self.apps: list[Any] = []
        self.key_owner: dict[bytes, int] = {}  # token_key_id -> the index of the request it was made for
        self._by_last_byte: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _fresh(self) -> Any:
        with self._lock:
            i = len(self.apps)
            state = self.tmp / f"evil-{i}"
            app = create_issuer_app(IssuerSettings(str(state), (self.authority.public_key,), tokens_per_day=K))
            self.apps.append(app)
            return app, i, state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.apps[0](scope, receive, send) if self.apps else None
        if scope["path"] == "/v1/token-keys":
            app, i, state = self._fresh()
            await app(scope, receive, send)  # makes its day keys
            for pub in (state / "public").glob("token-key-*.json"):
                entry = json.loads(pub.read_text())
                kid = bytes.fromhex(entry["token_key_id"])
                self.key_owner[kid] = i
                self._by_last_byte[kid[-1]] = app
                shutil.copy(pub, self.collector_keys / f"{pub.stem}-{i}.json")
            return None
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        req = json.loads(body)["requests"][0]
        truncated = base64.urlsafe_b64decode(req + "=" * (-len(req) % 4))[2]
        app = self._by_last_byte[truncated]
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, replay, send)
        return None


class RecordingCollector:
    """The real collector app, with what an observer at the collector sees of each upload: the token's key id
    and the answer's status (the operator runs the collector, so it sees this)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.uploads: list[tuple[bytes, int]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/reports":
            return await self.app(scope, receive, send)  # type: ignore[no-any-return]
        auth = dict(scope["headers"]).get(b"authorization", b"").decode()
        try:
            kid = tokens.Token.from_bytes(tokens.parse_authorization(auth)).token_key_id
        except tokens.TokenError:
            kid = b""

        async def watch(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                self.uploads.append((kid, int(msg["status"])))
            await send(msg)

        return await self.app(scope, receive, watch)  # type: ignore[no-any-return]


@pytest.fixture
def metrics_doc(tmp_path: Path) -> dict[str, Any]:
    write_metrics(tmp_path / "metrics.json", emoji_reports_per_day=R)
    return json.loads((tmp_path / "metrics.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("published_first", [True, False], ids=["key-published-first", "nothing-published"])
def test_a_per_request_key_links_no_upload(
    tmp_path: Path, authority: EnrollmentAuthority, metrics_doc: dict[str, Any], published_first: bool
) -> None:
    """10 real SDK devices (TelemetryClient with tokens) against the per-request-key issuer and a real
    collector, one after the other. On the code before the fix, 10 of 10 uploads were accepted, each under its
    device's own key: 10 of 10 linkable. Now a device finds the issuer's key missing from the collector's
    GET /v1/token-keys (the collector refuses a day for which its folder holds several keys), counts
    token_key_inconsistent and asks for no token.

    ``key-published-first``: the day's key was on disk before the devices came (as in docker-compose.yml,
    where the collector starts once the issuer's /readyz has written today's key): 0 of 10 linkable.
    ``nothing-published``: the hostile issuer publishes nothing until the first victim asks; that victim's
    key is, for a moment, the day's only one, so its upload is accepted and linkable: at most 1 of 10 (the
    residual in docs/PRIVACY.md), and none once a second key exists."""
    keys = tmp_path / "collector-keys"
    keys.mkdir()
    evil = PerRequestKeyIssuer(tmp_path, authority, keys)
    policy = LocalPolicy(per_metric_daily=50.0, total_daily=50.0)
    recording = RecordingCollector(create_app(collector_settings(tmp_path, keys)))
    errors = []
    with ServerThread(evil) as issuer, ServerThread(recording) as col:
        if published_first:
            assert httpx.get(issuer.url + "/v1/token-keys").status_code == 200  # e.g. the readiness probe's
        for i in range(10):
            authority.enroll(f"victim-{i}").save(tmp_path / f"victim-{i}.json")
            cfg = ClientConfig(
                issuer_url=issuer.url,
                enrollment_path=str(tmp_path / f"victim-{i}.json"),
                token_origin=ORIGIN,
                batch_max_age=0.0,
                backoff=BackoffPolicy(base=0.05, max_delay=0.2),
            )
            with TelemetryClient(tmp_path / f"sdk-{i}", col.url, policy, metrics_doc, cfg) as c:
                c.record("settings_tab", "abcd"[i % 4])
                delivered, deadline = False, time.monotonic() + 20
                while not delivered and not c.errors().get("token_key_inconsistent") and time.monotonic() < deadline:
                    delivered = c.flush(0.2)
                errors.append((delivered, _nonzero(c)))
    accepted = [kid for kid, status in recording.uploads if status == 202]
    linked = {evil.key_owner[kid] for kid in accepted if kid in evil.key_owner}
    print(
        f"[{'published first' if published_first else 'nothing published'}] uploads sent {len(recording.uploads)},"
        f" accepted {len(accepted)}, linkable to one device {len(linked)} of 10; per-request keys {len(evil.apps)}"
    )
    refused = [e for ok, e in errors if not ok and e.get("token_key_inconsistent", 0) >= 1]
    if published_first:
        assert len(linked) == 0 and accepted == [], recording.uploads
        assert len(refused) == 10, errors
    else:
        assert linked <= {0} and len(accepted) <= 1, recording.uploads  # only the first victim, if any
        assert len(refused) >= 9, errors
    assert len(evil.apps) >= 10  # the issuer did hand out its per-request keys


def test_a_day_with_two_keys_is_refused_whole(tmp_path: Path, authority: EnrollmentAuthority) -> None:
    """The collector's side alone: its key folder holds two keys for today (the issuer's and a second one).
    Neither is listed by GET /v1/token-keys, a token under either is refused 401 token_unknown_key, and the
    refused day is counted once in the collector's metrics."""
    metrics: MetricSet = write_metrics(tmp_path / "metrics.json", emoji_reports_per_day=R)
    keys = tmp_path / "collector-keys"
    keys.mkdir()
    toks: list[tokens.Token] = []
    for name in ("a", "b"):
        settings = IssuerSettings(str(tmp_path / f"issuer-{name}"), (authority.public_key,), tokens_per_day=K)
        with ServerThread(create_issuer_app(settings)) as issuer:
            toks += tokens.IssuerClient(issuer.url, authority.enroll(f"d-{name}"), origin=ORIGIN).fetch(1)
        today = iso_day(utc_day(time.time()))
        shutil.copy(tmp_path / f"issuer-{name}" / "public" / f"token-key-{today}.json", keys / f"k-{name}.json")
        (keys / f"k-{name}.json").rename(keys / f"token-key-{today}-{name}.json")
    app = create_app(collector_settings(tmp_path, keys))
    with ServerThread(app) as col:
        listed = httpx.get(col.url + "/v1/token-keys").json()
        assert [e["day"] for e in listed["keys"]] == [], listed
        for i, tok in enumerate(toks):
            r = post(col.url, encode_frame(olh_batch(metrics, R, first_seed=100 * i)), tok)
            assert r.status_code == 401 and r.json()["error"] == "token_unknown_key", r.text
        assert app.metrics.token_key_days_refused._value.get() == 1  # type: ignore[attr-defined]


@pytest.fixture
def honest(tmp_path: Path, authority: EnrollmentAuthority) -> Iterator[tuple[ServerThread, ServerThread]]:
    write_metrics(tmp_path / "metrics.json", emoji_reports_per_day=R)
    settings = IssuerSettings(str(tmp_path / "issuer"), (authority.public_key,), tokens_per_day=K)
    with (
        ServerThread(create_issuer_app(settings)) as issuer,
        ServerThread(create_app(collector_settings(tmp_path, tmp_path / "issuer" / "public"))) as col,
    ):
        yield issuer, col


def test_the_collector_lists_the_issuers_key_and_the_device_pins_it(
    tmp_path: Path, authority: EnrollmentAuthority, honest: tuple[ServerThread, ServerThread]
) -> None:
    """An honest issuer and collector serve the same key of today; the device pins it. A later, different
    key for that pinned day (the issuer's state replaced) is refused even though the collector now lists it
    too, and no token request is sent under it."""
    from client_sdk.store import Store
    from client_sdk.upload.token_wallet import StoreKeyPins

    issuer, col = honest
    today = iso_day(utc_day(time.time()))
    mine = {e["day"]: e for e in httpx.get(issuer.url + "/v1/token-keys").json()["keys"]}
    theirs = {e["day"]: e for e in httpx.get(col.url + "/v1/token-keys").json()["keys"]}
    assert theirs[today] == mine[today] and set(theirs) <= set(mine)
    store = Store(tmp_path / "sdk")
    pins = StoreKeyPins(store)
    ident = authority.enroll("pinner")
    cli = tokens.IssuerClient(issuer.url, ident, origin=ORIGIN, key_sources=[col.url + "/v1/token-keys"], pins=pins)
    assert len(cli.fetch(1)) == 1
    assert pins.pinned(today) == (mine[today]["token_key_id"], mine[today]["public_key"])
    # later the issuer serves this device another key of today (the collector lists it too, say a second
    # collector of the same operator): the pin refuses it, and the issuer signs nothing for this device
    other = IssuerSettings(str(tmp_path / "issuer2"), (authority.public_key,), tokens_per_day=K)
    app2 = create_issuer_app(other)
    with ServerThread(app2) as issuer2:
        cli2 = tokens.IssuerClient(
            issuer2.url, ident, origin=ORIGIN, key_sources=[issuer2.url + "/v1/token-keys"], pins=pins
        )
        with pytest.raises(tokens.TokenError) as exc:
            cli2.fetch(1)
        assert exc.value.reason == "inconsistent_key"
        assert app2.state.counts.used("pinner", today) == 0
    store.close()


def _nonzero(c: TelemetryClient) -> dict[str, Any]:
    """The client's non-zero tallies, and the wallet's last error (for the assertion messages)."""
    out: dict[str, Any] = {k: v for k, v in {**c.errors(), **c.stats()}.items() if v}
    wallet = getattr(c, "_wallet", None)
    if wallet is not None and wallet.last_error:
        out["last_error"] = wallet.last_error
    return out


class StaticDocument:
    """A third party's mirror: serves the token-key document it fetched itself, the same to everyone."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.body = json.dumps(doc).encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": self.body})


def test_a_mirror_the_operator_does_not_run_catches_a_key_served_in_both_documents(
    tmp_path: Path, authority: EnrollmentAuthority
) -> None:
    """The residual and its remedy: an operator running both issuer and collector gives one device a key of its
    own in both documents (here: a second issuer state, its key in a collector key folder of its own). The
    device's issuer/collector check passes, so without a mirror it gets tokens under the per-device key; with
    a ``token_key_mirrors`` document fetched by a third party from the fleet-wide issuer, it refuses."""
    write_metrics(tmp_path / "metrics.json", emoji_reports_per_day=R)
    fleet = IssuerSettings(str(tmp_path / "fleet"), (authority.public_key,), tokens_per_day=K)
    target = IssuerSettings(str(tmp_path / "target"), (authority.public_key,), tokens_per_day=K)
    ident = authority.enroll("target-device")
    with (
        ServerThread(create_issuer_app(fleet)) as fleet_issuer,
        ServerThread(create_issuer_app(target)) as target_issuer,
    ):
        mirror_doc = httpx.get(fleet_issuer.url + "/v1/token-keys").json()  # what everyone else sees
        httpx.get(target_issuer.url + "/v1/token-keys")  # writes the per-device keys
        col_app = create_app(collector_settings(tmp_path, tmp_path / "target" / "public"))
        with ServerThread(col_app) as col, ServerThread(StaticDocument(mirror_doc)) as mirror:
            sources = [col.url + "/v1/token-keys"]
            no_mirror = tokens.IssuerClient(target_issuer.url, ident, origin=ORIGIN, key_sources=sources)
            assert len(no_mirror.fetch(1)) == 1  # the two documents agree: the device cannot tell
            with_mirror = tokens.IssuerClient(
                target_issuer.url, ident, origin=ORIGIN, key_sources=[*sources, mirror.url + "/v1/token-keys"]
            )
            with pytest.raises(tokens.TokenError) as exc:
                with_mirror.fetch(1)
            assert exc.value.reason == "inconsistent_key"


def test_token_key_mirrors_must_be_https_urls() -> None:
    from client_sdk.config import ClientConfigError

    with pytest.raises(ClientConfigError, match="token_key_mirrors"):
        ClientConfig(token_key_mirrors=("http://mirror.example.org/v1/token-keys",))  # plain http off loopback
    with pytest.raises(ClientConfigError, match="list of URLs"):
        ClientConfig(token_key_mirrors="https://mirror.example.org/v1/token-keys")  # type: ignore[arg-type]
    cfg = ClientConfig(token_key_mirrors=["https://mirror.example.org/v1/token-keys"])  # type: ignore[arg-type]
    assert cfg.token_key_mirrors == ("https://mirror.example.org/v1/token-keys",)
