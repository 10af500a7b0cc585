"""ldp_core.processes: a server's built heap frozen out of the cyclic GC's sight (``ldp collector`` does it
before serving). Run in a child process, so that this one's heap stays as it is."""

from __future__ import annotations

import subprocess
import sys


def test_a_server_s_built_heap_leaves_the_cyclic_collector_s_sight() -> None:
    code = (
        "import gc\n"
        "import collector.http.app\n"  # what a collector has built before it serves, roughly
        "from ldp_core.processes import freeze_built_heap\n"
        "before = gc.get_freeze_count()\n"
        "freeze_built_heap()\n"
        "print(before, gc.get_freeze_count(), len(gc.get_objects(generation=2)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    before, frozen, oldest = (int(x) for x in out.stdout.split())
    assert before == 0
    assert frozen > 10_000  # the modules and everything they built
    assert oldest < frozen / 100  # the oldest generation, which a full collection walks, is nearly empty
