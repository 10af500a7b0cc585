"""The accounting questions ``ldp privacy`` answers, each as a JSON-ready dict: its inputs, the figures, and
a ``protects`` line saying what the figure protects and against whom (docs/PRIVACY.md).

* :func:`gaussian_epsilon`, :func:`gaussian_noise`, :func:`gaussian_steps`: T Poisson-sampled Gaussian
  steps (DP-SGD, DP-FedAvg): their ε, the noise for a target ε, the steps that fit one;
* :func:`shuffle_local_epsilon`: the largest local ε₀ whose shuffled batch meets a target ε;
* :func:`local_reports`: what K reports of an ε-LDP mechanism spend for one user;
* :func:`central_release`: the noise (and optionally the release) of integer counts at a target ε;
* :func:`budget_plan`: a sequence of central releases charged to a privacy filter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from estimator.accounting.accountant import (
    Neighbors,
    account,
    basic_epsilon,
    epsilon_pld,
    gaussian_noise_for_epsilon,
    max_steps_for_epsilon,
    sensitivity_factor,
)
from estimator.accounting.central import GaussianCounts, LaplaceCounts, SparseVector
from estimator.accounting.odometer import BasicFilter, PrivacyFilter, ZCDPFilter
from estimator.accounting.shuffle import PROTECTS as SHUFFLE_PROTECTS
from estimator.accounting.shuffle import local_epsilon_for_target, numerical_epsilon
from ldp_core.privacy_events import LocalReportEvent, PrivacyEvent, SelfComposedEvent, sampled_gaussian_event

__all__ = [
    "GAUSSIAN_PROTECTS",
    "LOCAL_PROTECTS",
    "CENTRAL_PROTECTS",
    "BUDGET_PROTECTS",
    "RELEASE_KINDS",
    "gaussian_epsilon",
    "gaussian_noise",
    "gaussian_steps",
    "shuffle_local_epsilon",
    "local_reports",
    "central_release",
    "release_event",
    "budget_plan",
]

GAUSSIAN_PROTECTS = {
    "add_or_remove": "whether one person's data was used at all, against anyone who sees every noisy release "
    "(assumes each person's contribution is clipped to the bound the noise multiplier refers to, "
    "and that the Poisson sample stays secret)",
    "replace": "what one person's data is (replace-one neighbours), against anyone who sees every noisy release "
    "(assumes each person's contribution is clipped to the bound the noise multiplier refers to, "
    "and that the Poisson sample stays secret)",
}
LOCAL_PROTECTS = (
    "the user's true values, against everyone who sees the reports (collector, shuffler, analyst); "
    "not the fact that the user sent reports, nor their number"
)
CENTRAL_PROTECTS = (
    "the people behind the counts, against everyone who sees the released counts (assumes each person moves "
    "the counts by at most the sensitivity: L1 for laplace, L2 for gaussian); not against whoever computes "
    "the exact counts, nor a second release of the same counts that is not charged"
)
BUDGET_PROTECTS = (
    "the people behind the data, against everyone who sees every release charged to the filter, however "
    "each release was chosen after the previous ones; not releases that bypass the filter"
)
#: the release kinds :func:`budget_plan` takes and what their number is
RELEASE_KINDS = {
    "laplace": "ε of a discrete Laplace release of counts (LaplaceCounts)",
    "gaussian": "σ of a discrete Gaussian release of counts (GaussianCounts)",
    "sparse-vector": "ε of a sparse-vector selection of counts above a threshold (SparseVector)",
}


def gaussian_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    neighbors: Neighbors,
    discretization: float,
) -> dict[str, Any]:
    """ε of ``steps`` Gaussian steps at Poisson rate ``sample_rate``: the inputs and every figure of the
    accountant's :class:`~estimator.accounting.accountant.EpsilonReport` (``epsilon_pld``, ``epsilon_rdp``,
    ``rdp_complete``, ``epsilon_exact``, ``notes``, ...)."""
    report = account(sampled_gaussian_event(noise_multiplier, sample_rate, steps), delta, neighbors, discretization)
    head = {"noise_multiplier": noise_multiplier, "sample_rate": sample_rate, "steps": steps}
    return {**head, **report.to_dict(), "protects": GAUSSIAN_PROTECTS[neighbors]}


def gaussian_noise(
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    neighbors: Neighbors,
    discretization: float,
) -> dict[str, Any]:
    """The noise multiplier that keeps ``steps`` Gaussian steps within ``target_epsilon``, with the
    accountant's figures at that multiplier."""
    z = gaussian_noise_for_epsilon(target_epsilon, delta, sample_rate, steps, neighbors, discretization)
    report = account(sampled_gaussian_event(z, sample_rate, steps), delta, neighbors, discretization)
    head = {"noise_multiplier": z, "target_epsilon": target_epsilon, "sample_rate": sample_rate, "steps": steps}
    return {**head, **report.to_dict(), "protects": GAUSSIAN_PROTECTS[neighbors]}


def gaussian_steps(
    noise_multiplier: float,
    sample_rate: float,
    target_epsilon: float,
    delta: float,
    neighbors: Neighbors,
    discretization: float,
) -> dict[str, Any]:
    """How many Gaussian steps fit ``target_epsilon`` (key ``steps``; PLD accountant)."""
    t = max_steps_for_epsilon(noise_multiplier, sample_rate, target_epsilon, delta, neighbors, discretization)
    return {
        "steps": t,
        "noise_multiplier": noise_multiplier,
        "sample_rate": sample_rate,
        "target_epsilon": target_epsilon,
        "delta": delta,
        "neighbors": neighbors,
        "protects": GAUSSIAN_PROTECTS[neighbors],
    }


