"""Memoization against a hostile server: pinned definitions and the local policy's bounds.

The adversary here is the server itself. It serves ``GET /v1/metrics`` from a real HTTP
server on loopback (a stdlib ``http.server`` in this process: the real collector serves one
fixed metrics file, and a hostile server is exactly what it is not), chooses each day's
definitions, and keeps every frame a real :class:`TelemetryClient` posts to it.

* It changes a RAPPOR metric's ``hash_seed`` and its hashed domain's ``seed`` every day (each
  definition passes the ε caps), so that a device which adopted them would draw a fresh
  permanent response of the same value daily. The attacker then computes the exact Bayes
  posterior on the device's value among 3 candidates.
* It serves a definition with no instantaneous randomization and 4,096 bits in 65,536 cohorts,
  which would make a device's daily reports a byte-identical fingerprint.
* An old (schema 1) store is upgraded in place, keeps its rows, and its memoized metric is
  pinned to the definition it was reported under.
"""

from __future__ import annotations

import copy
import http.server
import json
import logging
import math
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from client_sdk.client import TelemetryClient
from client_sdk.config import ClientConfig
from client_sdk.memo import SECRET_FILENAME, MemoStore
from client_sdk.policy import LocalPolicy
from client_sdk.store import DB_FILENAME, SCHEMA_VERSION, Store
from ldp_core.canonical import canonical_json
from ldp_core.domain import Domain
from ldp_core.errors import BudgetError
from ldp_core.mechanisms.rappor import RapporSpec
from ldp_core.metrics import FORMAT, MetricDefinition, parse_metrics
from ldp_core.randomness import simulation_generator
from ldp_core.wire.frames import decode_frame, read_header

DAY = 86400.0
D0 = 20_500  # the first simulated UTC day
EPS = 2.0  # the permanent bound eps_inf of every RAPPOR definition below
#: The most a uniform-prior attacker can believe any of 3 candidates after seeing everything that
#: depends on one eps_inf-DP permanent response: L(x) / sum_y L(y) <= e^eps / (e^eps + 2), since
#: L(y) >= e^-eps L(x) for every y (the IRR and the cohort are post-processing / value-independent).
BOUND = math.exp(EPS) / (math.exp(EPS) + 2.0)
CANDIDATES = ["https://example.org/a", "https://example.org/b", "https://example.org/c"]
TRUE = CANDIDATES[0]
SECRET = bytes(range(32))  # a fixed device secret, so that every run draws the same permanent responses
POLICY = LocalPolicy(per_metric_daily=EPS, total_daily=EPS)
BASE = {"mechanism": "rappor", "epsilon": EPS, "num_bits": 16, "num_hashes": 2, "num_cohorts": 4, "p": 0.25, "q": 0.75}


def metric(mechanism: dict[str, Any], domain: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": "the page a user opened",
        "owner": "sdk-tests@example.org",
        "expires": "2099-12-31",
        "mechanism": mechanism,
        "domain": domain,
        "max_reports_per_day": 1,
    }


