"""Collective relinearisation key (ldp_core.he.relin) and the mean of squares / variance it allows.

Tolerances: :func:`estimator.he.moments.square_precision_bound` (seven standard deviations of the fresh
encryption, relinearisation and flooding noise terms in a decoded slot, plus double-precision decoding:
formulas in its docstring) and :func:`estimator.he.moments.variance_bound` (ε_sq + 2|μ|ε_μ + ε_μ²). The key
noise check: a coefficient of s·e0 + u·e1 + e2 + e3 has variance V = 2·N·(2n/3)·n·σ² + 2n·σ² (σ² = 10.5);
7·√V over the 8192·3 coefficients (false alarm < 1e-7). "Uncorrelated": |r| < 6/√4096.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.he.aggregate import he_weighted_mean, precision_bound
from estimator.he.moments import SEAL_ERROR_VARIANCE, square_precision_bound, variance_bound
from ldp_core.he.relin import RkgParty, _crp, collective_relin_keys, relin_keys_from_shares, rkg_gadget_count
from ldp_core.he.shamir import ShamirKeyParty, setup_shamir
from ldp_core.he.threshold import CkksContext, HeError, _seal, collective_public_key, decode_sum

PARTIES = 3


def _sum(ctx, arrays):
    acc = arrays[0]
    for a in arrays[1:]:
        acc = np.stack([ctx.add(x, y) for x, y in zip(acc, a)])
    return acc


@pytest.fixture(scope="module")
def setup():
    """A 3-party committee (t = 2 Shamir sharing too), its public key and a relinearisation key from a
    transcript kept for the attack test."""
    ctx = CkksContext()
    parties = [ShamirKeyParty(ctx, i) for i in range(PARTIES)]
    pk = collective_public_key(ctx, [p.public_share() for p in parties])
    setup_shamir(parties, 2)
    rkg = [RkgParty(p) for p in parties]
    first = [r.round1() for r in rkg]
    h0 = _sum(ctx, [f[0] for f in first])
    h1 = _sum(ctx, [f[1] for f in first])
    second = [r.round2(h0, h1) for r in rkg]
    rk = relin_keys_from_shares(ctx, h1, second)
    transcript = {"first": first, "h0": h0, "h1": h1, "second": second}
    return ctx, parties, pk, rk, transcript


def _secret(ctx, parties):
    s = parties[0]._s
    for p in parties[1:]:
        s = ctx.add(s, p._s)
    return s


def _centred_coeffs(ctx, row: np.ndarray, j: int) -> np.ndarray:
    q = ctx.moduli[j]
    c = np.array(_seal().util.inverse_ntt_negacyclic_harvey([int(v) for v in row], ctx._ntt[j]), dtype=object)
    return np.where(c > q // 2, c - q, c)


def test_relin_key_has_seals_layout(setup):
    """One key-switching key per data prime, at the key level, in NTT form, as SEAL's own KeyGenerator
    makes; and b_i + a'_i·s = w_i·s² + e with e small: w_i = P on limb i, 0 on the others."""
    ctx, parties, _, rk, _ = setup
    single = _seal().RelinKeys()
    _seal().KeyGenerator(ctx.seal).create_relin_keys(single)
    keys, ref = rk.data(), single.data()
    assert len(keys) == len(ref) == 1 and len(keys[0]) == len(ref[0]) == rkg_gadget_count(ctx) == 3
    assert list(rk.parms_id()) == list(ctx.seal.key_parms_id())
    s = _secret(ctx, parties)
    s2 = ctx.mul(s, s)
    big_p = ctx.moduli[-1]
    v = 2 * ctx.n * (2 * PARTIES / 3) * PARTIES * SEAL_ERROR_VARIANCE + 2 * PARTIES * SEAL_ERROR_VARIANCE
    for i, key in enumerate(keys[0]):
        data = key.data()
        assert data.is_ntt_form() and data.size() == 2
        polys = ctx.read_ciphertext(data)
        r = ctx.add(polys[0], ctx.mul(polys[1], s))
        for j, q in enumerate(ctx.moduli):
            want = (s2[j].astype(object) * (big_p % q)) % q if j == i else np.zeros(ctx.n, dtype=object)
            e = _centred_coeffs(ctx, ((r[j].astype(object) - want) % q).astype(np.uint64), j)
            assert np.abs(e).max() <= 7 * math.sqrt(v), (i, j)


@pytest.mark.parametrize("threshold", [None, 2])
def test_weighted_mean_of_squares_and_variance(setup, threshold):
    """Σ n_u·x_u²/Σ n_u computed by the server from the clients' mean ciphertexts and decrypted by the
    committee (all three, or two of them after the Shamir sharing), within the derived bounds."""
    ctx, parties, pk, rk, _ = setup
    rng = np.random.default_rng(5)
    updates = [rng.normal(scale=0.3, size=5000) for _ in range(4)]  # two ciphertexts each
    weights = np.array([30.0, 10.0, 45.0, 15.0])
    answering = parties if threshold is None else parties[1:]
    out = he_weighted_mean(ctx, answering, pk, updates, weights, threshold, relin_keys=rk)
    x = np.stack(updates)
    sq = (weights[:, None] * x**2).sum(0) / weights.sum()
    mu = (weights[:, None] * x).sum(0) / weights.sum()
    var = (weights[:, None] * (x - mu) ** 2).sum(0) / weights.sum()
    k = threshold or PARTIES
    sq_bound = square_precision_bound(ctx.params, PARTIES, k, float(np.abs(x).max()), float(weights.sum()))
    assert out.mean_of_squares is not None and out.mean_of_squares.shape == sq.shape
    assert np.abs(out.mean_of_squares - sq).max() <= sq_bound
    assert sq_bound < 1e-9
    got_var = out.mean_of_squares - out.mean**2
    assert np.abs(got_var - var).max() <= variance_bound(sq_bound, precision_bound(ctx.params, k), np.abs(mu).max())


