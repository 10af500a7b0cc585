"""Attacks on sealed reports: linking a shuffled upload by its encapsulations, and the collector's view.

* After the shuffle, records of one upload must not be linkable: the attacker takes one record it knows
  came from a target upload and looks, among the shuffled records, for others sharing its encapsulated
  key (or any other byte string at the same place). With per-record encapsulation it finds none; against
  the alternative this design rejects (one HPKE context per upload, records sealed under sequence
  numbers, so they share one ``enc``) the same attacker recovers the whole upload, which shows the
  attack has teeth.
* The collector validates sealed uploads without any analyzer key: it is served a metrics file with
  public keys only, no key folder exists anywhere it could read, and it still accepts them; nothing it
  serves or stores contains the private key; no module of ``collector`` touches private-key APIs.
"""

from __future__ import annotations

import ast
import json
import pathlib
import time
import uuid
from typing import Any

import httpx
import numpy as np

from client_sdk import ClientConfig, TelemetryClient
from client_sdk.policy import LocalPolicy
from collector.http.app import create_app
from collector.settings import CollectorSettings
from ldp_core.mechanisms import spec_from_dict
from ldp_core.metrics import parse_metrics
from ldp_core.wire import hpke
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, ReportBatch, decode_frame, encode_frame, read_header
from ldp_core.wire.sealing import (
    SEALED_OVERHEAD,
    AnalyzerKey,
    BatchOpener,
    KeyRing,
    SealedSpec,
    open_batch,
    seal_batch,
    sealed_info,
)
from pipeline.envelope import ShuffledBatch, ShuffleMeta, open_sealed
from pipeline.topics import RAW_TOPIC
from pipeline.transport import open_transport
from tests.support.collector_support import TODAY, ServerThread
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = spec_from_dict({"mechanism": "olh", "epsilon": 1.0, "domain_size": 256})
UPLOADS, PER_UPLOAD = 40, 25
COLORS = {"kind": "dictionary", "values": ["red", "green", "blue"], "other": True}


def _uploads(rng: np.random.Generator) -> list[ReportBatch]:
    return [ReportBatch("m", SPEC, TODAY, SPEC.encode(rng.integers(0, 256, PER_UPLOAD), rng)) for _ in range(UPLOADS)]


def _per_upload_context(batch: ReportBatch, key: AnalyzerKey) -> np.ndarray:
    """The rejected design: one HPKE context per upload, each record sealed at the next sequence number
    (same width: key id || the upload's enc || ct)."""
    suite = hpke.Suite()
    enc, ctx = suite.setup_sender(key.public_key, sealed_info(batch.metric, SPEC.spec_id, batch.day, key.key_id))
    kid = bytes.fromhex(key.key_id)
    raw = np.ascontiguousarray(batch.records).view(np.uint8).reshape(len(batch), -1)
    out = b"".join(kid + enc + ctx.seal(row.tobytes()) for row in raw)
    return np.frombuffer(out, dtype=np.dtype([("sealed", np.uint8, (SPEC.record_size + SEALED_OVERHEAD,))]))


