"""The personalization specs a round carries: Ditto, Per-FedAvg and MOON.

Each is a frozen value that rides on the :class:`~ldp_core.fl.training.RoundConfig`
(``personalization``) with ``algorithm = "fedavg"``, and that a task file and a
round state carry as ``{"kind": ..., <fields>}`` (:func:`personalization_to_dict`,
:func:`personalization_from_dict`). What a device does under each spec, and the
papers, are in :mod:`ldp_core.fl.personalized_training`. This module needs
nothing of the training code, so the round types can hold a spec.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

from ldp_core.fl.errors import ModelError

__all__ = [
    "DittoSpec",
    "PerFedAvgSpec",
    "MoonSpec",
    "Personalization",
    "personalization_to_dict",
    "personalization_from_dict",
]


def _finite_pos(name: str, v: object, allow_zero: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or (v < 0 if allow_zero else v <= 0):  # type: ignore[operator]
        bound = ">= 0" if allow_zero else "> 0"
        raise ModelError(f"{name} must be a finite number {bound}, got {v!r}")


@dataclasses.dataclass(frozen=True)
class DittoSpec:
    """Ditto with regularization weight λ (``lam`` ≥ 0) toward the global model."""

    lam: float = 0.1
    kind: Literal["ditto"] = "ditto"

    def __post_init__(self) -> None:
        _finite_pos("Ditto's lam", self.lam, allow_zero=True)


@dataclasses.dataclass(frozen=True)
class PerFedAvgSpec:
    """Per-FedAvg (FO): inner step α; ``eval_steps`` SGD steps of size α personalize at evaluation."""

    inner_learning_rate: float = 0.05
    eval_steps: int = 5
    kind: Literal["perfedavg"] = "perfedavg"

    def __post_init__(self) -> None:
        _finite_pos("Per-FedAvg's inner_learning_rate", self.inner_learning_rate)
        if isinstance(self.eval_steps, bool) or not isinstance(self.eval_steps, int) or self.eval_steps < 0:
            raise ModelError(f"Per-FedAvg's eval_steps must be an integer >= 0, got {self.eval_steps!r}")


@dataclasses.dataclass(frozen=True)
class MoonSpec:
    """MOON with contrastive weight μ and temperature τ (the paper's defaults: μ = 1, τ = 0.5)."""

    mu: float = 1.0
    tau: float = 0.5
    kind: Literal["moon"] = "moon"

    def __post_init__(self) -> None:
        _finite_pos("MOON's mu", self.mu, allow_zero=True)
        _finite_pos("MOON's tau", self.tau)


Personalization = DittoSpec | PerFedAvgSpec | MoonSpec


def personalization_to_dict(spec: Personalization | None) -> dict[str, Any] | None:
    """The JSON form a task file and a round state carry: ``{"kind": ..., <the spec's fields>}``."""
    return None if spec is None else dataclasses.asdict(spec)


def personalization_from_dict(obj: Mapping[str, Any] | Personalization | None) -> Personalization | None:
    """Parse :func:`personalization_to_dict`'s form (``kind`` ditto, perfedavg or moon); a spec passes through."""
    if obj is None or isinstance(obj, (DittoSpec, PerFedAvgSpec, MoonSpec)):
        return obj
    if not isinstance(obj, Mapping):
        raise ModelError(f"personalization must be an object with a kind, got {obj!r}")
    kinds: dict[str, type[DittoSpec] | type[PerFedAvgSpec] | type[MoonSpec]] = {
        "ditto": DittoSpec,
        "perfedavg": PerFedAvgSpec,
        "moon": MoonSpec,
    }
    cls = kinds.get(str(obj.get("kind")))
    if cls is None:
        raise ModelError(f"personalization kind must be one of {sorted(kinds)}, got {obj.get('kind')!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(obj) - names
    if unknown:
        raise ModelError(f"unknown {cls.__name__} fields {sorted(unknown)}; known: {sorted(names)}")
    return cls(**obj)
