"""Sinks: consumers of the shuffled topic that store reports outside the transport.

* :mod:`collector.sinks.parquet` -- a Parquet dataset partitioned by metric and day.
"""

from __future__ import annotations

__all__: list[str] = []
