"""The committed vectors of the TypeScript SDK are exactly what the Python SDK generates now.

If this fails after a deliberate change to an encoder, the frame or the spec ids, run
``scripts/make-web-vectors`` and make the TypeScript SDK pass its tests against the new files
(``cd sdk-web && npm test``): the two SDKs must change together.
"""

from __future__ import annotations

import json

import pytest

from tests.web.make_vectors import VECTORS_DIR, build_vectors, render

CONTENT = build_vectors()


@pytest.mark.parametrize("fname", sorted(CONTENT))
def test_committed_vectors_match_the_python_sdk(fname: str) -> None:
    path = VECTORS_DIR / fname
    assert path.exists(), f"{path} is missing: run scripts/make-web-vectors"
    committed = path.read_text(encoding="utf-8")
    assert committed == render(CONTENT[fname]), f"{path} is stale: run scripts/make-web-vectors"


def test_vectors_cover_every_frequency_oracle_of_the_issue() -> None:
    names = {m["name"] for m in CONTENT["mechanisms.json"]["mechanisms"]}
    assert names == {"rr", "grr", "oue", "rappor", "olh", "cms", "hcms", "hr"}
    for m in CONTENT["mechanisms.json"]["mechanisms"]:
        assert m["cases"], m["name"]
        assert all(c["draws"] for c in m["cases"]), f"{m['name']}: every report consumes randomness"


def test_files_parse_as_json() -> None:
    for fname in CONTENT:
        assert json.loads((VECTORS_DIR / fname).read_text(encoding="utf-8")) == json.loads(render(CONTENT[fname]))


def test_kind_vectors_cover_every_other_mechanism() -> None:
    """kinds.json covers every registered mechanism that mechanisms.json does not (numeric, repeated, heavy
    hitters), each with cases that consumed randomness where the encoder draws any."""
    from ldp_core.mechanisms import MECHANISMS

    kinds = CONTENT["kinds.json"]
    names = {m["name"] for m in kinds["numeric"] + kinds["memoized"]} | {"pem", "sfp"}
    freq = {m["name"] for m in CONTENT["mechanisms.json"]["mechanisms"]}
    assert names | freq == set(MECHANISMS)
    assert kinds["pem"] and kinds["sfp"]
    for m in kinds["numeric"] + kinds["pem"] + kinds["sfp"]:
        assert m["cases"] and all(c["draws"] for c in m["cases"]), m["canonical"]
