"""Anonymous upload tokens end to end: ``ldp issuer`` (real HTTP) and the collector with ``--require-tokens``.

Each refusal is an attack played against the real services: a device asking for more than K tokens, a
replayed or forged issuance request, an upload without a token, with a forged or another day's token, and a
token spent twice (in one collector, and across two collector processes racing for it)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from collector.http.app import create_app
from collector.issuer import IssuerSettings, create_issuer_app
from collector.settings import CollectorSettings
from ldp_core.days import utc_iso_day
from ldp_core.metrics import MetricSet
from ldp_core.tokens import privacy_pass as tokens
from ldp_core.tokens.enrollment import DeviceIdentity, EnrollmentAuthority
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, encode_frame
from tests.support.collector_support import ServerThread, olh_batch, start_collector_command, write_metrics

ROOT = Path(__file__).resolve().parents[2]
K = 3
ORIGIN = "test-collector"


@pytest.fixture(scope="module")
def authority() -> EnrollmentAuthority:
    return EnrollmentAuthority.generate()


@pytest.fixture
def issuer(tmp_path: Path, authority: EnrollmentAuthority) -> Iterator[ServerThread]:
    settings = IssuerSettings(str(tmp_path / "issuer"), (authority.public_key,), tokens_per_day=K)
    with ServerThread(create_issuer_app(settings)) as srv:
        yield srv


def client(url: str, ident: DeviceIdentity, origin: str = ORIGIN) -> tokens.IssuerClient:
    return tokens.IssuerClient(url, ident, origin=origin)


def test_issuer_grants_k_per_device_per_day_then_429(issuer: ServerThread, authority: EnrollmentAuthority) -> None:
    a, b = authority.enroll("device-a"), authority.enroll("device-b")
    got = client(issuer.url, a).fetch(2)
    assert len(got) == 2
    assert len(client(issuer.url, a).fetch(5)) == 1  # the rest of a's day, not 5
    with pytest.raises(tokens.TokenError) as exc:
        client(issuer.url, a).fetch(1)
    assert exc.value.reason == "limit"
    assert len(client(issuer.url, b).fetch(K)) == K  # per device


def test_issuer_refuses_unenrolled_and_replayed_requests(issuer: ServerThread, authority: EnrollmentAuthority) -> None:
    rogue = EnrollmentAuthority.generate().enroll("device-a")  # a credential from an authority the issuer does not know
    with pytest.raises(tokens.TokenError) as exc:
        client(issuer.url, rogue).fetch(1)
    assert exc.value.reason == "unauthenticated"
    assert httpx.post(issuer.url + "/v1/token-requests", json={"day": "x", "requests": []}).status_code == 401
    # a captured request replayed: refused, and it took nothing from the device's K
    ident = authority.enroll("device-r")
    keys = httpx.get(issuer.url + "/v1/token-keys").json()
    import base64

    from ldp_core.tokens import blind_rsa

    (entry,) = [e for e in keys["keys"] if e["day"] == utc_iso_day(time.time())]
    pk = blind_rsa.PublicKey.from_der(base64.b64decode(entry["public_key"]))
    p = tokens.begin(pk, issuer_name=keys["issuer_name"], origin=ORIGIN, day=entry["day"])
    body = json.dumps({"day": entry["day"], "requests": [base64.urlsafe_b64encode(p.request).decode()]}).encode()
    headers = {"content-type": "application/json", **ident.sign_request("POST", "/v1/token-requests", body)}
    assert httpx.post(issuer.url + "/v1/token-requests", content=body, headers=headers).status_code == 200
    again = httpx.post(issuer.url + "/v1/token-requests", content=body, headers=headers)
    assert again.status_code == 401 and "replayed" in again.json()["message"]
    assert len(client(issuer.url, ident).fetch(K)) == K - 1


def test_issuer_restart_loses_no_counts(tmp_path: Path, authority: EnrollmentAuthority) -> None:
    settings = IssuerSettings(str(tmp_path / "issuer"), (authority.public_key,), tokens_per_day=K)
    ident = authority.enroll("device-x")
    with ServerThread(create_issuer_app(settings)) as srv:
        assert len(client(srv.url, ident).fetch(K - 1)) == K - 1
    with ServerThread(create_issuer_app(settings)) as srv:  # a new process state: the counts and keys are on disk
        assert len(client(srv.url, ident).fetch(K)) == 1
        with pytest.raises(tokens.TokenError):
            client(srv.url, ident).fetch(1)
    assert (tmp_path / "issuer" / "keys").stat().st_mode & 0o777 == 0o700
    for f in (tmp_path / "issuer" / "keys").iterdir():
        assert f.stat().st_mode & 0o777 == 0o600


# -- the collector ------------------------------------------------------------------------------
def collector_settings(tmp_path: Path, **kw: object) -> CollectorSettings:
    base: dict[str, object] = dict(
        metrics_path=str(tmp_path / "metrics.json"),
        transport_url=f"sqlite:///{tmp_path}/log.sqlite3",
        dedup_path=str(tmp_path / "ids.sqlite3"),
        raw_partitions=1,
        require_tokens=True,
        token_keys=str(tmp_path / "issuer" / "public"),
        token_origin=ORIGIN,
        spent_path=str(tmp_path / "spent.sqlite3"),
    )
    base.update(kw)
    return CollectorSettings(**base)  # type: ignore[arg-type]


def post(url: str, body: bytes, token: tokens.Token | None = None, auth: str | None = None) -> httpx.Response:
    headers = {"content-type": FRAME_CONTENT_TYPE}
    if token is not None:
        headers["authorization"] = tokens.authorization_header(token)
    if auth is not None:
        headers["authorization"] = auth
    return httpx.post(url + "/v1/reports", content=body, headers=headers, timeout=30)


@pytest.fixture
def metrics(tmp_path: Path) -> MetricSet:
    return write_metrics(tmp_path / "metrics.json", emoji_reports_per_day=5)


def test_collector_requires_a_valid_unspent_token(
    tmp_path: Path, issuer: ServerThread, authority: EnrollmentAuthority, metrics: MetricSet
) -> None:
    ident = authority.enroll("device-c")
    t1, t2 = client(issuer.url, ident).fetch(2)
    with ServerThread(create_app(collector_settings(tmp_path))) as col:
        r = post(col.url, encode_frame(olh_batch(metrics, 5)))
        assert r.status_code == 401 and r.json()["error"] == "token_missing"
        forged = bytearray(t1.to_bytes())
        forged[-1] ^= 1
        r = post(col.url, encode_frame(olh_batch(metrics, 5)), auth=tokens.authorization_header(bytes(forged)))
        assert r.status_code == 401 and r.json()["error"] == "token_bad_signature"
        r = post(col.url, encode_frame(olh_batch(metrics, 5)), auth="PrivateToken token=!!!")
        assert r.status_code == 401 and r.json()["error"] == "token_malformed"
        batch = encode_frame(olh_batch(metrics, 5))
        assert post(col.url, batch, t1).status_code == 202
        assert post(col.url, batch, t1).json()["status"] == "duplicate"  # a retry: same token, same batch
        r = post(col.url, encode_frame(olh_batch(metrics, 5, first_seed=9)), t1)  # the token again, another batch
        assert r.status_code == 409 and r.json()["error"] == "token_spent"
        r = post(col.url, encode_frame(olh_batch(metrics, 6, first_seed=9)), t2)  # more than one device-day's reports
        assert r.status_code == 422 and r.json()["error"] == "too_many_reports"
        assert post(col.url, encode_frame(olh_batch(metrics, 5, first_seed=9)), t2).status_code == 202
    # a token made for another collector is refused by this one
    (t3,) = client(issuer.url, ident, origin="other-collector").fetch(1)
    with ServerThread(create_app(collector_settings(tmp_path))) as col:
        r = post(col.url, encode_frame(olh_batch(metrics, 5, first_seed=20)), t3)
        assert r.status_code == 401 and r.json()["error"] == "token_wrong_challenge"


def test_token_expires_after_its_day_and_the_next(
    tmp_path: Path, issuer: ServerThread, authority: EnrollmentAuthority, metrics: MetricSet
) -> None:
    """Grace: a token of day D pays for a batch of D on D and on D + 1 (a late upload); from D + 2 it is refused
    401 token_expired."""
    (tok,) = client(issuer.url, authority.enroll("device-d")).fetch(1)
    now = time.time()
    midnight = (int(now) // 86400 + 1) * 86400
    # the collector's clock just after the second UTC midnight; the batch's day is still within its window
    app = create_app(collector_settings(tmp_path, max_day_age=3), clock=lambda: midnight + 86400 + 1.0)
    with ServerThread(app) as col:
        r = post(col.url, encode_frame(olh_batch(metrics, 5)), tok)
        assert r.status_code == 401 and r.json()["error"] == "token_expired"
    app = create_app(collector_settings(tmp_path), clock=lambda: midnight + 86400 - 1.0)  # the last second of D + 1
    with ServerThread(app) as col:
        assert post(col.url, encode_frame(olh_batch(metrics, 5)), tok).status_code == 202


def test_missing_token_key_folder_is_a_start_up_error(tmp_path: Path, metrics: MetricSet) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        create_app(collector_settings(tmp_path, token_keys=str(tmp_path / "nowhere")))


def _start_collector(tmp_path: Path, name: str, dedup: str | None = None) -> tuple[subprocess.Popen[str], str]:
    proc, url, _ = start_collector_command(
        tmp_path,
        "--require-tokens",
        "--token-keys",
        str(tmp_path / "issuer" / "public"),
        "--token-origin",
        ORIGIN,
        "--spent-tokens",
        str(tmp_path / "spent.sqlite3"),
        dedup=dedup or f"ids-{name}.sqlite3",
    )
    return proc, url


def test_double_spend_across_two_collector_processes(
    tmp_path: Path, issuer: ServerThread, authority: EnrollmentAuthority, metrics: MetricSet
) -> None:
    """Each of K tokens is sent at once to two collector processes (separate dedup stores, one spent-token
    store), with two different batches: exactly one of each pair is accepted."""
    toks = client(issuer.url, authority.enroll("device-e")).fetch(K)
    procs = [_start_collector(tmp_path, n) for n in ("a", "b")]
    try:
        with ThreadPoolExecutor(2) as pool:
            for i, tok in enumerate(toks):
                bodies = [encode_frame(olh_batch(metrics, 3, first_seed=100 * i + j)) for j in range(2)]
                answers = list(pool.map(lambda j, b=bodies, t=tok: post(procs[j][1], b[j], t), range(2)))
                codes = sorted(a.status_code for a in answers)
                assert codes == [202, 409], [a.text for a in answers]
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(30)
            proc.communicate()


def test_a_token_spent_at_one_collector_is_refused_at_the_other(
    tmp_path: Path, issuer: ServerThread, authority: EnrollmentAuthority, metrics: MetricSet
) -> None:
    """Two ``ldp collector`` processes sharing the spent-token store and the dedup store (one host, as
    docs/COLLECTOR.md "Several collectors" requires): a token spent at A pays for nothing at B (409
    token_spent), and the retry of A's batch at B is a duplicate, not a second count."""
    (tok,) = client(issuer.url, authority.enroll("device-s")).fetch(1)
    procs = [_start_collector(tmp_path, n, dedup="ids-shared.sqlite3") for n in ("a", "b")]
    try:
        batch = encode_frame(olh_batch(metrics, 3, first_seed=500))
        assert post(procs[0][1], batch, tok).json()["status"] == "accepted"
        r = post(procs[1][1], encode_frame(olh_batch(metrics, 3, first_seed=600)), tok)
        assert r.status_code == 409 and r.json()["error"] == "token_spent", r.text
        assert post(procs[1][1], batch, tok).json()["status"] == "duplicate"  # the device's retry, elsewhere
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(30)
            proc.communicate()