def _shuffle(uploads: list[np.ndarray], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    rows = np.concatenate([u.view(np.uint8).reshape(len(u), -1) for u in uploads])
    source = np.repeat(np.arange(len(uploads)), [len(u) for u in uploads])
    perm = rng.permutation(rows.shape[0])
    return rows[perm], source[perm]


def _link(rows: np.ndarray, target: int) -> np.ndarray:
    """The attacker: the shuffled records whose encapsulated key (bytes 4..36) equals the target record's."""
    encs = rows[:, 4:36]
    return np.flatnonzero((encs == encs[target]).all(axis=1))


def test_after_the_shuffle_an_upload_is_not_linkable_through_its_encapsulations() -> None:
    rng = np.random.default_rng(5)
    key = AnalyzerKey(bytes(rng.integers(0, 256, 32, dtype=np.uint8)))
    uploads = _uploads(rng)
    rows, source = _shuffle([seal_batch(u, key.public).records for u in uploads], rng)
    # every encapsulated key is distinct: nothing in a record names its upload
    assert len({r[4:36].tobytes() for r in rows}) == rows.shape[0] == UPLOADS * PER_UPLOAD
    for target in range(0, rows.shape[0], 97):
        linked = _link(rows, target)
        assert linked.tolist() == [target]  # only itself
    # the control: the rejected per-upload context gives the attacker every upload whole
    weak_rows, weak_source = _shuffle([_per_upload_context(u, key) for u in uploads], rng)
    for target in range(0, weak_rows.shape[0], 97):
        linked = _link(weak_rows, target)
        assert len(linked) == PER_UPLOAD and set(weak_source[linked]) == {weak_source[target]}
    # the rejected design is a working one, just a linkable one: its records open in order
    first = _per_upload_context(uploads[0], key).view(np.uint8).reshape(PER_UPLOAD, -1)
    ctx = hpke.Suite().setup_receiver(
        first[0, 4:36].tobytes(), key.private, key.public_key, sealed_info("m", SPEC.spec_id, TODAY, key.key_id)
    )
    opened = b"".join(ctx.open(r[36:].tobytes()) for r in first)
    assert opened == uploads[0].records.tobytes()
    assert sorted(np.bincount(source).tolist()) == [PER_UPLOAD] * UPLOADS


def _metrics_doc(key: AnalyzerKey) -> dict[str, object]:
    return {
        "format": "ldp-metrics/1",
        "analyzer_keys": [key.public.to_dict()],
        "metrics": {
            "m": {
                "description": "sealed",
                "owner": "o@example.org",
                "expires": "2099-12-31",
                "mechanism": {"mechanism": "olh", "epsilon": 1.0},
                "domain": {"kind": "hashed", "size": 256, "seed": 0},
                "max_reports_per_day": 1,
                "sealed": True,
            },
            "p": {
                "description": "plain",
                "owner": "o@example.org",
                "expires": "2099-12-31",
                "mechanism": {"mechanism": "olh", "epsilon": 1.0},
                "domain": {"kind": "hashed", "size": 256, "seed": 0},
                "max_reports_per_day": 1,
            },
        },
    }


def test_the_collector_validates_sealed_uploads_without_the_private_key(tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(9)
    key = AnalyzerKey(bytes(rng.integers(0, 256, 32, dtype=np.uint8)))  # exists in this test only: no key file
    secret = key.private_bytes().hex()
    (tmp_path / "metrics.json").write_text(json.dumps(_metrics_doc(key)))
    settings = CollectorSettings(
        metrics_path=str(tmp_path / "metrics.json"),
        transport_url=f"sqlite:///{tmp_path}/log.sqlite3",
        dedup_path=str(tmp_path / "ids.sqlite3"),
        raw_partitions=1,
    )
    plain = ReportBatch("m", SPEC, TODAY, SPEC.encode(rng.integers(0, 256, 30), rng))
    sealed = seal_batch(plain, key.public)
    other = seal_batch(plain, AnalyzerKey(bytes(32 * [7])).public)  # sealed to a key the file does not name
    p_sealed = seal_batch(ReportBatch("p", SPEC, TODAY, plain.records), key.public)
    app = create_app(settings)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        h = {"content-type": FRAME_CONTENT_TYPE}
        ok = http.post("/v1/reports", content=encode_frame(sealed), headers=h)
        assert ok.status_code == 202, ok.text
        plain_r = http.post(
            "/v1/reports", content=encode_frame(ReportBatch("m", SPEC, TODAY, plain.records)), headers=h
        )
        assert (plain_r.status_code, plain_r.json()["error"]) == (422, "spec_mismatch")
        assert "is sealed" in plain_r.json()["message"]
        unknown = http.post("/v1/reports", content=encode_frame(other), headers=h)
        assert (unknown.status_code, unknown.json()["error"]) == (422, "unknown_analyzer_key")
        wrong = http.post("/v1/reports", content=encode_frame(p_sealed), headers=h)
        assert (wrong.status_code, wrong.json()["error"]) == (422, "not_sealed_metric")
        as_json = http.post(
            "/v1/reports",
            json={
                "version": 1,
                "metric": "m",
                "spec_id": SPEC.spec_id,
                "day": TODAY,
                "batch_id": uuid.uuid4().hex,
                "records": [[1, 2]],
            },
        )
        assert (as_json.status_code, as_json.json()["error"]) == (422, "spec_mismatch")
        served = http.get("/v1/metrics").text
    served_doc = parse_metrics(served)
    assert served_doc.analyzer_key == key.public and served_doc["m"].sealed
    assert secret not in served and secret not in repr(settings) and secret not in repr(app.state.metrics.to_dict())
    tr = open_transport(settings.transport_url)
    try:
        with tr.consume(RAW_TOPIC, "reader") as c:
            values = [r.value for r in c.poll(max_records=100, timeout=1.0)]
    finally:
        tr.close()
    assert len(values) == 1
    stored = decode_frame(values[0], SPEC)
    assert stored.sealed and np.array_equal(stored.records, sealed.records)
    assert plain.records.tobytes() not in values[0] and secret not in values[0].hex()


_PRIVATE_KEY_APIS = {
    "KeyRing",
    "AnalyzerKey",
    "load_key_file",
    "new_key_file",
    "BatchOpener",
    "open_batch",
    "open_sealed",
}


def test_no_collector_module_uses_an_analyzer_private_key_api() -> None:
    found = []
    for path in sorted((ROOT / "collector").rglob("*.py")):
        if path.parts[-2] == "sinks":  # the sink runs in the analyzer's domain (it opens records)
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = {a.name for a in node.names} if isinstance(node, ast.ImportFrom) else set()
            if isinstance(node, ast.Name):
                names = {node.id}
            if isinstance(node, ast.Attribute):
                names = {node.attr}
            hit = names & _PRIVATE_KEY_APIS
            if hit:
                found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)} {sorted(hit)}")
    assert not found, found


