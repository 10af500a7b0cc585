"""PEM's ranking by posterior probability (estimator/mechanisms/pem_posterior.py).

The Bayes factor against a numerical integral; the pruned extension against the plain one; and, on a
seeded population, the two failures the ranking is built to avoid: a heavy word's siblings inheriting
its mass (a sum of the chain's estimates ranks them first) and a second heavy word under the same
first-level prefix being explained away (the one-value-per-root model alone ranks it last). The
population's margins are stated in standard deviations of the level estimates
(``pem_count_variance``), at least 8 (union bound over every candidate: false failure < 1e-6).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from estimator.errors import BatchError
from estimator.mechanisms.heavy_hitters import (
    alphabet_prefixes,
    discover_pem,
    enumerate_alphabet_prefixes,
    extend_prefixes,
    extend_prefixes_pruned,
    pem_count_variance,
)
from estimator.mechanisms.pem_posterior import PosteriorChains, log_bayes_factor, theta_grid
from ldp_core.mechanisms.heavy_hitters import PEMSpec, pad_value

AZ = b"abcdefghijklmnopqrstuvwxyz"


def test_log_bayes_factor_is_the_prior_average_of_the_likelihood_ratio() -> None:
    theta = theta_grid(50.0, 10_000)
    assert theta[0] == pytest.approx(25.0) and theta[-1] == pytest.approx(10_000.0)
    # the grid is log-uniform: the average over its points is ∫ f(e^u) du / (u1 - u0) by the trapezoid rule
    u0, u1 = math.log(theta[0]), math.log(theta[-1])
    for a, b in [(0.0, 1e-4), (0.02, 1e-4), (0.05, 3e-4), (-0.01, 2e-4)]:

        def ratio(u: float, a: float = a, b: float = b) -> float:
            return math.exp(math.exp(u) * a - math.exp(2 * u) * b / 2)

        exact, _ = integrate.quad(ratio, u0, u1, limit=200)
        got = math.exp(log_bayes_factor(np.array([a]), np.array([b]), theta)[0])
        assert got == pytest.approx(exact / (u1 - u0), rel=0.05)
    one = np.array([300.0])  # a one-point grid: the likelihood ratio at that count, exactly
    assert log_bayes_factor(np.array([0.02]), np.array([1e-4]), one)[0] == pytest.approx(300 * 0.02 - 300**2 * 1e-4 / 2)


def test_extend_prefixes_pruned_is_extend_prefixes_filtered_with_parents() -> None:
    rows = enumerate_alphabet_prefixes(12, 4, b"abc")
    for bits, new in [(12, 24), (12, 13), (12, 28)]:
        plain = extend_prefixes(rows, bits, new)
        want = plain[alphabet_prefixes(plain, new, b"abc")]
        got, parent = extend_prefixes_pruned(rows, bits, new, b"abc")
        assert np.array_equal(got, want)
        step = new - bits
        assert np.array_equal(np.unpackbits(got, axis=1)[:, :bits], np.unpackbits(rows[parent], axis=1)[:, :bits])
        assert step and np.all(np.diff(parent) >= 0)
    got, parent = extend_prefixes_pruned(rows[:3], 12, 20)  # no alphabet: every extension, in order
    assert np.array_equal(got, extend_prefixes(rows[:3], 12, 20)) and np.array_equal(
        parent, np.repeat(np.arange(3), 256)
    )


def test_posterior_chains_give_a_heavy_prefix_s_mass_to_one_child() -> None:
    chains = PosteriorChains(np.array([900.0, 10.0, -5.0]), 100.0**2, 10_000)
    before = chains.score()
    assert before[0] > before[1] > before[2]  # at level 0 the score rises with the estimate
    chains.keep(np.array([0, 1]))
    # 100 children of the heavy prefix (one carries its mass), one of the weak one
    est = np.concatenate([[880.0], np.linspace(-150.0, 150.0, 99), [400.0]])
    chains.extend(np.repeat([0, 1], [100, 1]), est, 100.0**2)
    s = chains.score()
    assert s[0] > math.log(0.99) and s[1:100].max() < math.log(0.01)  # the heavy child, not its siblings
    assert s[100] > s[1:100].max()  # a weak prefix's strong child beats the heavy prefix's noise


def _population(rng: np.random.Generator) -> tuple[np.ndarray, dict[bytes, int]]:
    counts = {b"abcd": 16_000, b"abce": 2_400, b"wxyz": 2_400}
    tail = set()
    while len(tail) < 2_000:
        w = bytes(rng.choice(np.frombuffer(AZ, dtype=np.uint8), 4))
        if w[:3] not in (b"abc", b"wxy"):
            tail.add(w)
    for w in sorted(tail):
        counts[w] = 9  # 18,000 devices over 2,000 words
    raws = [pad_value(w.decode(), 4) for w in counts]
    table = np.frombuffer(b"".join(raws), dtype=np.uint8).reshape(len(raws), 4)
    return np.repeat(table, list(counts.values()), axis=0), counts


@pytest.mark.parametrize("alphabet", [AZ, None])
def test_posterior_ranking_neither_lets_siblings_inherit_nor_explains_a_second_word_away(
    alphabet: bytes | None,
) -> None:
    rng = np.random.default_rng(20261206)
    users, counts = _population(rng)
    spec = PEMSpec(epsilon=4.0, length=4, start_bits=16, step_bits=8)  # levels of 16, 24, 32 bits
    n = users.shape[0]
    sd = math.sqrt(pem_count_variance(spec, np.zeros(1), n, n // spec.num_levels)[0])
    # margins: the three words stand 2,400/sd above zero at every level, the tail words 9/sd
    assert 2_400 / sd > 8 + 9 / sd and n == 38_800
    disc = discover_pem(spec, spec.encode(users, rng), top=3, keep=8, alphabet=alphabet)
    top = [h.raw for h in disc.top(3)]
    assert set(top) == {b"abcd", b"abce", b"wxyz"}  # not abca/abcb/... (the chain sum's siblings)
    assert top[0] == b"abcd"  # the first `top` are listed by estimate
    assert disc.top(3)[0].estimate == pytest.approx(counts[b"abcd"], abs=8 * sd)
    old = discover_pem(spec, spec.encode(users, np.random.default_rng(1)), top=3, keep=8, ranking="estimate")
    assert {h.raw for h in old.top(3)} == set(top)
    with pytest.raises(BatchError, match="ranking"):
        discover_pem(spec, spec.encode(users[:10], rng), top=3, ranking="sum")


def test_the_wide_beam_is_kept_for_small_n_only() -> None:
    """4·c candidates at level 0 and 2·c after up to WIDE_BEAM_MAX_REPORTS reports, c above: what level 1
    ranks is the kept level-0 prefixes' 2^8 extensions each (less the impossible ones), so it counts the
    beam. The population does not matter for the count, only n does."""
    from estimator.mechanisms.heavy_hitters import WIDE_BEAM_MAX_REPORTS, posterior_beam

    assert posterior_beam(WIDE_BEAM_MAX_REPORTS) == (4, 2) and posterior_beam(WIDE_BEAM_MAX_REPORTS + 1) == (1, 1)
    spec = PEMSpec(epsilon=4.0, length=5, start_bits=16, step_bits=8)  # levels of 16, 24, 32, 40 bits
    rng = np.random.default_rng(7)
    words = np.frombuffer(b"".join(pad_value(w, 5) for w in (b"abc", b"abd", b"xyz", b"qrs")), dtype=np.uint8)
    ranked = {}
    for n in (WIDE_BEAM_MAX_REPORTS, WIDE_BEAM_MAX_REPORTS + 1):
        users = words.reshape(4, 5)[rng.integers(0, 4, n)]
        ranked[n] = discover_pem(spec, spec.encode(users, rng), top=4, keep=8).candidates
    wide, narrow = ranked[WIDE_BEAM_MAX_REPORTS], ranked[WIDE_BEAM_MAX_REPORTS + 1]
    assert wide[0] == narrow[0]  # level 0 ranks every 16-bit prefix either way
    assert 3 * 8 * 256 < wide[1] <= 4 * 8 * 256 and 0 < narrow[1] <= 8 * 256
    assert 8 * 256 < wide[2] <= 2 * 8 * 256 and 0 < narrow[2] <= 8 * 256