def test_a_wrong_relin_key_gives_garbage_and_an_unrelinearised_product_is_refused(setup):
    """The collective key is the one that works: a key of one party's own secret (what a party could
    produce alone) relinearises into noise; a size-3 product is not partially decrypted."""
    ctx, parties, pk, rk, _ = setup
    s = _seal()
    x = np.random.default_rng(2).normal(scale=0.5, size=ctx.params.slots)
    ct = ctx.encrypt(pk, x)[0]
    sq = s.Ciphertext()
    ctx.evaluator.square(ct, sq)
    with pytest.raises(HeError, match="relinearise"):
        parties[0].partial_decrypt(sq)
    own = s.RelinKeys()
    s.KeyGenerator(ctx.seal).create_relin_keys(own)
    for key, ok in ((rk, True), (own, False)):
        r = s.Ciphertext()
        ctx.evaluator.relinearize(sq, key, r)
        got = decode_sum(ctx, r, [p.partial_decrypt(r) for p in parties])
        if ok:
            assert np.abs(got - x**2).max() <= square_precision_bound(ctx.params, PARTIES, PARTIES, 3.0, 1.0)
        else:
            assert np.abs(got - x**2).min() > 1e3


def test_colluders_with_the_whole_transcript_cannot_decrypt(setup):
    """The server and parties 0 and 1 pool their secrets (s_j, and the round's ephemeral u_j is dropped
    by design but treated as known) with the whole RKG transcript, and solve for the honest party 2's
    secret the only ways the transcript offers: s_2 ≈ h1_2,i / a_i (round 1) and s_2 ≈ h0'_2,i / h0_i
    (round 2), pointwise in NTT form. With the error terms these are uniform; the candidate key decrypts
    a fresh ciphertext to noise. (Checked once against rounds without errors: the round-1 solution
    recovered s_2 exactly and this test failed.)"""
    ctx, parties, pk, _, transcript = setup
    x = np.random.default_rng(3).normal(scale=0.1, size=ctx.params.slots)
    ct = ctx.multiply_scalar(ctx.encrypt(pk, x)[0], 1.0)
    c0, c1 = ctx.read_ciphertext(ct)
    limbs = c1.shape[0]
    known = ctx.add(parties[0]._s, parties[1]._s)

    def inverse(a: np.ndarray) -> np.ndarray:
        return np.stack([[pow(int(v), -1, q) for v in row] for row, q in zip(a, ctx.moduli)]).astype(np.uint64)

    candidates = [
        ctx.mul(transcript["first"][2][1][0], inverse(_crp(ctx, 0))),
        ctx.mul(transcript["second"][2][0][0], inverse(transcript["h0"][0])),
    ]
    for cand in candidates:
        key = ctx.add(known, cand)
        pt = ctx.load_plaintext(ct.parms_id(), ctx.add(c0, ctx.mul(c1, key[:limbs])), ct.scale)
        got = np.asarray(ctx.encoder.decode_double(pt))
        assert np.abs(got - x).min() > 1e3
        assert abs(np.corrcoef(got, x)[0, 1]) < 6 / math.sqrt(x.size)


def test_protocol_misuse_is_refused(setup):
    ctx, parties, pk, rk, transcript = setup
    fresh = RkgParty(parties[0])
    with pytest.raises(HeError, match="round 1 first"):
        fresh.round2(transcript["h0"], transcript["h1"])
    fresh.round1()
    with pytest.raises(HeError, match="shape"):
        fresh.round2(transcript["h0"][:1], transcript["h1"])
    updates = [np.ones(10), np.zeros(10)]
    with pytest.raises(HeError, match="whole-number weights"):
        he_weighted_mean(ctx, parties, pk, updates, np.array([1.5, 2.0]), relin_keys=rk)


def test_collective_relin_keys_runs_both_rounds():
    ctx = CkksContext()
    parties = [ShamirKeyParty(ctx, i) for i in range(2)]
    pk = collective_public_key(ctx, [p.public_share() for p in parties])
    rk = collective_relin_keys(ctx, parties)
    x = np.linspace(-1, 1, 64)
    out = he_weighted_mean(ctx, parties, pk, [x, 2 * x], np.array([1.0, 3.0]), relin_keys=rk)
    want = (x**2 + 3 * 4 * x**2) / 4
    assert out.mean_of_squares is not None
    assert np.abs(out.mean_of_squares - want).max() <= square_precision_bound(ctx.params, 2, 2, 2.0, 4.0)
