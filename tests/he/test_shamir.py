"""t-of-n threshold CKKS (ldp_core.he.shamir): any t of n key parties decrypt, t − 1 cannot, dropouts pass.

Tolerance: :func:`estimator.he.aggregate.precision_bound` with the t answering parties — seven standard
deviations of the summed flooding noise in a decoded slot, √(N·t/3)·2^k/(Δ·Δ_w), plus 1e-9 for SEAL's
own noise (chance that any of the 4096 slots compared exceeds it < 1e-8 per decryption). "Uncorrelated"
is |r| < 6/√4096: six standard deviations of the correlation of independent vectors (false alarm ~ 2e-9).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from estimator.he.aggregate import precision_bound
from ldp_core.he.shamir import (
    ShamirKeyParty,
    combine_threshold,
    lagrange_at_zero,
    setup_shamir,
    share_polynomial,
)
from ldp_core.he.threshold import (
    CkksContext,
    HeError,
    MissingShareError,
    collective_public_key,
    combine,
    decode_sum,
)

N_PARTIES, T = 4, 3


@pytest.fixture(scope="module")
def committee():
    ctx = CkksContext()
    parties = [ShamirKeyParty(ctx, i) for i in range(N_PARTIES)]
    pk = collective_public_key(ctx, [p.public_share() for p in parties])
    dealt = {p.point: p.deal([q.point for q in parties], T) for p in parties}  # kept: the colluders' view
    for p in parties:
        p.receive({i: dealt[i][p.point] for i in dealt}, T)
    rng = np.random.default_rng(11)
    x = rng.normal(scale=0.1, size=ctx.params.slots)
    ct = ctx.multiply_scalar(ctx.encrypt(pk, x)[0], 1.0)  # one client's update at the decryptable scale
    return ctx, parties, pk, dealt, x, ct


def _far_and_uncorrelated(got: np.ndarray, x: np.ndarray) -> None:
    assert np.abs(got - x).min() > 1e3
    assert abs(np.corrcoef(got, x)[0, 1]) < 6 / math.sqrt(x.size)


def test_any_t_subset_decrypts(committee):
    ctx, parties, _, _, x, ct = committee
    bound = precision_bound(ctx.params, T)
    for subset in itertools.combinations(parties, T):
        active = [p.point for p in subset]
        partials = {p.point: p.partial_decrypt_among(ct, active) for p in subset}
        got = combine_threshold(ctx, ct, partials, T)
        assert np.abs(got - x).max() <= bound, active


def test_a_dropout_stops_n_of_n_but_not_t_of_n(committee):
    """Party 3 is gone. The n-of-n decryption refuses (and its remaining answers decode to noise); the
    t-of-n committee decrypts with the three that are left."""
    ctx, parties, _, _, x, ct = committee
    present = parties[:-1]
    nn = {p.index: p.partial_decrypt(ct) for p in present}
    with pytest.raises(MissingShareError):
        combine(ctx, ct, nn, range(N_PARTIES))
    _far_and_uncorrelated(decode_sum(ctx, ct, list(nn.values())), x)
    active = [p.point for p in present]
    got = combine_threshold(ctx, ct, {p.point: p.partial_decrypt_among(ct, active) for p in present}, T)
    assert np.abs(got - x).max() <= precision_bound(ctx.params, T)


def test_t_minus_1_colluders_pooling_everything_cannot_decrypt(committee):
    """Parties 0 and 1 (t − 1 = 2) collude with the server. They pool their own key shares s_i, their whole
    dealing polynomials, every Shamir share they received, and their partial decryptions, and try:
    (a) interpolating F(0) from their two points; (b) their own additive shares plus the honest dealers'
    polynomials interpolated at 0 from the two points they hold of each; (c) their Lagrange-weighted answers
    for an active set that includes a third, absent party. Every attempt decodes to noise.
    (Checked once against a sharing polynomial of degree t − 2: (a) recovered the plaintext and this failed.)"""
    ctx, parties, _, dealt, x, ct = committee
    colluders = parties[: T - 1]
    pts = [p.point for p in colluders]
    polys = ctx.read_ciphertext(ct)
    c0, c1 = polys[0], polys[1]

    def interpolate(values: dict[int, np.ndarray]) -> np.ndarray:
        acc = np.zeros_like(next(iter(values.values())))
        for xj, v in values.items():
            lam = lagrange_at_zero(ctx, xj, list(values))
            acc = ctx.add(acc, ctx.mul(v, np.array(lam, dtype=np.uint64)[:, None] * np.ones_like(v)))
        return acc

    def decode_with(key: np.ndarray) -> np.ndarray:
        limbs = c1.shape[0]
        acc = ctx.add(c0, ctx.mul(c1, key[:limbs]))
        pt = ctx.load_plaintext(ct.parms_id(), acc, ct.scale)
        return np.asarray(ctx.encoder.decode_double(pt))

    points_held = {p.point: p._point_share for p in colluders}
    _far_and_uncorrelated(decode_with(interpolate(points_held)), x)  # (a)
    own = colluders[0]._s
    for p in colluders[1:]:
        own = ctx.add(own, p._s)
    honest = [p.point for p in parties if p not in colluders]
    rest = np.zeros_like(own)
    for i in honest:
        rest = ctx.add(rest, interpolate({xj: dealt[i][xj] for xj in pts}))
    _far_and_uncorrelated(decode_with(ctx.add(own, rest)), x)  # (b)
    active = [*pts, parties[-1].point]
    answers = [p.partial_decrypt_among(ct, active) for p in colluders]
    _far_and_uncorrelated(decode_sum(ctx, ct, answers), x)  # (c)
    with pytest.raises(MissingShareError, match="needs 3"):
        combine_threshold(ctx, ct, dict(zip(pts, answers)), T)


def test_collective_secret_is_the_shared_polynomial_at_zero(committee):
    """With t points the interpolation gives s = Σ s_i exactly (no noise involved): the sharing is right."""
    ctx, parties, *_ = committee
    s = parties[0]._s
    for p in parties[1:]:
        s = ctx.add(s, p._s)
    subset = parties[1:]
    active = [p.point for p in subset]
    acc = np.zeros_like(s)
    for p in subset:
        lam = np.array(lagrange_at_zero(ctx, p.point, active), dtype=np.uint64)
        acc = ctx.add(acc, ctx.mul(p._point_share, lam[:, None] * np.ones_like(s)))
    assert np.array_equal(acc, s)


def test_bad_requests_are_refused(committee):
    ctx, parties, pk, _, x, ct = committee
    with pytest.raises(HeError, match="exactly t = 3"):
        parties[0].partial_decrypt_among(ct, [1, 2])
    with pytest.raises(HeError, match="not among"):
        parties[0].partial_decrypt_among(ct, [2, 3, 4])
    with pytest.raises(HeError, match="too small for flooding"):
        parties[0].partial_decrypt_among(ctx.encrypt(pk, x)[0], [1, 2, 3])
    with pytest.raises(HeError, match="threshold must be"):
        share_polynomial(ctx, parties[0]._s, [1, 2], 3, lambda n: bytes(n))
    fresh = ShamirKeyParty(ctx, 9)
    with pytest.raises(HeError, match="no Shamir share"):
        fresh.partial_decrypt_among(ct, [1, 2, 10])


def test_setup_shamir_runs_the_sharing_round():
    ctx = CkksContext()
    parties = [ShamirKeyParty(ctx, i) for i in range(3)]
    pk = collective_public_key(ctx, [p.public_share() for p in parties])
    setup_shamir(parties, 2)
    x = np.linspace(-1, 1, 100)
    ct = ctx.multiply_scalar(ctx.encrypt(pk, x)[0], 1.0)
    active = [parties[0].point, parties[2].point]
    got = combine_threshold(ctx, ct, {p.point: p.partial_decrypt_among(ct, active) for p in parties[::2]}, 2, 100)
    assert np.abs(got - x).max() <= precision_bound(ctx.params, 2)
