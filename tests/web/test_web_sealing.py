"""The web SDK's sealed records open in Python (docs/SEALED.md): the other direction of
``sdk-web/test/sealing.test.ts`` (which opens the frame Python sealed, ``ldp_core/vectors/sealed_frame.json``).

``sdk-web/test/interop/seal.ts`` seals records that the Python encoder made, with ``@hpke/core``, to a
fresh analyzer key; Python's own opener (the one the sink and the estimator use) must open every record
to the same bytes, and none under another day or metric.
"""

from __future__ import annotations

import os

import numpy as np

from ldp_core.mechanisms import spec_from_dict
from ldp_core.wire.frames import decode_frame, read_header
from ldp_core.wire.sealing import AnalyzerKey, KeyRing, open_batch
from tests.web.node_support import run_tsx

SPECS = [
    {"mechanism": "olh", "epsilon": 1.0, "domain_size": 1024},
    {"mechanism": "grr", "epsilon": 2.0, "domain_size": 8},
    {"mechanism": "oue", "epsilon": 1.0, "domain_size": 20},
]


def test_records_the_web_sdk_sealed_open_in_python() -> None:
    key = AnalyzerKey(os.urandom(32))
    other = AnalyzerKey(os.urandom(32))
    rng = np.random.default_rng(7)
    for i, d in enumerate(SPECS):
        spec = spec_from_dict(d)
        plain = spec.encode(rng.integers(0, spec.domain_size, size=25), rng)
        day = 20_400 + i
        out = run_tsx(
            "test/interop/seal.ts",
            f"metric_{i}",
            spec.spec_id,
            str(day),
            key.key_id,
            key.public_key.hex(),
            plain.tobytes().hex(),
            str(spec.record_size),
            timeout=120,
        )
        frame = bytes.fromhex(out["frame_hex"])
        h = read_header(frame)
        assert h.sealed and (h.metric, h.day, h.n_records) == (f"metric_{i}", day, 25)
        batch = decode_frame(frame, spec)
        res = open_batch(batch, KeyRing([key]))
        assert res.failed == 0
        assert res.batch.records.tobytes() == plain.tobytes()
        # the binding: the same records under another key or day do not open
        assert open_batch(batch, KeyRing([other])).failed == 25
        moved = decode_frame(_with_day(frame, day + 1), spec)
        assert open_batch(moved, KeyRing([key])).failed == 25


def _with_day(frame: bytes, day: int) -> bytes:
    import struct
    import zlib

    b = bytearray(frame)
    struct.pack_into("<I", b, 16, day)
    struct.pack_into("<I", b, len(b) - 4, zlib.crc32(bytes(b[:-4])))
    return bytes(b)
