"""Readiness and counters of the workers without an HTTP port, as a file an operator (and a healthcheck) reads.

``ldp shuffler``, ``ldp sink`` and ``ldp estimator`` take ``--status-file
PATH``; :class:`StatusFile` keeps ``PATH`` a JSON object (written
atomically, :func:`ldp_core.files.write_atomic`)::

    {"service": "shuffler", "pid": 4711, "state": "ready", "ready": true, "since": 1764633600.1,
     "detail": "", "transport": "kafka://kafka:9092", "group": "ldp-shuffler", "member": "shuffler-0",
     "updated": 1764633642.5, "counters": {...}}

``state`` and ``ready`` are the processor's (:attr:`pipeline.processor.StreamProcessor.run_state`);
the file is rewritten on every change of state and every ``every`` seconds
(``updated``), so a stale file means a hung process. ``counters`` are the
service's (the shuffler's are its durable totals, see :mod:`collector.shuffler`).

The check a healthcheck runs is this module's command line::

    python -m pipeline.status /tmp/ldp-shuffler.json --max-age 60   # exit 0 iff ready and fresh
    python -m pipeline.status --url http://127.0.0.1:8090/readyz      # exit 0 iff the URL answers 200

(the second form for the HTTP services: the collector's and the estimator's
``GET /readyz``), so that the compose file needs neither curl nor a shell.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["StatusFile", "check_file", "check_url", "main"]


class StatusFile:
    """Keeps ``path`` the JSON status of ``processor`` (see the module docstring).

    ``counters`` returns the service's counters (called under no lock of
    ours; it must be safe from another thread). :meth:`start` adds itself to
    the processor's state listeners and writes every ``every`` seconds until
    ``stop`` is set, then once more.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        service: str,
        processor: Any,
        counters: Callable[[], Mapping[str, Any]] = dict,
        *,
        every: float = 5.0,
    ) -> None:
        self.path = Path(path)
        self.service = service
        self.processor = processor
        self.counters = counters
        self.every = float(every)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {"service": self.service, "pid": os.getpid()}
        out.update(self.processor.run_status())
        out["updated"] = round(time.time(), 3)
        out["counters"] = dict(self.counters())
        return out

    def write(self) -> None:
        from ldp_core.files import write_atomic

        body = json.dumps(self.snapshot(), sort_keys=True).encode()
        with self._lock:
            write_atomic(self.path, body)

    def start(self, stop: threading.Event) -> StatusFile:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.processor.state_listeners.append(lambda _p, _s: self.write())
        self.write()

        def loop() -> None:
            while not stop.wait(self.every):
                try:
                    self.write()
                except OSError as exc:  # a full disk must not stop the worker; the stale file says it
                    print(f"status file {self.path}: {exc}", file=sys.stderr)

        self._thread = threading.Thread(target=loop, name=f"ldp-{self.service}-status", daemon=True)
        self._thread.start()
        return self


def check_file(path: str | os.PathLike[str], max_age: float = 60.0, now: float | None = None) -> tuple[bool, str]:
    """Whether the status file says ready and was updated within ``max_age`` seconds, and why not."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return False, f"no readable status file at {path}: {exc}"
    age = (time.time() if now is None else now) - float(obj.get("updated", 0.0))
    if age > max_age:
        return False, f"{obj.get('service')}: status is {age:.0f} s old (more than {max_age:g} s): hung or gone"
    if not obj.get("ready"):
        return False, f"{obj.get('service')}: {obj.get('state')} ({obj.get('detail') or 'no detail'})"
    return True, f"{obj.get('service')}: ready"


def check_url(url: str, timeout: float = 5.0) -> tuple[bool, str]:
    """Whether ``GET url`` answers 200."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - an operator's own URL
            return r.status == 200, f"{url}: {r.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: {exc.code} {exc.read()[:200].decode(errors='replace')}"
    except (OSError, ValueError) as exc:
        return False, f"{url}: {exc}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pipeline.status", description="Exit 0 if a worker is ready (a healthcheck)."
    )
    p.add_argument("path", nargs="?", help="a --status-file of ldp shuffler, sink, estimator or fl job")
    p.add_argument("--max-age", type=float, default=60.0, help="seconds after which the file is stale (default 60)")
    p.add_argument("--url", default=None, help="instead of a file: a readiness URL that must answer 200")
    args = p.parse_args(argv)
    if (args.path is None) == (args.url is None):
        p.error("give a status file or --url")
    ok, why = check_url(args.url) if args.url else check_file(args.path, args.max_age)
    print(why, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
