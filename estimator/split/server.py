"""The split-learning server: the model above the cut (a softmax layer on the cut-layer activations),
trained with the labels the client sends, served over HTTP by FastAPI (``ldp split serve``).

Routes (bodies in the :mod:`ldp_core.split.wire` format):

* ``POST /split/v1/train``: ``smashed`` (batch × width, float32) and ``labels`` (batch, int64) → one SGD
  step on the mean cross-entropy; answers ``grad`` (its gradient with respect to ``smashed``) and
  ``meta.loss``.
* ``POST /split/v1/predict``: ``smashed`` → ``labels`` (the argmax class).
* ``GET /split/v1/info``: the width, classes, steps and examples so far (JSON).
* ``GET /split/v1/observed``: with ``record`` on (a study of what the server sees, ``--record``), the
  activations received by ``predict`` in order, as ``smashed``; 404 otherwise.

One client trains at a time (vanilla split learning); a lock serializes the steps.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException, Request, Response

from ldp_core.split.wire import SPLIT_CONTENT_TYPE, SplitWireError, decode_message, encode_message

__all__ = ["TopModel", "SplitServer", "create_app", "MAX_BODY"]

MAX_BODY = 16 << 20
_MAX_RECORD = 100_000


@dataclasses.dataclass
class TopModel:
    """z = a·W + b, softmax cross-entropy; ``width`` inputs, ``classes`` outputs."""

    W: np.ndarray
    b: np.ndarray

    @classmethod
    def init(cls, width: int, classes: int) -> TopModel:
        return cls(np.zeros((width, classes)), np.zeros(classes))

    def logits(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a, dtype=np.float64) @ self.W + self.b

    def step(self, a: np.ndarray, y: np.ndarray, lr: float) -> tuple[float, np.ndarray]:
        """One SGD step on the mean loss; (loss, ∂loss/∂a) with ∂/∂a taken before the step."""
        a64 = np.asarray(a, dtype=np.float64)
        z = self.logits(a64)
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        n = len(y)
        loss = float(-logp[np.arange(n), y].mean())
        gz = np.exp(logp)
        gz[np.arange(n), y] -= 1.0
        gz /= n
        ga = gz @ self.W.T
        self.W -= lr * (a64.T @ gz)
        self.b -= lr * gz.sum(axis=0)
        return loss, ga


class SplitServer:
    """The server's state: its half of the model, counters and (``record``) what ``predict`` received."""

    def __init__(self, width: int, classes: int, learning_rate: float, record: bool = False) -> None:
        if width < 1 or classes < 2 or not learning_rate > 0:
            raise ValueError("need width >= 1, classes >= 2 and learning_rate > 0")
        self.width, self.classes, self.learning_rate = width, classes, learning_rate
        self.model = TopModel.init(width, classes)
        self.record = record
        self.observed: list[np.ndarray] = []
        self.steps = 0
        self.examples = 0
        self.lock = threading.Lock()

    def _smashed(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        a = arrays.get("smashed")
        if a is None or a.ndim != 2 or a.shape[1] != self.width or a.dtype.kind != "f":
            raise SplitWireError(f"'smashed' must be a float32 batch × {self.width} array")
        if not np.all(np.isfinite(a)):
            raise SplitWireError("'smashed' has a non-finite value")
        return a

    def train(self, body: bytes) -> bytes:
        _, arrays = decode_message(body)
        a = self._smashed(arrays)
        y = arrays.get("labels")
        if (
            y is None
            or y.shape != (len(a),)
            or y.dtype.kind != "i"
            or (len(y) and (y.min() < 0 or y.max() >= self.classes))
        ):
            raise SplitWireError(f"'labels' must be {len(a)} int64 labels in [0, {self.classes})")
        if len(a) == 0:
            raise SplitWireError("an empty batch")
        with self.lock:
            loss, grad = self.model.step(a, y.astype(np.int64), self.learning_rate)
            self.steps += 1
            self.examples += len(a)
        return encode_message({"loss": loss, "step": self.steps}, {"grad": grad})

    def predict(self, body: bytes) -> bytes:
        _, arrays = decode_message(body)
        a = self._smashed(arrays)
        with self.lock:
            labels = np.argmax(self.model.logits(a), axis=1).astype(np.int64)
            if self.record and sum(len(o) for o in self.observed) < _MAX_RECORD:
                self.observed.append(np.array(a, dtype=np.float32))
        return encode_message({}, {"labels": labels})

    def observed_message(self) -> bytes:
        with self.lock:
            rows = np.concatenate(self.observed) if self.observed else np.zeros((0, self.width), np.float32)
        return encode_message({}, {"smashed": rows})

    def info(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "classes": self.classes,
            "learning_rate": self.learning_rate,
            "steps": self.steps,
            "examples": self.examples,
            "record": self.record,
        }


def create_app(server: SplitServer) -> Any:
    """The FastAPI app of ``server``."""
    app = FastAPI(title="ldp split-learning server", docs_url=None, redoc_url=None)

    async def _body(request: Request) -> bytes:
        body = await request.body()
        if len(body) > MAX_BODY:
            raise HTTPException(413, f"the body is over {MAX_BODY} bytes")
        return body

    def _answer(fn: Any, body: bytes) -> Response:
        try:
            return Response(fn(body), media_type=SPLIT_CONTENT_TYPE)
        except SplitWireError as exc:
            raise HTTPException(400, str(exc)) from None

    @app.post("/split/v1/train")
    async def train(request: Request) -> Response:
        return _answer(server.train, await _body(request))

    @app.post("/split/v1/predict")
    async def predict(request: Request) -> Response:
        return _answer(server.predict, await _body(request))

    @app.get("/split/v1/info")
    async def info() -> dict[str, Any]:
        return server.info()

    @app.get("/split/v1/observed")
    async def observed() -> Response:
        if not server.record:
            raise HTTPException(404, "this server does not record what it sees (start it with --record)")
        return Response(server.observed_message(), media_type=SPLIT_CONTENT_TYPE)

    return app
