"""Devices of one federated task run from one process: ``ldp fl device`` (the device side of the quickstart).

A fleet is N :class:`~client_sdk.fl.device.FLDevice` objects, the task's first N client ids, each with its
share of one data file and its enrolled identity, stepped in turn over HTTP against the collector until the
task is done. It is for trying a task across processes and for tests: a real deployment runs one device per
install (``docs/fl/RUNNING.md``).

The data file is an ``.npz`` with ``x`` (rows × features, float) and ``y`` (labels, integers), and optionally
``client`` (one integer per row: the index of the device, in the task's client order, that holds it); without
``client`` the rows are split into N near-equal consecutive parts. :func:`make_task_data` makes one that fits
the task's model (seeded, a fresh linear rule per class, each device's features shifted a little so the
devices are not identically distributed).

Identities come either from ``ldp fl enroll --out DIR`` bundles (``DIR/<client-id>.json``) or are minted in
memory with the authority's key file (:func:`mint_identities`): the quickstart's example authority, whose key
is public, or a test's own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from client_sdk.fl.device import FLDevice
from ldp_core.fl.errors import FLError
from ldp_core.fl.models import accuracy
from ldp_core.fl.protocol import decode_vector, model_from_dict
from ldp_core.tokens.enrollment import DeviceIdentity, EnrollmentAuthority, EnrollmentError

__all__ = ["make_task_data", "save_data", "load_data", "split_data", "mint_identities", "load_identities", "Fleet"]


def _classes(model: Mapping[str, Any]) -> int:
    return 2 if model.get("kind") == "logistic" else int(model["n_classes"])


def make_task_data(
    model: Mapping[str, Any], devices: int, rows_per_device: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Data that fits ``model`` (a task's ``model`` object) for ``devices`` devices of ``rows_per_device`` rows:
    ``x`` standard normal plus a per-device shift of scale 0.3, ``y`` the argmax of a random linear score per
    class (for ``logistic``: the sign of one), ``client`` the device index of each row."""
    model_from_dict(model)  # checked: a wrong field is named
    n = int(model["n_features"])
    k = _classes(model)
    w = rng.normal(size=(n, k))
    shift = rng.normal(scale=0.3, size=(devices, n))
    client = np.repeat(np.arange(devices), rows_per_device)
    x = rng.normal(size=(devices * rows_per_device, n)) + shift[client]
    y = np.argmax(x @ w, axis=1) if k > 2 else (x @ w[:, 0] > 0).astype(np.int64)
    return {"x": x.astype(np.float64), "y": y.astype(np.int64), "client": client.astype(np.int64)}


def save_data(path: str | os.PathLike[str], data: Mapping[str, np.ndarray]) -> None:
    """Write ``data`` (``x``, ``y``, optional ``client``) as an ``.npz`` file."""
    arrays: dict[str, Any] = {k: np.asarray(v) for k, v in data.items()}
    np.savez(path, **arrays)


