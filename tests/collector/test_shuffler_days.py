"""One day window for the collector and the shuffler: what the collector answers 202 is counted end to end.

The shuffler used to drop a group once it fell ``max_age_days`` (a setting since removed) behind the newest day
of its partition: one report dated today + 1 dropped groups the collector had accepted. Now expiry follows the
UTC clock with the collector's window (:mod:`ldp_core.days`), and a group dropped because its day left the window
while buffered is counted (``expired_groups``, ``expired_reports``) and logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from collector.http.app import create_app
from collector.settings import CollectorSettings
from collector.shuffler import Shuffler, ShufflerSettings
from ldp_core.days import DayWindow
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import encode_frame
from pipeline.transport import Transport, open_transport
from tests.collector.test_shuffler import Topics, publish, read_shuffled
from tests.support.collector_support import TODAY, ServerThread, olh_batch, write_metrics

DAY = 86400.0


@pytest.fixture
def metrics(tmp_path: Path) -> MetricSet:
    return write_metrics(tmp_path / "metrics.json")


@pytest.fixture
def transport(tmp_path: Path) -> Iterator[Transport]:
    tr = open_transport(f"sqlite:///{tmp_path}/log.sqlite3")
    yield tr
    tr.close()


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_one_report_dated_tomorrow_expires_nothing(metrics: MetricSet, transport: Transport) -> None:
    """The incident: groups of today - 10 and today - 9 stay buffered when a report of today + 1 arrives."""
    tp = Topics()
    old = [olh_batch(metrics, 40, first_seed=40 * i, day=TODAY - 10 + i % 2) for i in range(4)]
    # one partition, as in the incident (the old expiry counted from the newest day of a partition)
    publish(transport, tp.raw, [*old, olh_batch(metrics, 1, first_seed=999, day=TODAY + 1)], partitions=1)
    sh = Shuffler(transport, metrics, tp.settings(min_batch=100, partitions=1))
    sh.run(idle_exit=0.5)
    sh.close()
    assert sh.stats.expired_reports == 0 and sh.stats.buffered_reports == 161
    # they are released once they reach a crowd
    publish(transport, tp.raw, [olh_batch(metrics, 20, first_seed=1000 + 20 * i, day=TODAY - 10 + i) for i in range(2)])
    sh = Shuffler(transport, metrics, tp.settings(min_batch=100, partitions=1))
    sh.run(idle_exit=0.5)
    sh.close()
    out = read_shuffled(transport, tp.shuffled, metrics, expect=200)
    assert sorted(sb.meta.n for _, sb in out) == [100, 100]


def test_a_group_that_leaves_the_window_is_counted_and_logged_once(
    metrics: MetricSet, transport: Transport, caplog: pytest.LogCaptureFixture
) -> None:
    tp = Topics()
    clock = Clock(TODAY * DAY + 3600.0)
    window = DayWindow()
    edge = TODAY - window.max_day_age  # the oldest day the collector accepts today
    publish(transport, tp.raw, [olh_batch(metrics, 30, day=edge), olh_batch(metrics, 20, first_seed=30, day=TODAY)])
    sh = Shuffler(transport, metrics, tp.settings(min_batch=100), clock=clock)
    sh.open()
    try:
        for _ in range(20):
            sh.step(timeout=0.05)
        sh.checkpoint(force=True)
        assert sh.stats.buffered_reports == 50 and sh.stats.expired_reports == 0
        clock.t += window.grace_days * DAY  # the grace day: still kept
        for _ in range(5):
            sh.step(timeout=0.05)
        sh.checkpoint(force=True)
        assert sh.stats.expired_groups == 0 and sh.stats.buffered_reports == 50
        caplog.set_level(logging.WARNING, logger="ldp.shuffler")
        clock.t += DAY  # now edge < today - max_day_age - grace
        for _ in range(20):
            sh.step(timeout=0.05)
        sh.checkpoint(force=True)
        assert sh.stats.expired_groups == 1 and sh.stats.expired_reports == 30
        assert sh.stats.buffered_reports == 20
        # a late upload of that day is dropped too, and counted as such
        publish(transport, tp.raw, [olh_batch(metrics, 5, first_seed=60, day=edge)])
        for _ in range(20):
            sh.step(timeout=0.05)
        sh.checkpoint(force=True)
        assert sh.stats.expired_batches == 1 and sh.stats.expired_reports == 35
    finally:
        sh.close()
    drops = [r for r in caplog.records if "dropping 30 buffered reports" in r.getMessage()]
    assert len(drops) == 1 and f"day {edge}" in drops[0].getMessage()


def test_the_window_is_one_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LDP_MAX_DAY_AGE", "12")
    monkeypatch.setenv("LDP_MAX_DAYS_AHEAD", "2")
    c = CollectorSettings.from_env(metrics_path=str(tmp_path / "m.json"))
    s = ShufflerSettings.from_env()
    assert c.day_window.bounds(TODAY) == s.day_window.bounds(TODAY) == (TODAY - 12, TODAY + 2)
    monkeypatch.setenv("LDP_COLLECTOR_MAX_DAY_AGE", "9")  # the collector's own name still wins
    assert CollectorSettings.from_env(metrics_path="m.json").max_day_age == 9


# -- end to end: collector HTTP -> transport -> shuffler -> shuffled topic ----------------------------------


def edge_batches_are_counted(transport: Transport, tmp_path: Path, metrics: MetricSet) -> None:
    """Batches of today - max_day_age, today - 10 and today + 1 (the window's edges and the incident's days),
    each answered 202 by the collector, are all released by the shuffler, and counted."""
    tp = Topics()
    window = DayWindow()
    days = [TODAY + window.max_days_ahead, TODAY - window.max_day_age, TODAY - 10]  # the newest day first
    settings = CollectorSettings(
        metrics_path=str(tmp_path / "metrics.json"),
        transport_url=transport.url,
        raw_topic=tp.raw,
        raw_partitions=1,  # every day in one partition: the old expiry counted from a partition's newest day
        dedup_path=str(tmp_path / "ids.sqlite3"),
    )
    sent = {d: olh_batch(metrics, 150, first_seed=1000 * i, day=d) for i, d in enumerate(days)}
    with ServerThread(create_app(settings, transport=transport)) as srv:
        for day, batch in sent.items():
            r = httpx.post(
                srv.url + "/v1/reports",
                content=encode_frame(batch),
                headers={"Content-Type": "application/vnd.ldp.frame"},
                timeout=30,
            )
            assert r.status_code == 202, (day, r.text)
        too_old = olh_batch(metrics, 150, day=TODAY - window.max_day_age - 1)
        r = httpx.post(
            srv.url + "/v1/reports",
            content=encode_frame(too_old),
            headers={"Content-Type": "application/vnd.ldp.frame"},
            timeout=30,
        )
        assert r.status_code == 422  # just outside: refused, so nothing answered 202 is ever dropped for its day
    sh = Shuffler(transport, metrics, tp.settings(min_batch=100, max_batch=1000, partitions=1))
    sh.run(idle_exit=1.0)
    sh.close()
    assert sh.stats.expired_reports == 0 and sh.stats.released_reports == 450
    out = read_shuffled(transport, tp.shuffled, metrics, expect=450)
    for day, batch in sent.items():
        got = np.concatenate([sb.batch.records["seed"] for _, sb in out if sb.batch.day == day])
        assert np.array_equal(np.sort(got), np.sort(batch.records["seed"])), day


def test_edge_days_are_counted_end_to_end_embedded(tmp_path: Path, metrics: MetricSet, transport: Transport) -> None:
    edge_batches_are_counted(transport, tmp_path, metrics)


@pytest.mark.kafka
def test_edge_days_are_counted_end_to_end_kafka(tmp_path: Path, metrics: MetricSet, kafka_bootstrap: str) -> None:
    with open_transport(f"kafka://{kafka_bootstrap}") as tr:
        edge_batches_are_counted(tr, tmp_path, metrics)
