"""Crafted reports: records a poisoning device uploads, each supporting one target value with certainty,
and how far each one moves its target's unbiased count (:mod:`simulator.scenarios.ldp.poisoning`)."""

from __future__ import annotations

import numpy as np

from ldp_core.hashing import hash_to_range
from ldp_core.mechanisms.base import MechanismSpec

#: mechanisms with a crafting rule here
CRAFTABLE = ("grr", "oue", "olh")


def influence(spec: MechanismSpec) -> float:
    """Δ = (1 − q*)/(p* − q*): how far one crafted report moves its target's unbiased count."""
    p, q = spec.support_probabilities()  # type: ignore[attr-defined]
    return (1.0 - q) / (p - q)


def crafted_reports(spec: MechanismSpec, target: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` records, each supporting ``target`` with certainty: a GRR value, an OUE bit, an OLH (seed, y) pair."""
    if not 0 <= target < spec.domain_size:
        raise ValueError(f"target {target} is outside the domain [0, {spec.domain_size})")
    out = np.zeros(m, dtype=spec.record_dtype)
    if spec.name == "grr":
        out["value"] = target
    elif spec.name == "oue":
        out["bits"][:, target // 8] = 1 << (target % 8)  # packed little-endian (docs/SDK.md, "Records")
    elif spec.name == "olh":
        seeds = rng.integers(0, 2**32, size=m, dtype=np.uint32)
        out["seed"] = seeds
        out["y"] = hash_to_range(np.full(m, target, dtype=np.uint32), seeds, spec.hash_range)  # type: ignore[attr-defined]
    else:
        raise ValueError(f"no crafting rule for {spec.name!r}; one of {CRAFTABLE}")
    spec.check_records(out)  # what the collector checks: the crafted records pass
    return out
