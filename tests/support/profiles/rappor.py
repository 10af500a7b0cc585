"""Test profile of RAPPOR.

What is audited. A RAPPOR spec's ``epsilon`` is the permanent bound ε∞ over
all reports of one value; one report satisfies the smaller one-report bound
ε1 (``spec.epsilon_one_report``, Erlingsson et al. 2014, Sec. 3.1). The audit
encodes single reports, so its event targets the one-report guarantee:

    E = "cohort c ∈ C*, every bit of B_c(x) \\ B_c(x') is 1 and every bit of
         B_c(x') \\ B_c(x) is 0",

where B_c(v) is v's Bloom filter in cohort c and C* are the cohorts where
that pattern is most telling. Report bits are independent given the filter
(1 w.p. q* on filter bits, p* elsewhere), so in cohort c with a bits only in
B_c(x) and b bits only in B_c(x'),

    P[E_c | x] / P[E_c | x'] = (q*/p*)^a ((1 - p*)/(1 - q*))^b ≤ e^{ε1} ≤ e^{ε∞},

with equality to e^{ε1} when a = b = h. The event is tight against the claimed
ε∞ only without an IRR (p = 0, q = 1, where ε1 = ε∞): :func:`audit_tight`.

Broken variant: no IRR and a PRR at 3ε (f derived from 3ε) while claiming ε,
so one report leaks e^{3ε} on E.

No ``fresh_trial_spec``: the least-squares estimate is unbiased for *any*
fixed hash functions with a full-rank design, and ``count_variance`` is its
exact variance given those hash functions (ldp_core.mechanisms.rappor), so
the statistical suite need not average over hash seeds.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ldp_core.mechanisms.rappor import RapporSpec

__all__ = ["specs", "audit_event", "audit_tight", "audit_plan", "broken_spec", "LeakyRapporSpec"]


def specs() -> list[RapporSpec]:
    """Defaults, a crowded filter, one-time RAPPOR without IRR, three hashes with a custom IRR."""
    return [
        RapporSpec(epsilon=2.0, domain_size=16),
        RapporSpec(epsilon=4.0, domain_size=32, num_bits=16, num_cohorts=4),
        RapporSpec(epsilon=1.0, domain_size=8, num_bits=8, num_cohorts=2, num_hashes=1, p=0.0, q=1.0),
        RapporSpec(epsilon=6.0, domain_size=24, num_bits=24, num_cohorts=4, num_hashes=3, p=0.25, q=0.75),
    ]


def audit_plan(spec: RapporSpec, x: int, x_prime: int) -> tuple[float, dict[int, tuple[list[int], list[int]]]]:
    """The log-ratio of E and, for each cohort in C*, the bits that must be 1 and 0."""
    log_one = math.log(spec.q_star / spec.p_star)
    log_zero = math.log((1.0 - spec.p_star) / (1.0 - spec.q_star))
    cohorts = np.arange(spec.num_cohorts)
    px, pxp = spec.bloom_positions(x, cohorts), spec.bloom_positions(x_prime, cohorts)
    plans: dict[int, tuple[list[int], list[int]]] = {}
    scores = []
    for c in range(spec.num_cohorts):
        ones = sorted(set(px[c].tolist()) - set(pxp[c].tolist()))
        zeros = sorted(set(pxp[c].tolist()) - set(px[c].tolist()))
        plans[c] = (ones, zeros)
        scores.append(len(ones) * log_one + len(zeros) * log_zero)
    best = max(scores)
    return best, {c: plans[c] for c in range(spec.num_cohorts) if math.isclose(scores[c], best)}


def audit_event(spec: RapporSpec, records: np.ndarray, x: int, x_prime: int) -> np.ndarray:
    """Whether each report is in E (module docstring)."""
    _, plan = audit_plan(spec, x, x_prime)
    bits = np.unpackbits(records["bits"], axis=1, bitorder="little").astype(bool)
    out = np.zeros(records.shape[0], dtype=bool)
    for c, (ones, zeros) in plan.items():
        hit = records["cohort"] == c
        if ones:
            hit &= bits[:, ones].all(axis=1)
        if zeros:
            hit &= ~bits[:, zeros].any(axis=1)
        out |= hit
    return out


def audit_tight(spec: RapporSpec) -> bool:
    """E's ratio is e^{ε∞} exactly when there is no IRR (ε1 = ε∞) and C* cohorts have a = b = h."""
    if spec.p != 0.0 or spec.q != 1.0:
        return False
    best, _ = audit_plan(spec, 0, 1)
    return math.isclose(best, spec.epsilon)


@dataclasses.dataclass(frozen=True)
class LeakyRapporSpec(RapporSpec):
    """Claims ``epsilon`` but uses the PRR noise f of 3ε (callers pass p=0, q=1: no IRR)."""

    @property
    def f(self) -> float:
        return 2.0 / (1.0 + math.exp(3.0 * self.epsilon / (2.0 * self.num_hashes)))


def broken_spec(spec: RapporSpec) -> RapporSpec:
    """RAPPOR without IRR and with a PRR at 3ε, claiming ε: one report leaks e^{3ε} on E."""
    params = {**spec.params(), "p": 0.0, "q": 1.0}
    return LeakyRapporSpec(**params)
