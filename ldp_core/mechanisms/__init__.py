"""Mechanism specs, by registry name.

The registry is an explicit table (no scanning of globals): a name maps to
the module and class that implement it. Modules are imported on first use,
so a device that only uses one mechanism loads only that one.
"""

from __future__ import annotations

import importlib
from typing import Any

from ldp_core.errors import SpecError
from ldp_core.mechanisms.base import MechanismSpec, ReportSpec, pure_protocol_variance

__all__ = [
    "ReportSpec",
    "MechanismSpec",
    "MECHANISMS",
    "FREQUENCY_MECHANISMS",
    "NUMERIC_MECHANISMS",
    "HEAVY_HITTER_MECHANISMS",
    "spec_class",
    "make_spec",
    "spec_from_dict",
    "frequency_spec",
    "pure_protocol_variance",
]

#: name -> "module:Class"
MECHANISMS: dict[str, str] = {
    "rr": "ldp_core.mechanisms.rr:BinaryRRSpec",
    "grr": "ldp_core.mechanisms.grr:GRRSpec",
    "oue": "ldp_core.mechanisms.oue:OUESpec",
    "rappor": "ldp_core.mechanisms.rappor:RapporSpec",
    "olh": "ldp_core.mechanisms.olh:OLHSpec",
    "cms": "ldp_core.mechanisms.cms:CMSSpec",
    "hcms": "ldp_core.mechanisms.cms:HCMSSpec",
    "hr": "ldp_core.mechanisms.hr:HRSpec",
    # numeric: means and distributions of bounded numbers (docs/NUMERIC.md)
    "duchi": "ldp_core.mechanisms.numeric:DuchiSpec",
    "pm": "ldp_core.mechanisms.numeric:PiecewiseSpec",
    "hm": "ldp_core.mechanisms.numeric:HybridSpec",
    "sw": "ldp_core.mechanisms.square_wave:SquareWaveSpec",
    # repeated collection: memoized (docs/NUMERIC.md, "Repeated collection")
    "1bitmean": "ldp_core.mechanisms.repeated:OneBitMeanSpec",
    "dbitflip": "ldp_core.mechanisms.repeated:DBitFlipSpec",
    "loloha": "ldp_core.mechanisms.loloha:LolohaSpec",
    # heavy hitters: discovery of frequent strings (docs/HEAVY_HITTERS.md)
    "pem": "ldp_core.mechanisms.heavy_hitters:PEMSpec",
    "sfp": "ldp_core.mechanisms.heavy_hitters:SFPSpec",
}

#: the frequency oracles (counts per domain index): the registry names whose specs are :class:`MechanismSpec`
FREQUENCY_MECHANISMS = ("rr", "grr", "oue", "rappor", "olh", "cms", "hcms", "hr", "loloha")
#: the numeric mechanisms (means and distributions of bounded numbers, one-shot and repeated)
NUMERIC_MECHANISMS = ("duchi", "pm", "hm", "sw", "1bitmean", "dbitflip")
#: the heavy-hitter mechanisms (discovery of frequent strings)
HEAVY_HITTER_MECHANISMS = ("pem", "sfp")


def spec_class(name: str) -> type[ReportSpec]:
    """The spec class registered under ``name``."""
    try:
        target = MECHANISMS[name]
    except KeyError:
        raise SpecError(f"unknown mechanism {name!r}; choose one of {sorted(MECHANISMS)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def make_spec(name: str, **params: Any) -> ReportSpec:
    """Build the spec ``name`` from keyword parameters (``epsilon``, ``domain_size``, ...)."""
    cls = spec_class(name)
    try:
        return cls(**params)
    except TypeError as exc:  # unknown or missing parameter names
        raise SpecError(f"{name}: {exc}") from None


def spec_from_dict(data: dict[str, Any]) -> ReportSpec:
    """Inverse of :meth:`MechanismSpec.to_dict`."""
    if not isinstance(data, dict) or "mechanism" not in data:
        raise SpecError(f"a spec must be an object with a 'mechanism' key, got {data!r}")
    params = {k: v for k, v in data.items() if k != "mechanism"}
    return make_spec(str(data["mechanism"]), **params)


def frequency_spec(spec: ReportSpec) -> MechanismSpec:
    """``spec`` as a frequency oracle's, or :class:`SpecError` naming what it estimates instead."""
    if not isinstance(spec, MechanismSpec):
        raise SpecError(f"{spec.name} estimates a {spec.kind}, not frequencies: this needs a frequency oracle")
    return spec
