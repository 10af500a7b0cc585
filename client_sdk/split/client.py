"""The client of split learning: the bottom of the model (one dense layer with ReLU, the cut layer),
its forward and backward passes, and the HTTP exchange with the server.

Per batch: the client computes the cut-layer activations of its inputs, clips and noises them
(:class:`ldp_core.split.SmashedDP`), POSTs them with the labels to ``/split/v1/train``; the server
steps its half and answers with the gradient of the mean loss with respect to the activations it got;
the client scales it by each row's clipping factor, backpropagates through its layer and steps.
Inputs never leave the device; labels do (the server computes the loss). Every byte of every request
and response body is counted (``bytes_up``, ``bytes_down``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np

from client_sdk.upload.uploader import HttpRequest, HttpTransport, urllib_transport
from ldp_core.errors import LDPError
from ldp_core.split.dp import SmashedDP
from ldp_core.split.wire import SPLIT_CONTENT_TYPE, decode_message, encode_message

__all__ = ["BottomModel", "SplitClient", "SplitServerError"]


class SplitServerError(LDPError, RuntimeError):
    """The split-learning server refused a request or could not be reached."""


@dataclasses.dataclass
class BottomModel:
    """x ↦ ReLU(x·W + b): ``n_features`` inputs, ``width`` cut-layer units (Glorot-uniform W)."""

    W: np.ndarray
    b: np.ndarray

    @classmethod
    def init(cls, n_features: int, width: int, rng: np.random.Generator) -> BottomModel:
        a = math.sqrt(6.0 / (n_features + width))
        return cls(rng.uniform(-a, a, size=(n_features, width)), np.zeros(width))

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pre = x @ self.W + self.b
        return pre, np.maximum(pre, 0.0)

    def backward(self, x: np.ndarray, pre: np.ndarray, grad: np.ndarray, lr: float) -> None:
        g = grad * (pre > 0)
        self.W -= lr * (x.T @ g)
        self.b -= lr * g.sum(axis=0)


class SplitClient:
    """Trains the bottom half against the server at ``url`` (``http://host:port``)."""

    def __init__(
        self,
        url: str,
        model: BottomModel,
        dp: SmashedDP,
        transport: HttpTransport = urllib_transport,
        timeout: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.dp = dp
        self.transport = transport
        self.timeout = timeout
        self.bytes_up = 0
        self.bytes_down = 0
        self.released = 0

    def _post(self, path: str, body: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        req = HttpRequest("POST", self.url + path, body, {"Content-Type": SPLIT_CONTENT_TYPE}, self.timeout)
        try:
            resp = self.transport(req)
        except OSError as exc:
            raise SplitServerError(f"the split server at {self.url} cannot be reached: {exc}") from None
        self.bytes_up += len(body)
        self.bytes_down += len(resp.body)
        if resp.status != 200:
            try:
                detail = json.loads(resp.body).get("detail", resp.body[:200])
            except ValueError:
                detail = resp.body[:200]
            raise SplitServerError(f"{path}: HTTP {resp.status}: {detail}")
        return decode_message(resp.body)

    def smash(self, x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(released activations, pre-activations, clipping scales) of ``x``; counts the releases."""
        pre, a = self.model.forward(x)
        out, scale = self.dp.privatize(a, rng)
        self.released += len(x)
        return out, pre, scale

    def train_epoch(
        self, x: np.ndarray, y: np.ndarray, batch_size: int, learning_rate: float, rng: np.random.Generator
    ) -> float:
        """One pass over (x, y) in shuffled batches; each example is released once. The mean loss."""
        order = rng.permutation(len(x))
        losses = []
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            smashed, pre, scale = self.smash(x[idx], rng)
            meta, arrays = self._post("/split/v1/train", encode_message({}, {"smashed": smashed, "labels": y[idx]}))
            grad = arrays.get("grad")
            if grad is None or grad.shape != smashed.shape:
                raise SplitServerError("the server's answer has no gradient of the activations' shape")
            self.model.backward(x[idx], pre, grad * scale[:, None], learning_rate)
            losses.append(float(meta.get("loss", math.nan)))
        return float(np.mean(losses))

    def predict(self, x: np.ndarray, rng: np.random.Generator, batch_size: int = 512) -> np.ndarray:
        """The server's predicted labels of ``x`` (the activations released, with noise, as in training)."""
        out = []
        for start in range(0, len(x), batch_size):
            smashed, _, _ = self.smash(x[start : start + batch_size], rng)
            _, arrays = self._post("/split/v1/predict", encode_message({}, {"smashed": smashed}))
            out.append(np.asarray(arrays["labels"], dtype=np.int64))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def info(self) -> dict[str, Any]:
        req = HttpRequest("GET", self.url + "/split/v1/info", None, {}, self.timeout)
        try:
            resp = self.transport(req)
        except OSError as exc:
            raise SplitServerError(f"the split server at {self.url} cannot be reached: {exc}") from None
        if resp.status != 200:
            raise SplitServerError(f"/split/v1/info: HTTP {resp.status}")
        return dict(json.loads(resp.body))
