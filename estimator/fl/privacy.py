"""The job's ε figures beside its own ε: per adversary (client level) and the devices' sample level.

Both are functions of the task's public parameters (sampling, population, δ, σ, ``local_dp_sgd``) and of
how many rounds were released, never of the realized sample, so the public stats every collector serves
may carry them (:func:`estimator.fl.status.public_stats`). Both are cached per number of rounds: the status
is written every 0.1 s, and PLD accounting is not free.
"""

from __future__ import annotations

from typing import Any

from estimator.fl.aggregator_specs import FLAccountant
from estimator.fl.checkpoint import JobState
from estimator.fl.checkpoint import json_float as _f
from estimator.fl.ddg_accounting import DDGAccountant, ddg_epsilon_by_adversary
from estimator.fl.dp import FLTRUST_OPERATOR_SEES, epsilon_by_adversary
from estimator.fl.task import FLTaskSpec

__all__ = ["PrivacyFigures", "ddg_accountant"]


def ddg_accountant(spec: FLTaskSpec, payload_size: int, rounds: int) -> DDGAccountant:
    """The distributed-DG accountant after ``rounds`` released rounds (every round has the same public spec)."""
    noise = spec.noise
    assert noise is not None
    acc = DDGAccountant(spec.delta)
    ddg = noise.build(spec, payload_size)
    for _ in range(rounds):
        acc.record(ddg, noise.shares(spec))
    return acc


class PrivacyFigures:
    """The ε figures of one task's job, each computed once per number of rounds it covers."""

    def __init__(self, spec: FLTaskSpec, payload_size: int) -> None:
        self.spec = spec
        self.payload_size = payload_size
        self._by_adversary: tuple[int, list[dict[str, Any]]] | None = None  # (rounds accounted, figures)
        self._sample_level: tuple[int, dict[str, Any]] | None = None  # (rounds released, figures)
        self._sample_figures: dict[int, dict[str, Any]] = {}

    def by_adversary(self, accountant: FLAccountant | None, st: JobState) -> list[dict[str, Any]] | None:
        """ε against each adversary (:func:`estimator.fl.dp.epsilon_by_adversary`; with distributed noise
        :func:`estimator.fl.ddg_accounting.ddg_epsilon_by_adversary`) after the rounds ``accountant`` has
        recorded; None without DP. The observer's figure is the state's ε when it covers the same rounds.
        Each figure carries its neighbouring relation: ``neighbors`` (``add_or_remove`` for Poisson sampling
        and DP-FTRL, ``replace`` for fixed-count sampling and distributed noise) of one ``client``."""
        acc = accountant
        if acc is None:
            return None
        if self._by_adversary is None or self._by_adversary[0] != acc.rounds:
            spec = self.spec
            fresh = acc.rounds and st.epsilon is not None and len(st.noise_history) == acc.rounds
            observer = st.epsilon if fresh else None
            neighbors = acc.neighbors
            if spec.noise is not None:  # distributed noise: the server operator gets a figure too
                figures = ddg_epsilon_by_adversary(
                    ddg_accountant(spec, self.payload_size, acc.rounds),
                    spec.secagg_threshold,
                    spec.noise.honest_shares(spec),
                    float(spec.noise.assumed_honest_fraction),
                )
                neighbors = "replace"  # the distributed-DG accountant's relation (ddg_accounting.py)
            else:
                sees = FLTRUST_OPERATOR_SEES if spec.aggregator.kind == "fltrust" else None  # DP-FLTrust
                figures = epsilon_by_adversary(acc, secagg=bool(spec.secagg), observer=observer, operator_sees=sees)
            for a in figures:
                a["epsilon"] = _f(a["epsilon"])
                a.setdefault("neighbors", neighbors)  # every ε names its relation (issue 28)
                a.setdefault("neighbors_unit", "client")
            self._by_adversary = (acc.rounds, figures)
        return [dict(a) for a in self._by_adversary[1]]

    def sample_level(self, done: int) -> dict[str, Any] | None:
        """The devices' sample-level ε (task option ``local_dp_sgd``; None without it) after ``done`` released
        rounds: per round, so far (a device may have joined every released round) and for the whole task
        (every round), all worst cases over devices from public task parameters only."""
        spec = self.spec
        if spec.local_dp_sgd is None:
            return None
        if self._sample_level is None or self._sample_level[0] != done:
            task = self._figure(spec.rounds, add_remove=True)
            per_round, so_far = self._figure(1), self._figure(done)
            self._sample_level = (
                done,
                {
                    "epsilon": _f(so_far["epsilon"]),
                    "neighbors": "replace one example (a device's example count is public)",
                    "rounds": done,
                    "epsilon_per_round": _f(per_round["epsilon"]),
                    "epsilon_task": _f(task["epsilon"]),
                    "epsilon_task_add_remove": _f(task["epsilon_add_remove"]),
                    "epsilon_task_add_remove_rdp": _f(task["epsilon_add_remove_rdp"]),
                    "task_rounds": spec.rounds,
                    "delta": spec.delta,
                    "local_dp_sgd": dict(spec.local_dp_sgd or {}),
                    "worst_case": "a device that took part in every round",
                    "protects": "one training example of one device, against anyone who sees that device's "
                    "update, the server included; the client-level epsilon protects a whole device's data "
                    "against those who see the models",
                },
            )
        return dict(self._sample_level[1])

    def _figure(self, rounds: int, add_remove: bool = False) -> dict[str, Any]:
        """:meth:`FLTaskSpec.sample_level_privacy` for ``rounds``, computed once per count (PLD takes ~1 s);
        the add/remove figures only when asked (the task's total)."""
        have = self._sample_figures.get(rounds)
        if have is None or (add_remove and "epsilon_add_remove" not in have):
            fig = self.spec.sample_level_privacy(rounds, add_remove=add_remove)
            assert fig is not None
            self._sample_figures[rounds] = fig
        return self._sample_figures[rounds]
