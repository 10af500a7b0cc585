"""Per-round progress of the FL scenarios (issue #30): one callback per round, no change to results, a bar on
stderr only when it is a terminal."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pty

from ldp_cli.commands.study.common import round_bar
from ldp_cli.main import main
from simulator.rounds import RoundRecord
from simulator.scenarios.fl.clinics import ClinicsConfig, run_clinics
from simulator.scenarios.fl.drift import DriftConfig, run_drift
from simulator.scenarios.fl.personalize import PersonalizeConfig, run_personalize


def test_clinics_calls_back_once_per_round_and_keeps_the_result() -> None:
    cfg = ClinicsConfig(rounds=4, noise_multipliers=(0.5,), target_epsilons=())
    seen: list[RoundRecord] = []
    with_cb = run_clinics(cfg, noise_for_targets=False, on_round=seen.append)
    without = run_clinics(cfg, noise_for_targets=False)
    # two settings (FedAvg, σ = 0.5), each cfg.rounds rounds, in order
    assert [r.round for r in seen] == list(range(cfg.rounds)) * 2
    assert [r.test_accuracy for r in seen[: cfg.rounds]] == with_cb["settings"][0]["accuracy_per_round"]
    assert json.dumps(with_cb) == json.dumps(without)


def test_drift_calls_back_once_per_round_per_strategy() -> None:
    cfg = DriftConfig(rounds=3)
    seen: list[int] = []
    result = run_drift(cfg, on_round=lambda rec: seen.append(rec.round))
    assert seen == list(range(cfg.rounds)) * len(result["strategies"])


def test_personalize_calls_back_once_per_round_per_method() -> None:
    base = PersonalizeConfig()
    cfg = PersonalizeConfig(drift=dataclasses.replace(base.drift, rounds=2), methods=("fedavg", "ditto"))
    seen: list[int] = []
    run_personalize(cfg, on_round=lambda rec: seen.append(rec.round))
    assert seen == list(range(2)) * 2


def _args(no_progress: bool) -> argparse.Namespace:
    return argparse.Namespace(command="study", scenario="clinics", no_progress=no_progress)


def test_bar_drawn_on_a_terminal_only() -> None:
    master, slave = pty.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            for no_progress, expect in ((False, True), (True, False)):
                with round_bar(_args(no_progress), tty) as bar:
                    bar.update()
                tty.flush()
                os.set_blocking(master, False)
                try:
                    drawn = os.read(master, 65536)
                except BlockingIOError:
                    drawn = b""
                assert (b"round" in drawn) is expect, drawn
    finally:
        os.close(master)
        os.close(slave)


def test_json_stays_one_object_and_piped_stderr_stays_clean(capsys) -> None:
    argv = ["study", "clinics", "--rounds", "2", "--no-noise-search", "--json"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert main([*argv, "--no-progress"]) == 0
    second = capsys.readouterr()
    assert json.loads(first.out) == json.loads(second.out)
    assert first.out.count("\n") == 1
    assert first.err == "" and second.err == ""  # stderr is not a terminal here: no bar, nothing else


def test_compress_calls_back_once_per_round_of_every_scheme() -> None:
    from simulator.scenarios.fl.compress import DEFAULT_SCHEMES, run_compress
    from simulator.scenarios.fl.drift import DriftDPConfig

    seen: list[int] = []
    run_compress(DriftConfig(rounds=2), DriftDPConfig(), DEFAULT_SCHEMES[:2], on_round=lambda r: seen.append(r.round))
    assert seen == [0, 1] * 2


def test_local_dpsgd_calls_back_once_per_round_of_every_run() -> None:
    from simulator.scenarios.fl.local_dpsgd import LocalDPSGDConfig, run_local_dpsgd

    seen: list[int] = []
    run_local_dpsgd(DriftConfig(rounds=2), LocalDPSGDConfig(noise_multipliers=(1.0,)), lambda r: seen.append(r.round))
    assert seen == [0, 1] * 3  # plain SGD, clipped without noise, σ = 1


def test_drift_dp_and_ddg_call_back_too() -> None:
    from simulator.scenarios.fl.drift import DriftDPConfig, run_drift_study

    seen: list[int] = []
    result = run_drift_study(DriftConfig(rounds=2), DriftDPConfig(), (16,), on_round=lambda r: seen.append(r.round))
    runs = len(result["strategies"]) + len(result["dp"]["runs"]) + 2  # --ddg: central and 16 bits, one seed
    assert seen == [0, 1] * runs


def test_attacks_and_poisoning_call_back_once_per_round() -> None:
    from simulator.scenarios.fl.attacks import InversionConfig, MembershipConfig, run_attacks
    from simulator.scenarios.fl.poisoning import PoisoningConfig, run_fl_poisoning

    seen: list[int] = []
    membership = MembershipConfig(rounds=2, candidate_clients=40, noise_multipliers=(1.0,))
    run_attacks(membership, InversionConfig(trials=1), lambda r: seen.append(r.round))
    assert seen == [0, 1] * 2
    seen.clear()
    run_fl_poisoning(
        PoisoningConfig(rounds=2, fractions=(0.2,)), ("label_flip",), ("mean", "median"), on_round=seen.append
    )
    assert seen == [0, 1] * 4  # (clean + one attack at one fraction) × two aggregators


def test_forced_progress_draws_on_a_pipe_and_json_alone_does_not(capsys) -> None:
    argv = ["study", "compress", "--rounds", "1", "--json"]
    assert main([*argv, "--progress"]) == 0
    forced = capsys.readouterr()
    assert "ldp study compress" in forced.err and "round" in forced.err
    assert forced.out.count("\n") == 1 and json.loads(forced.out)["scenario"] == "compress"
    assert main(argv) == 0
    assert capsys.readouterr().err == ""
