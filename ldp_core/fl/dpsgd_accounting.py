"""The privacy accounting of DP-SGD, in one place: the ε of its event, by ``dp_accounting``.

T steps of DP-SGD with noise multiplier σ on Poisson batches at rate q are the event
SelfComposed(PoissonSampled(q, Gaussian(σ)), T), built by
:func:`ldp_core.privacy_events.sampled_gaussian_event` for the central job
(:meth:`ldp_core.fl.dpsgd.DPSGDConfig.event`) and for a device's rounds
(:meth:`ldp_core.fl.local_dpsgd.LocalDPSGDSpec.event`). Its ε comes from here, by
``dp_accounting``'s PLD accountant (tight) with its RDP accountant as a second opinion:

* :func:`dpsgd_epsilon` composes the whole event once, under add/remove or replace-one
  neighbours: a device's own sample-level ledger
  (:class:`~ldp_core.fl.local_dpsgd.SampleLevelAccountant`). The server's general accountant
  (:func:`estimator.accounting.accountant.account`, which the task's stated sample-level ε
  uses) composes the same event the same way, so the two figures agree.
* :class:`StepAccountant` builds one step's privacy loss distribution and RDP curve once and
  answers ε after any number of steps (the central ``ldp dpsgd`` job asks after every epoch;
  the torch DP-SGD is accounted the same way).

Importing this module needs only numpy; an ε needs the ``dp-accounting`` package (the
``server`` extra), imported when asked.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ldp_core.fl.errors import FLError, ModelError
from ldp_core.privacy_events import GaussianEvent, PoissonSampledEvent, PrivacyEvent, SelfComposedEvent

if TYPE_CHECKING:
    from ldp_core.fl.dpsgd import DPSGDConfig

__all__ = ["dp_accounting_event", "dpsgd_epsilon", "StepAccountant", "quiet_rdp_warnings"]


class _ConvergenceFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


class quiet_rdp_warnings:
    """Silence ``dp_accounting``'s absl warning for each RDP order whose subsampled-Gaussian series fails
    to converge (q ≥ 0.1 with little noise): the order is dropped and the RDP figure stays a valid bound;
    the server's accountant lists the dropped orders itself."""

    _filter = _ConvergenceFilter()

    def __enter__(self) -> None:
        logging.getLogger("absl").addFilter(self._filter)

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger("absl").removeFilter(self._filter)


def dp_accounting_event(event: PrivacyEvent) -> Any:
    """The ``dp_accounting`` event of a Gaussian / Poisson-sampled / self-composed event (what DP-SGD
    produces; the server's converter for every event is :func:`estimator.accounting.accountant.to_dp_event`)."""
    from dp_accounting import dp_event

    if isinstance(event, GaussianEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier)
    if isinstance(event, PoissonSampledEvent):
        return dp_event.PoissonSampledDpEvent(event.sampling_probability, dp_accounting_event(event.event))
    if isinstance(event, SelfComposedEvent):
        return dp_event.SelfComposedDpEvent(dp_accounting_event(event.event), event.count)
    raise FLError(f"the device accountant handles Gaussian, Poisson-sampled and self-composed events, got {event!r}")


def dpsgd_epsilon(
    event: PrivacyEvent,
    delta: float,
    neighbors: Literal["add_or_remove", "replace"] = "add_or_remove",
    accountant: Literal["pld", "rdp"] = "pld",
) -> float:
    """ε at ``delta`` of a DP-SGD event (the whole composition at once) under ``neighbors`` (one example
    added or removed, or replaced), by ``dp_accounting``'s PLD or RDP accountant. Its RDP accountant has
    no Poisson-sampled replace-one analysis: ask RDP for add/remove. Needs the ``dp-accounting`` package."""
    try:
        import dp_accounting
        from dp_accounting.pld import pld_privacy_accountant
        from dp_accounting.rdp import rdp_privacy_accountant
    except ImportError:
        raise FLError("the device's sample-level ε needs the dp-accounting package (the server extra)") from None
    rel = dp_accounting.NeighboringRelation
    relation = rel.REPLACE_ONE if neighbors == "replace" else rel.ADD_OR_REMOVE_ONE
    if accountant == "pld":
        acc: Any = pld_privacy_accountant.PLDAccountant(neighboring_relation=relation)
    else:
        acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    acc.compose(dp_accounting_event(event))
    return float(acc.get_epsilon(delta))


class StepAccountant:
    """ε after t DP-SGD steps of ``config``, for any t, from one step's privacy computed once.

    The same accountants as :func:`dpsgd_epsilon` (``dp_accounting``'s PLD and RDP, add/remove
    neighbours), but a run asks after every epoch, and building the subsampled-Gaussian PLD or RDP curve
    is the expensive part: here it is built once for one step, and t steps are its t-fold
    self-composition (PLD: ``self_compose``; RDP: t times the curve, since Rényi divergences add under
    composition, Mironov 2017, Prop. 1). The test suite checks the figures equal the server accountant's
    (:func:`estimator.accounting.accountant.account`)."""

    def __init__(self, config: DPSGDConfig) -> None:
        event = config.event(1)
        if event is None:
            raise ModelError("without noise (noise multiplier 0) there is no finite ε to account")
        from dp_accounting.pld import pld_privacy_accountant
        from dp_accounting.rdp import rdp_privacy_accountant

        step = dp_accounting_event(event)
        pld = pld_privacy_accountant.PLDAccountant()
        pld.compose(step)
        self._pld = pld._pld
        rdp = rdp_privacy_accountant.RdpAccountant()
        with quiet_rdp_warnings():
            rdp.compose(step)
        self._orders = np.array(rdp._orders, dtype=np.float64)
        self._curve = np.array(rdp._rdp, dtype=np.float64)

    def epsilon_pld(self, steps: int, delta: float) -> float:
        return float(self._pld.self_compose(steps).get_epsilon_for_delta(delta))

    def epsilon_rdp(self, steps: int, delta: float) -> tuple[float, float]:
        """(ε, optimal order) by the RDP accountant's conversion (``compute_epsilon``)."""
        from dp_accounting.rdp import rdp_privacy_accountant

        eps, order = rdp_privacy_accountant.compute_epsilon(self._orders, steps * self._curve, delta)
        return float(eps), float(order)
