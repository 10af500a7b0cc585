"""``ldp fl device``'s fleet (simulator/fl_fleet.py) without a server: its data file checks, the split, and
one progress call per round the devices saw end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldp_core.fl.errors import FLError
from simulator.fl_fleet import Fleet, load_data, make_task_data, save_data, split_data


def test_made_data_fits_the_model_and_round_trips(tmp_path: Path) -> None:
    model = {"kind": "softmax", "n_features": 3, "n_classes": 4}
    data = make_task_data(model, devices=5, rows_per_device=20, rng=np.random.default_rng(1))
    assert data["x"].shape == (100, 3) and set(np.unique(data["y"])) <= {0, 1, 2, 3}
    save_data(tmp_path / "d.npz", data)
    back = load_data(tmp_path / "d.npz")
    parts = split_data(back, 5)
    assert [len(y) for _, y in parts] == [20] * 5
    assert np.array_equal(np.concatenate([x for x, _ in parts]), data["x"])


def test_a_bad_data_file_is_named(tmp_path: Path) -> None:
    np.savez(tmp_path / "bad.npz", x=np.zeros((4, 2)), labels=np.zeros(4))
    with pytest.raises(FLError, match=r"bad.npz.*needs x and y.*missing: \['y'\], unknown: \['labels'\]"):
        load_data(tmp_path / "bad.npz")
    np.savez(tmp_path / "short.npz", x=np.zeros((4, 2)), y=np.zeros(4, int), client=np.array([0, 0, 1, 1]))
    with pytest.raises(FLError, match=r"no rows to device\(s\) \[2\] of 3"):
        split_data(load_data(tmp_path / "short.npz"), 3)


class _Stub:
    """A device that walks a fixed script of (what step() returns, round of the view)."""

    def __init__(self, script: list[tuple[str, int]]) -> None:
        self.script = script
        self.last_view: dict[str, Any] | None = None
        self.task, self.client_id, self.uploads = "t", "c", 0

    def step(self) -> str:
        kind, r = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        self.last_view = {"round": r, "rounds": 2}
        return kind


def test_one_progress_call_per_round_with_its_uploads() -> None:
    a = _Stub([("update", 0), ("idle", 0), ("update", 1), ("done", 1)])
    b = _Stub([("idle", 0), ("update", 0), ("idle", 1), ("done", 1)])
    seen: list[tuple[int, int]] = []
    fleet = Fleet([a, b])  # type: ignore[list-item]
    assert fleet.run(timeout=10, poll_interval=0, on_round=lambda r, k, _t: seen.append((r, k)))
    assert seen == [(0, 2), (1, 1)]
    assert fleet.uploaded == {0: 2, 1: 1}