def doc(mechanism: dict[str, Any], domain: dict[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "metrics": {"page": metric(mechanism, domain)}}


class Clock:
    def __init__(self, day: int) -> None:
        self.t = day * DAY + 3600.0

    def __call__(self) -> float:
        return self.t

    def set_day(self, day: int) -> None:
        self.t = day * DAY + 3600.0


class HostileServer:
    """``GET /v1/metrics`` answers ``serve(day)`` for the device clock's current day;
    ``POST /v1/reports`` keeps the frame and answers 202."""

    def __init__(self, clock: Clock, serve: Callable[[int], dict[str, Any]], known: dict[str, Any] | None) -> None:
        self.clock, self.serve = clock, serve
        self.frames: list[bytes] = []
        #: every definition served (or ``known``: the device's bundled ones), by spec id
        self.served: dict[str, MetricDefinition] = {}
        for m in parse_metrics(known or {"format": FORMAT, "metrics": {}}, reject_expired=False).values():
            self.served[m.spec.spec_id] = m
        self.lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 -- http.server's spelling
                if self.path.split("?", 1)[0] != "/v1/metrics":
                    return self._answer(404)
                document = owner.serve(int(owner.clock() // DAY))
                with owner.lock:
                    for m in parse_metrics(document, reject_expired=False).values():
                        owner.served[m.spec.spec_id] = m
                return self._answer(200, json.dumps(document).encode())

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with owner.lock:
                    owner.frames.append(body)
                self._answer(202)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reports(self) -> list[tuple[MetricDefinition, np.ndarray]]:
        """Each received frame's records with the definition the server had served under its spec id."""
        with self.lock:
            frames, served = list(self.frames), dict(self.served)
        out = []
        for frame in frames:
            m = served[read_header(frame).spec_id]
            out.append((m, np.array(decode_frame(frame, m.spec).records)))
        return out

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hostile() -> Iterator[Callable[..., HostileServer]]:
    started: list[HostileServer] = []

    def start(
        clock: Clock, serve: Callable[[int], dict[str, Any]], known: dict[str, Any] | None = None
    ) -> HostileServer:
        server = HostileServer(clock, serve, known)
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


def device_dir(tmp_path: Any) -> Any:
    """A storage directory holding the fixed device secret (0600), as the SDK would have made it."""
    d = tmp_path / "sdk"
    d.mkdir(mode=0o700)
    fd = os.open(d / SECRET_FILENAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, SECRET)
    os.close(fd)
    return d


def definition_of(m: MetricDefinition) -> str:
    """What a memoized report depends on besides the value: the spec and the domain (RFC 8785 JSON),
    the form the SDK pins (docs/SDK.md, "Pinned definitions")."""
    return canonical_json({"domain": m.domain.to_dict(), "mechanism": m.spec.to_dict()}).decode()


# --------------------------------------------------------------------------- the attacker
def memoized_loglik(spec: RapporSpec, domain: Domain, records: np.ndarray, value: str) -> float:
    """log P(records | value) when all ``records`` share one permanent response (one definition,
    one device): per bit j, independently given the Bloom filter b of the value in the
    report's cohort, P = sum_B P(PRR_j = B | b_j) * prod_t P(S_tj | B), with
    P(PRR_j = 1 | b_j = 1) = 1 - f/2, P(PRR_j = 1 | b_j = 0) = f/2, P(S = 1 | PRR = 1) = q and
    P(S = 1 | PRR = 0) = p (Erlingsson et al., CCS 2014, Sec. 3)."""
    index, half, total = domain.index_of(value), spec.f / 2.0, 0.0
    for cohort in np.unique(records["cohort"]).tolist():
        group = records[records["cohort"] == cohort]
        bits = np.unpackbits(group["bits"], axis=1, bitorder="little")[:, : spec.num_bits]
        ones = bits.sum(axis=0)
        zeros = bits.shape[0] - ones
        bloom = np.zeros(spec.num_bits, dtype=bool)
        bloom[spec.bloom_positions(index, cohort)] = True
        prr_one = np.where(bloom, 1.0 - half, half)
        if_one = ones * math.log(spec.q) + zeros * math.log1p(-spec.q)
        if_zero = ones * math.log(spec.p) + zeros * math.log1p(-spec.p)
        total += float(np.logaddexp(np.log(prr_one) + if_one, np.log1p(-prr_one) + if_zero).sum())
    return total


def posterior(reports: list[tuple[MetricDefinition, np.ndarray]]) -> np.ndarray:
    """The attacker's posterior on the device's value over CANDIDATES (uniform prior): reports under
    one definition share a permanent response; different definitions have independent ones."""
    groups: dict[str, tuple[MetricDefinition, list[np.ndarray]]] = {}
    for m, recs in reports:
        groups.setdefault(definition_of(m), (m, []))[1].append(recs)
    loglik = np.zeros(len(CANDIDATES))
    for m, parts in groups.values():
        recs = np.concatenate(parts)
        assert isinstance(m.spec, RapporSpec)
        loglik += [memoized_loglik(m.spec, m.domain, recs, v) for v in CANDIDATES]
    post = np.exp(loglik - loglik.max())
    return post / post.sum()


# --------------------------------------------------------------------------- 1. rotating seeds
DAYS = 180


def rotating(day: int) -> dict[str, Any]:
    """The hostile schedule: the base definition on every 4th day, otherwise a new ``hash_seed``
    and hashed-domain ``seed`` each day (each within the ε caps)."""
    k = day - D0
    if k % 4 == 0:
        return doc(BASE, {"kind": "hashed", "size": 64, "seed": 0})
    return doc(dict(BASE, hash_seed=1000 + k), {"kind": "hashed", "size": 64, "seed": k})


def test_a_server_rotating_seeds_daily_gets_no_second_permanent_response(tmp_path, hostile) -> None:
    """180 days, one report of one true value a day. Without pins, a device adopting each day's
    definition draws a fresh permanent response (PRR) on 135 of them, and the attacker's posterior
    on the true value goes to 1 (the control below: 0.99+ with these parameters; the issue saw 0.999
    after 730 days with the paper's IRR). With pins, every report the server gets is under the
    pinned definition, so they all depend on one eps_inf = 2 PRR, and the posterior can never exceed
    BOUND = e^2 / (e^2 + 2) = 0.787 (for any realization, not only on average); the server's 135
    rotated definitions are refused, each counted once."""
    clock = Clock(D0)
    server = hostile(clock, rotating)
    storage = device_dir(tmp_path)
    c = TelemetryClient(storage, server.url, POLICY, {"format": FORMAT, "metrics": {}}, config=ClientConfig(fetch_metrics=True, clock=clock, mode="simulation", simulation_seed=7))  # fmt: skip
    try:
        for k in range(DAYS):
            clock.set_day(D0 + k)
            assert c.flush(30)  # the uploader refreshes the definitions first: today's are in effect
            c.record("page", TRUE)
            assert c.flush(30)
        errors = c.errors()
    finally:
        c.close()
    rotated = sum(1 for k in range(DAYS) if k % 4)
    assert errors["metric_refused"] == rotated == 135
    assert errors["unknown_metric"] == rotated  # not reported on the days its pinned definition is not served
    reports = server.reports()
    assert len(reports) == DAYS - rotated  # one report on each day the pinned definition was served
    pinned = {definition_of(m) for m, _ in reports}
    assert pinned == {definition_of(parse_metrics(rotating(D0), reject_expired=False)["page"])}
    post = posterior(reports)
    assert post.max() <= BOUND + 1e-12, post

    # Control: the same attacker against what an unpinned device sends (a PRR per definition it is
    # served, keyed as the SDK keys it), one report a day: the attack is real and the math sees it.
    memo, rng = MemoStore(SECRET), simulation_generator(7)
    unpinned = []
    for k in range(DAYS):
        m = parse_metrics(rotating(D0 + k), reject_expired=False)["page"]
        unpinned.append((m, memo.encode("page", m.spec, np.array([m.domain.index_of(TRUE)]), rng)))
    assert posterior(unpinned)[0] > 0.99


# --------------------------------------------------------------------------- 2. fingerprint
FINGERPRINT = {
    "mechanism": "rappor", "epsilon": EPS, "num_bits": 4096, "num_hashes": 2, "num_cohorts": 65536,
    "p": 0.0, "q": 1.0,
}  # fmt: skip


def test_a_definition_without_instantaneous_noise_is_refused_not_a_fingerprint(tmp_path, hostile, caplog) -> None:
    """Served every day for 30 days: p = 0, q = 1 (every report of a value would be its permanent
    response, byte for byte), 4,096 bits, 65,536 cohorts. It is within the ε caps but beyond the
    local policy's bounds, so it is refused (counted and logged once) and nothing is ever sent under
    it; the device keeps its bundled definition, whose instantaneous noise makes its 30 daily
    reports differ (all 30 equal would have probability below 0.75^(16*29) here)."""
    clock = Clock(D0)
    hashed = {"kind": "hashed", "size": 64, "seed": 0}
    server = hostile(clock, lambda day: doc(FINGERPRINT, hashed), known=doc(BASE, hashed))
    c = TelemetryClient(device_dir(tmp_path), server.url, POLICY, doc(BASE, hashed), config=ClientConfig(fetch_metrics=True, clock=clock, mode="simulation", simulation_seed=3))  # fmt: skip
    caplog.set_level(logging.WARNING, logger="client_sdk")
    try:
        for k in range(30):
            clock.set_day(D0 + k)
            assert c.flush(30)
            c.record("page", TRUE)
            assert c.flush(30)
        errors = c.errors()
        in_effect = c.metrics["page"].spec
    finally:
        c.close()
    assert errors["metric_refused"] == 1
    warnings = [r for r in caplog.records if r.name == "client_sdk" and "refused" in r.getMessage()]
    assert len(warnings) == 1 and "instantaneous randomization" in warnings[0].getMessage()
    hostile_spec = parse_metrics(doc(FINGERPRINT, hashed), reject_expired=False)["page"].spec
    reports = server.reports()
    assert len(reports) == 30
    assert all(hostile_spec.spec_id != m.spec.spec_id and m.spec == in_effect for m, _ in reports)
    records = [recs.tobytes() for _, recs in reports]
    assert len(set(records)) > 1  # not byte-identical


def test_the_local_policy_bounds_memoized_definitions_and_ships_the_laxest(tmp_path) -> None:
    def page(**overrides: Any) -> MetricDefinition:
        return parse_metrics(doc(dict(BASE, **overrides), {"kind": "hashed", "size": 16}), reject_expired=False)["page"]

    from client_sdk import policy

    assert (policy.SHIPPED_MAX_IRR_EPSILON, policy.SHIPPED_MAX_RAPPOR_BITS, policy.SHIPPED_MAX_RAPPOR_COHORTS) == (
        2.5,
        1024,
        128,
    )
    POLICY.check_metric(page())  # p = 0.25, q = 0.75: ln 9 = 2.2 per bit
    POLICY.check_metric(page(p=0.5, q=0.75, num_bits=1024, num_cohorts=128))  # the paper's IRR: ln 3
    assert page(p=0.5, q=0.75).spec.irr_epsilon == pytest.approx(math.log(3))
    for overrides, why in (
        ({"p": 0.0, "q": 1.0}, "per-bit epsilon of inf"),
        ({"p": 0.0}, "per-bit epsilon of inf"),
        ({"q": 1.0}, "per-bit epsilon of inf"),
        ({"p": 0.2, "q": 0.8}, "per-bit epsilon of 2.77"),  # ln 16
        ({"num_bits": 1032}, "num_bits 1032 is above 1024"),
        ({"num_cohorts": 129}, "num_cohorts 129 is above 128"),
    ):
        with pytest.raises(BudgetError, match=why):
            POLICY.check_metric(page(**overrides))
    strict = LocalPolicy(EPS, EPS, max_irr_epsilon=1.5, max_rappor_bits=64, max_rappor_cohorts=2)
    for overrides in ({}, {"num_bits": 72, "p": 0.5}, {"num_cohorts": 3, "p": 0.5}):
        with pytest.raises(BudgetError):
            strict.check_metric(page(**overrides))
    strict.check_metric(page(p=0.5, num_cohorts=2))
    for laxer in ({"max_irr_epsilon": 2.6}, {"max_rappor_bits": 1025}, {"max_rappor_cohorts": 129}):
        with pytest.raises(BudgetError, match="never laxer"):
            LocalPolicy(EPS, EPS, **laxer)
    for bad in ({"max_irr_epsilon": 0.0}, {"max_rappor_bits": 1.5}, {"max_rappor_cohorts": True}):
        with pytest.raises(BudgetError):
            LocalPolicy(EPS, EPS, **bad)
    with pytest.raises(BudgetError, match="identify it"):  # a bundled file beyond the bounds fails loudly
        TelemetryClient(
            tmp_path / "never",
            None,
            POLICY,
            doc(FINGERPRINT, {"kind": "hashed", "size": 64}),
            config=ClientConfig(upload=False),
        )


# --------------------------------------------------------------------------- 3. store upgrade
#: The schema an SDK of store version 1 wrote (client_sdk/store.py before pins), verbatim.
SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS clock (id INTEGER PRIMARY KEY CHECK (id = 1), high_water REAL NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
    day INTEGER NOT NULL, metric TEXT NOT NULL, spent INTEGER NOT NULL, reports INTEGER NOT NULL,
    PRIMARY KEY (day, metric)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS specs (spec_id TEXT PRIMARY KEY, spec TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, metric TEXT NOT NULL, spec_id TEXT NOT NULL, day INTEGER NOT NULL,
    record BLOB NOT NULL, enqueued REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_group ON outbox (metric, spec_id, day, id);
CREATE TABLE IF NOT EXISTS batches (
    batch_id BLOB PRIMARY KEY, frame BLOB NOT NULL, n INTEGER NOT NULL, first_id INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, next_attempt REAL NOT NULL, lease_until REAL NOT NULL DEFAULT 0,
    lease_pid INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
PRAGMA user_version = 1;
"""
HASHED = {"kind": "hashed", "size": 64, "seed": 0}
OLD = doc(dict(BASE, hash_seed=7), HASHED)  # what the old device reported under (and cached)
NEW = doc(dict(BASE, hash_seed=8), dict(HASHED, seed=8))  # what the server serves after the upgrade


def old_store(tmp_path: Any) -> tuple[Any, MetricDefinition, bytes]:
    """A storage directory as a schema-1 SDK left it: the secret, the cached server document, and
    a database with a day of spending, one report still queued and a persisted tally."""
    storage = device_dir(tmp_path)
    (storage / "server_metrics.json").write_text(json.dumps(OLD))
    m = parse_metrics(OLD, reject_expired=False)["page"]
    spec = m.spec
    record = MemoStore(SECRET).encode("page", spec, np.array([m.domain.index_of(TRUE)]), simulation_generator(1))
    conn = sqlite3.connect(storage / DB_FILENAME)
    conn.executescript(SCHEMA_V1)
    conn.execute("INSERT INTO clock VALUES (1, ?)", ((D0 - 1) * DAY + 3600.0,))
    conn.execute("INSERT INTO ledger VALUES (?, 'page', 2000000000, 1)", (D0 - 1,))
    conn.execute("INSERT INTO specs VALUES (?, ?)", (spec.spec_id, json.dumps(spec.to_dict(), sort_keys=True)))
    conn.execute(
        "INSERT INTO outbox (metric, spec_id, day, record, enqueued) VALUES ('page', ?, ?, ?, ?)",
        (spec.spec_id, D0 - 1, record.tobytes(), (D0 - 1) * DAY + 3600.0),
    )
    conn.execute("INSERT INTO counters VALUES ('uploaded_reports', 7)")
    conn.commit()
    conn.close()
    return storage, m, record.tobytes()


def test_an_old_store_is_upgraded_in_place_and_pins_what_it_reported(tmp_path, hostile) -> None:
    """The first start after the upgrade (with the server already serving a new hash_seed and
    domain seed) keeps every old row (the queued report is sent as it was), pins "page" to the
    definition it was reported under (the cached one: reports follow the last adopted definition),
    refuses the new one, and -- once the pinned definition is served again -- goes on with the same
    memoized cohort."""
    storage, old_def, old_record = old_store(tmp_path)
    clock = Clock(D0)
    serving = {"doc": NEW}
    server = hostile(clock, lambda day: serving["doc"], known=OLD)
    c = TelemetryClient(storage, server.url, POLICY, {"format": FORMAT, "metrics": {}}, config=ClientConfig(fetch_metrics=True, clock=clock, mode="simulation", simulation_seed=5))  # fmt: skip
    try:
        assert c.flush(30)  # the server's NEW definition has been fetched, the queued report sent
        conn = sqlite3.connect(storage / DB_FILENAME)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        assert conn.execute("SELECT day, metric, spent, reports FROM ledger").fetchall() == [
            (D0 - 1, "page", 2_000_000_000, 1)
        ]
        assert conn.execute("SELECT metric, definition FROM pins").fetchall() == [("page", definition_of(old_def))]
        assert [(m.spec, recs.tobytes()) for m, recs in server.reports()] == [(old_def.spec, old_record)]
        assert c.stats()["uploaded_reports"] == 7 + 1  # the persisted tally went on counting
        assert c.errors()["metric_refused"] == 1 and "page" not in c.metrics
        c.record("page", TRUE)
        assert c.flush(30) and c.errors()["unknown_metric"] == 1

        serving["doc"] = OLD
        clock.set_day(D0 + 1)
        assert c.flush(30)
        assert c.metrics["page"].spec == old_def.spec
        c.record("page", TRUE)
        assert c.flush(30) and c.stats()["recorded"] == 1
        conn.close()
    finally:
        c.close()
    reports = server.reports()
    assert [m.spec for m, _ in reports] == [old_def.spec] * 2
    spec = old_def.spec
    assert isinstance(spec, RapporSpec)
    key = MemoStore(SECRET).metric_secret("page", spec.memo_derivation_id)
    old_cohort = int(np.frombuffer(old_record, spec.record_dtype)["cohort"][0])
    assert int(reports[1][1]["cohort"][0]) == spec.cohort_of(key) == old_cohort


def test_a_store_newer_than_the_sdk_is_refused(tmp_path) -> None:
    conn = sqlite3.connect(tmp_path / DB_FILENAME)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(sqlite3.DatabaseError, match=f"versions up to {SCHEMA_VERSION}"):
        Store(tmp_path)


# --------------------------------------------------------------------------- pins and processes
def test_an_app_update_cannot_redraw_and_two_processes_agree_on_one_pin(tmp_path) -> None:
    """(a) A new bundled definition of a pinned metric (an app update) is refused like a server's.
    (b) Two clients on one storage directory, started before either reported, hold different
    definitions: the first report pins one; the other client's reports under its own are dropped
    (``pin_conflict``), spend nothing, and it stops using that definition."""
    one = doc(BASE, HASHED)
    two = doc(dict(BASE, hash_seed=9), HASHED)
    clock = Clock(D0)
    a = TelemetryClient(tmp_path / "s", None, POLICY, one, config=ClientConfig(upload=False, clock=clock))
    b = TelemetryClient(tmp_path / "s", None, POLICY, two, config=ClientConfig(upload=False, clock=clock))
    try:
        a.record("page", TRUE)
        assert a.flush(10) and a.stats()["recorded"] == 1
        b.record("page", TRUE)
        assert b.flush(10)
        assert b.stats()["recorded"] == 0 and b.errors()["pin_conflict"] == 1
        assert b.errors()["metric_refused"] == 1 and "page" not in b.metrics
        assert b.privacy_spent().metrics["page"].reports == 1  # a's report only
    finally:
        a.close()
        b.close()
    c = TelemetryClient(
        tmp_path / "s", None, POLICY, copy.deepcopy(two), config=ClientConfig(upload=False, clock=clock)
    )
    try:
        assert c.errors()["metric_refused"] == 1 and "page" not in c.metrics
    finally:
        c.close()
    d = TelemetryClient(tmp_path / "s", None, POLICY, one, config=ClientConfig(upload=False, clock=clock))
    try:
        assert d.errors()["metric_refused"] == 0 and "page" in d.metrics
    finally:
        d.close()
