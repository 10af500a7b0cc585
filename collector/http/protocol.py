"""The collector's HTTP/1.1 protocol: uvicorn's httptools protocol with a request-head deadline and a
connection cap that evicts the oldest connection still waiting for its head.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but only once a response has been
sent, and any byte cancels that timer: a socket that connects and sends nothing, or a request line and then
one header byte at a time, is kept for ever. :class:`CollectorProtocol` arms a timer when a connection opens
and again when an answer has been sent; unless a complete request line and headers have arrived within
``header_timeout`` seconds it closes the connection (idle keep-alive included). Body reading has its own
rules in :mod:`collector.http.bodies`.

Beyond ``max_connections`` open connections, each new one makes the oldest connection still waiting for its
head close (honest clients send their head at once, so they are almost never the oldest waiting); if none
waits, the newcomer is closed. ``ldp collector`` raises the process's open-file limit to its hard limit and
keeps ``max_connections`` below it, so the event loop never runs out of file descriptors (asyncio stops
accepting for a second when ``accept`` fails with ``EMFILE``).

Use :func:`protocol_factory` as ``uvicorn.Config(http=...)``: a :func:`functools.partial` of the class, which
pickles by reference, so it also reaches ``--workers`` processes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
import weakref
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["CollectorProtocol", "ConnectionStats", "protocol_factory", "server_options", "stats_of"]

log = logging.getLogger("ldp.collector")

#: file descriptors kept for everything but client connections (listeners, transport, SQLite, decode pipes)
SPARE_FDS = 256


class ConnectionStats:
    """Per server: the connections waiting for their request head (oldest first) and what was closed."""

    def __init__(self) -> None:
        self.waiting: dict[CollectorProtocol, None] = {}  # insertion-ordered: the oldest waiting first
        self.header_timeouts = 0
        self.evicted = 0


_STATS: weakref.WeakKeyDictionary[Any, ConnectionStats] = weakref.WeakKeyDictionary()


def stats_of(server_state: Any) -> ConnectionStats:
    """The :class:`ConnectionStats` of one uvicorn server (its ``server_state``)."""
    stats = _STATS.get(server_state)
    if stats is None:
        stats = _STATS[server_state] = ConnectionStats()
    return stats


class CollectorProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head deadline and the connection cap (module docstring)."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        header_timeout: float = 5.0,
        max_connections: int = 8192,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self._stats = stats_of(server_state)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            waiting = self._stats.waiting
            oldest = next(iter(waiting), None)
            self._stats.evicted += 1
            if oldest is None:
                transport.close()
                return
            oldest._close_waiting()
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._head_arrived()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # the next request's head is already here
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._await_head()

    # -- the head deadline ---------------------------------------------------------------------------

    def _await_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_deadline)
        self._stats.waiting.pop(self, None)
        self._stats.waiting[self] = None

    def _head_arrived(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._stats.waiting.pop(self, None)

    def _head_deadline(self) -> None:
        self._head_timer = None
        self._stats.header_timeouts += 1
        self._close_waiting()

    def _close_waiting(self) -> None:
        self._head_arrived()
        if not self.transport.is_closing():
            self.transport.close()


def protocol_factory(header_timeout: float, max_connections: int) -> Any:
    """What ``uvicorn.Config(http=...)`` takes: :class:`CollectorProtocol` with these limits."""
    return functools.partial(CollectorProtocol, header_timeout=header_timeout, max_connections=max_connections)


def raise_open_files() -> int:
    """Raise this process's soft open-file limit to its hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def server_options(settings: Any) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords for a collector with ``settings`` (:class:`CollectorSettings`): the
    protocol with its head deadline and connection cap, and the keep-alive timeout. Raises the open-file limit
    first and keeps ``max_connections`` below it (a warning says when it had to be lowered)."""
    limit = raise_open_files()
    cap = settings.max_connections
    if limit != resource.RLIM_INFINITY and cap > limit - SPARE_FDS:
        cap = max(16, limit - SPARE_FDS)
        log.warning(
            "max_connections %d lowered to %d: the open-file limit is %d (raise it with ulimit -n)",
            settings.max_connections,
            cap,
            limit,
        )
    return {
        "http": protocol_factory(settings.header_timeout, cap),
        "timeout_keep_alive": max(1, int(settings.header_timeout)),
    }
