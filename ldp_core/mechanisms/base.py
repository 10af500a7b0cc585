"""The common shape of every mechanism specification.

A spec is a frozen, validated value object: its ε and its own parameters
(:class:`ReportSpec`; a frequency oracle's :class:`MechanismSpec` adds its
domain size). It knows

* its stable ``spec_id`` (a hash of its RFC 8785 canonical form; it travels
  in every wire frame, so a report is never decoded under the wrong
  parameters), and its ``memo_derivation_id``, which keys the device-side
  derivations of memoized state (never sent, never read from data),
* its report layout (a fixed-width numpy structured dtype, little-endian),
* its device-side encoders (:meth:`encode` for batches, :meth:`encode_one`
  for the SDK), which take the randomness as an explicit argument, and
* the theoretical variance of its unbiased estimates (a frequency oracle's
  :meth:`MechanismSpec.count_variance`), which the estimator and the tests
  both use.

Values handed to a frequency oracle are domain *indices* ``0 .. domain_size-1``;
mapping application values to indices is :mod:`ldp_core.domain`'s job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from abc import ABC, abstractmethod
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ldp_core.canonical import CanonicalizationError, canonical_json
from ldp_core.errors import DomainError, FrameError, SpecError

__all__ = ["ReportSpec", "MechanismSpec", "MAX_EPSILON", "pure_protocol_variance"]

#: Above this a mechanism offers no meaningful privacy and exp(ε) starts to
#: lose precision in the estimators; specs refuse it.
MAX_EPSILON = 30.0


def pure_protocol_variance(true_counts: np.ndarray, p_star: float, q_star: float) -> np.ndarray:
    """Variance of the unbiased count of a *pure* frequency oracle.

    For a protocol in which each report "supports" value v with probability
    p* if the user's value is v and q* otherwise, independently across users
    (Wang et al., "Locally Differentially Private Protocols for Frequency
    Estimation", USENIX Security 2017, Sec. 3), the estimator
    ``(C_v - n q*) / (p* - q*)`` has variance

        Var = [n_v p*(1-p*) + (n - n_v) q*(1-q*)] / (p* - q*)^2.
    """
    c = np.asarray(true_counts, dtype=np.float64)
    n = float(c.sum())
    return (c * p_star * (1.0 - p_star) + (n - c) * q_star * (1.0 - q_star)) / (p_star - q_star) ** 2


@dataclasses.dataclass(frozen=True)
class ReportSpec(ABC):
    """What every privatized report's spec has, whatever it estimates: ε, an id, a record layout, encoders.

    The wire, the collector, the shuffler and the catalogs need only this.
    :class:`MechanismSpec` (frequency oracles over domain indices) and
    :class:`ldp_core.mechanisms.numeric.NumericSpec` (means and
    distributions of bounded numbers) add what their estimators need.
    """

    epsilon: float

    #: Short registry name, used on the command line and in metric files.
    name: ClassVar[str] = ""
    #: What the reports estimate: ``"frequency"`` (counts per domain index) or a numeric kind.
    kind: ClassVar[str] = "frequency"

    def __post_init__(self) -> None:
        eps = self.epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
            raise SpecError(f"{self.name}: epsilon must be a number, got {eps!r}")
        eps = float(eps)
        if not math.isfinite(eps) or eps <= 0.0:
            raise SpecError(f"{self.name}: epsilon must be a finite number > 0, got {eps!r}")
        if eps > MAX_EPSILON:
            raise SpecError(f"{self.name}: epsilon {eps} is above {MAX_EPSILON}; such a report is not private")
        object.__setattr__(self, "epsilon", eps)
        self._validate_base()
        self._validate()

    def _validate_base(self) -> None:  # noqa: B027  (an optional hook for intermediate bases)
        """Intermediate bases (:class:`MechanismSpec`) check their shared fields here."""

    def _validate(self) -> None:  # noqa: B027  (an optional hook: a spec without parameters of its own needs none)
        """Subclasses check (and normalize) their own parameters here."""

    @staticmethod
    def _require_int(spec_name: str, field: str, value: Any, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise SpecError(f"{spec_name}: {field} must be an integer, got {value!r}")
        if not low <= value <= high:
            raise SpecError(f"{spec_name}: {field} must be between {low} and {high}, got {value}")
        return int(value)

    # -- canonical form ---------------------------------------------------
    def params(self) -> dict[str, Any]:
        """The spec's parameters, in field order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_dict(self) -> dict[str, Any]:
        """``{"mechanism": name, **params}``: what metric files and JSON frames carry."""
        return {"mechanism": self.name, **self.params()}

    def canonical_bytes(self) -> bytes:
        """The RFC 8785 (JCS) form of :meth:`to_dict`: what :attr:`spec_id` hashes.

        E.g. ``{"domain_size":4,"epsilon":1,"mechanism":"grr"}`` (keys sorted by
        UTF-16 code units, no whitespace, ECMAScript number form: ``1``, not
        ``1.0``); see :mod:`ldp_core.canonical` and ``ldp_core/vectors/spec_ids.json``.
        """
        try:
            return canonical_json(self.to_dict())
        except CanonicalizationError as exc:
            raise SpecError(f"{self.name}: {exc}") from None

    @cached_property
    def spec_id(self) -> str:
        """16 lowercase hex digits: the first 8 bytes of SHA-256 over :meth:`canonical_bytes`."""
        return hashlib.sha256(self.canonical_bytes()).hexdigest()[:16]

    @cached_property
    def memo_derivation_id(self) -> str:
        """16 hex digits that key the device's memoized state for this spec: the memo key, RAPPOR's cohort and
        permanent bits, the dBitFlip/1BitMean/LOLOHA keystreams.

        It hashes Python's ``json.dumps(to_dict(), sort_keys=True, separators=(",", ":"))`` (ASCII-escaped
        strings, Python float repr: ``1.0``, ``1e-05``): the id scheme before :attr:`spec_id` followed RFC 8785.
        It never travels and no reader accepts it as a spec id; it only must not change, because a new key
        would re-draw every device's permanent randomized response, and two independent PRRs of one value
        reveal more than the ε∞ each device was promised. The web SDK computes it too (``memoDerivationId``).
        """
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def exp_epsilon(self) -> float:
        return math.exp(self.epsilon)

    # -- report layout ----------------------------------------------------
    @property
    @abstractmethod
    def record_dtype(self) -> np.dtype:
        """Fixed-width little-endian structured dtype of one report."""

    @property
    def record_size(self) -> int:
        return self.record_dtype.itemsize

    def record_bounds(self) -> dict[str, int]:
        """Exclusive upper bounds of integer record fields (checked on decode)."""
        return {}

    def check_records(self, records: np.ndarray) -> None:
        """Raise :class:`FrameError` if a decoded record cannot have come from this spec."""
        for field, bound in self.record_bounds().items():
            col = records[field]
            if col.size and int(col.max()) >= bound:
                i = int(np.argmax(col >= bound))
                raise FrameError(
                    f"{self.name}: record {i} has {field}={int(col.reshape(col.shape[0], -1)[i].max())}, "
                    f"which must be below {bound}"
                )

    @abstractmethod
    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """Privatize a batch of values; returns records of :attr:`record_dtype`."""


@dataclasses.dataclass(frozen=True)
class MechanismSpec(ReportSpec):
    """A frequency oracle's spec: ε, a domain of ``domain_size`` indices, and its own parameters."""

    domain_size: int

    def _validate_base(self) -> None:
        d = self.domain_size
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise SpecError(f"{self.name}: domain_size must be an integer, got {d!r}")
        if d < 2:
            raise SpecError(f"{self.name}: domain_size must be at least 2, got {d}")
        if d > 2**31:
            raise SpecError(f"{self.name}: domain_size {d} is above 2**31; use a hashed domain")
        object.__setattr__(self, "domain_size", int(d))

    # -- device side ------------------------------------------------------
    def check_values(self, values: Any) -> np.ndarray:
        """Return ``values`` as an int64 array, or raise :class:`DomainError`."""
        try:
            arr = np.asarray(values)
        except (ValueError, TypeError) as exc:
            raise DomainError(f"{self.name}: values must be a flat sequence of domain indices ({exc})") from None
        if arr.dtype.kind not in "iu":
            if arr.dtype.kind == "f" and arr.size and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
                arr = arr.astype(np.int64)
            elif arr.size == 0:
                arr = arr.astype(np.int64)
            else:
                raise DomainError(f"{self.name}: values must be integer domain indices, got dtype {arr.dtype}")
        arr = arr.astype(np.int64, copy=False).reshape(-1)
        if arr.size and (arr.min() < 0 or arr.max() >= self.domain_size):
            bad = arr[(arr < 0) | (arr >= self.domain_size)][0]
            raise DomainError(f"{self.name}: value {int(bad)} is outside the domain [0, {self.domain_size})")
        return arr

    @abstractmethod
    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """Privatize a batch of domain indices; returns records of :attr:`record_dtype`."""

    def encode_one(self, value: int, rng: np.random.Generator) -> np.ndarray:
        """Privatize one value; returns a length-1 record array."""
        return self.encode(np.array([value], dtype=np.int64), rng)

    # -- server-side math shared with the estimator -------------------------
    @abstractmethod
    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        """Theoretical variance of each unbiased count estimate given the true counts."""
