"""The web SDK pays its uploads with anonymous tokens from the REAL Python issuer and collector
(docs/TOKENS.md, "The web SDK"): ``ldp issuer serve`` and ``ldp collector --require-tokens`` processes,
and a web-SDK device (``sdk-web/test/interop/tokens_drive.ts``, Node with fake-indexeddb) driven command by
command. Node and ``npm ci`` are required (an assertion, not a skip).

* every upload is paid with one token the device got by an Ed25519-signed, blind-RSA token request;
* a device whose tokens run out (the issuer down) keeps its reports (``flushResult`` says why) and sends
  them after the next refill;
* an issuer serving a key the collector does not list (a per-device key would let it link tokens to
  devices) gets no token request: ``token_key_inconsistent``;
* without a ``tokens`` option the reports are kept, not dropped, and the SDK says what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.issuer import IssuerSettings, create_issuer_app
from collector.spent_tokens import SpentTokens
from ldp_core.tokens.enrollment import EnrollmentAuthority
from tests.sdk.test_sdk_tokens import METRICS, ORIGIN, ROOT, IssuerProcess, free_port
from tests.support.collector_support import ServerThread
from tests.support.sdk_collector import RealCollectorProcess
from tests.web.node_support import SDK_WEB, node_path


class Device:
    """One web-SDK device process (its IndexedDB lives as long as the process)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [node_path(), "--import", "tsx", "test/interop/tokens_drive.ts", json.dumps(config)],
            cwd=SDK_WEB,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def send(self, **cmd: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"the web-SDK device exited: {err[-3000:]}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(op="close")
                self.proc.wait(30)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(30)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One issuer and one collector for the module (making the RSA day keys is the slow part)."""
    node_path()
    tmp = tmp_path_factory.mktemp("web-tokens")
    authority = EnrollmentAuthority.generate()
    authority.save(tmp / "authority.key")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    keys = [sys.executable, "-m", "ldp_cli.main", "issuer", "keys", "--state", str(tmp / "issuer"), "--days", "2"]
    subprocess.run(keys, check=True, env=env, cwd=ROOT, capture_output=True)
    issuer = IssuerProcess(tmp / "issuer", tmp / "authority.key", k=20, port=free_port())
    col = RealCollectorProcess(
        tmp / "collector",
        metrics=METRICS,
        require_tokens=True,
        token_keys=tmp / "issuer" / "public",
        token_origin=ORIGIN,
        spent_tokens=tmp / "spent.sqlite3",
    )
    try:
        yield {"issuer": issuer, "collector": col, "dir": tmp, "authority": authority}
    finally:
        col.stop()
        issuer.stop()


@pytest.fixture
def stack(services: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The module's services, a device identity of this test's own, and the counts before it ran."""
    tmp = services["dir"]
    device_id = f"web-{request.node.name[5:40]}".replace("[", "-").replace("]", "")
    services["authority"].enroll(device_id).save(tmp / f"{device_id}.json")
    devices: list[Device] = []

    def device(**kw: Any) -> Device:
        cfg = {
            "collectorUrl": services["collector"].url,
            "issuerUrl": services["issuer"].url,
            "devicePath": str(tmp / f"{device_id}.json"),
            "origin": ORIGIN,
            "metrics": METRICS,
            **kw,
        }
        d = Device(cfg)
        devices.append(d)
        return d

    before = {"accepted": services["collector"].stats()["accepted"], "spent": len(spent_rows(services))}
    yield {**services, "device": device, "before": before}
    for d in devices:
        d.close()
    if services["issuer"].proc is None:
        services["issuer"].start()


def spent_rows(s: dict[str, Any]) -> list[tuple[bytes, str]]:
    store = SpentTokens(s["dir"] / "spent.sqlite3")
    try:
        return [(batch_id, day) for _, batch_id, day in store.records()]
    finally:
        store.close()


def issued(state: Path) -> int:
    path = state / "counts.sqlite3"
    if not path.exists():
        return 0
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COALESCE(SUM(n), 0) FROM issued").fetchone()[0])


def test_every_web_upload_is_paid_with_one_token_from_the_real_issuer(stack: dict[str, Any]) -> None:
    d = stack["device"](stock=4)
    for i in range(6):
        d.send(op="record", metric="m", values=["abcd"[i % 4]])
        r = d.send(op="flush")
        assert r["ok"] and r["sent"] == {"batches": 1, "reports": 1}, r
    st = d.send(op="state")
    col = stack["collector"].stats()
    assert col["accepted"] - stack["before"]["accepted"] == 6, col
    rows = spent_rows(stack)[stack["before"]["spent"] :]
    assert len(rows) == 6 and len({b for b, _ in rows}) == 6  # one token per batch
    assert st["stats"]["tokens_fetched"] >= 6 and st["errors"]["token_key_inconsistent"] == 0, st


def test_a_device_whose_tokens_run_out_keeps_its_reports_and_sends_them_after_the_refill(
    stack: dict[str, Any],
) -> None:
    d = stack["device"](stock=2)
    d.send(op="record", metric="m", values=["a"])
    assert d.send(op="flush")["ok"]  # the stock (2 tokens) is fetched, one spent
    stack["issuer"].stop()
    d.send(op="record", metric="m", values=["b", "c", "d"])
    r = d.send(op="flush")
    # the last token of the stock pays for one batch; the others wait for a token
    assert not r["ok"] and r["sent"]["reports"] == 1 and r["queued"] == 2, r
    assert r["refused"] == {"batches": 0, "reports": 0}
    assert r["waiting"]["reason"] == "no_token" and "cannot be reached" in r["waiting"]["message"], r
    r = d.send(op="flush")
    assert not r["ok"] and r["queued"] == 2 and r["waiting"]["reason"] == "no_token", r
    st = d.send(op="state")
    assert st["pending"] == 2 and st["errors"]["tokens_exhausted"] >= 2 and st["errors"]["token_fetch_failed"] >= 2
    stack["issuer"].start()  # the refill
    # The first request after the restart may still meet the old process's closed connection (a transient
    # failure, retried after the backoff): a few flushes, each one attempt.
    sent, results = 0, []
    for _ in range(4):
        r = d.send(op="flush")
        results.append(r)
        sent += r["sent"]["reports"]
        if r["ok"]:
            break
    assert r["ok"] and sent == 2 and r["queued"] == 0, results
    assert stack["collector"].stats()["accepted"] - stack["before"]["accepted"] == 4
    assert len(spent_rows(stack)) - stack["before"]["spent"] == 4


def test_an_issuer_key_the_collector_does_not_list_gets_no_token_request(stack: dict[str, Any]) -> None:
    """The attack: an issuer serving this device a key of its own (it could then tell this device's tokens
    apart). A second issuer with its own keys plays it; the collector lists the first one's."""
    state = stack["dir"] / "evil"
    shutil.rmtree(state, ignore_errors=True)
    settings = IssuerSettings(state_dir=str(state), authority_keys=(stack["authority"].public_key,), tokens_per_day=20)
    with ServerThread(create_issuer_app(settings)) as evil:
        d = stack["device"](issuerUrl=evil.url)
        d.send(op="record", metric="m", values=["a", "b"])
        r = d.send(op="flush")
        assert not r["ok"] and r["queued"] == 2 and r["waiting"]["reason"] == "no_token", r
        assert "does not list the issuer's token key" in r["waiting"]["message"]
        st = d.send(op="state")
        assert st["errors"]["token_key_inconsistent"] >= 1, st
        assert issued(state) == 0, "no token request was sent under the inconsistent key"
        assert stack["collector"].stats()["accepted"] == stack["before"]["accepted"]


def test_without_a_token_option_the_reports_are_kept_and_the_sdk_says_what_to_do(stack: dict[str, Any]) -> None:
    d = stack["device"](noTokens=True)
    d.send(op="record", metric="m", values=["a", "b"])
    r = d.send(op="flush")
    assert not r["ok"] and r["queued"] == 2 and r["refused"]["batches"] == 0, r
    assert r["waiting"]["reason"] == "tokens_required" and "`tokens` option" in r["waiting"]["message"], r
    assert d.send(op="state")["errors"]["upload_tokens_required"] >= 1


def test_a_token_for_another_collector_is_refused_the_batch_kept_and_the_fix_said(stack: dict[str, Any]) -> None:
    d = stack["device"](origin="not-the-collector")  # its tokens' challenge names another collector
    d.send(op="record", metric="m", values=["a"])
    r = d.send(op="flush")
    assert not r["ok"] and r["queued"] == 1 and r["refused"]["batches"] == 0, r
    assert r["waiting"]["reason"] == "token_refused", r
    assert "token_wrong_challenge" in r["waiting"]["message"] and "--token-origin" in r["waiting"]["message"], r
    st = d.send(op="state")
    assert st["errors"]["tokens_refused"] == 1 and st["pending"] == 1, st