def load_data(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of a data file, checked: ``x`` 2-D, ``y`` one label per row, ``client`` (optional) one
    integer ≥ 0 per row. Anything else is an :class:`FLError` naming the file and what is wrong."""
    try:
        with np.load(path, allow_pickle=False) as f:
            data = {k: np.asarray(f[k]) for k in f.files}
    except (OSError, ValueError) as exc:
        raise FLError(f"data file {os.fspath(path)!r}: {exc}") from None
    missing = [k for k in ("x", "y") if k not in data]
    unknown = sorted(set(data) - {"x", "y", "client"})
    if missing or unknown:
        raise FLError(
            f"data file {os.fspath(path)!r}: arrays {sorted(data)}; it needs x and y, and may have client "
            f"(missing: {missing or 'none'}, unknown: {unknown or 'none'})"
        )
    x, y = data["x"], data["y"]
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise FLError(f"data file {os.fspath(path)!r}: x must be rows × features and y one label per row")
    c = data.get("client")
    if c is not None and (c.shape != y.shape or not np.issubdtype(c.dtype, np.integer) or (c < 0).any()):
        raise FLError(f"data file {os.fspath(path)!r}: client must hold one device index >= 0 per row")
    return data


def load_queries(path: str | os.PathLike[str]) -> np.ndarray:
    """A PATE task's public queries: an .npy array, or the array ``x`` of an .npz (rows × features)."""
    try:
        with open(path, "rb") as f:
            obj = np.load(f, allow_pickle=False)
            q = obj["x"] if isinstance(obj, np.lib.npyio.NpzFile) else obj
            q = np.asarray(q, np.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise FLError(f"queries file {str(path)!r}: {exc}") from None
    if q.ndim != 2 or not np.all(np.isfinite(q)):
        raise FLError(f"queries file {str(path)!r}: a rows × features array of finite numbers is needed, got {q.shape}")
    return q


def split_data(data: Mapping[str, np.ndarray], devices: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each device's ``(X, y)``: the rows whose ``client`` is its index, or N near-equal consecutive parts.
    A device without rows is an :class:`FLError` (it could not train)."""
    x, y = np.asarray(data["x"], np.float64), np.asarray(data["y"], np.int64)
    c = data.get("client")
    if c is None:
        parts = [(a, b) for a, b in zip(np.array_split(x, devices), np.array_split(y, devices))]
    else:
        parts = [(x[c == i], y[c == i]) for i in range(devices)]
    empty = [i for i, (a, _) in enumerate(parts) if len(a) == 0]
    if empty:
        raise FLError(f"the data file gives no rows to device(s) {empty} of {devices}")
    return parts


def mint_identities(authority_file: str, client_ids: Sequence[str], lifetime: int = 86400) -> list[DeviceIdentity]:
    """A fresh key and a credential per client id, signed by the authority in ``authority_file``."""
    try:
        auth = EnrollmentAuthority.load(authority_file)
    except EnrollmentError as exc:
        raise FLError(f"authority {authority_file!r}: {exc}") from None
    return [auth.enroll(c, lifetime=lifetime) for c in client_ids]


def load_identities(folder: str, client_ids: Sequence[str]) -> list[DeviceIdentity]:
    """The bundles ``folder/<client-id>.json`` written by ``ldp fl enroll --out``."""
    out = []
    for c in client_ids:
        path = os.path.join(folder, f"{c}.json")
        try:
            out.append(DeviceIdentity.load(path))
        except (OSError, EnrollmentError) as exc:
            raise FLError(f"device bundle {path!r}: {exc}") from None
    return out


class Fleet:
    """N devices stepped in turn until the task is done.

    ``on_round(round, uploaded, elapsed)`` is called once per round the fleet saw end (for progress: the
    round's index, how many of the fleet's devices uploaded in it, seconds since :meth:`run` began)."""

    def __init__(self, devices: Sequence[FLDevice], clock: Callable[[], float] = time.monotonic) -> None:
        if not devices:
            raise FLError("a fleet needs at least one device")
        self.devices = list(devices)
        self.clock = clock
        self.uploaded: dict[int, int] = {}
        self.final_view: Mapping[str, Any] | None = None

    def run(
        self,
        timeout: float,
        poll_interval: float = 0.05,
        on_round: Callable[[int, int, float], None] | None = None,
    ) -> bool:
        """Step every device until each has seen the task done (True) or ``timeout`` seconds pass (False)."""
        start = self.clock()
        done: set[int] = set()
        current: int | None = None
        while len(done) < len(self.devices):
            if self.clock() - start > timeout:
                return False
            for i, d in enumerate(self.devices):
                if i in done:
                    continue
                kind = d.step()
                if kind == "unavailable":  # the collector did not answer (after the device's retries): the
                    break  # others would wait the same; try again on the next pass
                view = d.last_view
                r = None if view is None else int(view["round"])
                if kind == "done":
                    done.add(i)
                    self.final_view = view
                elif kind in ("update", "masked") and r is not None:
                    self.uploaded[r] = self.uploaded.get(r, 0) + 1
                if r is not None and (current is None or r > current):
                    if current is not None and on_round is not None:
                        on_round(current, self.uploaded.get(current, 0), self.clock() - start)
                    current = r
            if len(done) < len(self.devices):
                time.sleep(poll_interval)
        if current is not None and on_round is not None and current in self.uploaded:
            on_round(current, self.uploaded[current], self.clock() - start)
        return True

    def accuracy(self, data: Sequence[tuple[np.ndarray, np.ndarray]]) -> float | None:
        """The released model's accuracy on the fleet's own (training) rows, once the task is done."""
        v = self.final_view
        if v is None:
            return None
        model = model_from_dict(v["model"])
        params = decode_vector(v["params"], int(v["num_params"]), what="params")
        X = np.concatenate([a for a, _ in data])
        y = np.concatenate([b for _, b in data])
        return float(accuracy(model, params, X, y))

    def report(self, data: Sequence[tuple[np.ndarray, np.ndarray]], finished: bool, elapsed: float) -> dict[str, Any]:
        """The JSON-ready summary ``ldp fl device`` prints."""
        return {
            "task": self.devices[0].task,
            "finished": finished,
            "devices": [
                {"client_id": d.client_id, "rows": int(len(d.y)), "uploads": d.uploads, "errors": dict(d.errors)}
                for d in self.devices
            ],
            "uploads": sum(d.uploads for d in self.devices),
            "uploads_per_round": {str(r): n for r, n in sorted(self.uploaded.items())},
            "rounds": None if self.final_view is None else int(self.final_view["rounds"]),
            "train_accuracy": self.accuracy(data),
            "seconds": round(elapsed, 3),
        }
