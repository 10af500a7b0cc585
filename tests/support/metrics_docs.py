"""Metrics documents for tests, built from one line per metric.

``metric("grr", 1.0, dictionary("a", "b"))`` is a metric that never expires, owned by a test address,
with one report per day; ``metrics_doc(tab=..., word=...)`` wraps metrics into an ``ldp-metrics/1``
document (a metric's description defaults to its name).
"""

from __future__ import annotations

from typing import Any

__all__ = ["metric", "metrics_doc", "dictionary", "hashed"]


def dictionary(*values: str, other: bool = True) -> dict[str, Any]:
    return {"kind": "dictionary", "values": list(values), "other": other}


def hashed(size: int, seed: int) -> dict[str, Any]:
    return {"kind": "hashed", "size": size, "seed": seed}


def metric(
    mechanism: str, epsilon: float, domain: dict[str, Any], *, params: dict[str, Any] | None = None, **fields: Any
) -> dict[str, Any]:
    """One metric: ``mechanism`` at ``epsilon`` (with its ``params``) over ``domain``; ``fields`` add or
    override top-level keys (``kind``, ``description``, ``sealed``, ``max_reports_per_day``, ...)."""
    return {
        "owner": "o@example.org",
        "expires": "2099-12-31",
        "mechanism": {"mechanism": mechanism, "epsilon": epsilon, **(params or {})},
        "domain": domain,
        "max_reports_per_day": 1,
        **fields,
    }


def metrics_doc(*, analyzer_keys: list[dict[str, str]] | None = None, **metrics: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {"format": "ldp-metrics/1"}
    if analyzer_keys is not None:
        doc["analyzer_keys"] = analyzer_keys
    doc["metrics"] = {name: {"description": name, **m} for name, m in metrics.items()}
    return doc
