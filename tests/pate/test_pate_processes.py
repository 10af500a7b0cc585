"""A PATE task with the commands an operator runs: ``ldp collector --fl``, ``ldp fl job`` and ``ldp fl device
--queries`` as three processes over HTTP on 127.0.0.1."""

from __future__ import annotations

import json

import numpy as np
import pytest

from estimator.pate.accounting import data_independent
from simulator.pate_fl import pate_task
from tests.pate.test_pate_http import MODEL, TEACHERS, TRAINING, _digits


def test_the_task_kind_runs_with_ldp_fl_job_and_ldp_fl_device_as_processes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The CLI path: ``ldp collector --fl``, ``ldp fl job`` and ``ldp fl device --queries`` as three processes
    over HTTP on 127.0.0.1; the job's status file ends with the round's PATE record."""
    import os
    import shutil
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from ldp_core.tokens.enrollment import EnrollmentAuthority

    root = Path(__file__).resolve().parents[2]
    authority_file = root / "examples" / "fl" / "example-authority.json"
    parts, queries, _ = _digits()
    spec = pate_task(
        "pate-cli",
        EnrollmentAuthority.load(str(authority_file)),
        queries,
        TEACHERS,
        MODEL,
        TRAINING,
        {"sigma": 2.0},
        seed=5,
    )
    (tmp_path / "task.json").write_text(json.dumps(spec.to_dict()))
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    client = np.concatenate([np.full(len(p[1]), i) for i, p in enumerate(parts)])
    np.savez(tmp_path / "data.npz", x=x, y=y, client=client)
    np.save(tmp_path / "queries.npy", queries)
    shutil.copy(root / "metrics" / "example.json", tmp_path / "metrics.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    transport = f"sqlite:///{tmp_path}/t.sqlite3"
    ldp = [sys.executable, "-m", "ldp_cli.main"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = []
    try:
        with open(tmp_path / "collector.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        *ldp,
                        "collector",
                        "--fl",
                        "--transport",
                        transport,
                        "--metrics",
                        "metrics.json",
                        "--port",
                        str(port),
                    ],
                    cwd=tmp_path,
                    env=env,
                    stdout=log,
                    stderr=log,
                )
            )
        with open(tmp_path / "job.log", "wb") as log:
            job = subprocess.Popen(
                [*ldp, "fl", "job", "--task", "task.json", "--transport", transport, "--status-file", "status.json"],
                cwd=tmp_path,
                env=env,
                stdout=log,
                stderr=log,
            )
        procs.append(job)
        dev = subprocess.run(
            [
                *ldp,
                "fl",
                "device",
                "--task",
                "task.json",
                "--authority",
                str(authority_file),
                "--data",
                "data.npz",
                "--queries",
                "queries.npy",
                "--collector",
                f"http://127.0.0.1:{port}",
                "--json",
                "--timeout",
                "240",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert dev.returncode == 0, dev.stderr + (tmp_path / "job.log").read_text()
        job.wait(timeout=120)
        status = json.loads((tmp_path / "status.json").read_text())
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
    rec = status["history"][-1]
    assert rec["clients"] == TEACHERS and len(rec["pate"]["labels"]) == len(queries)
    assert rec["pate"]["epsilon"] == pytest.approx(data_independent(2.0, len(queries), 1e-5)["epsilon"])
    assert "histograms" not in json.dumps(status)
