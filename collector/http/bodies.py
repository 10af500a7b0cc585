"""Reading request bodies so that slow sockets cannot hold the collector: a whole-body deadline, a minimum
data rate, and reading places that a slow reader gives up to a newcomer (:class:`BodyReaders`).

A per-chunk timeout is what a slow-body attack feeds on (one byte every few seconds keeps it alive); so the
rules here look at the whole body. A body must

* arrive whole within ``body_timeout`` seconds of the request's headers, and
* keep, from ``body_grace`` seconds after the headers, an average of at least ``min_body_rate`` bytes a second:
  by ``t`` seconds after the headers at least ``min_body_rate × (t − body_grace)`` bytes must have arrived.

At most ``max_reading`` bodies are read at once, but a full set of places does not lock newcomers out: the
newcomer takes the place of the oldest reader whose average rate since its headers is below ``min_body_rate``
(a trickling socket); only when every reader keeps the rate is the newcomer answered 503.
Holding every place therefore takes ``max_reading × min_body_rate`` bytes a second of real traffic, not a
few thousand idle sockets.

The checks run in one sweep over every body being read, a bare loop timer every ``min(50 ms, body_timeout /
4)`` while any is (and every ``body_grace / 4`` if that is shorter), so a body is stopped at most one period
after it broke a rule. A timer per body (armed when its headers arrived, cancelled when it was whole) cost
about 6 % of the event loop's time under upload load, though nearly every body arrives whole in its first
chunk; the sweep costs a comparison or two per body being read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from collector.errors import RejectedBatch

__all__ = ["BodyReaders", "BodyTimeout", "read_body"]


class BodyTimeout(Exception):
    """The body was too slow: ``reason`` is ``body_timeout`` (past the whole-body deadline), ``body_too_slow``
    (below the minimum rate) or ``evicted`` (gave its reading place to a newcomer while below the rate)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def read_body(chunks: AsyncIterator[bytes], max_bytes: int, reader: _Reader | None = None) -> bytes:
    """The whole body; :class:`RejectedBatch` (413) as soon as it grows past ``max_bytes``. ``reader`` counts
    the bytes as they arrive."""
    buf = bytearray()
    async for chunk in chunks:
        buf += chunk
        if reader is not None:
            reader.received = len(buf)
        if len(buf) > max_bytes:
            raise RejectedBatch(413, "too_large", f"the body exceeds {max_bytes} bytes; split the batch")
    return bytes(buf)


class _Reader:
    """One body being read: when it started (``time.monotonic``), its deadline (loop time), how much has
    arrived, its task and why it was stopped."""

    __slots__ = ("start", "deadline", "received", "task", "reason")

    def __init__(self, start: float, deadline: float, task: asyncio.Task[object]) -> None:
        self.start = start
        self.deadline = deadline
        self.received = 0
        self.task = task
        self.reason: str | None = None

    def stop(self, reason: str) -> None:
        """End this read with :class:`BodyTimeout` ``reason`` (cancels its task; the reader turns it into that)."""
        if self.reason is None:
            self.reason = reason
            self.task.cancel()


class BodyReaders:
    """The bodies being read (:meth:`read`), with the rules of the module docstring."""

    def __init__(self, *, max_reading: int, body_timeout: float, min_body_rate: float, body_grace: float) -> None:
        self.max_reading = max_reading
        self.body_timeout = body_timeout
        self.min_body_rate = min_body_rate
        self.body_grace = body_grace
        self._readers: dict[_Reader, None] = {}  # insertion-ordered: the oldest first
        self.evicted = 0  # readers that gave their place to a newcomer (counted for tests and logs)
        period = min(0.05, body_timeout / 4)
        if min_body_rate > 0 and body_grace > 0:
            period = min(period, body_grace / 4)
        self.period = max(period, 0.001)
        self._sweep_loop: asyncio.AbstractEventLoop | None = None  # the loop a sweep is scheduled on, if any

    def __len__(self) -> int:
        return len(self._readers)

    def admit(self) -> bool:
        """Whether one more body may be read now: a free place, or one taken from the slowest reader that is
        below the minimum rate (that reader ends with ``evicted``)."""
        if len(self._readers) < self.max_reading:
            return True
        if self.min_body_rate <= 0:
            return False
        now = time.monotonic()
        for reader in self._readers:  # the oldest first: under a slow-body attack the first one looked at
            if reader.received < self.min_body_rate * (now - reader.start):
                del self._readers[reader]
                reader.stop("evicted")
                self.evicted += 1
                return True
        return False  # every reader keeps the rate: a bandwidth matter, answered 503

    async def read(self, chunks: AsyncIterator[bytes], max_bytes: int) -> bytes:
        """The whole body (call after :meth:`admit` answered True), or :class:`BodyTimeout`."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        reader = _Reader(time.monotonic(), loop.time() + self.body_timeout, task)
        self._readers[reader] = None
        if self._sweep_loop is not loop:
            self._sweep_loop = loop
            loop.call_later(self.period, self._sweep, loop)
        try:
            return await read_body(chunks, max_bytes, reader)
        except asyncio.CancelledError:
            if reader.reason is not None and task.uncancel() == 0:
                raise BodyTimeout(reader.reason) from None
            raise  # cancelled by someone else (the server shutting down)
        finally:
            self._readers.pop(reader, None)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer: every reader past its deadline, or below the rate after the grace, is stopped; the next
        sweep is set while any body is being read."""
        if self._sweep_loop is not loop:
            return
        if not self._readers:
            self._sweep_loop = None
            return
        now = loop.time()
        elapsed_base = time.monotonic()
        rate, grace = self.min_body_rate, self.body_grace
        for reader in self._readers:
            if now >= reader.deadline:
                reader.stop("body_timeout")
            elif rate > 0 and reader.received < rate * (elapsed_base - reader.start - grace):
                reader.stop("body_too_slow")
        loop.call_later(self.period, self._sweep, loop)
