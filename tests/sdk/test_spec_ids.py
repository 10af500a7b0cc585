"""spec_id: RFC 8785 canonical form, test vectors checked by an independent implementation, memo derivation ids.

``ldp_core/vectors/spec_ids.json`` holds, for a spec of every mechanism, its dict,
its canonical bytes and its id, plus number, string and key-order vectors.
Those were computed by node (``tests/sdk/jcs.js``: ``JSON.stringify`` of
the value with its keys sorted, which is RFC 8785's form, and node's SHA-256),
not by :mod:`ldp_core.canonical`. ``test_vectors_agree_with_node`` re-runs
node on the file here, so the file cannot drift from the standard either;
node is part of the test environment (and of CI): without it the test fails.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldp_core.canonical import CanonicalizationError, canonical_json, canonical_number
from ldp_core.errors import SpecError
from ldp_core.mechanisms import MECHANISMS, make_spec, spec_from_dict
from tests.support.vectors import load_vectors

VECTORS = load_vectors("spec_ids.json")
JCS = Path(__file__).resolve().parent / "jcs.js"


def node_canonical(values: list[Any]) -> list[tuple[str, str]]:
    """``[(canonical string, sha256 hex)]`` of ``values`` as node computes them."""
    node = shutil.which("node")
    assert node is not None, "node is required for the independent RFC 8785 check (install nodejs)"
    out = subprocess.run(
        [node, str(JCS)],
        input=json.dumps(values),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [tuple(x) for x in json.loads(out.stdout)]


def test_vectors_cover_every_mechanism() -> None:
    assert {v["spec"]["mechanism"] for v in VECTORS["specs"]} == set(MECHANISMS)


def test_vectors_agree_with_node() -> None:
    got = node_canonical([v["spec"] for v in VECTORS["specs"]])
    for v, (canon, digest) in zip(VECTORS["specs"], got):
        assert canon == v["canonical"] and digest[:16] == v["spec_id"]
    for kind in ("numbers", "strings", "objects"):
        assert [c for c, _ in node_canonical([v["value"] for v in VECTORS[kind]])] == [
            v["canonical"] for v in VECTORS[kind]
        ]


@pytest.mark.parametrize("v", VECTORS["specs"], ids=lambda v: v["spec_id"])
def test_spec_matches_vector(v: dict[str, Any]) -> None:
    spec = spec_from_dict(v["spec"])
    assert spec.to_dict() == v["spec"]
    assert spec.canonical_bytes() == v["canonical"].encode("utf-8")
    assert spec.spec_id == v["spec_id"] == hashlib.sha256(v["canonical"].encode()).hexdigest()[:16]
    assert spec.memo_derivation_id == v["memo_derivation_id"]
    assert not hasattr(spec, "spec_ids") and not hasattr(spec, "has_id")  # one id names a spec


def test_memo_derivation_ids_are_frozen() -> None:
    """The memo derivation ids key memoized device state: they must never change."""
    assert make_spec("grr", epsilon=1.0, domain_size=4).memo_derivation_id == "26c35ef1fe813001"
    assert make_spec("grr", epsilon=2.0, domain_size=1024).memo_derivation_id == "1e432c2896943cfb"
    assert make_spec("rr", epsilon=0.5).memo_derivation_id == "6bdd76e2ff273ccf"


@pytest.mark.parametrize("v", VECTORS["numbers"], ids=lambda v: v["canonical"])
def test_number_vectors(v: dict[str, Any]) -> None:
    assert canonical_number(v["value"]) == v["canonical"]
    assert canonical_json(v["value"]) == v["canonical"].encode()


@pytest.mark.parametrize("kind", ["strings", "objects"])
def test_string_and_object_vectors(kind: str) -> None:
    for v in VECTORS[kind]:
        assert canonical_json(v["value"]) == v["canonical"].encode("utf-8")


def test_numbers_against_node_on_random_doubles() -> None:
    """Random doubles over the whole exponent range, and random small decimals like ε values."""
    rng = np.random.default_rng(8785)
    xs = [float(x) for x in rng.standard_normal(300) * 10.0 ** rng.integers(-30, 30, 300)]
    xs += [float(np.round(x, int(k))) for x, k in zip(rng.uniform(0, 30, 300), rng.integers(0, 8, 300))]
    xs += [float(i) for i in rng.integers(-(2**53), 2**53, 100)]
    got = node_canonical(xs)
    assert [canonical_number(x) for x in xs] == [c for c, _ in got]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 2**53 + 1, {1: 2}, "\ud800", object()])
def test_values_without_canonical_form_are_refused(bad: Any) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json(bad)


def test_spec_without_canonical_form_is_a_spec_error() -> None:
    spec = make_spec("grr", epsilon=1.0, domain_size=4)
    object.__setattr__(spec, "domain_size", 2**60)  # only a corrupted spec can get here
    with pytest.raises(SpecError):
        spec.canonical_bytes()


def test_equal_specs_have_equal_ids_whatever_the_input_types() -> None:
    a = make_spec("grr", epsilon=2, domain_size=np.int64(1024))
    b = make_spec("grr", epsilon=np.float32(2.0), domain_size=1024)
    assert a.spec_id == b.spec_id == make_spec("grr", epsilon=2.0, domain_size=1024).spec_id


def _write_part(root: Path, metric: str, day: int, spec: Any, records: np.ndarray, spec_id: str, first: int) -> Path:
    """A part file as the sink writes it, but named and tagged with ``spec_id``."""
    import pyarrow as pa

    from pipeline.dataset import FORMAT, part_name, records_to_table, write_table_atomic

    table = records_to_table(records, spec)
    table = table.set_column(
        table.schema.get_field_index("spec_id"),
        "spec_id",
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(records.size, dtype=np.int32)), pa.array([spec_id])),
    )
    table = table.replace_schema_metadata(
        {
            "ldp.format": FORMAT,
            "ldp.metric": metric,
            "ldp.day": str(day),
            "ldp.spec": json.dumps(spec.to_dict(), sort_keys=True),
            "ldp.spec_id": spec_id,
            "ldp.source": json.dumps({"topic": "t", "partition": 0, "first": first, "last": first}),
            "ldp.shuffles": "[]",
        }
    )
    path = root / f"metric={metric}" / f"day={day}" / part_name("t", 0, first, first, spec_id)
    write_table_atomic(path, table)
    return path


def test_a_part_file_under_another_id_than_its_specs_is_refused(tmp_path: Path) -> None:
    """A Parquet part named and tagged with the memo derivation id does not read: a part carries its spec_id."""
    from pipeline.dataset import DatasetError, list_parts, read_part

    spec = make_spec("grr", epsilon=1.0, domain_size=4)
    assert spec.spec_id != spec.memo_derivation_id
    rng = np.random.default_rng(3)
    _write_part(tmp_path, "m", 5, spec, spec.encode(rng.integers(0, 4, 300), rng), spec.memo_derivation_id, 0)
    (part,) = list_parts(tmp_path, "m")
    with pytest.raises(DatasetError, match="its name says"):
        read_part(part)


def test_a_streaming_state_entry_under_another_id_is_refused() -> None:
    from estimator.service import Tally

    spec = make_spec("grr", epsilon=2.0, domain_size=8)
    rng = np.random.default_rng(4)
    t = Tally()
    t.add("m", 3, spec, spec.encode(rng.integers(0, 8, 50), rng), None)
    items = t.to_json_obj()
    assert Tally.from_json_obj(items).n == 50
    items[0]["spec_id"] = spec.memo_derivation_id
    with pytest.raises(Exception, match="says spec"):
        Tally.from_json_obj(items)


def test_rappor_device_randomness_is_keyed_by_the_memo_derivation_id() -> None:
    """RAPPOR's cohort and permanent bits are keyed by the memo derivation id, not the spec id: a change of the
    id scheme keeps every device's PRR (re-drawing it would hand an observer a second independent PRR)."""
    import hmac
    import struct

    spec = make_spec("rappor", epsilon=4.0, domain_size=128, num_bits=64, num_hashes=2, num_cohorts=16)
    assert spec.spec_id != spec.memo_derivation_id
    secret = bytes(range(32))
    block = hmac.new(
        secret,
        b"ldp-telemetry/rappor/cohort/v1\x00" + bytes.fromhex(spec.memo_derivation_id) + struct.pack("<Q", 0),
        hashlib.sha256,
    ).digest()
    assert spec.cohort_of(secret) == int.from_bytes(block[:8], "little") % 16