# ---------------------------------------------------------------------------------------------------------
# An active collector against the device: the real TelemetryClient fetches the hostile collector's
# GET /v1/metrics (a real `ldp collector` process serving a document the attacker wrote) and uploads to it
# over 4 simulated days, one report a day.

DAYS = 4
_COMMON = {"description": "d", "owner": "o@example.org", "expires": "2099-12-31", "max_reports_per_day": 2}
_COLOR = {**_COMMON, "mechanism": {"mechanism": "grr", "epsilon": 1.0}, "domain": COLORS}
_POLICY = LocalPolicy(per_metric_daily=2.0, total_daily=4.0)
START = (TODAY - DAYS + 1) * 86400 + 43200.0  # noon of the first simulated day


def _color_doc(keys: list[AnalyzerKey], *, sealed: bool = True) -> dict[str, Any]:
    color = {**_COLOR, "sealed": True} if sealed else dict(_COLOR)
    doc: dict[str, Any] = {"format": "ldp-metrics/1", "metrics": {"color": color}}
    if keys:
        doc["analyzer_keys"] = [k.public.to_dict() for k in keys]
    return doc


def _opened(batches: list[ReportBatch], key: AnalyzerKey) -> int:
    """How many records of ``batches`` the holder of ``key`` opens."""
    return sum(len(open_batch(b, KeyRing([key])).batch) for b in batches)


def _days_against(collector: Any, storage: pathlib.Path, bundled: dict[str, Any]) -> dict[str, int]:
    """The device bundles ``bundled``, refreshes its definitions from ``collector`` every simulated day and
    records one report of ``color`` a day for DAYS days (the collector's window takes the last 4 days).
    Returns the device's errors and stats, and ``pending``: the reports left in its outbox."""
    now = [START]
    c = TelemetryClient(
        storage,
        collector.url,
        _POLICY,
        bundled,
        config=ClientConfig(
            batch_size=1, batch_max_age=0.0, fetch_metrics=True, metrics_refresh_interval=3600.0, clock=lambda: now[0]
        ),
    )
    try:
        deadline = time.monotonic() + 20
        while c._server is None and time.monotonic() < deadline:  # the first GET /v1/metrics, at start
            time.sleep(0.02)
        assert c._server is not None
        for day in range(DAYS):
            now[0] = START + day * 86400
            c.flush(30)  # the day's refresh of the served definitions, before the day's report
            c.record("color", "red")
            c.flush(30)
        return {**c.errors(), **c.stats(), "pending": c.pending_reports()}
    finally:
        c.close()


def _color_frames(collector: Any) -> list[ReportBatch]:
    """What the collector accepted of ``color``, decoded (sealed or plain, as each frame says)."""
    spec = parse_metrics(json.dumps(_color_doc([], sealed=False)))["color"].spec
    sealed = SealedSpec.of(spec)
    out = []
    for f in collector.frames():
        h = read_header(f)
        if h.metric == "color":
            out.append(decode_frame(f, sealed if h.sealed else spec))
    return out


def test_a_collector_serving_its_own_analyzer_key_opens_no_upload(
    tmp_path: pathlib.Path, collector_factory: Any
) -> None:
    rng = np.random.default_rng(21)
    analyzer = AnalyzerKey(bytes(rng.integers(0, 256, 32, dtype=np.uint8)))
    attacker = AnalyzerKey(bytes(rng.integers(0, 256, 32, dtype=np.uint8)))
    # the hostile collector serves its own key first and keeps the analyzer's listed, so that it accepts
    # whatever the device sends: it can only read what is sealed to its key
    hostile = collector_factory(metrics=_color_doc([attacker, analyzer]))
    tally = _days_against(hostile, tmp_path / "sdk", _color_doc([analyzer]))
    frames = _color_frames(hostile)
    assert sum(len(b) for b in frames) == DAYS, tally  # every day's report reached the collector ...
    assert all(b.sealed for b in frames)
    assert _opened(frames, attacker) == 0  # ... and it opens none
    assert _opened(frames, analyzer) == DAYS  # the analyzer opens all
    assert tally["analyzer_key_refused"] == 1


