"""The device side stays light: client_sdk never loads server-side packages.

Each check runs in a fresh interpreter (the test process itself has loaded
numba and scipy long ago) and inspects ``sys.modules`` after importing
``client_sdk``, a mechanism module and encoding a few reports through it,
the wire format included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from ldp_core.mechanisms import MECHANISMS

FORBIDDEN = ["numba", "pandas", "pyarrow", "fastapi", "kafka", "scipy", "matplotlib"]

_PROBE = textwrap.dedent(
    """
    import importlib, json, sys
    import numpy as np
    import client_sdk
    from ldp_core.mechanisms import MECHANISMS, make_spec
    from ldp_core.wire.frames import ReportBatch, decode_frame, encode_frame, encode_json
    name = sys.argv[1]
    if name:
        module = MECHANISMS[name].split(":")[0]
        importlib.import_module(module)
        rng = np.random.default_rng(0)
        kind = getattr(importlib.import_module(module), MECHANISMS[name].split(":")[1]).kind
        if kind == "heavy_hitters":
            spec = make_spec(name, epsilon=1.0, length=6)
            records = spec.encode(["hello", "wörld"], rng)
            spec.encode_one("x", rng, 0) if name == "pem" else spec.encode_one("x", rng)
        elif kind != "frequency":
            spec = make_spec(name, epsilon=1.0, low=0, high=1)
            records = spec.encode(rng.random(16), rng)
            spec.encode_one(0.5, rng)
        else:
            spec = make_spec(name, epsilon=1.0) if name == "rr" else make_spec(name, epsilon=1.0, domain_size=16)
            records = spec.encode(np.arange(spec.domain_size), rng)
            spec.encode_one(1, rng)
            spec.count_variance(np.ones(spec.domain_size))
        batch = ReportBatch("probe", spec, 1, records)
        decode_frame(encode_frame(batch), spec)
        encode_json(batch)
    loaded = sorted({m.split(".")[0] for m in sys.modules})
    print(json.dumps(loaded))
    """
)


def loaded_top_level_modules(name: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", _PROBE, name], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_client_sdk_is_light() -> None:
    loaded = loaded_top_level_modules("")
    assert "client_sdk" in loaded and "numpy" in loaded
    assert not loaded & set(FORBIDDEN), sorted(loaded & set(FORBIDDEN))


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_mechanism_module_and_encoding_are_light(name: str) -> None:
    loaded = loaded_top_level_modules(name)
    assert not loaded & set(FORBIDDEN), f"{name} loads {sorted(loaded & set(FORBIDDEN))}"
    assert not loaded & {"estimator", "collector", "simulator"}, f"{name} loads a server package"
