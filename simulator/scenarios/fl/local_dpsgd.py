"""DP-SGD on the devices of the drift scenario: accuracy against sample-level ε, under client-level DP.

The drift scenario's label-skewed, feature-shifted partition (:mod:`simulator.scenarios.fl.drift`: 50
clients, 10 per round on a schedule drawn once, softmax regression) with DP-FedAvg on
(:class:`~estimator.fl.dp.FixedClippingDP`: each update clipped to C, N(0, (zC)²) on the sum), and the
devices' local training replaced by DP-SGD (task option ``local_dp_sgd``,
:mod:`ldp_core.fl.local_dpsgd`): Poisson batches at rate q over the device's examples, per-example
clip c, noise multiplier σ, E·round(1/q) steps per round. One run per σ, and one reference run with plain
local SGD of the same step size (no sample-level DP), and one with the DP-SGD runs' Poisson batches,
per-example clipping and step count but no noise (what the noise costs, apart from the fewer clipped
steps); every run has the same data, schedule and seed.

Per run: test accuracy per round, the sample-level ε at δ of a device that took part in every round
(the worst case the job states; PLD, one example replaced since a device's example count is public; the
add/remove figures by PLD and RDP beside it), the largest and the median ε over the devices of
this run (each device's own ledger: the rounds the schedule gave it), and the client-level ε (the same for
every run: DP-FedAvg's noise does not change).

The two figures protect different things: the client-level ε a whole device's data against whoever sees
the released models (not the server, which sees each update in the clear); the sample-level ε one example
of a device against anyone who sees that device's updates, the server included.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from estimator.accounting.accountant import account
from estimator.fl.aggregators import ValidatingAggregator, WeightedMean
from estimator.fl.dp import ClientLevelAccountant, FixedClippingDP
from estimator.fl.sampling import FixedCountSampling
from estimator.fl.strategies import FedAvg
from ldp_core.fl.dpsgd import DPSGDConfig
from ldp_core.fl.errors import FLError
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec
from ldp_core.fl.models import SoftmaxRegression
from simulator.plots import finish_axes, save_figure
from simulator.rounds import FederatedClient, RoundRecord, run_rounds
from simulator.scenarios.fl.drift import DATA_NOTE, DriftConfig, ScheduledSampling, make_drift_data

__all__ = ["LocalDPSGDConfig", "run_local_dpsgd", "plot_local_dpsgd", "report_lines"]


@dataclasses.dataclass(frozen=True)
class LocalDPSGDConfig:
    """The devices' DP-SGD (σ per run in ``noise_multipliers``, clip c, rate q, epochs E per round) and the
    job's client-level DP (clip C, noise multiplier z), δ for both."""

    noise_multipliers: tuple[float, ...] = (0.8, 1.5, 3.0)
    clip: float = 1.0
    sample_rate: float = 0.1
    epochs: int = 2
    client_clip_norm: float = 2.0
    client_noise_multiplier: float = 3.0
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if not self.noise_multipliers:
            raise FLError("noise_multipliers must not be empty")
        for z in self.noise_multipliers:
            LocalDPSGDSpec(z, self.clip, self.sample_rate, epochs=self.epochs)  # each option's own checks
        for name in ("client_clip_norm", "client_noise_multiplier"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise FLError(f"LocalDPSGDConfig.{name} must be a finite number > 0, got {v!r}")
        if not 0 < self.delta < 1:
            raise FLError(f"delta must be in (0, 1), got {self.delta!r}")


@dataclasses.dataclass(frozen=True)
class _ClippedNoNoise:
    """The reference run's local training: the same Poisson batches, per-example clip and step count as the
    DP-SGD runs, without noise (no sample-level DP; a task cannot ask for it, σ = 0 is refused there). It
    separates what the noise costs from what the fewer, clipped steps cost."""

    clip: float
    sample_rate: float
    epochs: int

    @property
    def steps_per_round(self) -> int:
        return int(self.epochs) * max(1, round(1.0 / float(self.sample_rate)))

    def dpsgd_config(self, learning_rate: float) -> DPSGDConfig:
        return DPSGDConfig(0.0, float(self.clip), float(self.sample_rate), learning_rate)


def _sample_eps(
    spec: LocalDPSGDSpec, rounds: int, delta: float, cache: dict[int, tuple[float, float]]
) -> tuple[float, float]:
    if rounds == 0:
        return 0.0, 0.0
    if rounds not in cache:
        rep = account(spec.event(rounds), delta, "replace")  # N public: one example replaced (PLD)
        assert rep.epsilon_pld is not None
        cache[rounds] = (float(rep.epsilon_pld), math.nan)
    return cache[rounds]


def _train(
    cfg: DriftConfig,
    dp: LocalDPSGDConfig,
    clients: list[FederatedClient],
    schedule: ScheduledSampling,
    test: tuple[np.ndarray, np.ndarray],
    spec: LocalDPSGDSpec | _ClippedNoNoise | None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> list[float]:
    model = SoftmaxRegression(cfg.features, cfg.classes)
    fresh = [FederatedClient(c.client_id, c.X, c.y) for c in clients]
    agg = ValidatingAggregator(FixedClippingDP(WeightedMean(), dp.client_clip_norm, dp.client_noise_multiplier))
    strategy = FedAvg(cfg.training, local_dp_sgd=spec)
    _, hist = run_rounds(
        model,
        strategy,
        agg,
        fresh,
        ScheduledSampling(schedule.schedule),
        cfg.rounds,
        np.random.default_rng([cfg.seed, 2]),
        test=test,
        on_round=on_round,
    )
    return [float(h.test_accuracy) for h in hist]  # type: ignore[arg-type]


def _summary(name: str, acc: Sequence[float]) -> dict[str, Any]:
    tail = list(acc[-min(10, len(acc)) :])
    return {
        "name": name,
        "accuracy_per_round": list(acc),
        "final_accuracy": acc[-1],
        "mean_accuracy_last_10": float(np.mean(tail)),
    }


def run_local_dpsgd(
    cfg: DriftConfig | None = None,
    dp: LocalDPSGDConfig | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """One run per σ in ``dp.noise_multipliers`` and the plain-SGD reference (see the module docstring);
    defaults: ``DriftConfig()`` and ``LocalDPSGDConfig()``. ``on_round`` is called after every round of every
    run, ``(2 + len(dp.noise_multipliers)) * cfg.rounds`` times (progress display; draws nothing)."""
    cfg = DriftConfig() if cfg is None else cfg
    dp = LocalDPSGDConfig() if dp is None else dp
    skewed, _, test = make_drift_data(cfg, np.random.default_rng([cfg.seed, 0]))
    n, m = cfg.clients, cfg.clients_per_round
    schedule = ScheduledSampling.draw(n, m, cfg.rounds, np.random.default_rng([cfg.seed, 1]))
    joined = np.bincount(np.concatenate([np.asarray(r) for r in schedule.schedule]), minlength=n)
    client_acc = ClientLevelAccountant(FixedCountSampling(m), n, dp.delta)
    for _ in range(cfg.rounds):
        client_acc.record(float(dp.client_noise_multiplier))
    client_level = {
        "clip_norm": dp.client_clip_norm,
        "noise_multiplier": dp.client_noise_multiplier,
        "epsilon_known_sample": client_acc.epsilon_known_sample(),
        "epsilon_observers": client_acc.epsilon(),
        "delta": dp.delta,
        "protects": "a whole device's data, against whoever sees the released models (not the server)",
        "neighbors": "replace one device's data (fixed-count sampling)",
    }
    runs: list[dict[str, Any]] = [
        {
            **_summary("plain_local_sgd", _train(cfg, dp, skewed, schedule, test, None, on_round)),
            "noise_multiplier": None,
            "epsilon_worst_case": None,
        },
        {
            **_summary(
                "clipped_poisson_sgd_no_noise",
                _train(cfg, dp, skewed, schedule, test, _ClippedNoNoise(dp.clip, dp.sample_rate, dp.epochs), on_round),
            ),
            "noise_multiplier": 0.0,
            "epsilon_worst_case": None,
        },
    ]
    for z in dp.noise_multipliers:
        spec = LocalDPSGDSpec(float(z), float(dp.clip), float(dp.sample_rate), epochs=int(dp.epochs))
        cache: dict[int, tuple[float, float]] = {}
        worst, _ = _sample_eps(spec, cfg.rounds, dp.delta, cache)
        add_remove = account(spec.event(cfg.rounds), dp.delta)
        # each device's own ledger is the rounds the schedule gave it; ε grows with rounds, so the busiest
        # device has the largest and the median of the ε is that of the middle round counts
        srt = np.sort(joined)
        mid = [int(srt[(n - 1) // 2]), int(srt[n // 2])]
        eps_mid = float(np.mean([_sample_eps(spec, k, dp.delta, cache)[0] for k in mid]))
        eps_max = _sample_eps(spec, int(srt[-1]), dp.delta, cache)[0]
        acc = _train(cfg, dp, skewed, schedule, test, spec, on_round)
        runs.append(
            {
                **_summary(f"local_dp_sgd_sigma{z:g}", acc),
                "noise_multiplier": float(z),
                "epsilon_worst_case": worst,
                "epsilon_worst_case_add_remove": add_remove.epsilon_pld,
                "epsilon_worst_case_add_remove_rdp": add_remove.epsilon_rdp,
                "epsilon_per_round": _sample_eps(spec, 1, dp.delta, cache)[0],
                "epsilon_max_device": eps_max,
                "epsilon_median_device": eps_mid,
            }
        )
    return {
        "scenario": "local-dpsgd",
        "data": DATA_NOTE,
        "seed": cfg.seed,
        "rounds": cfg.rounds,
        "clients": n,
        "clients_per_round": m,
        "model": f"softmax regression, {cfg.features} features, {cfg.classes} classes",
        "train_examples_per_client": {
            "min": int(min(len(c.y) for c in skewed)),
            "max": int(max(len(c.y) for c in skewed)),
        },
        "rounds_joined": {"min": int(joined.min()), "median": float(np.median(joined)), "max": int(joined.max())},
        "local_dp_sgd": {
            "clip": dp.clip,
            "sample_rate": dp.sample_rate,
            "epochs": dp.epochs,
            "steps_per_round": LocalDPSGDSpec(1.0, dp.clip, dp.sample_rate, epochs=dp.epochs).steps_per_round,
            "learning_rate": cfg.training.learning_rate,
            "delta": dp.delta,
            "protects": "one example of one device, against anyone who sees that device's updates (the server too)",
        },
        "plain_local_sgd": {
            "epochs": cfg.training.epochs,
            "batch_size": cfg.training.batch_size,
            "learning_rate": cfg.training.learning_rate,
        },
        "client_level": client_level,
        "runs": runs,
    }


def plot_local_dpsgd(result: dict[str, Any], path: str) -> None:
    """Final test accuracy (and mean of the last 10 rounds) against the worst-case sample-level ε, one point
    per σ; plain local SGD (no sample-level DP) as a dashed line (matplotlib, server extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in result["runs"] if r["noise_multiplier"]]
    ref = next(r for r in result["runs"] if r["noise_multiplier"] is None)
    clipped = next(r for r in result["runs"] if r["noise_multiplier"] == 0.0)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = [r["epsilon_worst_case"] for r in runs]
    ax.plot(xs, [r["final_accuracy"] for r in runs], "o-", label="final accuracy")
    ax.plot(xs, [r["mean_accuracy_last_10"] for r in runs], "s--", alpha=0.7, label="mean of last 10 rounds")
    ax.plot(
        [r["epsilon_max_device"] for r in runs],
        [r["final_accuracy"] for r in runs],
        "x",
        color="grey",
        label="(at the ε of this run's busiest device)",
    )
    for r in runs:
        ax.annotate(
            f"σ={r['noise_multiplier']:g}",
            (r["epsilon_worst_case"], r["final_accuracy"]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    ax.axhline(ref["final_accuracy"], color="tab:red", ls=":", label="plain local SGD (no sample-level DP)")
    ax.axhline(clipped["final_accuracy"], color="tab:green", ls="-.", label="same DP-SGD steps, no noise")
    ax.set_xscale("log")
    cl = result["client_level"]
    finish_axes(
        ax,
        f"sample-level ε (one example replaced, δ = {result['local_dp_sgd']['delta']:g}), a device in every round",
        "test accuracy",
        f"drift, {result['rounds']} rounds, DP-FedAvg C = {cl['clip_norm']:g}, z = {cl['noise_multiplier']:g} "
        f"(client-level ε {cl['epsilon_known_sample']:.1f} / {cl['epsilon_observers']:.1f})",
    )
    save_figure(fig, path)


def report_lines(result: dict[str, Any]) -> list[str]:
    """The table ``ldp study local-dpsgd`` prints for :func:`run_local_dpsgd`'s ``result``: what the
    client-level and the sample-level DP protect, and each run's ε and accuracy."""
    cl, ld = result["client_level"], result["local_dp_sgd"]
    lines = [
        f"local-dpsgd: {result['clients']} clients ({result['clients_per_round']} per round), {result['rounds']} "
        f"rounds, {result['model']}; rounds joined per device {result['rounds_joined']['min']}-"
        f"{result['rounds_joined']['max']} (median {result['rounds_joined']['median']:g})",
        f"client-level DP: C = {cl['clip_norm']:g}, z = {cl['noise_multiplier']:g}, ε = "
        f"{cl['epsilon_known_sample']:.2f} (knows the sample) / {cl['epsilon_observers']:.2f} (observers) at "
        f"δ = {cl['delta']:g}, {cl['neighbors']}: {cl['protects']}",
        f"sample-level DP: c = {ld['clip']:g}, q = {ld['sample_rate']:g}, {ld['steps_per_round']} steps per round, "
        f"η = {ld['learning_rate']:g}, δ = {ld['delta']:g}, replace one example: {ld['protects']}",
        f"{'run':<24} {'σ':>5} {'ε/round':>8} {'ε all':>8} {'ε busiest':>10} {'final':>7} {'last 10':>8}",
    ]
    for r in result["runs"]:
        if not r["noise_multiplier"]:
            lines.append(
                f"{r['name']:<24} {'-':>5} {'-':>8} {'-':>8} {'-':>10} {r['final_accuracy']:>7.4f} "
                f"{r['mean_accuracy_last_10']:>8.4f}"
            )
            continue
        lines.append(
            f"{r['name']:<24} {r['noise_multiplier']:>5g} {r['epsilon_per_round']:>8.2f} "
            f"{r['epsilon_worst_case']:>8.2f} {r['epsilon_max_device']:>10.2f} {r['final_accuracy']:>7.4f} "
            f"{r['mean_accuracy_last_10']:>8.4f}"
        )
    return lines
