"""FLTrust's root update inside the aggregation job: the trusted root dataset and the server's training on it.

A task with ``"aggregator": {"kind": "fltrust", "root_data": "PATH.npz"}`` (docs/fl/TASK.md, docs/fl/FLTRUST.md) gives
the job a small dataset the operator trusts. :func:`load_root_data` reads and checks it against the task's
model; :class:`RootTraining` is the ``root`` callable of :class:`~estimator.fl.robust.FLTrust`: each round it
trains from the round's global model (``RoundContext.params``) on the root data with the task's own local
training (the devices' :func:`~ldp_core.fl.client_round.train_client` with the strategy's round configuration),
so g₀ and the clients' updates are the same kind of vector (Cao et al., NDSS 2021, Algorithm 1).

Its generator is :func:`root_generator`: a function of the task's seed and the round only, never the job's
own generator, so a restarted job computes the same g₀ for a round from the checkpointed model and the
job's draws (sampling, noise) are those of every other aggregator. Without a seed (production) each
computation draws from the OS CSPRNG: g₀ is never published on its own, and a round recomputed after a
crash was never released (the same argument as for the noise, :mod:`estimator.fl.job`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import zipfile
from typing import Any

import numpy as np

from estimator.fl.aggregators import RoundContext
from ldp_core.fl.client_round import train_client
from ldp_core.fl.errors import FLError
from ldp_core.fl.personalization import DittoSpec
from ldp_core.randomness import secure_generator

__all__ = ["load_root_data", "file_sha256", "root_generator", "RootTraining", "ROOT_CLIENT_ID", "ROOT_STREAM"]

#: the client id the root update is computed under (it is never uploaded: only the digest of ClientUpdate uses it)
ROOT_CLIENT_ID = "fltrust-root"
#: the second word of the root generator's seed ("ROOT"), keeping its stream apart from anything else seeded
ROOT_STREAM = 0x524F4F54


def _what(path: str) -> str:
    return f"aggregator 'fltrust': root_data {path!r}"


def file_sha256(path: str) -> str:
    """The hex SHA-256 of the file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_root_data(path: str, model: Any, sha256: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The root dataset ``(x, y)`` of the .npz file at ``path``, checked against ``model``: ``x`` a
    non-empty 2-D float array of finite values with ``model.n_features`` columns (returned as float32,
    the devices' dtype), ``y`` a 1-D integer array of the same length with labels in [0, n_classes)
    (2 for logistic regression; returned as int64). Other arrays in the file are ignored. With ``sha256``
    the file's digest must equal it (a file changed under a running task would change its rounds).
    Anything else is an :class:`FLError` that says what is wrong."""
    what = _what(path)
    if not os.path.isfile(path):
        raise FLError(f"{what}: no such file (a relative path is relative to the task file)")
    if sha256 is not None:
        have = file_sha256(path)
        if have != sha256.lower():
            raise FLError(f"{what}: the file's SHA-256 is {have}, the task pins {sha256}; the root data changed")
    try:
        f = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise FLError(f"{what}: not a readable .npz archive ({exc})") from None
    if not isinstance(f, np.lib.npyio.NpzFile):  # a plain .npy file loads as one array
        raise FLError(f"{what}: not a .npz archive (np.savez with arrays x and y)")
    with f:
        missing = sorted({"x", "y"} - set(f.files))
        if missing:
            raise FLError(f"{what}: the archive has no array {missing} (it holds {sorted(f.files)})")
        try:
            x, y = f["x"], f["y"]
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise FLError(f"{what}: an array could not be read ({exc})") from None
    n_features = int(getattr(model, "n_features", -1))
    n_classes = int(getattr(model, "n_classes", 2))
    if x.ndim != 2 or x.dtype.kind != "f":
        raise FLError(f"{what}: x must be a 2-D float array, got shape {x.shape} dtype {x.dtype}")
    if x.shape[0] == 0:
        raise FLError(f"{what}: the root dataset is empty (x has 0 rows)")
    if x.shape[1] != n_features:
        raise FLError(f"{what}: x has {x.shape[1]} columns, the model takes {n_features} features")
    if not np.isfinite(x).all():
        raise FLError(f"{what}: x holds NaN or infinite values")
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise FLError(f"{what}: y must be a 1-D integer array of labels, got shape {y.shape} dtype {y.dtype}")
    if y.shape[0] != x.shape[0]:
        raise FLError(f"{what}: y has {y.shape[0]} labels for {x.shape[0]} rows of x")
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= n_classes:
        raise FLError(f"{what}: labels must be in [0, {n_classes}) for the model, got range [{lo}, {hi}]")
    return np.ascontiguousarray(x, np.float32), y.astype(np.int64)


def root_generator(seed: int | None, round: int) -> np.random.Generator:
    """The generator of round ``round``'s root training: PCG64 seeded with (seed, :data:`ROOT_STREAM`, round)
    for a seeded task (the same on every restart), the OS CSPRNG without a seed."""
    if seed is None:
        return secure_generator()
    return np.random.default_rng([int(seed), ROOT_STREAM, int(round)])


@dataclasses.dataclass
class RootTraining:
    """g₀ for FLTrust: the task's local training on the root data from the round's global model.

    ``strategy.configure(round, params)`` gives the same round configuration the devices train with
    (learning rate, epochs, batch size, max steps, FedProx's μ, Per-FedAvg's meta steps); Ditto's upload is
    the global model's plain local SGD, so its personal step is left out here."""

    model: Any
    strategy: Any
    x: np.ndarray
    y: np.ndarray
    seed: int | None

    def __call__(self, ctx: RoundContext) -> np.ndarray:
        if ctx.params is None:
            raise FLError("FLTrust's root update needs the round's global model (RoundContext.params)")
        cfg = self.strategy.configure(ctx.round, ctx.params)
        if isinstance(cfg.personalization, DittoSpec):
            cfg = dataclasses.replace(cfg, personalization=None)
        up = train_client(self.model, cfg, self.x, self.y, root_generator(self.seed, ctx.round), ROOT_CLIENT_ID)
        return np.asarray(up.delta, np.float64)
