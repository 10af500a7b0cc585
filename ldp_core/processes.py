"""Processes (standard library only): whether one is alive, by its pid (the one probe the SDK's outbox leases and
the collector's per-worker metrics files share), and a long-running server's heap frozen once it is built."""

from __future__ import annotations

import gc
import os

__all__ = ["freeze_built_heap", "pid_alive"]


#: the youngest generation's threshold of a server (CPython's default: 700). A collection walks every young
#: object still alive (an upload's objects while it is in flight), so the default walked the same objects many
#: times over their lives: 0.30 s of GC per 110,000 uploads of the native-front collector, 0.06-0.09 s with
#: 10,000 (issue 31; docs/benchmarks/PIPELINE.md, session 13). Its uploads make no reference cycles
#: (tests/collector/test_front_bridge.py), so collecting less often holds no more memory than a few
#: thousand young objects.
SERVER_GC_THRESHOLD = 10_000


def freeze_built_heap() -> None:
    """For a server about to serve: what the process built so far (modules, the app) lives as long as it does, so
    it leaves the cyclic collector's sight (``gc.freeze``), whose oldest generation would otherwise walk it again
    and again under load; and the youngest generation is collected every :data:`SERVER_GC_THRESHOLD` objects."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(SERVER_GC_THRESHOLD, older, oldest)


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
