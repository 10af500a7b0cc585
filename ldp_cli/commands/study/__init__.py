"""``ldp study``: research scenarios that study federated learning on seeded synthetic data.

* ``clinics``: 20 synthetic clinics, logistic regression, FedAvg without DP and
  with clipping 0.5 and noise multipliers 0 / 0.5 / 2.0; test accuracy, the
  client-level ε each setting gives and the noise needed for ε = 1, 3, 8
  (``--json``: one object, see :func:`simulator.scenarios.fl.clinics.run_clinics`).
* ``drift``: FedAvg, FedProx and SCAFFOLD on a label-skewed, feature-shifted
  partition, test accuracy per round (:func:`simulator.scenarios.fl.drift.run_drift`).
* ``personalize``: Ditto, Per-FedAvg and MOON against FedAvg and SCAFFOLD on the drift
  partition, each client scored on its own test data: median and worst decile
  (:func:`simulator.scenarios.fl.personalize.run_personalize`).
* ``local-dpsgd``: the drift partition under DP-FedAvg with DP-SGD on the devices, one run per
  local noise multiplier: test accuracy against the devices' sample-level ε
  (:func:`simulator.scenarios.fl.local_dpsgd.run_local_dpsgd`).
* ``attack``: membership inference by loss threshold with and without client-level
  DP (advantage, interval, DP bounds) and gradient inversion of one client's update
  in the clear, under central DP and under secure aggregation
  (:func:`simulator.scenarios.fl.attacks.run_attacks`); ``--poisoning``: model poisoning
  against robust aggregators (:func:`simulator.scenarios.fl.poisoning.run_fl_poisoning`).
* ``compress``: compressed uplink updates (quantization, rotation, count sketch, top-k with error
  feedback) against the float32 update on the drift partition at equal ε: uplink bytes per device,
  final accuracy, ε (:func:`simulator.scenarios.fl.compress.run_compress`).

Each scenario's runner, table (``report_lines``) and plot live in :mod:`simulator.scenarios.fl`; the
modules of this package hold their options and wiring (:mod:`~ldp_cli.commands.study.clinics`,
:mod:`~ldp_cli.commands.study.drift`, :mod:`~ldp_cli.commands.study.attack`). ``ldp fl <scenario>`` is the
older spelling of each, with the same options, output and ``--json`` keys: :func:`add_scenarios` registers
both.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from ldp_cli.commands.study.attack import register_attack
from ldp_cli.commands.study.clinics import register_clinics
from ldp_cli.commands.study.drift import register_compress, register_drift, register_local_dpsgd, register_personalize

__all__ = ["register", "add_scenarios", "SCENARIOS"]

_REGISTER: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "clinics": register_clinics,
    "drift": register_drift,
    "compress": register_compress,
    "personalize": register_personalize,
    "attack": register_attack,
    "local-dpsgd": register_local_dpsgd,
}
#: the scenarios, in the order ``ldp study --help`` lists them
SCENARIOS = tuple(_REGISTER)


def add_scenarios(ssub: argparse._SubParsersAction, names: Sequence[str] = SCENARIOS) -> None:
    """Register the scenarios ``names`` (their options and runners) under ``ssub``, whose ``dest`` must be
    ``scenario``: ``ldp study``'s sub-commands, and the same ones under ``ldp fl``."""
    for name in names:
        _REGISTER[name](ssub)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "study",
        help="research scenarios: federated learning with client-level DP on seeded synthetic data",
        description="Federated-learning scenarios that reproduce published set-ups on seeded synthetic data "
        "(also spelled ldp fl <scenario>).",
    )
    add_scenarios(p.add_subparsers(dest="scenario", required=True))