def test_issuer_readyz_and_the_public_key_it_publishes(issuer: ServerThread, tmp_path: Path) -> None:
    """/readyz answers once today's key is on disk, and that key's public half (the collector's --token-keys
    file) is in the RFC 9578 §6.5 encoding whose SHA-256 is the token_key_id the issuer names."""
    import base64
    import hashlib

    assert httpx.get(issuer.url + "/readyz").json() == {"status": "ready"}
    (pub,) = (tmp_path / "issuer" / "public").glob("token-key-*.json")
    entry = json.loads(pub.read_text())
    der = base64.b64decode(entry["public_key"])
    assert der[:21].hex().startswith("30820156304106092a864886f70d01010a")  # SEQUENCE { id-RSASSA-PSS ...
    assert hashlib.sha256(der).hexdigest() == entry["token_key_id"]
    listed = {e["day"]: e["token_key_id"] for e in httpx.get(issuer.url + "/v1/token-keys").json()["keys"]}
    assert listed[entry["day"]] == entry["token_key_id"]


def test_issuer_serve_takes_the_authority_key_from_the_environment(
    tmp_path: Path, authority: EnrollmentAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How docker-compose.yml passes it: $LDP_ISSUER_AUTHORITY_KEY, base64; none at all is a clear error."""
    import argparse
    import base64

    from ldp_cli.commands.issuer import AUTHORITY_KEY_ENV, _authority_keys

    none = argparse.Namespace(authority_key=[], authority=[])
    monkeypatch.delenv(AUTHORITY_KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=AUTHORITY_KEY_ENV):
        _authority_keys(none)
    monkeypatch.setenv(AUTHORITY_KEY_ENV, base64.b64encode(authority.public_key).decode())
    assert _authority_keys(none) == (authority.public_key,)
    monkeypatch.setenv(AUTHORITY_KEY_ENV, "not base64!")
    with pytest.raises(ValueError, match="not base64"):
        _authority_keys(none)
