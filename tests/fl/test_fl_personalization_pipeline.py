"""Personalization as a task option over the pipeline (embedded log, real collector, job thread):
MOON under DP-FedAvg ends in the in-process model bit for bit, and Ditto's devices hold exactly the
personal models of the in-process run; the task file refuses inconsistent settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from estimator.fl.task import FLTaskSpec
from ldp_core.fl.errors import FLError
from tests.support.fl_pipeline_support import (
    devices_for,
    drive,
    final_params,
    in_process_clients,
    make_data,
    reference_run,
    running_task,
    task_spec,
)

MLP_MODEL = {"kind": "mlp", "n_features": 4, "hidden": 5, "n_classes": 2}


def test_moon_task_under_dp_fedavg_equals_the_in_process_run(tmp_path: Path) -> None:
    spec = task_spec("moon-e", 8, model=MLP_MODEL, personalization={"kind": "moon", "mu": 1.0, "tau": 0.5})
    data = make_data(8)
    ref, _ = reference_run(spec, data)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (_, srv, jt):
        devices = devices_for(srv.url, spec, data)
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None
    assert np.array_equal(final_params(status), ref)
    # MOON's previous local model stayed on each device that trained, and made a difference:
    # a plain FedAvg run of the same task ends elsewhere
    assert sum(d.state.previous is not None for d in devices) >= 4
    plain, _ = reference_run(FLTaskSpec.from_dict({**spec.to_dict(), "personalization": None}), data)
    assert not np.array_equal(plain, ref)


def test_ditto_devices_hold_the_personal_models_of_the_in_process_run(tmp_path: Path) -> None:
    spec = task_spec("ditto-e", 6, clip_norm=None, noise_multiplier=0.0, personalization={"kind": "ditto", "lam": 0.5})
    data = make_data(6)
    ref, clients = in_process_clients(spec, data)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (_, srv, jt):
        devices = devices_for(srv.url, spec, data)
        drive(devices, jt.finished, timeout=60)
        status = jt.result
    assert status is not None
    assert np.array_equal(final_params(status), ref)
    trained = 0
    for dev, c in zip(devices, clients, strict=True):
        if c.state.personal is None:
            assert dev.state.personal is None
            continue
        trained += 1
        assert dev.state.personal is not None and np.array_equal(dev.state.personal, c.state.personal)
    assert trained >= 4


def test_task_spec_refuses_inconsistent_personalization() -> None:
    with pytest.raises(FLError, match="kind"):
        task_spec("p-bad", 4, personalization={"kind": "fedbn"})
    with pytest.raises(FLError, match="fedavg"):
        task_spec(
            "p-bad", 4, algorithm="scaffold", clip_norm=None, noise_multiplier=0.0, personalization={"kind": "ditto"}
        )
    with pytest.raises(FLError, match="mlp"):
        task_spec("p-bad", 4, personalization={"kind": "moon"})
    with pytest.raises(FLError, match="unknown"):
        task_spec("p-bad", 4, personalization={"kind": "ditto", "lambda": 1.0})
    spec = task_spec("p-ok", 4, personalization={"kind": "perfedavg", "eval_steps": 3})
    again = FLTaskSpec.from_dict(spec.to_dict())
    assert again.personalization == {"kind": "perfedavg", "inner_learning_rate": 0.05, "eval_steps": 3}
    assert type(again.build_strategy()).__name__ == "PerFedAvg"
