"""Empirical privacy audit of every mechanism (black-box, from its encoder alone).

For neighboring inputs x, x' (the profile's ``audit_inputs(spec)``, default
(0, 1)) the encoder runs N times on x and N times on x', and the profile's
``audit_event(spec, records, x, x')`` marks the reports in the event E built to
separate them. With k₁ and k₂ reports in E,

    P[E | x]  ∈ [L₁, U₁],    P[E | x'] ∈ [L₂, U₂]

by one-sided Clopper–Pearson bounds (exact binomial: L = Beta⁻¹(a; k, N-k+1),
U = Beta⁻¹(1-a; k+1, N-k)), each at level a = ALPHA / 4, so all four hold at
once with probability at least 1 - ALPHA (union bound). Then every ratio is
bounded below: P[E|x]/P[E|x'] ≥ L₁/U₂, P[E|x']/P[E|x] ≥ L₂/U₁, and for the
complement event (1-U₁)/(1-L₂) and (1-U₂)/(1-L₁). ε-LDP means every one of
these ratios is at most e^ε (Kairouz et al. 2014; auditing by confidence
bounds on such ratios as in Jagielski et al., NeurIPS 2020), so a lower bound
above e^ε proves a violation with confidence 1 - ALPHA; a correct mechanism
fails this test with probability at most ALPHA = 1e-6.

Power: the same procedure on the profile's ``broken_spec(spec)`` (an encoder
that leaks more while claiming the same ε) must find a lower bound above e^ε.

Input pairs: besides the profile's pair, every spec is audited on (0, d − 1)
(the largest index, i.e. the top of the record dtype's used range) and on a
pair drawn from a seeded generator per spec (for block HR, one in two
different blocks), with N_EXTRA reports per side: a leak that only shows for
some pair (an off-by-one at the domain's end, a per-block constant) is caught
there. Those extra audits check only that no ratio is provably above e^ε.

Tightness: where the profile's optional ``audit_tight(spec)`` says the event
attains the bound (P[E|x]/P[E|x'] = e^ε exactly, e.g. GRR's "report = x"),
the two-sided interval [L₁/U₂, U₁/L₂] must contain e^ε and be narrower than
a factor e^TIGHT_LOG_WIDTH, i.e. the observed ratio is close to e^ε.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import pytest
from scipy import stats

from tests.support.spec_cases import optional, profile_spec, spec_cases

N_AUDIT = 1_000_000
N_EXTRA = 250_000  # reports per side for the extra input pairs (no tightness check there)
CHUNK = 1 << 17
ALPHA = 1e-6
TIGHT_LOG_WIDTH = 0.35
SEED = 7_041_993

CASES = spec_cases()


def cp_lower(k: int, n: int, a: float) -> float:
    """One-sided Clopper–Pearson lower bound at level ``a``."""
    return 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))


def cp_upper(k: int, n: int, a: float) -> float:
    """One-sided Clopper–Pearson upper bound at level ``a``."""
    return 1.0 if k == n else float(stats.beta.isf(a, k + 1, n - k))


def count_event(prof: Any, spec: Any, value: int, x: int, x_prime: int, n: int, rng: np.random.Generator) -> int:
    """How many of ``n`` reports of ``value`` fall in the audit event (encoded in chunks)."""
    hits = 0
    done = 0
    while done < n:
        m = min(CHUNK, n - done)
        records = spec.encode(np.full(m, value, dtype=np.int64), rng)
        event = np.asarray(prof.audit_event(spec, records, x, x_prime))
        assert event.shape == (m,) and event.dtype == np.bool_, "audit_event must return one bool per record"
        hits += int(event.sum())
        done += m
    return hits


def extra_pairs(name: str, index: int, spec: Any) -> dict[str, tuple[int, int]]:
    """The extra audited input pairs of one spec: ``last`` = (0, d − 1), ``random`` = a seeded
    pair of distinct indices (in different blocks for block HR)."""
    d = spec.domain_size
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode()), index, 2])
    while True:
        x, x_prime = (int(v) for v in rng.choice(d, size=2, replace=False))
        per = getattr(spec, "block_size", 0) - 1 if getattr(spec, "variant", "") == "blocks" else 0
        if per <= 0 or x // per != x_prime // per or d <= per:
            break
    pairs = {"last": (0, d - 1), "random": (x, x_prime)}
    return {k: v for k, v in pairs.items() if v not in ((0, 1), (1, 0)) or d > 2}


def audit(
    prof: Any, spec: Any, rng: np.random.Generator, pair: tuple[int, int] | None = None, n: int = N_AUDIT
) -> dict[str, float]:
    """Counts, bounds and ratio bounds of one audit (see the module docstring)."""
    x, x_prime = pair if pair is not None else optional(prof, "audit_inputs", lambda s: (0, 1))(spec)
    k1 = count_event(prof, spec, x, x, x_prime, n, rng)
    k2 = count_event(prof, spec, x_prime, x, x_prime, n, rng)
    a = ALPHA / 4
    l1, u1, l2, u2 = cp_lower(k1, n, a), cp_upper(k1, n, a), cp_lower(k2, n, a), cp_upper(k2, n, a)

    def ratio(num: float, den: float) -> float:
        return math.inf if den <= 0.0 else num / den

    lower_bounds = {
        "P[E|x]/P[E|x']": ratio(l1, u2),
        "P[E|x']/P[E|x]": ratio(l2, u1),
        "P[not E|x]/P[not E|x']": ratio(1.0 - u1, 1.0 - l2),
        "P[not E|x']/P[not E|x]": ratio(1.0 - u2, 1.0 - l1),
    }
    return {
        "k1": k1,
        "k2": k2,
        "observed": ratio(k1, k2),
        "upper": ratio(u1, l2),
        **lower_bounds,
        "worst_lower": max(lower_bounds.values()),
    }


def _rng(name: str, index: int, broken: bool) -> np.random.Generator:
    return np.random.default_rng([SEED, zlib.crc32(name.encode()), index, int(broken)])


@pytest.mark.parametrize("name,index", CASES)
def test_honest_mechanism_passes_audit(name: str, index: int) -> None:
    """No event ratio is provably above e^ε (false failure probability ≤ 1e-6)."""
    prof, spec = profile_spec(name, index)
    r = audit(prof, spec, _rng(name, index, False))
    e_eps = math.exp(spec.epsilon)
    assert r["worst_lower"] <= e_eps, f"{name} ε={spec.epsilon}: ratio lower bound {r} exceeds e^ε = {e_eps:.4g}"
    if optional(prof, "audit_tight", lambda s: False)(spec):
        assert r["P[E|x]/P[E|x']"] <= e_eps <= r["upper"], f"tight event's ratio interval misses e^ε = {e_eps:.4g}: {r}"
        width = math.log(r["upper"]) - math.log(r["P[E|x]/P[E|x']"])
        assert width <= TIGHT_LOG_WIDTH, f"audit too imprecise to show tightness (log width {width:.3f}): {r}"


EXTRA_CASES = [pytest.param(*c.values, kind, id=f"{c.id}-{kind}") for c in CASES for kind in ("last", "random")]


@pytest.mark.parametrize("name,index,kind", EXTRA_CASES)
def test_honest_mechanism_passes_audit_on_more_pairs(name: str, index: int, kind: str) -> None:
    """(0, d − 1) and a seeded random pair per spec: no event ratio provably above e^ε (≤ 1e-6)."""
    prof, spec = profile_spec(name, index)
    pair = extra_pairs(name, index, spec).get(kind)
    if pair is None:  # d = 2: the pair is (0, 1), audited by test_honest_mechanism_passes_audit
        return
    r = audit(
        prof, spec, np.random.default_rng([SEED, zlib.crc32(name.encode()), index, 3, pair[0], pair[1]]), pair, N_EXTRA
    )
    e_eps = math.exp(spec.epsilon)
    assert r["worst_lower"] <= e_eps, f"{name} ε={spec.epsilon} {pair}: ratio lower bound {r} exceeds e^ε"


@pytest.mark.parametrize("name,index", CASES)
def test_audit_catches_broken_spec(name: str, index: int) -> None:
    """The same audit proves the profile's leaky variant violates its claimed ε."""
    prof, spec = profile_spec(name, index)
    broken = prof.broken_spec(spec)
    assert broken.epsilon == spec.epsilon, "broken_spec must claim the same ε"
    r = audit(prof, broken, _rng(name, index, True))
    e_eps = math.exp(spec.epsilon)
    assert r["worst_lower"] > e_eps, f"{name} ε={spec.epsilon}: the audit missed the broken spec: {r}"
