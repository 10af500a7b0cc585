"""Whether a process is alive, by its pid (standard library only): the one probe the SDK's outbox leases and the
collector's per-worker metrics files share."""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


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
