"""One aggregator's view reveals nothing on its own: the input share it opens has the same distribution
whatever the value. Shares of 0 and of 1 (Prio3Count), and of 0 and of the maximum (Prio3Sum), are drawn
through the binding with randomness from a seeded generator (``shard_with_random``: the crate's own
sharding, fed our bytes instead of the OS CSPRNG's, so the test is reproducible), and every field element
of the leader's share (and the helper's 32-byte seed, read as four 64-bit words) is compared between the
two values by a two-sample Kolmogorov-Smirnov test and against the uniform law on the field.

False-alarm rate: each p-value is uniform under the hypothesis (the shares are uniform, independent of
the value), and the test fails only when one p-value is below 1e-6 / (number of p-values computed in the
file), so the file's false-alarm rate is below 1e-6 (Bonferroni). Power: the same statistic on the values
themselves (a "share" that is the value) gives p-values far below the threshold (checked below), so the
threshold is not so small that a leak would pass.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ldp_core.prio3.vdaf import load_binding

N = 3000  #: shares per value
FIELD64 = 2**64 - 2**32 + 1
TESTS = 2 * 7 + 2 * 41 + 2 * 4 * 2 + 1  #: an upper bound on the p-values computed below
ALPHA = 1e-6 / TESTS


def _words(b: bytes) -> list[int]:
    return [int.from_bytes(b[i : i + 8], "little") for i in range(0, len(b) - 7, 8)]


def _shares(vdaf: object, value: int, seed: int, rand_len: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lead, helper = [], []
    for _ in range(N):
        _public, (l_share, h_share) = vdaf.shard_with_random(value, rng.bytes(16), rng.bytes(rand_len), b"t")  # type: ignore[attr-defined]
        lead.append(_words(l_share))
        helper.append(_words(h_share))
    return np.array(lead, dtype=np.float64), np.array(helper, dtype=np.float64)


@pytest.mark.parametrize(("kind", "low", "high", "rand_len"), [("count", 0, 1, 64), ("sum", 0, 255, 64)])
def test_a_single_share_does_not_depend_on_the_value(kind: str, low: int, high: int, rand_len: int) -> None:
    b = load_binding()
    vdaf = b.Prio3Count() if kind == "count" else b.Prio3Sum(255)
    lead_a, helper_a = _shares(vdaf, low, 11, rand_len)
    lead_b, helper_b = _shares(vdaf, high, 12, rand_len)
    assert lead_a.shape[1] <= 41 and helper_a.shape[1] == 4
    uniform = stats.uniform(0, FIELD64).cdf
    for j in range(lead_a.shape[1]):  # every field element of the leader's share (measurement and proof shares)
        assert stats.ks_2samp(lead_a[:, j], lead_b[:, j]).pvalue > ALPHA, (kind, j)
        assert stats.kstest(lead_a[:, j], uniform).pvalue > ALPHA, (kind, j)
    for j in range(4):  # the helper's share is a seed: uniform bytes
        assert stats.ks_2samp(helper_a[:, j], helper_b[:, j]).pvalue > ALPHA, (kind, j)
        assert stats.kstest(helper_a[:, j], stats.uniform(0, 2.0**64).cdf).pvalue > ALPHA, (kind, j)


def test_the_statistic_sees_a_leak() -> None:
    """Power control: a view that leaks the value (value * 200 plus uniform noise on [0, 1000)), as N draws
    for each of two values, is flagged by the same statistic at the same threshold."""
    rng = np.random.default_rng(5)
    leaky_a = 0 * 200 + rng.uniform(0, 1000, N)
    leaky_b = 1 * 200 + rng.uniform(0, 1000, N)
    assert stats.ks_2samp(leaky_a, leaky_b).pvalue < ALPHA
