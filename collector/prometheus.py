"""A small Prometheus registry: counters, gauges and histograms, rendered in the text exposition format 0.0.4.

Written by hand to keep the collector's dependencies short; it follows the
format described in Prometheus' "Exposition formats" documentation: a
``# HELP`` and a ``# TYPE`` line per metric family, one sample per line, label
values escaped (backslash, double quote, newline), histograms as cumulative
``_bucket{le=...}`` samples ending with ``le="+Inf"``, then ``_sum`` and ``_count``.
"""

from __future__ import annotations

import bisect
import json
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "Counter",
    "CounterStore",
    "Gauge",
    "Histogram",
    "Registry",
    "stored_key",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


class _Family:
    kind = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        try:
            key = tuple([str(labels[n]) for n in self.labelnames])
        except KeyError:
            key = ()
        if len(key) != len(labels) or len(key) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return key

    def _labels(self, key: tuple[str, ...], extra: str = "") -> str:
        parts = [f'{n}="{_escape(v)}"' for n, v in zip(self.labelnames, key)]
        if extra:
            parts.append(extra)
        return "{" + ",".join(parts) + "}" if parts else ""

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:
        raise NotImplementedError


def stored_key(name: str, labels: Sequence[str]) -> str:
    """The name under which a :class:`CounterStore` keeps the sample of family ``name`` with label values
    ``labels`` (in the family's label order): ``name``, a tab, the values as a JSON array."""
    return name + "\t" + json.dumps([str(v) for v in labels], separators=(",", ":"))


class CounterStore(Protocol):
    """Where a persisted :class:`Counter` keeps its values (the collector's: :class:`collector.dedup.BatchIdStore`)."""

    def add_counts(self, counts: Mapping[str, int]) -> None:
        """Add to the samples named by :func:`stored_key` (durably within a short while)."""

    def counter_values(self, name: str) -> dict[tuple[str, ...], float]:
        """Every sample of family ``name``, by label values (including what is not durable yet)."""


class Counter(_Family):
    """A monotonically increasing count per label set.

    In memory, or, after :meth:`persist`, in a :class:`CounterStore`: then
    the values survive a restart and every process sharing the store
    renders the same totals.
    """

    kind = "counter"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        self._store: CounterStore | None = None

    def persist(self, store: CounterStore) -> None:
        """Keep the values in ``store`` from now on; what was counted in memory so far is added to it."""
        with self._lock:
            moved, self._values, self._store = self._values, {}, store
        if moved:
            store.add_counts({stored_key(self.name, k): int(v) for k, v in moved.items()})

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
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

    def value(self, **labels: str) -> float:
        return self._items().get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        items = sorted(self._items().items())
        return self.header() + [f"{self.name}{self._labels(k)} {_fmt(v)}" for k, v in items]


class Gauge(Counter):
    """A value that goes up and down (in memory only: a gauge is the process's own)."""

    kind = "gauge"

    def persist(self, store: CounterStore) -> None:
        raise TypeError("a gauge is not persisted")

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)


class Histogram(_Family):
    """Observations counted in cumulative buckets (upper bounds ``buckets``), with their sum and count."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, labelnames: Sequence[str] = (), buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> None:
        super().__init__(name, help, labelnames)
        self.buckets = tuple(sorted(float(b) for b in buckets))
        self._values: dict[tuple[str, ...], list[float]] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        i = bisect.bisect_left(self.buckets, value)
        with self._lock:
            row = self._values.get(key)
            if row is None:
                row = self._values[key] = [0.0] * (len(self.buckets) + 3)
            row[i] += 1  # per-bucket; made cumulative when rendered
            row[-2] += value
            row[-1] += 1

    def count(self, **labels: str) -> int:
        with self._lock:
            row = self._values.get(self._key(labels))
            return 0 if row is None else int(row[-1])

    def render(self) -> list[str]:
        out = self.header()
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._values.items())
        for key, row in items:
            acc = 0.0
            for b, n in zip(self.buckets, row):
                acc += n
                le = self._labels(key, 'le="' + _fmt(b) + '"')
                out.append(f"{self.name}_bucket{le} {_fmt(acc)}")
            inf = self._labels(key, 'le="+Inf"')
            out.append(f"{self.name}_bucket{inf} {_fmt(row[-1])}")
            out.append(f"{self.name}_sum{self._labels(key)} {_fmt(row[-2])}")
            out.append(f"{self.name}_count{self._labels(key)} {_fmt(row[-1])}")
        return out


class Registry:
    """The metric families one process exposes, rendered in registration order."""

    def __init__(self) -> None:
        self._families: list[_Family] = []

    def register(self, family: _Family) -> _Family:
        if any(f.name == family.name for f in self._families):
            raise ValueError(f"metric {family.name!r} is registered twice")
        self._families.append(family)
        return family

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        return self.register(Counter(name, help, labelnames))  # type: ignore[return-value]

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self.register(Gauge(name, help, labelnames))  # type: ignore[return-value]

    def histogram(
        self, name: str, help: str, labelnames: Sequence[str] = (), buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> Histogram:
        return self.register(Histogram(name, help, labelnames, buckets))  # type: ignore[return-value]

    def render(self) -> str:
        lines: list[str] = []
        for f in self._families:
            lines.extend(f.render())
        return "\n".join(lines) + "\n"
