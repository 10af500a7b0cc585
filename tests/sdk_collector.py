"""The collector the SDK tests upload to, behind one fixture.

``collector_factory(**options)`` starts a collector process on 127.0.0.1 and
returns a handle with ``url``, ``stats()``, ``frames()`` (every accepted
frame, once per batch id) and ``stop()``. Today it runs the stdlib TEST
RECEIVER (:mod:`tests.sdk_test_receiver`); to run the SDK tests against the
real collector, make :data:`COLLECTOR` a class with the same four members
that starts it.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

__all__ = ["TestReceiverProcess", "COLLECTOR", "collector_factory"]

ROOT = pathlib.Path(__file__).resolve().parent.parent


class TestReceiverProcess:
    """The test receiver in a subprocess; its accepted frames live in ``directory``."""

    __test__ = False  # not a test class

    def __init__(self, directory: pathlib.Path, **options: Any) -> None:
        self.directory = pathlib.Path(directory)
        args = [sys.executable, "-m", "tests.sdk_test_receiver", "--dir", str(self.directory)]
        for key, val in options.items():
            flag = "--" + key.replace("_", "-")
            if val is True:
                args.append(flag)
            elif val is not None and val is not False:
                args += [flag, str(val)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("PORT "):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"test receiver did not start: {line!r} {err}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.url + "/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def frames(self) -> list[bytes]:
        return [p.read_bytes() for p in sorted(self.directory.glob("*.frame"))]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


#: The one line to change to test against the real collector.
COLLECTOR: Callable[..., Any] = TestReceiverProcess


@pytest.fixture
def collector_factory(tmp_path: pathlib.Path) -> Iterator[Callable[..., Any]]:
    started: list[Any] = []

    def start(**options: Any) -> Any:
        handle = COLLECTOR(tmp_path / f"collector{len(started)}", **options)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()
