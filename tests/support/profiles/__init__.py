"""Per-mechanism test profiles used by the generic statistical and audit suites.

Each mechanism registered in ``ldp_core.mechanisms.MECHANISMS`` has a module
``tests/support/profiles/<name>.py`` defining:

``specs() -> list[MechanismSpec]``
    2-4 specs spanning small and large ε and domain sizes, small enough that
    the generic suites run quickly (a few seconds per spec).

``audit_event(spec, records, x, x_prime) -> np.ndarray[bool]``
    For each record, whether it falls in the output event that best
    distinguishes input ``x`` from input ``x_prime`` (the event whose
    probability ratio P[E | x] / P[E | x_prime] is largest; for a pure ε-LDP
    mechanism ideally exactly e^ε).

``broken_spec(spec) -> MechanismSpec``
    A deliberately mis-parameterized variant that still *claims*
    ``spec.epsilon`` but whose encoder leaks more (for example encodes at 2ε,
    or uses a wrong p). The audit must catch it.

``fresh_trial_spec(spec, trial: int) -> MechanismSpec`` (optional)
    The spec to use in trial ``trial`` of the statistical suite. Mechanisms
    whose unbiasedness holds over a random choice of hash functions (CMS,
    HCMS, RAPPOR's hashing) return the spec with a trial-specific hash seed;
    others need not define it.

``audit_tight(spec) -> bool``
    Whether the audit event's true ratio is exactly e^ε for this spec (then
    the audit also checks the observed ratio comes close to e^ε from below).

``audit_inputs(spec) -> tuple[int, int]`` (optional)
    The pair of neighboring inputs to audit (default ``(0, 1)``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ldp_core.mechanisms import FREQUENCY_MECHANISMS

__all__ = ["profile", "NAMES"]

NAMES: list[str] = sorted(FREQUENCY_MECHANISMS)


def profile(name: str) -> ModuleType:
    """The profile module of mechanism ``name``."""
    return importlib.import_module(f"tests.support.profiles.{name}")
