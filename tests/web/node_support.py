"""Running the TypeScript SDK's Node programs from pytest: node and ``npm ci`` are required, loudly."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["SDK_WEB", "node_path", "run_tsx"]

SDK_WEB = Path(__file__).resolve().parents[2] / "sdk-web"


def node_path() -> str:
    """The ``node`` executable; an assertion error (not a skip) without it or without ``npm ci``."""
    node = shutil.which("node")
    assert node is not None, "node (20 or later) is required for the web SDK's tests: install nodejs and npm"
    assert (SDK_WEB / "node_modules" / "tsx").is_dir(), (
        f"the web SDK's packages are not installed: run `npm ci` in {SDK_WEB} (scripts/test does)"
    )
    return node


def run_tsx(script: str, *args: str, timeout: float = 600.0) -> Any:
    """Run ``sdk-web/<script>`` with tsx; its stdout parsed as JSON. A non-zero exit fails with its stderr."""
    proc = subprocess.run(
        [node_path(), "--import", "tsx", script, *args],
        cwd=SDK_WEB,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout)
