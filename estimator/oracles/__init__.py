"""Accumulators by mechanism name (an explicit table, mirroring
``client_sdk.mechanisms.MECHANISMS``)."""

from __future__ import annotations

import importlib

from client_sdk.mechanisms.base import MechanismSpec
from estimator.oracles.base import Accumulator

__all__ = ["Accumulator", "ACCUMULATORS", "accumulator_for"]

ACCUMULATORS: dict[str, str] = {
    "rr": "estimator.oracles.grr:BinaryRRAccumulator",
    "grr": "estimator.oracles.grr:GRRAccumulator",
    "oue": "estimator.oracles.oue:OUEAccumulator",
    "rappor": "estimator.oracles.rappor:RapporAccumulator",
    "olh": "estimator.oracles.olh:OLHAccumulator",
    "cms": "estimator.oracles.cms:CMSAccumulator",
    "hcms": "estimator.oracles.cms:HCMSAccumulator",
    "hr": "estimator.oracles.hr:HRAccumulator",
}


def accumulator_for(spec: MechanismSpec) -> Accumulator:
    """A fresh accumulator for ``spec``."""
    module, cls = ACCUMULATORS[spec.name].split(":")
    return getattr(importlib.import_module(module), cls)(spec)
