"""``ldp fl local-dpsgd``: the drift partition under DP-FedAvg with DP-SGD on the devices (in-process path)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from estimator.accounting.accountant import account
from ldp_cli.main import main
from ldp_core.fl.client_round import train_client
from ldp_core.fl.errors import FLError
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec
from ldp_core.fl.models import LogisticRegression
from ldp_core.fl.training import LocalTraining, RoundConfig
from simulator.scenarios.fl.drift import DriftConfig
from simulator.scenarios.fl.local_dpsgd import LocalDPSGDConfig, run_local_dpsgd

SMALL = DriftConfig(
    clients=12,
    clients_per_round=4,
    rounds=3,
    mean_examples=30,
    training=LocalTraining(epochs=1, batch_size=10, learning_rate=0.2),
    iid_reference=False,
)


def test_in_process_clients_add_the_dp_sgd_noise() -> None:
    """run_rounds' path (train_client with the round's local_dp_sgd): with all-zero features the weights move by
    the noise alone, Var = T·η²·σ²·c²/(qN)² per coordinate."""
    d, n, lr = 200, 50, 0.3
    spec = LocalDPSGDSpec(noise_multiplier=2.0, clip=0.5, sample_rate=0.2, steps=4)
    model = LogisticRegression(d, l2=0.0)
    X, y = np.zeros((n, d), np.float32), np.random.default_rng(3).integers(0, 2, n)
    cfg = RoundConfig(0, np.zeros(model.num_params, np.float32), "fedavg", LocalTraining(learning_rate=lr))
    cfg_dp = RoundConfig(
        0, np.zeros(model.num_params, np.float32), "fedavg", LocalTraining(learning_rate=lr), local_dp_sgd=spec
    )
    rng = np.random.default_rng(5)
    w = np.concatenate([train_client(model, cfg_dp, X, y, rng, "c").delta[:d] for _ in range(10)]).astype(np.float64)
    var = 4 * lr**2 * 2.0**2 * 0.5**2 / (0.2 * n) ** 2
    # χ²_m/m: the second moment's standard error is var·√(2/m), m = 2000 (±13 % at 4 of them)
    assert abs(float(np.mean(w**2)) - var) < 4 * var * math.sqrt(2 / w.size)
    assert np.all(train_client(model, cfg, X, y, rng, "c").delta[:d] == 0.0)  # plain SGD: the weights stay


def test_scenario_reports_both_epsilons() -> None:
    dp = LocalDPSGDConfig(noise_multipliers=(3.0, 6.0), sample_rate=0.2, epochs=1, client_noise_multiplier=1.0)
    a = run_local_dpsgd(SMALL, dp)
    plain, clipped, z1, z4 = a["runs"]  # σ = 3 and 6
    assert plain["noise_multiplier"] is None and plain["epsilon_worst_case"] is None
    assert clipped["noise_multiplier"] == 0.0 and clipped["epsilon_worst_case"] is None
    assert z1["epsilon_worst_case"] > z4["epsilon_worst_case"] > 0  # more noise, less ε
    spec = LocalDPSGDSpec(3.0, 1.0, 0.2, epochs=1)
    assert z1["epsilon_worst_case"] == pytest.approx(account(spec.event(SMALL.rounds), 1e-5, "replace").epsilon_pld)
    busiest = a["rounds_joined"]["max"]
    assert z1["epsilon_max_device"] == pytest.approx(account(spec.event(busiest), 1e-5, "replace").epsilon_pld)
    assert z1["epsilon_per_round"] <= z1["epsilon_median_device"] <= z1["epsilon_max_device"]
    assert z1["epsilon_max_device"] <= z1["epsilon_worst_case"]
    assert z1["epsilon_worst_case_add_remove"] < z1["epsilon_worst_case"]  # add/remove: the weaker relation
    assert z1["epsilon_worst_case_add_remove_rdp"] >= z1["epsilon_worst_case_add_remove"]  # RDP is looser
    assert a["client_level"]["epsilon_known_sample"] >= a["client_level"]["epsilon_observers"] > 0
    assert all(len(r["accuracy_per_round"]) == SMALL.rounds for r in a["runs"])


def test_config_refuses_bad_options() -> None:
    with pytest.raises(FLError, match="no sample-level DP"):
        LocalDPSGDConfig(noise_multipliers=(0.0,))
    with pytest.raises(FLError, match="must not be empty"):
        LocalDPSGDConfig(noise_multipliers=())
    with pytest.raises(FLError, match="client_noise_multiplier"):
        LocalDPSGDConfig(client_noise_multiplier=0.0)


def test_cli_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "p.png"
    argv = ["fl", "local-dpsgd", "--rounds", "2", "--noise-multipliers", "2", "--epochs", "1"]
    assert main([*argv, "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"] == "local-dpsgd" and out["plot"] == str(png) and png.stat().st_size > 0
    assert [r["noise_multiplier"] for r in out["runs"]] == [None, 0.0, 2.0]
    assert {"epsilon_known_sample", "epsilon_observers"} <= set(out["client_level"])
    with pytest.raises(SystemExit):
        main(["fl", "local-dpsgd", "--noise-multipliers", "1,-2"])
