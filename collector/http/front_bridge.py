"""The Python half of the native upload front (issue 31, "Collector CPU per report"; the Rust half: native/front).

The front (``ldp_front.Front``, in Rust) parses HTTP and reads upload bodies outside Python, and queues the
uploads of ``POST /v1/reports`` whose body it read whole; everything else it proxies to the collector's ASGI
app. :class:`FrontBridge` takes the queued uploads on the collector's event loop, in batches (one wake-up of
the loop per batch: ``loop.add_reader`` on the front's eventfd, then ``take_nowait``), and runs each through
the same steps as the ASGI path, :meth:`collector.http.upload.UploadHandler.start`: media type, token,
admission, decoding and checks, spending, publishing through the ingestor's group commit, the publish
deadline. No coroutine per upload, except for a body decoded off the event loop (above
``offload_*_bytes``), which takes the ASGI path's coroutine as a task.

The answers of one loop iteration leave in one ``answer_many`` call. Each is what the ASGI app answers the
same request (``tests/collector/test_front_bridge.py`` compares them), with these differences:

* no refusal carries ``Connection: close``: the front read the whole body, so the connection can be kept;
* the body was read by the front: a bridged upload never holds one of the ``max_reading`` places (the
  front bounds what it holds with ``max_body_bytes``, ``body_timeout`` and ``max_queued``); it counts in
  ``in_flight`` from its admission to its answer, as an ASGI upload does;
* its latency (``ldp_collector_upload_seconds``) runs from the take to the answer handed to the front.

CORS: with ``--allow-origin``, an answer carries the headers :class:`collector.cors.CorsMiddleware` adds for the
upload's ``Origin``. The front adds ``Content-Type: application/json`` and ``Content-Length`` itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any, Protocol

from collector.cors import CorsMiddleware
from collector.http.answers import Answer, error_parts
from collector.http.decode import Checked, SpecEntry, frame_specs
from collector.http.upload import Pending, UploadHandler

__all__ = ["FrontBridge", "FrontLike", "TAKE_BATCH"]

log = logging.getLogger("ldp.collector")

#: uploads taken from the front per wake-up of the loop
TAKE_BATCH = 512

#: what the front queues: (ticket, body, content type, Idempotency-Key, Authorization, Origin, the frame's fields
#: if its pre-check passed)
Upload = tuple[int, bytes, str, str | None, str | None, str | None, Checked | None]
#: what goes back: (ticket, status, body, headers)
Reply = tuple[int, int, bytes, list[tuple[bytes, bytes]]]


class FrontLike(Protocol):
    """The part of ``ldp_front.Front`` the bridge uses."""

    def notify_fd(self) -> int: ...

    def take_nowait(self, max_items: int) -> list[Upload]: ...

    def answer_many(self, answers: list[Reply]) -> int: ...

    def set_frame_specs(self, entries: list[SpecEntry]) -> None: ...


class FrontBridge:
    """Serves a front's queued uploads with ``upload`` (the collector app's :class:`UploadHandler`) on one event
    loop; ``cors`` is the app's CORS middleware when it has one (``--allow-origin``), else ``None``.

    :meth:`attach` starts taking a front's uploads, :meth:`detach` stops (uploads taken before are still
    answered). ``stats`` counts ``taken`` uploads, ``offloaded`` ones (decoded off the loop, as a task),
    ``answered`` ones, ``client_gone`` (answers no live client received) and ``flushes`` (``answer_many`` calls)."""

    def __init__(self, upload: UploadHandler, cors: CorsMiddleware | None = None, *, take: int = TAKE_BATCH) -> None:
        self.upload = upload
        self.cors = cors
        self.take = take
        self.front: FrontLike | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._replies: list[Reply] = []
        self._started: list[float] = []
        self._tasks: set[asyncio.Task[Answer]] = set()
        self.stats = {"taken": 0, "offloaded": 0, "answered": 0, "client_gone": 0, "flushes": 0}

    @classmethod
    def for_app(cls, app: Any, **kw: Any) -> FrontBridge:
        """The bridge of a :class:`collector.http.app.CollectorApp`: its upload handler and CORS middleware."""
        entry = app.entry
        return cls(app.upload, entry if isinstance(entry, CorsMiddleware) else None, **kw)

    def attach(self, front: FrontLike, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Take ``front``'s uploads on ``loop`` (the running loop by default) whenever its eventfd is readable."""
        if self.front is not None:
            raise RuntimeError("this bridge serves a front already; detach it first")
        self.loop = loop if loop is not None else asyncio.get_running_loop()
        self.front = front
        self._fd = front.notify_fd()
        front.set_frame_specs(frame_specs(self.upload.declared))
        self.loop.add_reader(self._fd, self._take)

    def detach(self) -> None:
        """Stop taking uploads (those taken are still answered when their outcome arrives)."""
        if self.loop is not None and self._fd is not None:
            self.loop.remove_reader(self._fd)
        self._fd = None

    # -- taking ---------------------------------------------------------------------------------------

    def _take(self) -> None:
        """The front's eventfd is readable: take up to ``take`` uploads and start each."""
        front = self.front
        if front is None or self._fd is None:
            return
        uploads = front.take_nowait(self.take)
        self.stats["taken"] += len(uploads)
        start, settled, loop = self.upload.start, self._settled, self.loop
        for ticket, body, ctype, key, auth, origin, checked in uploads:
            t0 = time.perf_counter()
            try:
                step = start(body, ctype, key, auth, checked, functools.partial(settled, ticket, origin, t0), loop)
            except Exception:
                log.exception("an upload from the native front failed unexpectedly")
                step = _internal()
            if isinstance(step, Pending):  # (a named tuple: tested before the answers)
                pass  # answered by _settled when its outcome arrives
            elif isinstance(step, asyncio.Task):
                self._tasks.add(step)
                self.stats["offloaded"] += 1
                step.add_done_callback(functools.partial(self._task_done, ticket, origin, t0))
            else:
                self._reply(ticket, origin, step, t0)

    def _settled(self, ticket: int, origin: str | None, t0: float, pending: Pending) -> None:
        try:
            answer = self.upload.finish(pending)
        except Exception:
            log.exception("an upload from the native front failed unexpectedly")
            answer = _internal()
        self._reply(ticket, origin, answer, t0)

    def _task_done(self, ticket: int, origin: str | None, t0: float, task: asyncio.Task[Answer]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            answer = error_parts(503, "shutting_down", "the collector is shutting down; retry later", 1)
        elif task.exception() is not None:
            log.error("an upload from the native front failed unexpectedly", exc_info=task.exception())
            answer = _internal()
        else:
            answer = task.result()
        self._reply(ticket, origin, answer, t0)

    # -- answering ------------------------------------------------------------------------------------

    def _reply(self, ticket: int, origin: str | None, answer: Answer, t0: float) -> None:
        """Queue one answer; the first of a loop iteration schedules the flush."""
        status, body, headers = answer
        if self.cors is not None:
            headers = [*headers, *self.cors.answer_headers(origin)]
        if not self._replies and self.loop is not None:
            self.loop.call_soon(self._flush)
        self._replies.append((ticket, status, body, headers))
        self._started.append(t0)

    def _flush(self) -> None:
        """Hand the answers of this iteration to the front in one call; count their latencies."""
        replies, started = self._replies, self._started
        self._replies, self._started = [], []
        if not replies or self.front is None:
            return
        delivered = self.front.answer_many(replies)
        stats = self.stats
        stats["flushes"] += 1
        stats["answered"] += len(replies)
        stats["client_gone"] += len(replies) - delivered
        now = time.perf_counter()
        self.upload.metrics.observe_uploads([now - t0 for t0 in started])


def _internal() -> Answer:
    """What the ASGI server answers an unexpected failure, in the collector's error shape."""
    return error_parts(500, "internal", "the collector failed on this upload; retry later")
