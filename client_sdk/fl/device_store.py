"""What an FL device keeps across app restarts, in the SDK's store (:mod:`client_sdk.store`, schema 4).

* The **sample-level ledger**: one row per (task, round) the device trained under the task option
  ``local_dp_sgd``, with the signed spec and δ. :meth:`FLDeviceStore.record_round` commits the row durably
  (``BEGIN IMMEDIATE``, ``synchronous=FULL``) before the round's update is uploaded, so a crash between
  training and upload can only over-count what the device spent, never under-count it; a restarted device
  rebuilds its :class:`~ldp_core.fl.local_dpsgd.SampleLevelAccountant` from these rows.
* The **client state** of each task (:class:`~ldp_core.fl.training.ClientState`): SCAFFOLD's control variate,
  Ditto's personal model, MOON's previous local model, tagged with the model they belong to (a task whose
  model changed starts afresh), and the last round's global model and settings, so the app can predict
  with :meth:`~client_sdk.fl.device.FLDevice.personalized_params` before the next round.

Arrays are stored as their raw little-endian bytes with dtype and shape, and read back bit for bit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from client_sdk.store import Store
from ldp_core.fl.errors import FLError
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec, SampleLevelAccountant, local_dp_sgd_from_dict
from ldp_core.fl.training import ClientState

__all__ = ["FLDeviceStore", "canonical_json"]

#: The :class:`ClientState` fields kept per task, and the last global model.
_ARRAYS = ("control", "personal", "previous")
_GLOBAL = "global"


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace: the form a spec or model is compared and stored in."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _to_row(a: np.ndarray) -> tuple[str, str, bytes]:
    a = np.asarray(a)
    le = a.astype(a.dtype.newbyteorder("<"), copy=False)
    return le.dtype.str, json.dumps(list(a.shape)), np.ascontiguousarray(le).tobytes()


def _from_row(dtype: str, shape: str, data: bytes) -> np.ndarray:
    dt = np.dtype(dtype)
    dims = tuple(int(n) for n in json.loads(shape))
    if int(np.prod(dims, dtype=np.int64)) * dt.itemsize != len(data):
        raise FLError(f"a stored FL array has {len(data)} bytes, not what {dtype} {dims} needs")
    return np.frombuffer(data, dtype=dt).reshape(dims).astype(dt.newbyteorder("="))


class FLDeviceStore:
    """The FL tables of the SDK store in ``directory`` (created if missing; the same file as the telemetry
    client's, so one app has one private database)."""

    def __init__(self, directory: str | os.PathLike[str] | Store, *, clock: Any = time.time) -> None:
        self._own = not isinstance(directory, Store)
        self.store = directory if isinstance(directory, Store) else Store(directory)
        self.clock = clock

    # -- the sample-level ledger ----------------------------------------------------------------------
    def ledger(self, task: str) -> SampleLevelAccountant | None:
        """The task's ledger as recorded (None before its first DP-SGD round)."""
        rows = (
            self.store.connection()
            .execute("SELECT round, spec, delta FROM fl_sample_ledger WHERE task = ? ORDER BY round", (task,))
            .fetchall()
        )
        if not rows:
            return None
        acc = SampleLevelAccountant(float(rows[0][2]))
        for r, spec, delta in rows:
            if float(delta) != acc.delta:
                raise FLError(f"the stored ledger of task {task!r} has two deltas ({acc.delta} and {delta})")
            parsed = local_dp_sgd_from_dict(json.loads(spec))
            assert parsed is not None
            acc.record(int(r), parsed)
        return acc

    def record_round(self, task: str, round: int, spec: LocalDPSGDSpec, delta: float) -> None:
        """Commit (durably) that the device trained ``round`` of ``task`` under ``spec``; a round already
        recorded is refused (a second training of it would release a second noisy view of the data)."""
        with self.store.transaction() as conn:
            if conn.execute(
                "SELECT 1 FROM fl_sample_ledger WHERE task = ? AND round = ?", (task, int(round))
            ).fetchone():
                raise FLError(f"round {round} of task {task!r} is already in this device's sample-level ledger")
            conn.execute(
                "INSERT INTO fl_sample_ledger (task, round, spec, delta, recorded) VALUES (?, ?, ?, ?, ?)",
                (task, int(round), canonical_json(spec.to_dict()), float(delta), float(self.clock())),
            )

    # -- client state -----------------------------------------------------------------------------------
    def load_state(self, task: str, model_key: str) -> ClientState:
        """The task's state if it belongs to ``model_key`` (the canonical JSON of the task's model), else a
        fresh one."""
        conn = self.store.connection()
        row = conn.execute("SELECT model FROM fl_state WHERE task = ?", (task,)).fetchone()
        state = ClientState()
        if row is None or row[0] != model_key:
            return state
        for name, dtype, shape, data in conn.execute(
            "SELECT name, dtype, shape, data FROM fl_arrays WHERE task = ?", (task,)
        ):
            if name in _ARRAYS:
                setattr(state, name, _from_row(dtype, shape, data))
        return state

    def save_state(
        self,
        task: str,
        model_key: str,
        state: ClientState,
        global_params: np.ndarray,
        settings: Mapping[str, Any],
    ) -> None:
        """Replace the task's stored state by ``state``, the round's global model and ``settings`` (the
        round's training and personalization, JSON), in one durable transaction."""
        arrays = {name: getattr(state, name) for name in _ARRAYS if getattr(state, name) is not None}
        arrays[_GLOBAL] = np.asarray(global_params)
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM fl_arrays WHERE task = ?", (task,))
            conn.execute(
                "INSERT INTO fl_state (task, model, settings, updated) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (task) DO UPDATE SET model = excluded.model, settings = excluded.settings, "
                "updated = excluded.updated",
                (task, model_key, canonical_json(dict(settings)), float(self.clock())),
            )
            conn.executemany(
                "INSERT INTO fl_arrays (task, name, dtype, shape, data) VALUES (?, ?, ?, ?, ?)",
                [(task, name, *_to_row(a)) for name, a in arrays.items()],
            )

    def last_round(self, task: str) -> tuple[str, dict[str, Any], np.ndarray] | None:
        """The model key, settings and global model of the task's last trained round (None if none)."""
        conn = self.store.connection()
        row = conn.execute("SELECT model, settings FROM fl_state WHERE task = ?", (task,)).fetchone()
        arr = conn.execute(
            "SELECT dtype, shape, data FROM fl_arrays WHERE task = ? AND name = ?", (task, _GLOBAL)
        ).fetchone()
        if row is None or arr is None:
            return None
        return str(row[0]), json.loads(row[1]), _from_row(*arr)

    def close(self) -> None:
        if self._own:
            self.store.close()
