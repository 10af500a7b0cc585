"""The sparse vector technique's noise scales, behaviour, and an empirical privacy audit that passes the
correct technique and catches two known-broken variants (Lyu, Su and Li, VLDB 2017).

Audit. For neighbouring query answers D, D' and an output pattern o, the runs give counts k, k' out of N;
with one-sided Clopper–Pearson bounds at level α each, ε_lb = ln(p_lo(o | D) / p_hi(o | D')) is a lower
bound on the true ε unless one of the two bounds fails (probability <= 2α). A correct ε-DP mechanism has
true ratio <= e^ε, so the audit falsely accuses it with probability <= 2α per (pattern, direction) checked;
The patterns are fixed before the runs; α = 2.5e-8 and at most 16 checks per audit keep the false-alarm
rate below 8e-7 < 1e-6.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta

from estimator.accounting.central import SparseVector
from estimator.selection.mechanisms import (
    AboveThreshold,
    SelectionError,
    exponential_mechanism,
    exponential_probabilities,
    naive_cost,
    svt_report,
    svt_select,
)
from ldp_core.noise import discrete_laplace

ALPHA = 2.5e-8
N = 100_000


def _cp_lower(k: int, n: int) -> float:
    return 0.0 if k == 0 else float(beta.ppf(ALPHA, k, n - k + 1))


def _cp_upper(k: int, n: int) -> float:
    return 1.0 if k == n else float(beta.ppf(1 - ALPHA, k + 1, n - k))


def _patterns(out: np.ndarray) -> dict[tuple[int, ...], int]:
    keys, counts = np.unique(out, axis=0, return_counts=True)
    return {tuple(int(v) for v in k): int(c) for k, c in zip(keys, counts)}


def halting_patterns(m: int) -> list[tuple[int, ...]]:
    """Every output of a c = 1 run over m queries: ⊥ up to the first ⊤, then not asked (m + 1 of them)."""
    return [tuple([0] * i + [1] + [-1] * (m - i - 1)) for i in range(m)] + [tuple([0] * m)]


def audit_lower_bound(
    run: object, d: np.ndarray, d2: np.ndarray, patterns: list[tuple[int, ...]], rng: np.random.Generator
) -> float:
    """The largest ε lower bound over the output ``patterns`` (fixed before the runs, at most 8), in both
    directions: at most 16 checks, so a false alarm has probability <= 32 α = 8e-7."""
    assert len(patterns) <= 8
    out_d = _patterns(run(np.tile(d, (N, 1)), rng))  # type: ignore[operator]
    out_d2 = _patterns(run(np.tile(d2, (N, 1)), rng))  # type: ignore[operator]
    best = 0.0
    for a, b in ((out_d, out_d2), (out_d2, out_d)):
        for o in patterns:
            lo, hi = _cp_lower(a.get(o, 0), N), _cp_upper(b.get(o, 0), N)
            if lo > 0:
                best = max(best, math.log(lo / hi))
    return best


def correct(svt: SparseVector):  # type: ignore[no-untyped-def]
    return lambda q, rng: AboveThreshold.outcomes(svt, q, rng)


def no_query_noise(svt: SparseVector):  # type: ignore[no-untyped-def]
    """Stoddard et al. 2014 (Lyu et al. Alg. 5): the threshold is noised, the queries are not."""

    def run(q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        rho = discrete_laplace(svt.scales[0], q.shape[0], rng)
        above = q - rho[:, None] >= svt.threshold
        out = np.where(above, 1, 0)
        out[(np.cumsum(above, axis=1) - above) >= svt.max_answers] = -1
        return out

    return run


def no_halting(svt: SparseVector):  # type: ignore[no-untyped-def]
    """Chen et al. 2015 (Lyu et al. Alg. 6): noise scaled for c answers, but the run never halts."""

    def run(q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        b1, b2 = svt.scales
        rho = discrete_laplace(b1, q.shape[0], rng)
        nu = discrete_laplace(b2, q.size, rng).reshape(q.shape)
        return np.where(q + nu - rho[:, None] >= svt.threshold, 1, 0)

    return run


def test_no_query_noise_is_caught_and_the_correct_technique_passes() -> None:
    """D = (0, 1), D' = (1, 0): each answer moves by 1 (general queries, Δ = 1). Without query noise the
    pattern (⊥, ⊤) needs 0 < T + ρ <= 1 on D but 1 < T + ρ <= 0 on D': possible on D, impossible on D'."""
    eps = 1.0
    svt = SparseVector(eps, threshold=1, max_answers=1, sensitivity=1, monotonic=False)
    d, d2 = np.array([0, 1]), np.array([1, 0])
    rng = np.random.default_rng(3201)
    patterns = halting_patterns(2)
    ok = audit_lower_bound(correct(svt), d, d2, patterns, rng)
    broken = audit_lower_bound(no_query_noise(svt), d, d2, patterns, rng)
    assert ok <= eps
    assert broken > eps, f"the audit missed the broken variant (ε_lb = {broken:.3f})"
    assert broken > 3 * eps  # not a borderline catch: (⊥, ⊤) has probability 0 on D'


def test_not_halting_is_caught_and_the_correct_technique_passes() -> None:
    """Lyu et al.'s example for Alg. 6: D = (0, 0, 0, 1, 1, 1), D' = (1, 1, 1, 0, 0, 0) (general queries,
    Δ = 1), pattern ⊥⊥⊥⊤⊤⊤. Charged for c = 1 but answering on, every answer adds to the privacy loss:
    at ε = 2 the pattern's true ratio is e^{3.23} (computed from the two pmfs while writing this test).
    Halting after the first ⊤ makes the pattern impossible, and the correct run's own patterns pass."""
    eps = 2.0
    svt = SparseVector(eps, threshold=1, max_answers=1, sensitivity=1, monotonic=False)
    d, d2 = np.array([0, 0, 0, 1, 1, 1]), np.array([1, 1, 1, 0, 0, 0])
    rng = np.random.default_rng(3202)
    patterns = [*halting_patterns(6), (0, 0, 0, 1, 1, 1)]
    ok = audit_lower_bound(correct(svt), d, d2, patterns, rng)
    broken = audit_lower_bound(no_halting(svt), d, d2, patterns, rng)
    assert ok <= eps
    assert broken > eps, f"the audit missed the broken variant (ε_lb = {broken:.3f})"


