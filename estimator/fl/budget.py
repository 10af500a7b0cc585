"""What a federated task's job debits to a shared budget session (``ldp fl job --budget-session``).

The whole plan, once, before round 1. The job debits the client-level event of *every* round it plans (and,
with ``--select``, every candidate's rounds and the choice: :mod:`estimator.selection.fl_job`) to the
partner's share before it opens a round, under the reference ``fl-job:<task id>``
(:meth:`~estimator.accounting.ledger.BudgetLedger.debit`'s ``ref``). A resumed job (a restart from its
checkpoints, a re-run of the same command) makes the same debit again: the ledger finds the reference, charges
nothing and logs a ``repeat``. A resumed job whose plan changed (σ, C, rounds, sampling, candidates, ε of the
choice) is **refused** (``changed_plan``), not charged the difference: rounds already released under the old
plan are part of what the guarantee must cover, so "the difference" is not an event of either plan (it
depends on where the first run stopped), and a debit must say what it paid for. A new plan is a new task id.

The relation. The job's printed ε is add/remove-one-client for Poisson sampling and replace-one-client for
fixed-count sampling (:class:`~estimator.fl.dp.ClientLevelAccountant`). What it debits (:func:`task_event`):

* Poisson sampling: SelfComposed(PoissonSampled(q, Gaussian(z)), T), stated add/remove; a replace session
  prices it under replace (group privacy: sensitivity doubled).
* Fixed count, replace session: SelfComposed(Gaussian(z), T), stated replace (a replacement moves the clipped
  sum by up to 2C); amplification by the secret sample is not credited (the session's zCDP filter credits none).
* Fixed count, add/remove session: SelfComposed(Gaussian(z/2), T), stated add/remove. Removing a client from
  the population does not shrink a fixed-count sample: its slot goes to another client. Coupling the samples
  (drop the client; if it was sampled, put a uniformly chosen unsampled client in its place: both sides are
  uniform m-subsets) pairs every output with one whose sum differs by one client's update swapped, at most 2C,
  and the divergences are jointly convex, so each round is dominated by the Gaussian of sensitivity 2C, i.e.
  multiplier z/2 against C. Same price as the replace statement; no factor lost.

Without Gaussian noise on every round (no DP, distributed noise, adaptive clipping, DP-FTRL's tree) a task has
no event here yet and ``--budget-session`` is refused as bad input.
"""

from __future__ import annotations

from typing import Any

from estimator.accounting.accountant import Neighbors
from estimator.fl.sampling import FixedCountSampling, PoissonSampling
from estimator.fl.task import FLTaskSpec
from ldp_core.fl.errors import FLError
from ldp_core.privacy_events import GaussianEvent, PrivacyEvent, SelfComposedEvent, sampled_gaussian_event

__all__ = ["BUDGET_KIND", "task_ref", "task_relation", "task_event", "check_debitable", "planned_epsilon"]

#: the kind of query an FL job's debit is (approve it with ``ldp budget approve FILE --kind fl-job``)
BUDGET_KIND = "fl-job"


def task_ref(spec: FLTaskSpec) -> str:
    """The reference an FL task is debited under: once per task id."""
    return f"fl-job:{spec.task}"


def check_debitable(spec: FLTaskSpec) -> None:
    """Raise :class:`FLError` unless every round of ``spec`` adds central Gaussian noise of multiplier
    ``noise_multiplier`` to clipped updates (the rounds :func:`task_event` describes)."""
    if spec.clip_norm is None or not spec.noise_multiplier > 0:
        raise FLError(f"task {spec.task!r} adds no noise: it has no finite ε and cannot be debited to a budget")
    if spec.aggregator.kind != "fedavg" or spec.noise is not None:
        raise FLError(
            f"task {spec.task!r} ({spec.aggregator.kind}{', distributed noise' if spec.noise is not None else ''}) "
            "cannot be debited yet: only fedavg tasks with central Gaussian noise have a planned event"
        )
    if not isinstance(spec.build_sampling(), (PoissonSampling, FixedCountSampling)):
        raise FLError(f"task {spec.task!r}: no planned event for its sampling")


def task_relation(spec: FLTaskSpec) -> Neighbors:
    """The relation of the job's printed ε: add/remove for Poisson sampling, replace for a fixed count."""
    return "add_or_remove" if isinstance(spec.build_sampling(), PoissonSampling) else "replace"


def task_event(spec: FLTaskSpec, session_neighbors: Neighbors | None = None) -> tuple[PrivacyEvent, Neighbors]:
    """(the event of all ``spec.rounds`` rounds, the relation it is stated under) for a session of
    ``session_neighbors`` (default: the task's own relation); see the module docstring."""
    check_debitable(spec)
    sampling = spec.build_sampling()
    z, rounds = float(spec.noise_multiplier), int(spec.rounds)
    if isinstance(sampling, PoissonSampling):
        return sampled_gaussian_event(z, float(sampling.rate), rounds), "add_or_remove"
    if (session_neighbors or "replace") == "replace":
        return SelfComposedEvent(GaussianEvent(z), rounds), "replace"
    return SelfComposedEvent(GaussianEvent(z / 2.0), rounds), "add_or_remove"


def planned_epsilon(spec: FLTaskSpec) -> dict[str, Any]:
    """The ε the job will print after its last round (against observers of the models), for its relation."""
    acc = spec.build_accountant()
    if acc is None:
        raise FLError(f"task {spec.task!r} has no DP")
    for _ in range(spec.rounds):
        acc.record(spec.noise_multiplier)
    return {"epsilon": acc.epsilon(), "delta": spec.delta, "rounds": spec.rounds, "neighbors": acc.neighbors}
