"""Processes (standard library only): whether one is alive, by its pid (the one probe the SDK's outbox leases and
the collector's per-worker metrics files share), and a long-running server's heap frozen once it is built."""

from __future__ import annotations

import gc
import os

__all__ = ["freeze_built_heap", "pid_alive"]


def freeze_built_heap() -> None:
    """For a server about to serve: what the process built so far (modules, the app) lives as long as it does, so
    it leaves the cyclic collector's sight (``gc.freeze``), whose oldest generation would otherwise walk it again
    and again under load."""
    gc.collect()
    gc.freeze()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0). Alive when we may not signal it (another user's process),
    when it is this process, and where no safe probe exists (not POSIX: the caller's own timeout decides)."""
    if pid <= 0:
        return False
    if pid == os.getpid() or os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
