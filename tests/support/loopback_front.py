"""An in-process stand-in for ``ldp_front.Front`` (the Rust front of native/front), for tests of
:mod:`collector.http.front_bridge` and its benchmark only (not a product): no HTTP, no sockets. A test queues uploads with :meth:`put` as the
native front does once it has read a body; the bridge takes them (``notify_fd`` is an eventfd, readable while
uploads wait, cleared when ``take_nowait`` empties the queue) and answers with ``answer_many``, recorded in
``answers`` (by ticket) and ``calls`` (the size of each ``answer_many`` call).

The frame pre-check (``set_frame_specs``, native/front/src/frames.rs) is the real one when ``precheck`` is an
``ldp_front.Front`` (its ``check_frame``), else no upload is pre-checked (each is decoded in full, as an upload
the front could not check)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import socket
from collections.abc import Iterator
from typing import Any

__all__ = ["LoopbackFront", "native_checker"]

Upload = tuple[int, bytes, str, str | None, str | None, str | None, Any]
Reply = tuple[int, int, bytes, list[tuple[bytes, bytes]]]


class LoopbackFront:
    """The front's queue and answer side, in memory; ``gone`` holds tickets whose client has left."""

    def __init__(self, precheck: Any = None) -> None:
        self.precheck = precheck
        self.frame_specs: list[Any] | None = None  # what the bridge registered
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
        checked = self.precheck.check_frame(body) if self.precheck is not None else None
        self._queue.append((ticket, body, content_type, key, authorization, origin, checked))
        os.eventfd_write(self._fd, 1)
        return ticket

    # -- the ldp_front.Front API ------------------------------------------------------------------------

    def notify_fd(self) -> int:
        return self._fd

    def set_frame_specs(self, entries: list[Any]) -> None:
        self.frame_specs = entries
        if self.precheck is not None:
            self.precheck.set_frame_specs(entries)

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


@contextlib.contextmanager
def native_checker() -> Iterator[Any]:
    """A real ``ldp_front.Front`` on a 127.0.0.1 port-0 socket nobody connects to, for its frame pre-check
    (``LoopbackFront(precheck=...)``); closed on exit."""
    import ldp_front  # built by scripts/bootstrap; a missing module fails the test that asked for it

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        front = ldp_front.Front(sock.fileno(), None)
        try:
            yield front
        finally:
            front.close(0.0)
