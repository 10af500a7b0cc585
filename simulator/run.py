"""One simulated collection: true values -> real encoders -> real estimator."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from estimator.oracles import accumulator_for
from estimator.result import Estimate
from ldp_core.mechanisms import frequency_spec, make_spec
from ldp_core.mechanisms.base import MechanismSpec
from simulator.population import Distribution

__all__ = ["SimulationResult", "simulate", "spec_for"]

CHUNK = 1 << 18


def spec_for(mechanism: str, epsilon: float, domain: int, **params: Any) -> MechanismSpec:
    """The spec the simulator uses: the mechanism's defaults (``rr`` has domain 2)."""
    if mechanism == "rr":
        return frequency_spec(make_spec("rr", epsilon=epsilon, **params))
    return frequency_spec(make_spec(mechanism, epsilon=epsilon, domain_size=domain, **params))


@dataclasses.dataclass
class SimulationResult:
    spec: MechanismSpec
    users: int
    seed: int | None
    true_counts: np.ndarray
    estimate: Estimate
    seconds: dict[str, float]

    @property
    def variance(self) -> np.ndarray:
        """Theoretical variance of each count estimate given the true counts."""
        return self.spec.count_variance(self.true_counts)

    def accuracy(self) -> dict[str, float]:
        """How the estimate fared against the truth: its MSE beside the theoretical one (``theory_mse``, the
        mean variance), the 95% intervals' coverage, and the mean and variance of the standardized errors
        (about 0 and 1 when the variance is right)."""
        err = self.estimate.counts - self.true_counts
        var = self.variance
        z = err / np.sqrt(var)
        ci = self.estimate
        return {
            "mse": float(np.mean(err**2)),
            "theory_mse": float(var.mean()),
            "ci_coverage": float(np.mean((ci.ci_low <= self.true_counts) & (self.true_counts <= ci.ci_high))),
            "z_mean": float(z.mean()),
            "z_variance": float(z.var()),
        }

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "mechanism": self.spec.name,
            "epsilon": self.spec.epsilon,
            "domain": self.spec.domain_size,
            "users": self.users,
            "seed": self.seed,
            "true": [int(c) for c in self.true_counts],
            "estimate": [float(c) for c in self.estimate.counts],
            "variance": [float(v) for v in self.variance],
            "seconds": dict(self.seconds),
            "spec": self.spec.to_dict(),
            "spec_id": self.spec.spec_id,
            "ci_low": [float(c) for c in self.estimate.ci_low],
            "ci_high": [float(c) for c in self.estimate.ci_high],
            "could_be_noise": [bool(z) for z in self.estimate.noise()[1]],
        }


def simulate(
    spec: MechanismSpec,
    users: int,
    distribution: Distribution,
    rng: np.random.Generator,
    seed: int | None = None,
    progress: Any = None,
) -> SimulationResult:
    """Draw ``users`` true values, privatize them with ``spec``'s batch encoder and
    estimate their counts with the matching accumulator. ``progress`` is an
    optional callable taking the number of users just processed."""
    if users < 1:
        raise ValueError(f"users must be at least 1, got {users}")
    acc = accumulator_for(spec)
    true_counts = np.zeros(spec.domain_size, dtype=np.int64)
    t_enc = t_agg = 0.0
    done = 0
    while done < users:
        m = min(CHUNK, users - done)
        values = distribution.sample(m, rng)
        true_counts += np.bincount(values, minlength=spec.domain_size)
        t0 = time.perf_counter()
        reports = spec.encode(values, rng)
        t1 = time.perf_counter()
        acc.update(reports)
        t2 = time.perf_counter()
        t_enc += t1 - t0
        t_agg += t2 - t1
        done += m
        if progress is not None:
            progress(m)
    t0 = time.perf_counter()
    est = acc.estimate()
    t_est = time.perf_counter() - t0
    return SimulationResult(
        spec, users, seed, true_counts, est, {"encode": t_enc, "aggregate": t_agg, "estimate": t_est}
    )
