"""The collector's counters are durable: kept in the batch-id store, the accepted ones counted in the transaction
that records the ids, so they survive restarts and every process sharing the file renders the same totals."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from collector.dedup import BatchIdStore
from collector.http.app import create_app
from collector.settings import CollectorSettings
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import encode_frame
from pipeline.prometheus import stored_key
from pipeline.transport import Transport, open_transport
from tests.support.collector_support import ServerThread, olh_batch, write_metrics

FRAME = {"content-type": "application/vnd.ldp.frame"}


@pytest.fixture
def metrics(tmp_path: Path) -> MetricSet:
    return write_metrics(tmp_path / "metrics.json")


@pytest.fixture
def transport(tmp_path: Path) -> Iterator[Transport]:
    tr = open_transport(f"sqlite:///{tmp_path}/log.sqlite3")
    yield tr
    tr.close()


def _settings(tmp_path: Path) -> CollectorSettings:
    return CollectorSettings(
        metrics_path=str(tmp_path / "metrics.json"),
        transport_url=f"sqlite:///{tmp_path}/log.sqlite3",
        dedup_path=str(tmp_path / "ids.sqlite3"),
        raw_partitions=2,
    )


def _samples(url: str) -> dict[str, float]:
    """The Prometheus text of ``url``/metrics as {sample with labels: value} (counters of uploads only)."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(("ldp_collector_batches_total", "ldp_collector_reports_total", "ldp_collector_accepted")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


ACCEPTED = 'ldp_collector_reports_total{outcome="accepted",reason="ok"}'
DUPLICATE = 'ldp_collector_reports_total{outcome="duplicate",reason="ok"}'


def test_counters_survive_a_restart_and_accepted_equals_the_ids_recorded(
    tmp_path: Path, metrics: MetricSet, transport: Transport
) -> None:
    batches = [olh_batch(metrics, 50 + i, first_seed=1000 * i) for i in range(3)]
    with ServerThread(create_app(_settings(tmp_path), transport=transport)) as srv:
        for b in batches:
            assert httpx.post(srv.url + "/v1/reports", content=encode_frame(b), headers=FRAME).status_code == 202
        assert (
            httpx.post(srv.url + "/v1/reports", content=encode_frame(batches[0]), headers=FRAME).json()["status"]
            == "duplicate"
        )
        assert httpx.post(srv.url + "/v1/reports", content=b"garbage", headers=FRAME).status_code == 400
        before = _samples(srv.url)
    assert before[ACCEPTED] == 50 + 51 + 52 and before[DUPLICATE] == 50
    assert before['ldp_collector_accepted_reports_total{metric="emoji_used"}'] == 50 + 51 + 52
    rejected = {k: v for k, v in before.items() if k.startswith('ldp_collector_batches_total{outcome="rejected"')}
    assert list(rejected.values()) == [1], before  # the 400, whatever its reason is called
    with ServerThread(create_app(_settings(tmp_path), transport=transport)) as srv:
        assert _samples(srv.url) == before  # a restart: the same counters, before any upload
        b = olh_batch(metrics, 7, first_seed=99_000)
        assert httpx.post(srv.url + "/v1/reports", content=encode_frame(b), headers=FRAME).status_code == 202
        after = _samples(srv.url)
    assert after[ACCEPTED] == before[ACCEPTED] + 7
    conn = sqlite3.connect(tmp_path / "ids.sqlite3")
    days = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'ids_%'")]
    recorded = sum(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in days)
    conn.close()
    assert after['ldp_collector_batches_total{outcome="accepted",reason="ok"}'] == recorded == 4


def test_processes_sharing_the_store_see_one_total_and_pending_counts_are_written_on_close(tmp_path: Path) -> None:
    a = BatchIdStore(tmp_path / "ids.sqlite3", counter_flush=3600.0)
    b = BatchIdStore(tmp_path / "ids.sqlite3", counter_flush=3600.0)
    key = stored_key("ldp_collector_reports_total", ("accepted", "ok"))
    a.add({b"i" * 16: b"c" * 16}, {key: 10})  # with the ids: written at once
    b.add({b"j" * 16: b"d" * 16}, {key: 5})
    a.add_counts({stored_key("ldp_collector_batches_total", ("rejected", "x")): 1})  # pending until a flush
    assert a.counter_values("ldp_collector_reports_total") == {("accepted", "ok"): 15.0}
    assert b.counter_values("ldp_collector_batches_total") == {}
    a.close()
    assert b.counter_values("ldp_collector_batches_total") == {("rejected", "x"): 1.0}
    b.close()