def test_a_collector_serving_an_unsealed_definition_gets_nothing_in_plain(
    tmp_path: pathlib.Path, collector_factory: Any
) -> None:
    rng = np.random.default_rng(22)
    analyzer = AnalyzerKey(bytes(rng.integers(0, 256, 32, dtype=np.uint8)))
    bundled = _color_doc([analyzer])
    # a report recorded under the bundled (sealed) definition waits in the outbox when the device meets
    # the hostile collector: it too must leave sealed
    early = TelemetryClient(
        tmp_path / "sdk", None, _POLICY, bundled, config=ClientConfig(upload=False, clock=lambda: START - 3600)
    )
    early.record("color", "blue")
    early.close()
    hostile = collector_factory(metrics=_color_doc([analyzer], sealed=False))
    tally = _days_against(hostile, tmp_path / "sdk", bundled)
    frames = _color_frames(hostile)
    plain = sum(len(b) for b in frames if not b.sealed)
    assert plain == 0  # nothing reached the hostile collector in plain
    assert tally["unsealing_refused"] == 1 and tally["metric_refused"] >= 1
    assert tally["unknown_metric"] == DAYS  # the refused metric is not reported (no ε spent on it)
    assert tally["recorded"] == 0
    # the early report left sealed, and the collector that declared the metric plain refused it (422)
    assert tally["upload_rejected_reports"] == 1 and tally["pending"] == 0, tally


def test_a_sealed_frame_replayed_under_a_fresh_batch_id_is_counted_once(tmp_path: pathlib.Path) -> None:
    """Issue #28, played as the adversary: whoever holds a sealed frame (the collector, a reader of
    ``ldp.reports.raw``) re-posts its records under a fresh batch id over HTTP; the collector's duplicate
    store keys on the batch id, so it takes them. The analyzer's opener (the path the sink and the streaming
    estimator take: :func:`open_sealed` with the log record as the source) must count each record once,
    since the copy carries the same per-record encapsulated key. Before the fix all 30 opened twice."""
    rng = np.random.default_rng(23)
    key = AnalyzerKey(bytes(rng.integers(0, 256, 32, dtype=np.uint8)))
    (tmp_path / "metrics.json").write_text(json.dumps(_metrics_doc(key)))
    settings = CollectorSettings(
        metrics_path=str(tmp_path / "metrics.json"),
        transport_url=f"sqlite:///{tmp_path}/log.sqlite3",
        dedup_path=str(tmp_path / "ids.sqlite3"),
        raw_partitions=1,
    )
    sealed = seal_batch(ReportBatch("m", SPEC, TODAY, SPEC.encode(rng.integers(0, 256, 30), rng)), key.public)
    replay = ReportBatch(sealed.metric, sealed.spec, sealed.day, sealed.records, uuid.uuid4().bytes)
    h = {"content-type": FRAME_CONTENT_TYPE}
    with ServerThread(create_app(settings)) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.post("/v1/reports", content=encode_frame(sealed), headers=h).status_code == 202
        again = http.post("/v1/reports", content=encode_frame(sealed), headers=h)  # same id: a duplicate
        assert (again.status_code, again.json()["status"]) == (202, "duplicate")
        assert http.post("/v1/reports", content=encode_frame(replay), headers=h).status_code == 202
    tr = open_transport(settings.transport_url)
    try:
        with tr.consume(RAW_TOPIC, "reader") as c:
            values = [r.value for r in c.poll(max_records=100, timeout=1.0)]
    finally:
        tr.close()
    assert len(values) == 2  # the same batch id once; the fresh one again: both reach the analyzer
    opener = BatchOpener(KeyRing([key]))
    counted, replayed = [], 0
    for offset, v in enumerate(values):  # as the shuffler forwards them: one envelope per log record
        b = decode_frame(v, SPEC)
        sb = ShuffledBatch(ShuffleMeta(b.batch_id.hex(), len(b), 1.0), b)
        got, failed, dropped = open_sealed(sb, opener, ("ldp.reports.shuffled", 0, offset))
        assert failed == 0
        counted.append(len(got.batch))
        replayed += dropped
    assert counted == [30, 0] and replayed == 30 and opener.replays.dropped == 30
    # a redelivery of the same log record (a rebalance, a restart before the commit) is not a replay
    first = decode_frame(values[0], SPEC)
    again_sb = ShuffledBatch(ShuffleMeta(first.batch_id.hex(), len(first), 1.0), first)
    redelivered, _, dropped = open_sealed(again_sb, opener, ("ldp.reports.shuffled", 0, 0))
    assert (len(redelivered.batch), dropped) == (30, 0)
