"""pipeline.prometheus: the services' /metrics on prometheus-client, one registry per app."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from prometheus_client import Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from pipeline.prometheus import CONTENT_TYPE, Readings, StoredCounter, new_registry, render, stored_key


class DictStore:
    """A CounterStore in memory (the collector's is its batch-id store)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add_counts(self, counts: Mapping[str, int]) -> None:
        for k, v in counts.items():
            self.counts[k] = self.counts.get(k, 0) + v

    def counter_values(self, name: str) -> dict[tuple[str, ...], float]:
        out: dict[tuple[str, ...], float] = {}
        for key, value in self.counts.items():
            family, _, labels = key.partition("\t")
            if family == name:
                out[tuple(labels.strip("[]").replace('"', "").split(","))] = float(value)
        return out


def samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
    }


def test_two_apps_in_one_process_keep_their_own_families() -> None:
    a, b = new_registry(), new_registry()
    ca = Counter("ldp_test_uploads_total", "uploads", ["outcome"], registry=a)
    cb = Counter("ldp_test_uploads_total", "uploads", ["outcome"], registry=b)  # no clash: another registry
    ca.labels(outcome="ok").inc(3)
    cb.labels(outcome="ok").inc()
    assert samples(render(a))[("ldp_test_uploads_total", frozenset({("outcome", "ok")}))] == 3
    assert samples(render(b))[("ldp_test_uploads_total", frozenset({("outcome", "ok")}))] == 1
    with pytest.raises(ValueError):
        Counter("ldp_test_uploads_total", "again", registry=a)  # one name once per registry


def test_stored_counter_moves_to_its_store_and_renders_from_it() -> None:
    r = new_registry()
    c = StoredCounter("ldp_test_batches_total", "batches", ["outcome", "reason"], registry=r)
    c.labels(outcome="rejected", reason="malformed").inc()
    store = DictStore()
    c.persist(store)
    assert store.counts == {stored_key("ldp_test_batches_total", ("rejected", "malformed")): 1}
    c.labels(outcome="rejected", reason="malformed").inc(2)
    store.add_counts({stored_key("ldp_test_batches_total", ("accepted", "ok")): 5})  # another process's
    got = samples(render(r))
    assert got[("ldp_test_batches_total", frozenset({("outcome", "rejected"), ("reason", "malformed")}))] == 3
    assert got[("ldp_test_batches_total", frozenset({("outcome", "accepted"), ("reason", "ok")}))] == 5
    assert c.value(outcome="accepted", reason="ok") == 5
    with pytest.raises(ValueError):
        c.labels(outcome="accepted")  # every label, no other
    with pytest.raises(ValueError):
        c.labels(outcome="accepted", reason="ok").inc(-1)


def test_readings_are_read_at_each_scrape_and_no_created_series_is_exposed() -> None:
    r = new_registry()
    values = {"ldp_test_records_total": 1.0, "ldp_test_last": 17.5}
    Readings(
        {"ldp_test_records_total": ("counter", "records"), "ldp_test_last": ("gauge", "last")},
        lambda: values,
        registry=r,
    )
    Histogram("ldp_test_seconds", "latency", registry=r).observe(0.01)
    values["ldp_test_records_total"] = 4.0
    text = render(r)
    got = samples(text)
    assert got[("ldp_test_records_total", frozenset())] == 4 and got[("ldp_test_last", frozenset())] == 17.5
    assert b"# TYPE ldp_test_records_total counter" in text and b"# TYPE ldp_test_last gauge" in text
    assert b"_created" not in text
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")
