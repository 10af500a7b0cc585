"""An in-process stand-in for ``ldp_front.Front`` (the Rust front of native/front), for tests of
:mod:`collector.http.front_bridge` and its benchmark only (not a product): no HTTP, no sockets. A test queues uploads with :meth:`put` as the
native front does once it has read a body; the bridge takes them (``notify_fd`` is an eventfd, readable while
uploads wait, cleared when ``take_nowait`` empties the queue) and answers with ``answer_many``, recorded in
``answers`` (by ticket) and ``calls`` (the size of each ``answer_many`` call)."""

from __future__ import annotations

import asyncio
import collections
import itertools
import os

__all__ = ["LoopbackFront"]

Upload = tuple[int, bytes, str, str | None, str | None, str | None]
Reply = tuple[int, int, bytes, list[tuple[bytes, bytes]]]


class LoopbackFront:
    """The front's queue and answer side, in memory; ``gone`` holds tickets whose client has left."""

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._queue: collections.deque[Upload] = collections.deque()
        self._tickets = itertools.count(1)
        self.answers: dict[int, tuple[int, bytes, list[tuple[bytes, bytes]]]] = {}
        self.calls: list[int] = []
        self.gone: set[int] = set()

    def put(
        self,
        body: bytes,
        content_type: str,
        *,
        key: str | None = None,
        authorization: str | None = None,
        origin: str | None = None,
    ) -> int:
        """Queue one upload as the front does after reading its body; its ticket."""
        ticket = next(self._tickets)
        self._queue.append((ticket, body, content_type, key, authorization, origin))
        os.eventfd_write(self._fd, 1)
        return ticket

    # -- the ldp_front.Front API ------------------------------------------------------------------------

    def notify_fd(self) -> int:
        return self._fd

    def take_nowait(self, max_items: int) -> list[Upload]:
        out = [self._queue.popleft() for _ in range(min(max_items, len(self._queue)))]
        if not self._queue:
            try:
                os.eventfd_read(self._fd)
            except BlockingIOError:
                pass
        return out

    def answer_many(self, answers: list[Reply]) -> int:
        self.calls.append(len(answers))
        live = 0
        for ticket, status, body, headers in answers:
            if ticket in self.answers:
                raise AssertionError(f"ticket {ticket} answered twice")
            self.answers[ticket] = (status, body, list(headers))
            live += ticket not in self.gone
        return live

    def close(self) -> None:
        os.close(self._fd)

    # -- for tests -------------------------------------------------------------------------------------

    async def wait(
        self, tickets: list[int], timeout: float = 30.0
    ) -> list[tuple[int, bytes, list[tuple[bytes, bytes]]]]:
        """The answers of ``tickets``, once all arrived (polling the loop); ``TimeoutError`` after ``timeout`` s."""
        async with asyncio.timeout(timeout):
            while any(t not in self.answers for t in tickets):
                await asyncio.sleep(0.005)
        return [self.answers[t] for t in tickets]
