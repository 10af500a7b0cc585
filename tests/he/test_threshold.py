"""Threshold CKKS (ldp_core.he.threshold): the aggregate is right, and no party short of all can decrypt.

The precision bound is :func:`estimator.he.aggregate.precision_bound`: seven standard deviations of the
flooding noise in a decoded slot, √(N·parties/3)·2^k/(Δ·Δ_w), plus 1e-9 for SEAL's own noise; the
chance that any of the 8192 compared values exceeds it is below 1e-8.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.he.aggregate import he_weighted_mean, precision_bound
from ldp_core.he.threshold import (
    CkksContext,
    HeError,
    KeyParty,
    MissingShareError,
    collective_public_key,
    combine,
    decode_sum,
)

PARTIES = 3


@pytest.fixture(scope="module")
def setup():
    ctx = CkksContext()
    parties = [KeyParty(ctx) for _ in range(PARTIES)]
    pk = collective_public_key(ctx, [p.public_share() for p in parties])
    rng = np.random.default_rng(7)
    updates = [rng.normal(scale=0.1, size=5000) for _ in range(4)]  # 5000 values: two ciphertexts each
    weights = np.array([30.0, 10.0, 45.0, 15.0])
    return ctx, parties, pk, updates, weights


def _aggregate(ctx, pk, updates, weights):
    share = weights / weights.sum()
    cts = [ctx.encrypt(pk, u)[0] for u in updates]
    return ctx.add_many([ctx.multiply_scalar(c, float(w)) for c, w in zip(cts, share)])


def test_weighted_mean_within_the_precision_bound(setup):
    ctx, parties, pk, updates, weights = setup
    out = he_weighted_mean(ctx, parties, pk, updates, weights)
    truth = (weights[:, None] * np.stack(updates)).sum(0) / weights.sum()
    bound = precision_bound(ctx.params, PARTIES)
    assert out.mean.shape == truth.shape
    assert np.abs(out.mean - truth).max() <= bound
    assert bound < 1e-5  # and the bound itself is useful for model updates
    assert out.upload_bytes_per_client > 100 * 8 * ctx.params.slots // 100  # ciphertexts, not the raw vector


def test_one_partial_decryption_alone_reveals_nothing(setup):
    """The server (which has c0) with one key party's answer gets c0 + c1·s_i: the other shares' c1·s_j
    remain, uniform mod Q, so the decoded values are huge and uncorrelated with the truth (|r| below
    6/√4096, six standard deviations of a correlation between independent vectors)."""
    ctx, parties, pk, updates, weights = setup
    agg = _aggregate(ctx, pk, updates, weights)
    truth = ((weights[:, None] * np.stack(updates)).sum(0) / weights.sum())[: ctx.params.slots]
    partials = [p.partial_decrypt(agg) for p in parties]
    for subset in ([partials[0]], [partials[1]], partials[:2], partials[1:]):  # one, or all but one
        got = decode_sum(ctx, agg, subset)
        assert np.abs(got - truth).min() > 1e3
        r = np.corrcoef(got, truth)[0, 1]
        assert abs(r) < 6 / math.sqrt(ctx.params.slots)
    full = decode_sum(ctx, agg, partials)
    assert np.abs(full - truth).max() <= precision_bound(ctx.params, PARTIES)


def test_decryption_refuses_a_missing_share(setup):
    ctx, parties, pk, updates, weights = setup
    agg = _aggregate(ctx, pk, updates, weights)
    partials = {i: p.partial_decrypt(agg) for i, p in enumerate(parties[:-1])}
    with pytest.raises(MissingShareError, match="missing \\[2\\]"):
        combine(ctx, agg, partials, range(PARTIES))


def test_each_party_alone_gets_garbage_where_all_together_decrypt(setup):
    """One client's update (weight 1, the scale threshold decryption works at): every party's own answer
    with c0 decodes to garbage, while the three answers together give the update. (Checked once against
    a mutated key generation where party 0 held the whole key and the others zero: this test failed.)"""
    ctx, parties, pk, updates, _ = setup
    ct = ctx.multiply_scalar(ctx.encrypt(pk, updates[0])[0], 1.0)
    x = updates[0][: ctx.params.slots]
    partials = [p.partial_decrypt(ct) for p in parties]
    for d in partials:
        got = decode_sum(ctx, ct, [d])
        assert np.abs(got - x).min() > 1e3
        assert abs(np.corrcoef(got, x)[0, 1]) < 6 / math.sqrt(ctx.params.slots)
    assert np.abs(decode_sum(ctx, ct, partials) - x).max() <= precision_bound(ctx.params, PARTIES)


def test_a_fresh_ciphertext_is_not_partially_decrypted(setup):
    """At the clients' scale Δ the flooding noise would swamp the value: refused rather than garbage."""
    ctx, parties, pk, updates, _ = setup
    with pytest.raises(HeError, match="too small for flooding"):
        parties[0].partial_decrypt(ctx.encrypt(pk, updates[0])[0])


def test_partial_decryption_is_fresh_each_time(setup):
    """Flooding noise is drawn anew for every answer (a repeated answer with the same noise would let the
    noise cancel between two ciphertexts)."""
    ctx, parties, pk, updates, _ = setup
    ct = ctx.multiply_scalar(ctx.encrypt(pk, updates[0])[0], 1.0)
    assert not np.array_equal(parties[0].partial_decrypt(ct), parties[0].partial_decrypt(ct))


def test_bad_partial_shape_is_refused(setup):
    ctx, parties, pk, updates, _ = setup
    ct = ctx.encrypt(pk, updates[0])[0]
    with pytest.raises(HeError, match="shape"):
        decode_sum(ctx, ct, [np.zeros((1, ctx.n), np.uint64)])
