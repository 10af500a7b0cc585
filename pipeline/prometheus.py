"""The services' operational metrics in Prometheus' text format, built on the ``prometheus-client`` library.

One place for every ``GET /metrics`` (the collector's, the streaming estimator's): the library keeps the
counters, gauges and histograms and writes the exposition format (``# HELP`` and ``# TYPE`` lines,
escaped label values, cumulative histogram buckets); this module adds what it has not:

* :func:`new_registry` -- each app builds its families in a registry of its own, never the library's
  global one, so that several apps in one process (tests, ``ldp demo``) keep apart;
* :class:`StoredCounter` -- a counter family kept in a :class:`CounterStore` (the collector's batch-id
  store), so that it survives restarts and every worker process sharing the store shows the same totals;
* :class:`Readings` -- counters and gauges whose values another object keeps (a processor's stats),
  read at each scrape;
* :func:`render` and :data:`CONTENT_TYPE` -- the text format 0.0.4 that Prometheus scrapes.

The library's ``_created`` series (one more sample per counter and histogram, the time it was created)
are switched off: the services never exposed them, and a restart-surviving counter has no such time.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, Protocol

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "CounterStore",
    "Readings",
    "StoredCounter",
    "new_registry",
    "render",
    "stored_key",
]

#: the media type of :func:`render`'s text
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
#: histogram buckets (seconds) for request and publish latencies
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # the library's own switch (process-wide); see the module's docstring


def new_registry() -> CollectorRegistry:
    """An empty registry of the app's own."""
    return CollectorRegistry(auto_describe=True)


def render(registry: CollectorRegistry) -> bytes:
    """Every family of ``registry`` in the text format (:data:`CONTENT_TYPE`)."""
    return generate_latest(registry)


def stored_key(name: str, labels: Sequence[str]) -> str:
    """The name under which a :class:`CounterStore` keeps the sample of family ``name`` with label values
    ``labels`` (in the family's label order): ``name``, a tab, the values as a JSON array."""
    return name + "\t" + json.dumps([str(v) for v in labels], separators=(",", ":"))


class CounterStore(Protocol):
    """Where a :class:`StoredCounter` keeps its values (the collector's: :class:`collector.dedup.BatchIdStore`)."""

    def add_counts(self, counts: Mapping[str, int]) -> None:
        """Add to the samples named by :func:`stored_key` (durably within a short while)."""

    def counter_values(self, name: str) -> dict[tuple[str, ...], float]:
        """Every sample of family ``name``, by label values (including what is not durable yet)."""


class _StoredChild:
    """One label set of a :class:`StoredCounter` (what :meth:`StoredCounter.labels` gives)."""

    __slots__ = ("_family", "_key")

    def __init__(self, family: StoredCounter, key: tuple[str, ...]) -> None:
        self._family = family
        self._key = key

    def inc(self, amount: float = 1) -> None:
        self._family._add(self._key, amount)


class StoredCounter(Collector):
    """A counter family with labels ``labelnames``, registered in ``registry``; counted with
    ``.labels(**values).inc(n)`` like the library's counters.

    In memory, or, after :meth:`persist`, in a :class:`CounterStore`: then the values survive a restart
    and every process sharing the store renders the same totals. ``name`` is the exposed name (ending in
    ``_total``) and the one the store keys samples by (:func:`stored_key`).
    """

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], *, registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        self._store: CounterStore | None = None
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, **labels: str) -> _StoredChild:
        """The sample of these label values (every label name, no other)."""
        if sorted(labels) != sorted(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return _StoredChild(self, tuple(str(labels[n]) for n in self.labelnames))

    def value(self, **labels: str) -> float:
        """The current value of one label set (0 if never counted)."""
        return self._items().get(self.labels(**labels)._key, 0.0)

    def persist(self, store: CounterStore) -> None:
        """Keep the values in ``store`` from now on; what was counted in memory so far is added to it."""
        with self._lock:
            moved, self._values, self._store = self._values, {}, store
        if moved:
            store.add_counts({stored_key(self.name, k): int(v) for k, v in moved.items()})

    def _add(self, key: tuple[str, ...], amount: float) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        store = self._store
        if store is not None:
            store.add_counts({stored_key(self.name, key): int(amount)})
            return
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def _items(self) -> dict[tuple[str, ...], float]:
        store = self._store
        if store is not None:
            return store.counter_values(self.name)
        with self._lock:
            return dict(self._values)

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, value in sorted(self._items().items()):
            family.add_metric(list(key), value)
        yield family


class Readings(Collector):
    """Unlabelled counters and gauges whose values another object keeps, read at each scrape.

    ``families`` maps each exposed name to its type and help text (a counter's name ends in ``_total``);
    ``read()`` gives the current values by the same names (a name it leaves out is not exposed then).
    """

    def __init__(
        self,
        families: Mapping[str, tuple[Literal["counter", "gauge"], str]],
        read: Callable[[], Mapping[str, float]],
        *,
        registry: CollectorRegistry,
    ) -> None:
        self.families = dict(families)
        self.read = read
        registry.register(self)

    @staticmethod
    def _family(name: str, kind: str, documentation: str, value: float | None = None) -> Metric:
        if kind == "counter":
            return CounterMetricFamily(name, documentation, value=value)
        return GaugeMetricFamily(name, documentation, value=value)

    def describe(self) -> Iterable[Metric]:
        return [self._family(name, kind, doc) for name, (kind, doc) in self.families.items()]

    def collect(self) -> Iterable[Metric]:
        values = self.read()
        for name, (kind, doc) in self.families.items():
            if name in values:
                yield self._family(name, kind, doc, float(values[name]))
