"""Synthetic telemetry: a table built from 2-way marginals that devices report under *local* DP.

The collection (what :mod:`simulator.synth_telemetry` drives through the real SDK, collector and shuffler):
every pair of columns is one metric whose domain is the pair's joint values (``"a|b"``); each device is
assigned one pair uniformly at random, independently of its data, and reports its joint value of that pair
once, through the metric's frequency oracle (OUE or OLH) at the metric's ε. A device's report is then
ε-LDP for its whole record: it reads two of its attributes, once, and the pair it was given reveals nothing.
The 1-way marginals are not reported separately: each is implied by the pairs that contain it, and the fitted
model makes them agree.

The estimation (here): each pair's frequency estimate (unbiased counts with their standard errors, as the
estimator serves them) is scaled from the n_p devices that reported it to the N devices of all pairs, and
fed to ``mbi`` as a noisy measurement with that standard deviation; the model's marginals are one consistent
distribution, and the synthetic table sampled from it reproduces them. Everything after the devices' reports
is post-processing: no further privacy cost.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

from estimator.synth.data import SynthError, Table, marginal
from estimator.synth.mbi_model import Measurement, fit, model_marginal, sample

__all__ = ["PairEstimate", "pairs_of", "pair_metric_name", "metrics_document", "joint_codes", "synthesize"]


@dataclasses.dataclass(frozen=True)
class PairEstimate:
    """One pair's LDP frequency estimate: counts per joint value (row-major), their standard errors, and
    the number of reports behind them."""

    pair: tuple[int, int]
    counts: np.ndarray
    std_error: np.ndarray
    n: int


def pairs_of(table: Table) -> list[tuple[int, int]]:
    return list(itertools.combinations(range(len(table.columns)), 2))


def pair_metric_name(table: Table, pair: tuple[int, int], prefix: str = "synth") -> str:
    return f"{prefix}.{table.columns[pair[0]]}.{table.columns[pair[1]]}"


def joint_labels(table: Table, pair: tuple[int, int]) -> list[str]:
    a, b = pair
    return [f"{x}|{y}" for x in table.labels[a] for y in table.labels[b]]


def joint_codes(table: Table, pair: tuple[int, int]) -> np.ndarray:
    """Each row's index in the pair's joint domain (row-major: a·|B| + b)."""
    a, b = pair
    return table.codes[:, a] * table.shape[b] + table.codes[:, b]


def metrics_document(
    table: Table, epsilon: float, mechanism: str = "oue", prefix: str = "synth", expires: str = "2030-12-31"
) -> dict[str, Any]:
    """The metrics file (``ldp-metrics/1``) of the collection: one metric per pair of columns."""
    if mechanism not in ("oue", "olh"):
        raise SynthError(f"the marginal collection uses oue or olh, got {mechanism!r}")
    if not epsilon > 0:
        raise SynthError(f"epsilon must be > 0, got {epsilon!r}")
    metrics = {}
    for p in pairs_of(table):
        metrics[pair_metric_name(table, p, prefix)] = {
            "description": f"the joint value of {table.columns[p[0]]} and {table.columns[p[1]]} (one assigned pair per device)",
            "owner": "synthetic-telemetry@example.org",
            "expires": expires,
            "mechanism": {"mechanism": mechanism, "epsilon": float(epsilon)},
            "domain": {"kind": "dictionary", "values": joint_labels(table, p)},
            "max_reports_per_day": 1,
        }
    return {"format": "ldp-metrics/1", "metrics": metrics}


def measurements(table: Table, estimates: list[PairEstimate]) -> tuple[list[Measurement], float]:
    """The estimates as ``mbi`` measurements on one scale (all N reports) and N."""
    total = float(sum(e.n for e in estimates))
    out = []
    for e in estimates:
        if e.n <= 0:
            continue
        if not (np.all(np.isfinite(e.counts)) and np.all(np.isfinite(e.std_error))):
            raise SynthError(f"the estimate of pair {e.pair} has non-finite counts or standard errors")
        scale = total / e.n
        # per cell: the oracle's variance, and the assignment's (the n_p reporters are a uniform random n_p
        # of the N devices: hypergeometric), both on the scale of N; their mean makes the one std mbi takes
        f = np.clip(np.asarray(e.counts) / e.n, 0.0, 1.0)
        sampling = total**2 * f * (1 - f) * (total - e.n) / (e.n * max(total - 1.0, 1.0))
        sd = float(np.sqrt(np.mean(np.square(e.std_error) * scale**2 + sampling)))
        out.append(
            Measurement(
                (table.columns[e.pair[0]], table.columns[e.pair[1]]), np.asarray(e.counts) * scale, max(sd, 1e-9)
            )
        )
    if not out:
        raise SynthError("no pair has any report")
    return out, total


def synthesize(
    table: Table, estimates: list[PairEstimate], rng: np.random.Generator, *, rows: int | None = None, iters: int = 1000
) -> tuple[Table, dict[str, Any]]:
    """The synthetic table and how its marginals agree with the LDP estimates: per pair, the largest
    |synthetic − estimate| and |model − estimate| in units of the estimate's standard error (scaled to the
    synthetic table's size)."""
    ms, total = measurements(table, estimates)
    pad = [(c,) for c in table.columns] + [(table.columns[a], table.columns[b]) for a, b in pairs_of(table)]
    model = fit(table, ms, iters=iters, total=total, pad=pad)
    m = int(rows or round(total))
    syn = sample(model, table, m, rng)
    report = []
    for meas in ms:
        pair = (table.columns.index(meas.clique[0]), table.columns.index(meas.clique[1]))
        k = m / total
        est, sd = meas.y * k, meas.stddev * k
        report.append(
            {
                "pair": list(meas.clique),
                "max_abs_z_synthetic": float(np.max(np.abs(marginal(syn, pair) - est)) / sd),
                "max_abs_z_model": float(np.max(np.abs(model_marginal(model, meas.clique) * k - est)) / sd),
                "std_error": sd,
            }
        )
    return syn, {"reports": int(total), "pairs": report}
