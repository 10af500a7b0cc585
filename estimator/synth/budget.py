"""A synthetic-data run as a privacy event, debited to a shared budget session before it reads the table.

What ``ldp synth --budget-session FILE --partner NAME`` (and :func:`debit_synth`) charges, as kind ``synth``:

* ``mst``, ``aim``: each run spends exactly ρ = ``rho_for_epsilon(ε, δ)`` of zCDP
  (:mod:`estimator.synth.zcdp`; its own ledger refuses a step beyond it), which is the zCDP cost of a
  Gaussian of noise multiplier 1/√(2ρ): that event is charged. Its ρ is exact for a session's ``zcdp``
  filter; a ``basic`` session would price the stand-in Gaussian by its privacy-loss distribution, which a
  mix of Gaussian measurements and exponential-mechanism selections need not share, so such a session
  is refused (an error, exit 2) rather than undercharged.
* ``dpgan``: the discriminator's steps, SelfComposed(PoissonSampled(q, Gaussian(σ)), T) with q = batch/N
  and σ calibrated to ε before the run (:func:`estimator.synth.dpgan.noise_for_epsilon`); the run is then
  made with that σ, so what is charged is what runs.
* ``ldp-marginals``: one local report per device at local ε (``LocalReportEvent``), which a session
  accounts only under replace-one neighbours (the ledger says so otherwise).
* the non-private baselines (``exact-marginals``, ``gan-nodp``, ``copy``) and the ``all`` comparison have no
  finite ε: refused.
"""

from __future__ import annotations

import math
from typing import Any

from estimator.synth.data import SynthError
from ldp_core.privacy_events import GaussianEvent, LocalReportEvent, PrivacyEvent, sampled_gaussian_event

__all__ = ["BUDGET_KIND", "synth_event", "debit_synth"]

#: the kind of query a synthetic-data run is debited as
BUDGET_KIND = "synth"


def synth_event(
    method: str, epsilon: float, delta: float, records: int, gan_steps: int = 1500, gan_batch: int = 64
) -> tuple[PrivacyEvent, dict[str, Any]]:
    """(the event of a ``method`` run at (``epsilon``, ``delta``) on ``records`` rows, the settings it fixes:
    ``rho`` for mst/aim, ``noise_multiplier`` and ``sample_rate`` for dpgan)."""
    if method in ("mst", "aim"):
        from estimator.synth.zcdp import rho_for_epsilon

        rho = rho_for_epsilon(epsilon, delta)
        return GaussianEvent(1.0 / math.sqrt(2.0 * rho)), {"rho": rho, "zcdp_only": True}
    if method == "dpgan":
        from estimator.synth.dpgan import noise_for_epsilon

        if records < 1:
            raise SynthError("the DP-GAN needs at least one record")
        q = min(1.0, gan_batch / records)
        sigma = noise_for_epsilon(epsilon, delta, q, gan_steps)
        return sampled_gaussian_event(sigma, q, gan_steps), {"noise_multiplier": sigma, "sample_rate": q}
    if method == "ldp-marginals":
        return LocalReportEvent(epsilon), {}
    raise SynthError(
        f"--method {method} is not differentially private (or is a comparison of several runs): it has no finite ε "
        "to debit to a budget session"
    )


def debit_synth(
    session: str | None,
    partner: str | None,
    method: str,
    epsilon: float,
    delta: float,
    records: int,
    gan_steps: int = 1500,
    gan_batch: int = 64,
) -> dict[str, Any] | None:
    """Debit the run before it reads the table (None without ``session``); the returned debit carries the
    settings the run must then use (``settings``). Raises
    :class:`~estimator.accounting.ledger.LedgerRefusal` when the ledger refuses."""
    if session is None:
        return None
    from estimator.accounting.ledger import BudgetLedger

    event, settings = synth_event(method, epsilon, delta, records, gan_steps, gan_batch)
    zcdp_only = settings.pop("zcdp_only", False)
    with BudgetLedger(session) as ledger:
        if zcdp_only and ledger.settings["filter"] != "zcdp":
            raise SynthError(
                f"{method} is accounted in zCDP only: debit it to a session with the zcdp filter, not "
                f"{ledger.settings['filter']!r}"
            )
        if partner is None:
            raise SynthError("a budget session needs the partner the run is debited to (--partner)")
        label = f"synth {method}: ε = {epsilon:g}, δ = {delta:g}, {records} records"
        debit = ledger.debit(partner, BUDGET_KIND, event, label)
    return debit | {"settings": settings}
