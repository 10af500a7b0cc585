"""Progress on stderr for the commands that run longer than a couple of seconds.

One rule for every command: progress goes to stderr, never to stdout, and only when it helps a person
watching. It is shown when stderr is a terminal, unless ``--no-progress`` is given or the command prints
``--json`` (a program reads that); ``--progress`` forces it on (a log file, a CI run). So piped output
and ``--json`` output are byte-for-byte what they were without progress.

Two shapes: :func:`bar` (a tqdm bar, for counted work: rounds of a scenario, devices enrolled) and
:func:`lines` (one line per event, for services and phases: a job's rounds, the demo's phases, Spark's
stages), both silent when progress is off.

Only the standard library is imported at module level (``ldp --help`` must stay fast); tqdm is imported
when a bar is made.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["add_progress_flags", "progress_enabled", "bar", "lines", "Lines"]


def add_progress_flags(p: argparse.ArgumentParser) -> None:
    """``--no-progress`` (never) and ``--progress`` (always, even when stderr is not a terminal)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--no-progress", action="store_true", help="never show progress on stderr")
    g.add_argument(
        "--progress",
        action="store_true",
        help="show progress on stderr even when it is not a terminal or with --json (default: only on a terminal)",
    )


def progress_enabled(args: argparse.Namespace, stream: TextIO | None = None) -> bool:
    """Whether to show progress on ``stream`` (stderr by default): forced by ``--progress``; off with
    ``--no-progress`` or ``--json``; else only when the stream is a terminal."""
    out = sys.stderr if stream is None else stream
    if getattr(args, "no_progress", False):
        return False
    if getattr(args, "progress", False):
        return True
    if getattr(args, "json", False):
        return False
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty())


def bar(args: argparse.Namespace, desc: str, unit: str, total: int | None = None, stream: TextIO | None = None) -> Any:
    """A tqdm bar on ``stream`` (stderr by default), disabled (and silent) unless :func:`progress_enabled`.
    Use it as a context manager and call ``update()``."""
    from tqdm import tqdm

    out = sys.stderr if stream is None else stream
    return tqdm(total=total, unit=unit, desc=desc, file=out, disable=not progress_enabled(args, out), leave=False)


class Lines:
    """Prints ``<prefix>: <message> (at <elapsed> s)`` lines (seconds since the printer was made) on a stream when on; does nothing when off."""

    def __init__(
        self, prefix: str, on: bool, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.prefix = prefix
        self.on = on
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.started = clock()

    def elapsed(self) -> float:
        """Seconds since the printer was made."""
        return self.clock() - self.started

    def __call__(self, message: str) -> None:
        if self.on:
            print(f"{self.prefix}: {message} (at {self.elapsed():.1f} s)", file=self.stream, flush=True)


def lines(args: argparse.Namespace, prefix: str, stream: TextIO | None = None) -> Lines:
    """A :class:`Lines` printer on ``stream`` (stderr by default), on only if :func:`progress_enabled`."""
    out = sys.stderr if stream is None else stream
    return Lines(prefix, progress_enabled(args, out), out)
