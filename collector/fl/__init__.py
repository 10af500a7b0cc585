"""The collector's federated-learning routes (:mod:`collector.fl.routes`), on with ``ldp collector --fl``."""

from __future__ import annotations

__all__: list[str] = []
