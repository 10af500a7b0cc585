"""TelemetryClient: the hot path never raises and counts what goes wrong; report
sampling and caps; server metric definitions checked against the local policy;
what leaves the device."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import stat
import threading
import time

import numpy as np
import pytest

from client_sdk.client import ERROR_TALLIES, STAT_TALLIES, TelemetryClient
from client_sdk.config import ClientConfig, ClientConfigError
from client_sdk.policy import LocalPolicy
from client_sdk.store import Store
from client_sdk.upload.backoff import BackoffPolicy
from client_sdk.upload.uploader import FRAME_CONTENT_TYPE, HttpRequest, HttpResponse
from ldp_core.errors import BudgetError
from ldp_core.metrics import FORMAT, MetricsFileError, parse_metrics
from ldp_core.randomness import secure_generator
from ldp_core.wire.frames import decode_frame, read_header
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)

DAY = 86400.0
T0 = 20_500 * DAY + 7200.0


def metric(mechanism: dict, domain: dict, r: int = 1, expires: str = "2099-12-31") -> dict:
    return {
        "description": "test metric",
        "owner": "sdk-tests@example.org",
        "expires": expires,
        "mechanism": mechanism,
        "domain": domain,
        "max_reports_per_day": r,
    }


COLORS = {"kind": "dictionary", "values": ["red", "green", "blue"], "other": True}
DOC = {
    "format": FORMAT,
    "metrics": {
        "color": metric({"mechanism": "grr", "epsilon": 1.0}, COLORS, r=3),
        "word": metric({"mechanism": "grr", "epsilon": 0.5}, {"kind": "hashed", "size": 64}, r=4),
        "flag": metric({"mechanism": "rr", "epsilon": 0.5}, {"kind": "dictionary", "values": [0, 1]}, r=1),
    },
}
POLICY = LocalPolicy(per_metric_daily=3.0, total_daily=4.0)


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeCollector:
    """An in-memory transport: records requests, answers 202 (and serves metrics)."""

    def __init__(self, metrics_doc: dict | None = None) -> None:
        self.requests: list[HttpRequest] = []
        self.metrics_doc = metrics_doc
        self.lock = threading.Lock()

    def __call__(self, req: HttpRequest) -> HttpResponse:
        with self.lock:
            self.requests.append(req)
        if req.method == "GET":
            if self.metrics_doc is None:
                return HttpResponse(404, {})
            return HttpResponse(200, {"Content-Type": "application/json"}, json.dumps(self.metrics_doc).encode())
        return HttpResponse(202, {})

    def frames(self) -> list[bytes]:
        return [r.body for r in self.requests if r.method == "POST" and r.body is not None]


def make_client(tmp_path, doc=DOC, policy=POLICY, clock=None, transport=None, **kw) -> TelemetryClient:
    return TelemetryClient(
        tmp_path / "sdk",
        "http://127.0.0.1:9",
        policy,
        doc,
        config=ClientConfig(
            transport=transport if transport is not None else FakeCollector(),
            clock=clock if clock is not None else Clock(),
            **kw,
        ),
    )


class Nasty:
    def __hash__(self) -> int:
        raise RuntimeError("boom")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("boom")


def test_hot_path_never_raises_and_counts_each_kind(tmp_path) -> None:
    with make_client(tmp_path) as c:
        c.record("color", "red")  # fine
        c.record("color", 3.5)  # not str/int -> bad value
        c.record("color", None)
        c.record("color", b"red")
        c.record("color", 2**70)  # does not fit 64 bits
        c.record("flag", 2)  # dictionary without 'other'
        c.record("color", ["red"])  # unhashable
        c.record("nope", 1)  # unknown metric
        c.record(["not", "a", "name"], 1)  # type: ignore[arg-type]
        c.record("color", Nasty())
        assert c.flush(10)
        errors = c.errors()
        assert set(errors) == set(ERROR_TALLIES) and set(c.stats()) == set(STAT_TALLIES)
        assert errors["bad_value"] == 7
        assert errors["unknown_metric"] == 2
        assert errors["internal_error"] == 0
        assert c.stats()["recorded"] == 1
    c.record("color", "red")  # after close: counted, not raised
    assert c.errors()["closed"] == 1


def test_configuration_errors_fail_loudly(tmp_path) -> None:
    with pytest.raises(ClientConfigError, match="simulation"):
        make_client(tmp_path, simulation_seed=1)
    with pytest.raises(ClientConfigError, match="collector_url"):
        TelemetryClient(tmp_path, "ftp://x", POLICY, DOC)
    with pytest.raises(ClientConfigError, match="collector_url"):
        TelemetryClient(tmp_path, None, POLICY, DOC)
    with pytest.raises(ClientConfigError, match="LocalPolicy"):
        TelemetryClient(tmp_path, "http://127.0.0.1:9", {"total": 1}, DOC)  # type: ignore[arg-type]
    with pytest.raises(BudgetError, match="'color'"):  # 3 reports x 1.0 > 2.0
        make_client(tmp_path, policy=LocalPolicy(per_metric_daily=2.0, total_daily=4.0))
    with pytest.raises(MetricsFileError):
        make_client(tmp_path, doc={"format": FORMAT, "metrics": {"x": {}}})
    afile = tmp_path / "a_file"
    afile.write_text("")
    with pytest.raises(ClientConfigError, match="storage_dir"):
        TelemetryClient(afile, "http://127.0.0.1:9", POLICY, DOC)
    with pytest.raises(ClientConfigError, match="max_queue"):
        make_client(tmp_path, max_queue=0)


def test_a_config_object_configures_the_client(tmp_path) -> None:
    clock, fake, backoff = Clock(), FakeCollector(), BackoffPolicy(base=2.0, max_delay=8.0)
    config = ClientConfig(transport=fake, clock=clock, batch_size=2, max_queue=50, upload_timeout=5.0, backoff=backoff)
    with TelemetryClient(tmp_path / "a", "http://127.0.0.1:9", POLICY, DOC, config) as c:
        assert c.config is config and c.mode == "device"
        assert c._uploader is not None and c._uploader.batch_size == 2 and c._uploader.backoff is backoff
        assert c._uploader.transport is fake and c._uploader.timeout == 5.0 and c._max_queue == 50
        for _ in range(3):
            c.record("color", "red")
        assert c.flush(10) and c.stats()["uploaded_reports"] == 3
    assert len([r for r in fake.requests if r.method == "POST"]) == 2  # batches of 2, as configured
    with TelemetryClient(tmp_path / "c", None, POLICY, DOC, config=dataclasses.replace(config, upload=False)) as c:
        assert c._uploader is None and c._max_queue == 50
    with pytest.raises(TypeError, match="upload"):
        TelemetryClient(tmp_path / "d", None, POLICY, DOC, upload=False)  # type: ignore[call-arg]  # ClientConfig only


def test_the_config_is_checked_when_it_is_made(tmp_path) -> None:
    with pytest.raises(ClientConfigError, match="simulation"):
        ClientConfig(simulation_seed=3)
    with pytest.raises(ClientConfigError, match="mode"):
        ClientConfig(mode="production")  # type: ignore[arg-type]
    with pytest.raises(ClientConfigError, match="batch_size"):
        ClientConfig(batch_size=0)
    with pytest.raises(ClientConfigError, match="upload_timeout"):
        ClientConfig(upload_timeout=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ClientConfig().upload = False  # type: ignore[misc]
    with pytest.raises(ClientConfigError, match="ClientConfig"):
        TelemetryClient(tmp_path, None, POLICY, DOC, {"upload": False})  # type: ignore[arg-type]
    assert ClientConfig(mode="simulation", simulation_seed=3).simulation_seed == 3


def test_report_sampling_caps_and_days(tmp_path) -> None:
    clock = Clock()
    with make_client(tmp_path, clock=clock, upload=False) as c:
        for _ in range(10):
            c.record("color", "blue")
        assert c.flush(10)
        assert c.stats()["recorded"] == 3 and c.stats()["sampled_out"] == 7  # r = 3
        for _ in range(5):
            c.record("word", "w")  # 4 x 0.5 would fit the metric cap; the total cap (4.0) allows 2
        c.record("flag", 1)
        assert c.flush(10)
        day = c.privacy_spent()
        assert day.day == 20_500
        assert day.spent == pytest.approx(4.0) and day.remaining == pytest.approx(0.0)
        assert day.metrics["color"].spent == pytest.approx(3.0) and day.metrics["color"].reports == 3
        assert day.metrics["word"].reports == 2 and day.metrics["word"].remaining == pytest.approx(2.0)
        assert "flag" not in day.metrics
        assert c.stats()["over_budget"] == 4  # 3 words + 1 flag
        with pytest.raises(TypeError):
            day.metrics["x"] = day.metrics["word"]  # type: ignore[index]

        clock.t = T0 - 3 * DAY  # clock set back: still day 20500, nothing new
        c.record("flag", 0)
        c.record("color", "red")
        assert c.flush(10)
        assert c.stats()["recorded"] == 5
        assert [d.day for d in c.privacy_history()] == [20_500]

        clock.t = T0 + DAY  # next day: fresh budget
        c.record("flag", 0)
        assert c.flush(10)
        assert c.stats()["recorded"] == 6
        assert c.privacy_spent().day == 20_501 and c.privacy_spent(20_500).spent == pytest.approx(4.0)
        assert c.pending_reports() == 6


def test_expired_metric_stops_recording(tmp_path) -> None:
    doc = copy.deepcopy(DOC)
    doc["metrics"]["old"] = metric(
        {"mechanism": "rr", "epsilon": 0.5}, {"kind": "dictionary", "values": [0, 1]}, expires="2026-01-01"
    )
    clock = Clock((20_454 + 1) * DAY)  # 2026-01-02
    with make_client(tmp_path, doc=doc, clock=clock, upload=False) as c:
        c.record("old", 1)
        clock.t = 20_454 * DAY + 10  # the clock goes back to 2026-01-01: the high-water mark keeps it expired
        c.record("old", 1)
        c.flush(5)
        assert c.errors()["expired_metric"] == 1 and c.stats()["recorded"] == 1


def test_queue_full_is_counted_not_blocking(tmp_path) -> None:
    with make_client(tmp_path, upload=False, max_queue=5) as c:
        blocker = Store(c.storage_dir)
        conn = blocker.connection()
        conn.execute("BEGIN IMMEDIATE")  # the recorder's next transaction waits for this lock
        c.record("color", "red")
        deadline = time.monotonic() + 10
        while c._queue and time.monotonic() < deadline:  # the recorder took it and is waiting
            time.sleep(0.01)
        time.sleep(0.05)
        for _ in range(8):  # record() never touches the database, so the held lock cannot block it
            c.record("word", "x")
        assert c.errors()["queue_full"] == 3
        conn.execute("ROLLBACK")
        blocker.close()
        assert c.flush(10)
        assert c.stats()["recorded"] == 1 + 4  # color once, word up to r = 4
        assert c.stats()["sampled_out"] == 1


def test_concurrent_recording_accounts_for_every_call(tmp_path) -> None:
    policy = LocalPolicy(per_metric_daily=20.0, total_daily=25.0)
    doc = copy.deepcopy(DOC)
    doc["metrics"]["color"]["max_reports_per_day"] = 20  # 20 x 1.0
    doc["metrics"]["word"]["max_reports_per_day"] = 20  # 20 x 0.5; together above the total cap
    calls = 4 * 500
    with make_client(tmp_path, doc=doc, policy=policy, upload=False, max_queue=100_000) as c:

        def work(k: int) -> None:
            for i in range(500):
                c.record("color" if i % 2 else "word", f"v{(i + k) % 7}")

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert c.flush(30)
        s, e = c.stats(), c.errors()
        assert s["recorded"] + s["sampled_out"] + s["over_budget"] + sum(e.values()) == calls
        day = c.privacy_spent()
        assert day.spent <= 25.0
        assert day.remaining < 0.5  # saturated: not even one more word fits
        assert day.metrics["color"].reports <= 20 and day.metrics["word"].reports <= 20
        assert day.metrics["color"].reports + day.metrics["word"].reports == s["recorded"]
        assert c.pending_reports() == s["recorded"]


def test_reports_carry_only_metric_spec_day_and_record(tmp_path) -> None:
    """With ε = 30 GRR reports its input with probability 1 - (d-1)/(e^30 + d - 1) > 1 - 1e-11,
    so the uploaded records must be exactly the recorded indices, per metric."""
    doc = {
        "format": FORMAT,
        "metrics": {
            "a": metric(
                {"mechanism": "grr", "epsilon": 30.0}, {"kind": "dictionary", "values": list(range(100))}, r=50
            ),
            "b": metric(
                {"mechanism": "grr", "epsilon": 30.0}, {"kind": "dictionary", "values": list(range(1000))}, r=50
            ),
        },
    }
    fake = FakeCollector()
    policy = LocalPolicy(per_metric_daily=1500.0, total_daily=3000.0)
    with make_client(tmp_path, doc=doc, policy=policy, transport=fake, batch_size=20) as c:
        for i in range(50):
            c.record("a", i)
            c.record("b", 999 - i)
        assert c.flush(20)
        assert c.stats()["uploaded_reports"] == 100
    specs = {m.spec.spec_id: m.spec for m in parse_metrics(doc).values()}
    got: dict[str, list[int]] = {"a": [], "b": []}
    ids = set()
    for req in fake.requests:
        assert set(req.headers) == {"Content-Type", "Idempotency-Key", "User-Agent"}
        assert req.headers["Content-Type"] == FRAME_CONTENT_TYPE
        batch = decode_frame(req.body, specs)
        assert req.headers["Idempotency-Key"] == batch.batch_id.hex()
        assert batch.day == 20_500 and len(batch) <= 20
        assert batch.records.dtype.names == ("value",)  # nothing but the privatized value
        got[batch.metric] += batch.records["value"].tolist()
        ids.add(batch.batch_id)
    assert sorted(got["a"]) == list(range(50)) and sorted(got["b"]) == list(range(950, 1000))
    assert len(ids) == len(fake.requests) == 6  # 2 metrics x ceil(50 / 20)


def test_simulation_seed_reproduces_reports(tmp_path) -> None:
    def run(sub: str) -> list[bytes]:
        fake = FakeCollector()
        doc = copy.deepcopy(DOC)
        doc["metrics"]["word"]["max_reports_per_day"] = 100
        policy = LocalPolicy(per_metric_daily=100.0, total_daily=100.0)
        with make_client(
            tmp_path / sub, doc=doc, policy=policy, transport=fake, mode="simulation", simulation_seed=42
        ) as c:
            for i in range(100):
                c.record("word", i)
            assert c.flush(10)
        spec = parse_metrics(doc)["word"].spec
        return [decode_frame(f, spec).records.tobytes() for f in fake.frames()]

    a, b = run("one"), run("two")
    assert a == b and len(a) == 1


def test_server_metrics_above_the_local_policy_are_refused_and_counted(tmp_path, collector_factory) -> None:  # noqa: F811
    server_doc = copy.deepcopy(DOC)
    server_doc["metrics"]["color"]["mechanism"]["epsilon"] = 5.0  # 3 x 5 per day: above the cap of 3
    server_doc["metrics"]["greedy"] = metric({"mechanism": "grr", "epsilon": 4.0}, COLORS)  # above the cap
    server_doc["metrics"]["fresh"] = metric({"mechanism": "grr", "epsilon": 0.25}, COLORS)  # fits
    path = tmp_path / "server_metrics.json"
    path.write_text(json.dumps(server_doc))
    col = collector_factory(metrics=path)
    now = Clock(time.time())  # the real collector takes batches of recent days only
    c = TelemetryClient(tmp_path / "sdk", col.url, POLICY, DOC, config=ClientConfig(fetch_metrics=True, clock=now))
    try:
        deadline = time.monotonic() + 20
        while "fresh" not in c.metrics and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "fresh" in c.metrics
        assert c.errors()["metric_refused"] == 2
        assert "greedy" not in c.metrics
        assert c.metrics["color"].spec.epsilon == 1.0  # the bundled definition stays
        c.record("greedy", "red")
        c.record("fresh", "red")
        c.record("color", "red")
        assert c.flush(20)
        assert c.errors()["unknown_metric"] == 1
        # the collector takes "color" only under its own (refused) spec: 422, dropped and counted
        assert c.stats()["uploaded_reports"] == 1
        assert c.errors()["upload_rejected_reports"] == 1
        spent = c.privacy_spent()
        assert spent.metrics["fresh"].spent == pytest.approx(0.25)
        assert spent.metrics["color"].spent == pytest.approx(1.0)
    finally:
        c.close()
    frames = col.frames()
    assert [read_header(f).metric for f in frames] == ["fresh"]
    assert col.stats()["invalid"] == 1
    c2 = TelemetryClient(tmp_path / "sdk", None, POLICY, DOC, config=ClientConfig(upload=False, clock=now))
    try:
        assert "fresh" not in c2.metrics  # fetch_metrics=False: bundled only
    finally:
        c2.close()
    col.stop()
    # with fetching on, a restarted client uses the stored server definitions while the server is away
    c3 = TelemetryClient(
        tmp_path / "sdk", col.url, POLICY, DOC, config=ClientConfig(fetch_metrics=True, upload=False, clock=now)
    )
    try:
        assert "fresh" in c3.metrics and "greedy" not in c3.metrics
        deadline = time.monotonic() + 20
        while c3.errors()["metrics_fetch_failed"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c3.errors()["metrics_fetch_failed"] == 1
        assert c3.errors()["metric_refused"] == 2  # the stored server document is checked again
    finally:
        c3.close()


def test_csprng_generator_is_uniform_and_unseeded() -> None:
    """Chi-square of 100,000 draws over 16 cells: mean 15, sd sqrt(30) ~ 5.5; 60 is over 8 sd."""
    g = secure_generator()
    x = g.integers(0, 16, size=100_000)
    counts = np.bincount(x, minlength=16)
    chi2 = float(((counts - 6250.0) ** 2 / 6250.0).sum())
    assert chi2 < 60.0
    u = g.random(100_000)
    assert abs(u.mean() - 0.5) < 6 * np.sqrt(1 / 12 / 100_000)
    assert not np.array_equal(secure_generator().integers(0, 2**62, 4), secure_generator().integers(0, 2**62, 4))


def test_a_forked_child_does_not_queue_into_a_dead_client(tmp_path) -> None:
    import os

    with make_client(tmp_path, upload=False) as c:
        pid = os.fork()
        if pid == 0:  # the child: no SDK threads exist here
            c.record("color", "red")
            os._exit(0 if (c._tally["closed"] == 1 and not c._queue) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        c.record("color", "red")  # the parent is unaffected
        assert c.flush(10) and c.stats()["recorded"] == 1


def test_the_sdks_files_are_private_to_the_app(tmp_path) -> None:
    """Another local user (the attacker here) must not read what the device spent or what waits in its
    outbox: the database, its WAL files and the cached server metrics are 0600 like the memo secret, even
    under a permissive umask, and a database left 0644 by an older SDK is tightened on open."""
    old = os.umask(0o022)
    try:
        fake = FakeCollector(DOC)
        with make_client(tmp_path, transport=fake, fetch_metrics=True) as client:
            client.record("color", "red")
            client.flush()
        files = [p for p in (tmp_path / "sdk").iterdir() if p.is_file()]
        assert any(p.name.endswith(".sqlite3") for p in files), files
        for p in files:
            assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p.name, oct(p.stat().st_mode))
        db = next(p for p in files if p.name.endswith(".sqlite3"))
        os.chmod(db, 0o644)
        with make_client(tmp_path):
            assert stat.S_IMODE(db.stat().st_mode) == 0o600
    finally:
        os.umask(old)


@pytest.mark.parametrize("url", ["http://collector.example.org", "http://10.1.2.3:8080", "http://127.example.org"])
def test_plain_http_off_loopback_is_refused(tmp_path, url: str) -> None:
    """A network observer would read every report and batch id of a plain-http upload."""
    with pytest.raises(ClientConfigError, match="https"):
        TelemetryClient(tmp_path / "sdk", url, POLICY, DOC, config=ClientConfig(transport=FakeCollector()))


@pytest.mark.parametrize(
    "url", ["https://collector.example.org", "http://127.0.0.1:8080", "http://[::1]:9", "http://localhost:8080"]
)
def test_https_and_loopback_http_are_accepted(tmp_path, url: str) -> None:
    TelemetryClient(tmp_path / "sdk", url, POLICY, DOC, config=ClientConfig(transport=FakeCollector())).close()
