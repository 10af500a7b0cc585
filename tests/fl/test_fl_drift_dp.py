"""The drift scenario with client-level DP: DP-FedAvg and DP-FTRL at equal ε (run_drift_dp)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from estimator.fl.dp import ClientLevelAccountant
from estimator.fl.ftrl import ftrl_epsilon
from estimator.fl.sampling import FixedCountSampling
from ldp_cli.main import main
from ldp_core.fl.errors import FLError
from ldp_core.fl.training import LocalTraining
from simulator.scenarios.fl.drift import DriftConfig, DriftDPConfig, epoch_schedule, run_drift_dp

SMALL = DriftConfig(
    clients=12,
    clients_per_round=4,
    features=6,
    classes=4,
    mean_examples=30,
    rounds=7,
    training=LocalTraining(epochs=2, batch_size=10, learning_rate=0.2),
)


def test_epoch_schedule_has_each_client_at_most_once_per_tree() -> None:
    sched = epoch_schedule(12, 4, 10, np.random.default_rng(1))
    assert len(sched.schedule) == 10 and all(len(r) == 4 for r in sched.schedule)
    for start in range(0, 10, 3):  # epochs of 12 // 4 = 3 rounds
        members = [c for r in sched.schedule[start : start + 3] for c in r]
        assert len(members) == len(set(members))
    with pytest.raises(FLError, match="exceeds"):
        epoch_schedule(3, 4, 2, np.random.default_rng(0))


def test_dp_ftrl_runs_at_dp_fedavg_epsilons() -> None:
    dp = DriftDPConfig(clip_norm=1.0, noise_multiplier=2.0)
    out = run_drift_dp(SMALL, dp)
    runs = {r["name"]: r for r in out["runs"]}
    assert list(runs) == [
        "dp_fedavg",
        "dp_ftrl_at_known_sample_epsilon",
        "dp_ftrl_at_observer_epsilon",
        "dp_ftrl_honaker_at_known_sample_epsilon",
    ]
    fedavg = runs["dp_fedavg"]
    acc = ClientLevelAccountant(FixedCountSampling(4), 12, 1e-5)
    for _ in range(7):
        acc.record(2.0)
    assert fedavg["epsilon_known_sample"] == acc.epsilon_known_sample()
    assert fedavg["epsilon_observers"] == acc.epsilon() < fedavg["epsilon_known_sample"]
    for name, key in [
        ("dp_ftrl_at_known_sample_epsilon", "epsilon_known_sample"),
        ("dp_ftrl_at_observer_epsilon", "epsilon_observers"),
        ("dp_ftrl_honaker_at_known_sample_epsilon", "epsilon_known_sample"),
    ]:
        r = runs[name]
        # 7 rounds in trees of 3, 3, 1: the accountant's ε at the chosen z is DP-FedAvg's figure
        assert r["epsilon"] == pytest.approx(fedavg[key], rel=1e-9)
        assert r["epsilon"] == ftrl_epsilon(r["noise_multiplier"], 7, 1e-5, 3, "replace")
        assert (r["restart_every"], r["trees"], len(r["accuracy_per_round"])) == (3, 3, 7)
    honaker, plain = runs["dp_ftrl_honaker_at_known_sample_epsilon"], runs["dp_ftrl_at_known_sample_epsilon"]
    assert honaker["efficient"] is True and plain["efficient"] is False
    assert honaker["noise_multiplier"] == plain["noise_multiplier"]  # the same accounting
    assert run_drift_dp(SMALL, dp)["final_accuracy"] == out["final_accuracy"]  # seeded
    assert run_drift_dp(dataclasses.replace(SMALL, seed=1), dp)["final_accuracy"] != out["final_accuracy"]


def test_drift_cli_dp_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fl", "drift", "--rounds", "2", "--dp", "--noise-multiplier", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"strategies", "final_accuracy", "dp"} <= set(out)
    assert out["dp"]["scenario"] == "drift-dp" and out["dp"]["runs"][0]["noise_multiplier"] == 2.0
    with pytest.raises(FLError, match="noise_multiplier"):
        DriftDPConfig(noise_multiplier=0.0)
