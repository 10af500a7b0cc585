"""PATE teachers as FL devices: what a teacher device and the aggregation job share.

A *PATE task* (the task file's ``pate`` object, docs/PATE.md "Federated teachers over HTTP") is a
one-round SecAgg task whose devices are teachers: each trains a model on its own partition (or loads one),
predicts the labels of the task's public queries, and sends its one-hot vote vector x_u ∈ {0, 1}^{Q·K}
through secure aggregation; the job unmasks only Σ_u x_u, the vote histograms, and answers with GNMax or
Confident-GNMax (:mod:`estimator.pate`). The queries themselves travel out of band (a file every teacher
holds): the task carries their SHA-256 (:func:`queries_digest`), signed by the enrollment authority, and a
device votes only on queries whose digest matches, so a server cannot ask a teacher other questions than
the task's.

``noise``: ``"server"`` (the job adds GNMax's noise to the unmasked histograms; the job's operator sees the
exact histograms) or ``"distributed"`` (GNMax only: each of the n teachers adds N_Z(0, σ²/n) to every word
before masking, :func:`noise_share`, so the server unmasks only noised histograms; Kairouz, Liu and Steinke
2021).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ldp_core.fl.errors import FLError

__all__ = ["PateTaskSpec", "queries_digest", "one_hot_votes", "teacher_predictions", "noise_share", "AGGREGATORS"]

AGGREGATORS = ("gnmax", "confident_gnmax")
NOISE = ("server", "distributed")


def queries_digest(queries: np.ndarray) -> str:
    """SHA-256 (hex) of the public queries as float32, little-endian, C order, prefixed by their shape."""
    q = np.ascontiguousarray(np.asarray(queries, dtype="<f4"))
    if q.ndim != 2:
        raise FLError(f"the public queries must be a rows × features array, got shape {q.shape}")
    h = hashlib.sha256(f"{q.shape[0]}x{q.shape[1]};".encode())
    h.update(q.tobytes())
    return h.hexdigest()


def one_hot_votes(predictions: np.ndarray, n_classes: int) -> np.ndarray:
    """One teacher's Q predicted labels as the flat uint32 vote vector of length Q·K."""
    p = np.asarray(predictions, dtype=np.int64)
    if p.ndim != 1 or (p.size and (p.min() < 0 or p.max() >= n_classes)):
        raise FLError(f"predictions must be a vector of labels in [0, {n_classes})")
    out = np.zeros((p.size, n_classes), dtype=np.uint32)
    out[np.arange(p.size), p] = 1
    return out.reshape(-1)


def teacher_predictions(
    model_spec: Mapping[str, Any],
    training: Mapping[str, Any],
    X: np.ndarray,
    y: np.ndarray,
    queries: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """A teacher's labels for ``queries``: the task's model trained from its initial parameters on the
    teacher's own (X, y) by local SGD (``training``'s epochs, batch size, step), with ``rng``."""
    from ldp_core.fl.protocol import model_from_dict
    from ldp_core.fl.training import LocalTraining, local_sgd

    model = model_from_dict(dict(model_spec))
    tr = LocalTraining(**dict(training))
    w, _ = local_sgd(model, model.init_params(rng), np.asarray(X, np.float32), np.asarray(y), tr, rng)
    return np.asarray(model.predict(w, np.asarray(queries, np.float32)), np.int64)


def noise_share(sigma: float, teachers: int) -> float:
    """Each of ``teachers`` devices' discrete Gaussian σ for a total σ (σ/√n; KLS21 needs it >= 1/2)."""
    return float(sigma) / math.sqrt(teachers)


def _num(d: Mapping[str, Any], name: str, required: bool = True) -> float | None:
    v = d.get(name)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise FLError(f"pate.{name} must be a finite number > 0, got {v!r}")
    return float(v)


@dataclasses.dataclass(frozen=True)
class PateTaskSpec:
    """The ``pate`` object of a task file: ``queries`` Q and ``classes`` K, ``queries_sha256`` (the digest of
    the public queries every teacher holds), ``aggregator`` (``gnmax`` with ``sigma``; ``confident_gnmax``
    with ``threshold`` T, ``sigma1`` σ₁ and ``sigma`` = σ₂) and ``noise`` (``server`` or ``distributed``)."""

    queries: int
    classes: int
    queries_sha256: str
    aggregator: str = "gnmax"
    sigma: float = 1.0
    threshold: float | None = None
    sigma1: float | None = None
    noise: str = "server"

    def __post_init__(self) -> None:
        for name, lo in (("queries", 1), ("classes", 2)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise FLError(f"pate.{name} must be an integer >= {lo}, got {v!r}")
        h = self.queries_sha256
        if not isinstance(h, str) or len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
            raise FLError("pate.queries_sha256 must be 64 lower-case hex digits (ldp_core.fl.pate.queries_digest)")
        if self.aggregator not in AGGREGATORS:
            raise FLError(f"pate.aggregator must be one of {list(AGGREGATORS)}, got {self.aggregator!r}")
        if self.noise not in NOISE:
            raise FLError(f"pate.noise must be one of {list(NOISE)}, got {self.noise!r}")
        d = dataclasses.asdict(self)
        _num(d, "sigma")
        if self.aggregator == "confident_gnmax":
            _num(d, "threshold")
            _num(d, "sigma1")
            if self.noise == "distributed":
                raise FLError(
                    "pate: confident_gnmax needs noise 'server' (its threshold check is not distributed: a second "
                    "SecAgg round on the noised top count would be needed)"
                )
        elif self.threshold is not None or self.sigma1 is not None:
            raise FLError("pate.threshold and pate.sigma1 belong to aggregator confident_gnmax")
        if self.queries * self.classes >= 2**26:
            raise FLError(f"pate: {self.queries} queries × {self.classes} classes is too long a vote vector")

    @property
    def length(self) -> int:
        """The vote vector's length Q·K (the SecAgg vector length)."""
        return self.queries * self.classes

    @classmethod
    def from_dict(cls, d: Any) -> PateTaskSpec:
        if isinstance(d, PateTaskSpec):
            return d
        if not isinstance(d, Mapping):
            raise FLError(f"pate must be an object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise FLError(f"unknown pate fields {sorted(unknown)}; known: {sorted(names)}")
        missing = {"queries", "classes", "queries_sha256"} - set(d)
        if missing:
            raise FLError(f"pate needs {sorted(missing)}")
        return cls(**dict(d))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
