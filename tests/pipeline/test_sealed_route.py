"""The routing of sealed records by encapsulated key and the envelope fields of a split release (issue 31)."""

from __future__ import annotations

import json

import numpy as np

from ldp_core.metrics import parse_metrics
from ldp_core.wire.frames import ReportBatch
from ldp_core.wire.sealed import ENC_SIZE, KEY_ID_SIZE
from ldp_core.wire.sealing import new_key_file, seal_batch
from pipeline.envelope import _HEAD, ShuffleMeta, decode_envelope, encode_envelope
from pipeline.topics import sealed_route
from tests.support.metrics_docs import hashed, metric, metrics_doc


def test_a_sealed_record_routes_by_its_encapsulated_key_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, key = new_key_file(tmp_path)
    doc = metrics_doc(
        analyzer_keys=[key.public.to_dict()],
        word=metric("olh", 1.0, hashed(64, 1), sealed=True, description="word"),
    )
    spec = parse_metrics(doc)["word"].spec
    rng = np.random.default_rng(2)
    sealed = seal_batch(ReportBatch("word", spec, 20000, spec.encode(rng.integers(0, 64, 4000), rng)), key.public)
    width = sealed.spec.record_size
    raw = sealed.records.view(np.uint8).reshape(-1, width)
    idx = sealed_route(sealed.records, width, 8)
    # the first 8 bytes of each encapsulated key, little-endian, modulo 8
    enc = raw[:, KEY_ID_SIZE : KEY_ID_SIZE + ENC_SIZE]
    expect = [int.from_bytes(bytes(e[:8]), "little") % 8 for e in enc]
    assert idx.tolist() == expect
    # the same records in another order, inside another batch: the same routes (a copy keeps its key)
    perm = rng.permutation(len(idx))
    assert sealed_route(sealed.records[perm], width, 8).tolist() == idx[perm].tolist()
    # ciphertext, tag and key id play no part
    other = raw.copy()
    other[:, KEY_ID_SIZE + ENC_SIZE :] ^= 0xFF
    other[:, :KEY_ID_SIZE] = 0
    assert sealed_route(other, width, 8).tolist() == idx.tolist()
    # uniform over the sub-keys: each of 8 counts 4000/8 = 500 within 5.7 binomial sd (sd = sqrt(4000·1/8·7/8) = 20.9;
    # a false alarm: 8 · P(|Z| > 5.7) ≈ 1e-7)
    counts = np.bincount(idx, minlength=8)
    assert np.all(np.abs(counts - 500) < 5.7 * np.sqrt(4000 * 1 / 8 * 7 / 8))


def test_the_release_fields_travel_only_with_a_split_release() -> None:
    whole = ShuffleMeta(shuffle_id="ab" * 16, n=3, epsilon0=1.0)
    assert set(whole.to_json()) == {
        "shuffle_id",
        "n",
        "epsilon0",
        "central_epsilon",
        "central_delta",
        "bound",
        "sources",
    }  # as before: consumers that predate the split read it
    part = ShuffleMeta("cd" * 16, 2, 1.0, 0.5, 1e-6, "b", 1, release_id="ab" * 16, release_n=3, part=1, parts=4)
    spec = parse_metrics(
        {
            "format": "ldp-metrics/1",
            "metrics": {
                "t": {
                    "owner": "o@example.org",
                    "expires": "2099-12-31",
                    "max_reports_per_day": 1,
                    "description": "t",
                    "mechanism": {"mechanism": "grr", "epsilon": 1.0},
                    "domain": {"kind": "dictionary", "values": ["a", "b"]},
                }
            },
        }
    )["t"].spec
    rng = np.random.default_rng(1)
    batch = ReportBatch("t", spec, 20000, spec.encode(np.array([0, 1]), rng), bytes.fromhex("cd" * 16))
    data = encode_envelope(part, batch)
    meta_len = _HEAD.unpack_from(data, 0)[3]
    assert json.loads(data[_HEAD.size : _HEAD.size + meta_len])["release_n"] == 3
    assert decode_envelope(data, {spec.spec_id: spec}).meta == part


def test_the_consumers_route_check_derives_n_itself_and_only_compares_the_envelopes_claim(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from pipeline.envelope import ShuffledBatch
    from pipeline.routes import SealedRoutes, sealed_spread
    from pipeline.topics import metric_day_key, spread_keys
    from pipeline.transport.base import partition_for

    _, key = new_key_file(tmp_path)
    doc = metrics_doc(
        analyzer_keys=[key.public.to_dict()], word=metric("olh", 1.0, hashed(64, 1), sealed=True, description="w")
    )
    spec = parse_metrics(doc)["word"].spec
    rng = np.random.default_rng(9)
    sealed = seal_batch(ReportBatch("word", spec, 20000, spec.encode(rng.integers(0, 64, 400), rng)), key.public)
    # N: 1 keyed by metric-day, else the spread (0: the partitions), never more than the partitions
    assert [sealed_spread("metric-day", 3, 8), sealed_spread("batch", 0, 8), sealed_spread("batch", 3, 8)] == [1, 8, 3]
    assert sealed_spread("batch", 16, 8) == 8
    # keyed by metric-day, every sealed record belongs on the metric-day key's partition
    whole = ShuffledBatch(ShuffleMeta("ab" * 16, len(sealed), 1.0), sealed)
    home = partition_for(metric_day_key("word", 20000), 8)
    md = SealedRoutes("metric-day")
    md.partitions = 8
    assert md.check(whole, home).misrouted == 0 and md.check(whole, (home + 1) % 8).misrouted == len(sealed)
    # spread over 8: each record belongs on its sub-key's partition; exactly those read elsewhere are dropped
    routes = SealedRoutes()
    routes.partitions = 8
    want = np.array([partition_for(k, 8) for k in spread_keys("word", 20000, 8, 8)])[
        sealed_route(sealed.records, sealed.spec.record_size, 8)
    ]
    chk = routes.check(whole, 3)
    assert chk.misrouted == int(np.count_nonzero(want != 3)) and len(chk.sb.batch) == int(np.count_nonzero(want == 3))
    assert chk.sb.meta.n == len(chk.sb.batch)
    # a claim in the envelope that is no positive integer up to the partitions is compared with nothing
    for bogus in ("8", True, 0, -2, 10**9):
        part = ShuffledBatch(dataclasses.replace(whole.meta, part=0, parts=bogus), sealed)  # type: ignore[arg-type]
        got = routes.check(part, 3)
        assert got.misrouted == chk.misrouted and got.other_n == 0 and got.mismatch is None
    assert routes.mismatch is None
