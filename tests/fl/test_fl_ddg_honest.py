"""The distributed discrete Gaussian's ε against the operator when only some sampled devices are honest (issue 28).

The operator runs the enrollment authority and draws the sample, so it can fill a round with devices whose noise
it knows and subtract it: only the honest devices' shares protect a target. Every place that prints the DDG ε
against the operator now prints, beside the all-honest figure, the figure for the share of honest devices the task
assumes (``assumed_honest_fraction``, default ½)."""

from __future__ import annotations

import functools
import math

import pytest

from estimator.fl.ddg_accounting import (
    DDGAccountant,
    assumed_honest_shares,
    ddg_epsilon_by_adversary,
    noise_for_epsilon,
)

#: the issue's audit of `ldp fl clinics --example`'s distributed-DG row (10 devices per round, 100 rounds,
#: δ = 1e-5, 16 bits, noise calibrated to ε 91.82): honest devices → ε against the operator, to one decimal
AUDIT = {10: 91.8, 6: 136.6, 3: 239.8, 1: 615.8}


@functools.lru_cache(maxsize=1)
def _clinics_accountant() -> DDGAccountant:
    spec = noise_for_epsilon(91.82, 1e-5, 100, clip_norm=0.5, clients=10, dim=5, bits=16)
    acc = DDGAccountant(1e-5)
    for _ in range(100):
        acc.record(spec)
    return acc


def test_the_audits_figures_for_6_3_1_honest_devices_of_10() -> None:
    """The method: with h honest devices the operator's view is the target's update plus h noise shares (the
    others' it knows), so the round's RDP is KLS21's bound with k = h shares; the audit's figures to its
    printed rounding (half a unit in the first decimal)."""
    acc = _clinics_accountant()
    for h, eps in AUDIT.items():
        assert abs(acc.epsilon(shares=h) - eps) <= 0.05, (h, acc.epsilon(shares=h))


@pytest.mark.parametrize("honest", [6, 3, 1])
def test_the_assumed_honest_figure_matches_dp_accounting(honest: int) -> None:
    """An independent computation: σ_ℓ is hundreds of ring units at 16 bits, so τ ≈ 0 and a round with h shares
    is a Gaussian of multiplier z = √h σ_ℓ / (2Δ) (replace-one); dp_accounting's RDP accountant on 100 of them,
    with its own orders and conversion, agrees to within 2 % (ours searches a finer grid: never above)."""
    import dp_accounting

    acc = _clinics_accountant()
    spec = acc.rounds_recorded[0][0]
    z = math.sqrt(honest * spec.local_sigma2) / (2 * math.sqrt(spec.norm_bound_sq))
    ref = dp_accounting.rdp.RdpAccountant()
    ref.compose(dp_accounting.GaussianDpEvent(z), 100)
    theirs = ref.get_epsilon(1e-5)
    ours = acc.epsilon(shares=honest)
    assert theirs * 0.98 <= ours <= theirs * 1.001


def test_assumed_honest_shares_counts_dropouts_against_the_honest() -> None:
    assert assumed_honest_shares(10, 0.5) == 5
    assert assumed_honest_shares(10, 0.6) == 6
    assert assumed_honest_shares(10, 1.0) == 10
    assert assumed_honest_shares(10, 0.5, min_shares=8) == 3  # the 2 that dropped may have been honest
    assert assumed_honest_shares(10, 0.1, min_shares=8) == 1  # at least the target's own share
    for bad in (0.0, 1.5, True, "half"):
        with pytest.raises(Exception, match="fraction"):
            assumed_honest_shares(10, bad)  # type: ignore[arg-type]


def test_the_operator_entry_carries_both_figures() -> None:
    acc = _clinics_accountant()
    server = ddg_epsilon_by_adversary(acc, 6, 5, 0.5)[2]
    assert server["adversary"] == "server_operator"
    assert server["epsilon"] == server["epsilon_all_honest"] == acc.epsilon()
    assert server["epsilon_assumed_honest"] == acc.epsilon(shares=5) > server["epsilon"]
    assert server["assumed_honest_shares"] == 5 and server["assumed_honest_fraction"] == 0.5
