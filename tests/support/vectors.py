"""Where the golden test vectors live: ``ldp_core/vectors/``, shipped with the package and read by both SDKs.

The RFC vectors (RFC 9474, 9578, 9180), the sealed frame and the RFC 8785 spec ids are transcribed or
computed outside the code under test; ``xxh32.json``, ``domains.json``, ``specs.json`` and ``mechanisms.json``
are written by ``scripts/make-web-vectors`` (``tests/web/make_vectors.py``) and read by ``sdk-web``'s tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ldp_core

__all__ = ["VECTORS_DIR", "load_vectors"]

VECTORS_DIR = Path(ldp_core.__file__).resolve().parent / "vectors"


def load_vectors(name: str) -> Any:
    """The parsed JSON of vector file ``name`` (e.g. ``"spec_ids.json"``)."""
    return json.loads((VECTORS_DIR / name).read_text(encoding="utf-8"))
