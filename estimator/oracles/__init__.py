"""Accumulators by mechanism name (an explicit table, mirroring
``ldp_core.mechanisms.MECHANISMS``)."""

from __future__ import annotations

import importlib

from estimator.oracles.base import Accumulator, LinearState
from ldp_core.mechanisms.base import MechanismSpec, ReportSpec

__all__ = ["Accumulator", "LinearState", "ACCUMULATORS", "accumulator_for", "state_for"]

ACCUMULATORS: dict[str, str] = {
    "rr": "estimator.oracles.grr:BinaryRRAccumulator",
    "grr": "estimator.oracles.grr:GRRAccumulator",
    "oue": "estimator.oracles.oue:OUEAccumulator",
    "rappor": "estimator.oracles.rappor:RapporAccumulator",
    "olh": "estimator.oracles.olh:OLHAccumulator",
    "cms": "estimator.oracles.cms:CMSAccumulator",
    "hcms": "estimator.oracles.cms:HCMSAccumulator",
    "hr": "estimator.oracles.hr:HRAccumulator",
    # numeric (estimator/mechanisms/numeric.py): their estimate is a MeanEstimate or a DistributionEstimate
    "duchi": "estimator.mechanisms.numeric:MeanAccumulator",
    "pm": "estimator.mechanisms.numeric:MeanAccumulator",
    "hm": "estimator.mechanisms.numeric:MeanAccumulator",
    "sw": "estimator.mechanisms.numeric:SquareWaveAccumulator",
    # repeated collection (estimator/mechanisms/repeated.py, estimator/oracles/loloha.py)
    "1bitmean": "estimator.mechanisms.repeated:OneBitMeanAccumulator",
    "dbitflip": "estimator.mechanisms.repeated:DBitFlipAccumulator",
    "loloha": "estimator.oracles.loloha:LolohaAccumulator",
    # heavy hitters (estimator/mechanisms/heavy_hitters.py): report counts and PEM's first level; discovery is a batch job
    "pem": "estimator.mechanisms.heavy_hitters:HeavyHitterStreamState",
    "sfp": "estimator.mechanisms.heavy_hitters:HeavyHitterStreamState",
}


def accumulator_for(spec: MechanismSpec) -> Accumulator:
    """A fresh accumulator for ``spec``."""
    module, cls = ACCUMULATORS[spec.name].split(":")
    return getattr(importlib.import_module(module), cls)(spec)


def state_for(spec: ReportSpec) -> LinearState:
    """A fresh accumulator for any spec (frequency or numeric): what the pipeline's consumers keep per key."""
    module, cls = ACCUMULATORS[spec.name].split(":")
    acc: LinearState = getattr(importlib.import_module(module), cls)(spec)
    return acc
