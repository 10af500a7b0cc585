"""Mechanism specs, by registry name.

The registry is an explicit table (no scanning of globals): a name maps to
the module and class that implement it. Modules are imported on first use,
so a device that only uses one mechanism loads only that one.
"""

from __future__ import annotations

import importlib
from typing import Any

from client_sdk.errors import SpecError
from client_sdk.mechanisms.base import MechanismSpec, ReportSpec, pure_protocol_variance

__all__ = [
    "ReportSpec",
    "MechanismSpec",
    "MECHANISMS",
    "FREQUENCY_MECHANISMS",
    "spec_class",
    "make_spec",
    "spec_from_dict",
    "frequency_spec",
    "pure_protocol_variance",
]

#: name -> "module:Class"
MECHANISMS: dict[str, str] = {
    "rr": "client_sdk.mechanisms.rr:BinaryRRSpec",
    "grr": "client_sdk.mechanisms.grr:GRRSpec",
    "oue": "client_sdk.mechanisms.oue:OUESpec",
    "rappor": "client_sdk.mechanisms.rappor:RapporSpec",
    "olh": "client_sdk.mechanisms.olh:OLHSpec",
    "cms": "client_sdk.mechanisms.cms:CMSSpec",
    "hcms": "client_sdk.mechanisms.cms:HCMSSpec",
    "hr": "client_sdk.mechanisms.hr:HRSpec",
    # numeric: means and distributions of bounded numbers (docs/NUMERIC.md)
    "duchi": "client_sdk.mechanisms.numeric:DuchiSpec",
    "pm": "client_sdk.mechanisms.numeric:PiecewiseSpec",
    "hm": "client_sdk.mechanisms.numeric:HybridSpec",
    "sw": "client_sdk.mechanisms.square_wave:SquareWaveSpec",
    # repeated collection: memoized (docs/NUMERIC.md, "Repeated collection")
    "1bitmean": "client_sdk.mechanisms.repeated:OneBitMeanSpec",
    "dbitflip": "client_sdk.mechanisms.repeated:DBitFlipSpec",
    "loloha": "client_sdk.mechanisms.loloha:LolohaSpec",
    # heavy hitters: discovery of frequent strings (docs/HEAVY_HITTERS.md)
    "pem": "client_sdk.heavy_hitters:PEMSpec",
    "sfp": "client_sdk.heavy_hitters:SFPSpec",
}

#: the frequency oracles (counts per domain index): the registry names whose specs are :class:`MechanismSpec`
FREQUENCY_MECHANISMS = ("rr", "grr", "oue", "rappor", "olh", "cms", "hcms", "hr", "loloha")


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