def shuffle_local_epsilon(target_epsilon: float, users: int, delta: float) -> dict[str, Any]:
    """The largest local ε₀ (key ``epsilon0``) whose shuffled batch of ``users`` reports meets
    ``target_epsilon``, and the bound it gets (key ``epsilon``)."""
    e0 = local_epsilon_for_target(target_epsilon, users, delta)
    return {
        "epsilon0": e0,
        "epsilon": numerical_epsilon(e0, users, delta),
        "target_epsilon": target_epsilon,
        "users": users,
        "delta": delta,
        "protects": SHUFFLE_PROTECTS,
    }


def local_reports(epsilon: float, reports: int, delta: float) -> dict[str, Any]:
    """What ``reports`` reports of an ``epsilon``-LDP mechanism spend for one user (basic composition and
    PLD, replace-one neighbours)."""
    report = account(SelfComposedEvent(LocalReportEvent(epsilon), reports), delta, "replace")
    return {"epsilon_per_report": epsilon, "reports": reports, **report.to_dict(), "protects": LOCAL_PROTECTS}


def central_release(
    mechanism: str,
    epsilon: float,
    delta: float | None,
    sensitivity: int,
    neighbors: Neighbors,
    counts: Sequence[int] | None = None,
    before_release: Callable[[PrivacyEvent], object] | None = None,
) -> dict[str, Any]:
    """Calibrate a central release of integer counts within ``epsilon`` (and ``delta``, required for
    ``gaussian``): discrete Laplace (key ``scale``) or discrete Gaussian (key ``sigma``) noise, the ε it
    achieves, its variance and std; with ``counts``, the release itself (key ``released``), its noise drawn
    from the OS CSPRNG, after ``before_release(event)`` (a budget ledger's debit, which may raise to stop it).
    ValueError for a gaussian release without ``delta``."""
    head: dict[str, Any] = {
        "mechanism": mechanism,
        "epsilon": epsilon,
        "delta": delta,
        "sensitivity": sensitivity,
        "neighbors": neighbors,
    }
    mech: LaplaceCounts | GaussianCounts
    if mechanism == "laplace":
        # ε-DP under add/remove; replace-one neighbours differ by two contributions
        mech = LaplaceCounts(epsilon / sensitivity_factor(neighbors), sensitivity)
        out = {**head, "scale": float(mech.scale), "epsilon_achieved": basic_epsilon(mech.event, neighbors)}
    else:
        if delta is None:
            raise ValueError("a discrete Gaussian release needs a delta")
        mech = GaussianCounts.for_epsilon(epsilon, delta, sensitivity, neighbors)
        out = {**head, "sigma": mech.sigma, "epsilon_achieved": epsilon_pld(mech.event, delta, neighbors)}
    out.update(variance=mech.variance, std=math.sqrt(mech.variance))
    if counts is not None:
        if before_release is not None:
            before_release(mech.event)
        released = mech.release(counts)  # no generator: the OS CSPRNG (secure_generator)
        out["released"] = [int(v) for v in released]
    out["protects"] = CENTRAL_PROTECTS
    return out


def release_event(kind: str, value: float, sensitivity: int) -> PrivacyEvent:
    """The privacy event of one release of :data:`RELEASE_KINDS` ``kind`` with its number ``value``."""
    if kind == "laplace":
        return LaplaceCounts(value, sensitivity).event
    if kind == "gaussian":
        return GaussianCounts(value, sensitivity).event
    return SparseVector(value, 0.0, sensitivity=sensitivity).event


def budget_plan(
    epsilon: float,
    delta: float | None,
    filter: str,
    releases: Sequence[tuple[str, float, int]],
    sensitivity: int,
    neighbors: Neighbors,
    per_release_delta: float | None = None,
) -> dict[str, Any]:
    """Charge ``releases`` ((kind, value, times) of :data:`RELEASE_KINDS`, in order) to a ``zcdp`` or ``basic``
    privacy filter with budget (``epsilon``, ``delta``): the filter's status, the ``plan`` (each release, whether
    it was admitted and its cost) and how many were ``refused``. ValueError for a zcdp filter without ``delta``."""
    flt: PrivacyFilter
    if filter == "zcdp":
        if delta is None:
            raise ValueError("a zCDP filter needs a delta")
        flt = ZCDPFilter(epsilon, delta, neighbors)
    else:
        flt = BasicFilter(epsilon, 0.0 if delta is None else delta, neighbors, per_release_delta=per_release_delta)
    plan: list[dict[str, Any]] = []
    for kind, value, times in releases:
        event = release_event(kind, value, sensitivity)
        label = f"{kind}:{value:g}"
        for _ in range(times):
            cost = dict(zip(flt.units, flt.cost(event)))
            plan.append({"release": label, "admitted": flt.try_spend(event, label), "cost": cost})
    refused = sum(not r["admitted"] for r in plan)
    return {**flt.status(), "plan": plan, "refused": refused, "protects": BUDGET_PROTECTS}
