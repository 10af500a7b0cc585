r"""LOLOHA: memoized local hashing for categorical values that change.

Arcolezi, Pinzón, Palamidessi and Gambs, "Frequency Estimation of Evolving
Data Under Local Differential Privacy", EDBT 2023 (arXiv:2210.00262).

**Encoding.** A device holds one hash function ``H_s : [d] → [g]`` for life (a
32-bit XXH32 seed ``s``, multiply-shift to ``[0, g)``, as
:mod:`ldp_core.mechanisms.olh`; ``s`` derived from the device key). For a
value ``x`` it computes ``h = H_s(x)`` and

* a *permanent* GRR over ``[g]`` at ``ε∞`` (``epsilon``),
  ``p1 = e^{ε∞}/(e^{ε∞} + g − 1)``, ``q1 = 1/(e^{ε∞} + g − 1)``, memoized per
  hashed value ``h`` (a keyed PRF of (key, spec, ``h``): nothing stored), then
* a fresh *instantaneous* GRR over ``[g]`` of the permanent output at
  ``ε_IRR``, ``p2 = e^{ε_IRR}/(e^{ε_IRR} + g − 1)``, ``q2 = (1 − p2)/(g − 1)``,

and reports ``(s, y)``. Given ``h`` the two stages are one GRR with
``p* = P[y = h] = p1 p2 + (1 − p1) q2 = p1 p2 + q1 (1 − p2)``. ``ε_IRR`` is
chosen so that this chain is exactly ``ε1``-LDP (``epsilon_one``):
``p*(g − 1)/(1 − p*) = e^{ε1}``, i.e. ``p* = e^{ε1}/(e^{ε1} + g − 1)``, which
solves to ``p2 = (p* − q1)/(p1 − q1)`` and

    e^{ε_IRR} = (e^{ε∞ + ε1} + (g − 2) e^{ε1} − g + 1) / (e^{ε∞} − e^{ε1})

(for ``g = 2`` the familiar ``(e^{ε∞+ε1} − 1)/(e^{ε∞} − e^{ε1})`` of L-GRR; it
needs ``ε1 < ε∞``). The seed does not depend on ``x``, so one report is
``ε1``-LDP, and tightly so (the privacy audit observes ``e^{ε1}``). A note on a
reference implementation: multi-freq-ldpy's L-GRR solves for ``p2`` with
``P[y = z | h ≠ z] = p1 q2 + q1 p2``, leaving out the ``(g − 2) q1 q2`` of the
``g − 2`` other permanent outputs; for ``g > 2`` that gives a smaller ``p2``
(more noise, a true one-report ε below the ``ε1`` asked for). Here the
equation is solved with the full chain.

**Repeated reports.** All of a device's reports are functions of its seed,
one permanent output per hashed value it used, and independent
instantaneous noise; each permanent output is ``ε∞``-LDP about its hashed value.
A device whose value never changes therefore leaks at most ``ε∞`` however
many reports it sends (its permanent output is fixed); one whose value
changes leaks at most ``ε∞`` per distinct *hashed* value used, so at most
``g·ε∞`` over any number of changes (Arcolezi et al., Thm. 1). This is why
``g`` is small (the device's local policy caps it at 64).

**Defaults.** ``epsilon_one`` defaults to ``ε∞/2`` (the paper's α = ε1/ε∞ =
0.5). ``g`` defaults to the paper's variance-optimal choice for (ε∞, α)
(OLOLOHA, Sec. 5; :func:`optimal_g`), at least 2, capped at :data:`MAX_G`.

**Estimate.** A report supports ``v`` when ``H_s(v) = y``: with probability
``p*`` for the holder's value and ``q* = 1/g`` for any other (the hash of
another value is uniform and independent of ``y`` over the seed, as in OLH).
The unbiased count is ``(C_v − n/g)/(p* − 1/g)`` and its variance the pure
protocol's, :func:`~ldp_core.mechanisms.base.pure_protocol_variance`
(``p* − 1/g = (p1 − 1/g)(p2 − q2)``, the paper's form). One report has the
distribution of OLH at ``ε1`` with this ``g``; the difference is over time.

**Linkability.** The seed travels in every report and is fixed per device
and metric: reports of one device are linkable across days by it (2^32
values), as in the paper. The value stays protected (ε∞ per hashed value);
the device's *participation pattern* does not. docs/NUMERIC.md,
"Repeated collection".

**Record** (as OLH): ``seed`` ``<u4`` and ``y`` (``u1`` for ``g ≤ 256``).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ldp_core.errors import SpecError
from ldp_core.hashing import hash_bytes, hash_to_range
from ldp_core.mechanisms.base import MechanismSpec, pure_protocol_variance
from ldp_core.mechanisms.grr import grr_index_dtype
from ldp_core.mechanisms.rappor import _as_secret, _Keystream
from ldp_core.mechanisms.repeated import keystream_index

__all__ = ["LolohaSpec", "optimal_g", "irr_epsilon", "MAX_G"]

#: largest hash range of a LOLOHA spec (the device's local policy caps it at 64)
MAX_G = 1024

_LABEL_SEED = b"ldp-telemetry/loloha/seed/v1"
_LABEL_PRR = b"ldp-telemetry/loloha/prr/v1"


def irr_epsilon(eps_inf: float, eps_one: float, g: int) -> float:
    """``ε_IRR`` that makes the permanent GRR at ``eps_inf`` followed by the instantaneous GRR ``eps_one``-LDP
    (module docstring)."""
    if not eps_one < eps_inf:
        raise SpecError(f"loloha: epsilon_one ({eps_one}) must be below epsilon, the permanent ε∞ ({eps_inf})")
    # with a = e^ε∞ - 1 and b = e^ε1 - 1 (expm1: exact near 0, where e^ε rounds to 1), the ratio
    # (e^ε∞·e^ε1 + (g-2)·e^ε1 - g + 1) / (e^ε∞ - e^ε1) is (a + (g-1)·b + a·b) / (a - b)
    a, b = math.expm1(eps_inf), math.expm1(eps_one)
    if not a > b:
        raise SpecError(f"loloha: epsilon {eps_inf} and epsilon_one {eps_one} are too close to tell apart")
    return math.log((a + (g - 1) * b + a * b) / (a - b))


def optimal_g(eps_inf: float, eps_one: float) -> int:
    """OLOLOHA's ``g`` (Arcolezi et al. 2023, Sec. 5): the rounded minimizer of the approximate variance at
    ``α = ε1/ε∞``, at least 2, at most :data:`MAX_G`."""
    a = eps_one / eps_inf
    e = eps_inf
    inner = (
        math.exp(4 * e)
        - 14 * math.exp(2 * e)
        - 12 * math.exp(2 * e * (a + 1))
        + 12 * math.exp(e * (a + 1))
        + 12 * math.exp(e * (a + 3))
        + 1
    )
    num = math.sqrt(max(inner, 0.0)) - math.exp(2 * e) + 6 * math.exp(e) - 6 * math.exp(e * a) + 1
    den = 6 * (math.exp(e) - math.exp(e * a))
    if not den > 0 or not math.isfinite(num / den):  # ε∞ so small that the two exponentials coincide
        return 2
    return int(min(MAX_G, max(2, round(num / den))))


@dataclasses.dataclass(frozen=True)
class LolohaSpec(MechanismSpec):
    """LOLOHA over ``domain_size`` items: ``epsilon`` is the permanent ε∞, ``epsilon_one`` a single report's
    ε1 (< ε∞), ``g`` the hash range (module docstring)."""

    epsilon_one: float | None = None
    g: int | None = None

    name: ClassVar[str] = "loloha"

    def _validate(self) -> None:
        e1: Any = self.epsilon / 2.0 if self.epsilon_one is None else self.epsilon_one
        if isinstance(e1, bool) or not isinstance(e1, (int, float, np.integer, np.floating)):
            raise SpecError(f"loloha: epsilon_one must be a number, got {e1!r}")
        e1 = float(e1)
        if not math.isfinite(e1) or e1 <= 0.0 or not e1 < self.epsilon:
            raise SpecError(
                f"loloha: epsilon_one must be above 0 and below epsilon (the permanent ε∞ = {self.epsilon}), got {e1}"
            )
        object.__setattr__(self, "epsilon_one", e1)
        g = optimal_g(self.epsilon, e1) if self.g is None else self._require_int("loloha", "g", self.g, 2, MAX_G)
        object.__setattr__(self, "g", g)
        if not 0.0 < self.p2 <= 1.0:  # pragma: no cover - guaranteed by ε1 < ε∞
            raise SpecError("loloha: these epsilons leave no instantaneous randomization")

    # -- probabilities -----------------------------------------------------------
    @property
    def hash_range(self) -> int:
        return int(self.g)  # type: ignore[arg-type]

    @property
    def eps_one(self) -> float:
        return float(self.epsilon_one)  # type: ignore[arg-type]

    @property
    def p1(self) -> float:
        e = self.exp_epsilon
        return e / (e + self.hash_range - 1)

    @property
    def q1(self) -> float:
        return 1.0 / (self.exp_epsilon + self.hash_range - 1)

    @property
    def irr_epsilon(self) -> float:
        """``ε_IRR`` of the instantaneous GRR (module docstring)."""
        return irr_epsilon(self.epsilon, self.eps_one, self.hash_range)

    @property
    def p2(self) -> float:
        e = math.exp(self.irr_epsilon)
        return e / (e + self.hash_range - 1)

    @property
    def q2(self) -> float:
        return (1.0 - self.p2) / (self.hash_range - 1)

    @property
    def p_star(self) -> float:
        """``p1 p2 + (1 − p1) q2`` (= ``e^{ε1}/(e^{ε1} + g − 1)``)."""
        return self.p1 * self.p2 + (1.0 - self.p1) * self.q2

    @property
    def q_star(self) -> float:
        return 1.0 / self.hash_range

    @property
    def epsilon_permanent(self) -> float:
        """ε∞: the bound over all reports of one hashed value (= ``epsilon``)."""
        return self.epsilon

    @property
    def epsilon_one_report(self) -> float:
        return self.eps_one

    @property
    def epsilon_total(self) -> float:
        """``g·ε∞``: the bound over any history, however often the value changes."""
        return self.hash_range * self.epsilon

    def support_probabilities(self) -> tuple[float, float]:
        return self.p_star, self.q_star

    # -- layout --------------------------------------------------------------------
    @cached_property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("seed", "<u4"), ("y", grr_index_dtype(self.hash_range))])

    def record_bounds(self) -> dict[str, int]:
        return {"y": self.hash_range}

    # -- device side -------------------------------------------------------------------
    @staticmethod
    def _grr(h: np.ndarray, p: float, g: int, rng: np.random.Generator) -> np.ndarray:
        keep = rng.random(h.shape) < p
        other = rng.integers(0, g - 1, size=h.shape, dtype=np.int64)
        other += other >= h
        return np.where(keep, h, other)

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        """One report per distinct simulated device: a fresh seed, a fresh permanent GRR, a fresh
        instantaneous GRR."""
        v = self.check_values(values)
        g = self.hash_range
        seeds = rng.integers(0, 2**32, size=v.size, dtype=np.uint32)
        h = hash_to_range(v.astype(np.uint32), seeds, g).astype(np.int64)
        y = self._grr(self._grr(h, self.p1, g, rng), self.p2, g, rng)
        out = np.empty(v.size, dtype=self.record_dtype)
        out["seed"], out["y"] = seeds, y
        return out

    def encode_one(self, value: int, rng: np.random.Generator) -> np.ndarray:
        return self.encode(np.array([value], dtype=np.int64), rng)

    def device_seed(self, secret: bytes) -> int:
        """The device's hash seed: 32 bits of HMAC-SHA256(key, ``ldp-telemetry/loloha/seed/v1`` ‖ 0x00 ‖
        memo derivation id ‖ counter)."""
        ks = _Keystream(_as_secret(secret), _LABEL_SEED, bytes.fromhex(self.memo_derivation_id))
        return int.from_bytes(ks.take(4), "little")

    def hashed(self, value: int, seed: int) -> int:
        """``H_s(value)`` in ``[0, g)`` (the scalar form of :func:`hash_to_range`)."""
        return (hash_bytes(int(value).to_bytes(4, "little"), seed) * self.hash_range) >> 32

    def permanent(self, h: int, secret: bytes) -> int:
        """The memoized permanent GRR of hashed value ``h``: from the keystream of
        (``ldp-telemetry/loloha/prr/v1``, memo derivation id, ``h`` int64 LE), keep ``h`` with probability
        exactly ``p1`` (bit-sliced), else a uniform other value of ``[g]`` (rejection sampling)."""
        ctx = bytes.fromhex(self.memo_derivation_id) + struct.pack("<q", int(h))
        ks = _Keystream(_as_secret(secret), _LABEL_PRR, ctx)
        if ks.bernoulli(self.p1, 1):
            return int(h)
        other = keystream_index(ks, self.hash_range - 1)
        return other + (other >= h)

    def encode_memoized(self, values: Any, secret: bytes, rng: np.random.Generator) -> np.ndarray:
        """Reports of one device: its fixed seed, the memoized permanent GRR of each value's hash and a fresh
        instantaneous GRR per report from ``rng``."""
        key = _as_secret(secret)
        v = self.check_values(values)
        seed = self.device_seed(key)
        memo: dict[int, int] = {}
        perm = np.empty(v.size, dtype=np.int64)
        for i, x in enumerate(v.tolist()):
            h = self.hashed(x, seed)
            if h not in memo:
                memo[h] = self.permanent(h, key)
            perm[i] = memo[h]
        out = np.empty(v.size, dtype=self.record_dtype)
        out["seed"] = seed
        out["y"] = self._grr(perm, self.p2, self.hash_range, rng)
        return out

    # -- server-side math -------------------------------------------------------------
    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        """``[n_v p*(1 − p*) + (n − n_v) q*(1 − q*)]/(p* − q*)²`` with ``q* = 1/g``."""
        return pure_protocol_variance(true_counts, self.p_star, self.q_star)