def test_the_scales_are_lyu_et_al_and_the_split_adds_up() -> None:
    for c, mono in ((1, False), (3, False), (1, True), (4, True)):
        svt = SparseVector(2.0, 0, max_answers=c, sensitivity=2, monotonic=mono)
        e1, e2 = svt.epsilon_split
        assert e1 + e2 == pytest.approx(2.0)
        assert e2 / e1 == pytest.approx((c if mono else 2 * c) ** (2 / 3))
        b1, b2 = (float(b) for b in svt.scales)
        assert b1 == pytest.approx(2 / e1, rel=1e-5)  # Δ/ε₁, rounded up by < 2^-20
        assert b2 == pytest.approx((1 if mono else 2) * c * 2 / e2, rel=1e-5)  # (2)cΔ/ε₂
        report = svt_report(2.0, 10, 1e-6, c, 2, mono)
        assert report["epsilon"] == 2.0 and report["query_scale"] == pytest.approx(b2)


def test_the_stream_halts_and_scores_lazily() -> None:
    svt = SparseVector(4.0, threshold=100, max_answers=1, sensitivity=1, monotonic=True)
    scored: list[int] = []

    def score(i: int) -> int:
        scored.append(i)
        return [0, 3, 1000, 5000][i]

    sel = svt_select(score, 4, svt, np.random.default_rng(1))
    assert sel.index == 2 and scored == [0, 1, 2] and sel.answers == (False, False, True)
    run = AboveThreshold(svt, np.random.default_rng(2))
    assert run.test(10_000)
    with pytest.raises(SelectionError, match="halted"):
        run.test(0)
    with pytest.raises(SelectionError, match="integer"):
        AboveThreshold(svt).test(1.5)  # type: ignore[arg-type]
    assert svt_select(lambda i: 0, 5, svt, np.random.default_rng(3)).index is None


def test_stream_and_batch_answer_with_the_same_probability() -> None:
    """One query at T: P[⊤] from 2000 streamed runs against 100 000 batch runs; the difference of two
    proportions is within 5.5 standard errors (sqrt(p(1-p)(1/n1 + 1/n2)); false alarm < 1e-7)."""
    svt = SparseVector(1.0, threshold=20, max_answers=1)
    rng = np.random.default_rng(5)
    batch = float((AboveThreshold.outcomes(svt, np.full((100_000, 1), 20), rng) == 1).mean())
    streamed = float(np.mean([AboveThreshold(svt, rng).test(20) for _ in range(2000)]))
    se = math.sqrt(batch * (1 - batch) * (1 / 2000 + 1 / 100_000))
    assert abs(streamed - batch) < 5.5 * se


def test_exponential_mechanism_frequencies_match_its_probabilities_and_ratio() -> None:
    """Frequencies over 60 000 draws within 5.5 binomial standard errors of the softmax; the
    probabilities of neighbouring (monotone) scores differ by at most e^ε per candidate."""
    scores, eps = [10, 12, 15, 9], 1.0
    p = exponential_probabilities(scores, eps, monotonic=True)
    rng = np.random.default_rng(6)
    n = 60_000
    picks = np.bincount([exponential_mechanism(scores, eps, monotonic=True, rng=rng) for _ in range(n)], minlength=4)
    assert np.all(np.abs(picks / n - p) < 5.5 * np.sqrt(p * (1 - p) / n) + 1e-12)
    for nb in ([11, 13, 16, 10], [10, 12, 16, 10], [9, 11, 14, 8]):  # one person added or removed
        q = exponential_probabilities(nb, eps, monotonic=True)
        assert np.all(np.maximum(p / q, q / p) <= math.exp(eps) + 1e-12)
    general = exponential_probabilities(scores, eps)  # ε u / 2Δ: flatter
    assert general.max() < p.max()
    with pytest.raises(SelectionError):
        exponential_mechanism([], 1.0)


def test_naive_cost_is_the_composition_of_every_candidate() -> None:
    """Basic composition is k·Δ/b; the PLD figure is checked against dp_accounting's own Laplace PLD."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    cost = naive_cost(20, 4.0, 1e-6)
    assert cost["epsilon_basic"] == pytest.approx(5.0)
    ref = pld.from_laplace_mechanism(4.0, value_discretization_interval=1e-4).self_compose(20)
    assert cost["epsilon_pld"] == pytest.approx(ref.get_epsilon_for_delta(1e-6), rel=1e-3)
    assert cost["epsilon_pld"] > 1.0  # far above the SVT's or the exponential mechanism's ε of 1 for 20
