"""Federated teachers over the FL pipeline: a PATE task's job answers the vote histograms SecAgg unmasked.

A PATE task (the task file's ``pate`` object, :mod:`ldp_core.fl.pate`) runs as any SecAgg task: ``ldp fl job``
publishes the round, teacher devices (``ldp fl device`` with ``--queries``, or :class:`client_sdk.fl.device.
FLDevice` with ``pate_queries``) upload their one-hot vote vectors masked through the collector over HTTP, and
the job unmasks only their sum (:func:`estimator.fl.release.close_pate`). :class:`PateVoteRelease` is what the job
then does with those histograms: GNMax or Confident-GNMax with the server's noise, or (``noise:
distributed``) the argmax of histograms already noised by the teachers, and the ε the release costs. The job's
history record of the round holds the labels (⊥ = -1), how many were answered and the ε; the histograms are
never published.

The noise generator: with the task's ``seed`` (simulations and tests), :func:`pate_noise_rng` (seed, round);
otherwise the OS CSPRNG. :func:`in_process_release` is the same release on histograms summed in one process,
which the tests compare with the HTTP run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from estimator.fl.task import FLTaskSpec
from estimator.pate.accounting import data_independent, release_data_dependent
from estimator.pate.aggregators import confident_gnmax, gnmax
from estimator.pate.federated import distributed_gnmax_epsilon
from ldp_core.fl.pate import PateTaskSpec
from ldp_core.randomness import secure_generator

__all__ = ["PateVoteRelease", "pate_noise_rng", "in_process_release", "PATE_STREAM"]

#: the stream tag of a seeded PATE job's noise generator (kept apart from the job's sampling/graph generator)
PATE_STREAM = 0x5A7E


def pate_noise_rng(seed: int | None, round: int) -> np.random.Generator:
    """The generator of round ``round``'s aggregator noise: seeded ``[seed, PATE_STREAM, round]`` for a
    simulation, the OS CSPRNG when ``seed`` is None (an observer must not predict the noise)."""
    return secure_generator() if seed is None else np.random.default_rng([seed, PATE_STREAM, round])


def in_process_release(
    pate: PateTaskSpec,
    histograms: np.ndarray,
    teachers: int,
    delta: float,
    rng: np.random.Generator,
    honest: int | None = None,
) -> dict[str, Any]:
    """Answer ``histograms`` (queries × classes; for ``noise: distributed`` already noised) as the task says and
    account for it at ``delta``: ``labels`` (-1 = ⊥), ``answered``, ``epsilon`` (data-independent, what the task
    charges), and with the server's noise ``epsilon_data_dependent_published`` (smooth sensitivity, with
    ``rng``; the raw data-dependent figure depends on the votes and is not published)."""
    h = np.asarray(histograms, dtype=np.int64)
    q, k = h.shape
    out: dict[str, Any] = {"aggregator": pate.aggregator, "noise": pate.noise, "queries": q, "teachers": teachers}
    out["delta"] = delta
    if pate.noise == "distributed":
        labels = np.argmax(h, axis=1)
        out["labels"] = labels.tolist()
        out["answered"] = q
        eps = distributed_gnmax_epsilon(pate.sigma, teachers, q, delta, k, honest)
        out["noise_shares"] = teachers if honest is None else honest
        out["epsilon"] = eps["epsilon"]
        out["protects"] = "as epsilon, against the server too: it unmasked only noised histograms"
        return out
    if pate.aggregator == "gnmax":
        labels = gnmax(h, pate.sigma, rng)
        answered = np.ones(q, dtype=bool)
        eps = data_independent(pate.sigma, q, delta)["epsilon"]
        published = release_data_dependent(h, pate.sigma, delta, rng)
    else:
        assert pate.threshold is not None and pate.sigma1 is not None
        ans = confident_gnmax(h, pate.threshold, pate.sigma1, pate.sigma, rng)
        labels, answered = ans.labels, ans.answered
        eps = data_independent(pate.sigma, ans.count, delta, queries=q, sigma1=pate.sigma1)["epsilon"]
        published = release_data_dependent(
            h, pate.sigma, delta, rng, answered=answered, threshold=pate.threshold, sigma1=pate.sigma1
        )
    out["labels"] = np.asarray(labels, np.int64).tolist()
    out["answered"] = int(np.sum(answered))
    out["epsilon"] = float(eps)
    out["epsilon_data_dependent_published"] = float(published.epsilon)
    out["protects"] = "as epsilon, against whoever sees the labels; not against the job's operator (exact sums)"
    return out


class PateVoteRelease:
    """The job's answer to a PATE task's unmasked histograms (:data:`estimator.fl.release.VoteRelease`)."""

    def __init__(self, spec: FLTaskSpec) -> None:
        if spec.pate is None:
            raise ValueError("not a pate task")
        self.spec = spec
        self.pate = PateTaskSpec.from_dict(spec.pate)

    def __call__(self, histograms: np.ndarray, survivors: int, round: int) -> dict[str, Any]:
        rng = pate_noise_rng(self.spec.seed, round)
        n = len(self.spec.clients)  # each device's noise share is σ/√n (the signed client set)
        return in_process_release(self.pate, histograms, n, float(self.spec.delta), rng, honest=survivors)
