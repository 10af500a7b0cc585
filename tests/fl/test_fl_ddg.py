"""The distributed discrete Gaussian: encoding, decoding and the accountant (ldp_core/fl/ddg.py,
estimator/fl/ddg_accounting.py; Kairouz, Liu, Steinke ICML 2021)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.special import logsumexp

from estimator.fl.ddg_accounting import DDGAccountant, noise_for_epsilon, rdp_to_epsilon, round_rdp, sum_dg_rdp
from ldp_core.fl.ddg import DDGSpec, rotate, unrotate
from ldp_core.fl.errors import SecAggError


def test_samplers_are_shared_with_the_central_releases() -> None:
    import estimator.accounting.central as central
    import ldp_core.noise

    assert central.discrete_gaussian is ldp_core.noise.discrete_gaussian
    assert central.discrete_laplace is ldp_core.noise.discrete_laplace
    assert central.bernoulli_exp is ldp_core.noise.bernoulli_exp


def test_rotation_is_orthonormal_and_inverted_by_the_public_seed() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=16)
    y = rotate(x, 42)
    assert math.isclose(float(np.linalg.norm(y)), float(np.linalg.norm(x)), rel_tol=1e-12)
    assert np.allclose(unrotate(y, 42), x, atol=1e-12)
    assert not np.allclose(unrotate(y, 43), x, atol=1e-3)  # the seed matters


def test_conditional_rounding_respects_the_norm_bound_always() -> None:
    # coarse γ so that the bound binds often (c/γ = 2 against D/4 = 2)
    spec = DDGSpec(clip_norm=0.5, noise_stddev=0.5, clients=4, dim=7, bits=12, gamma=0.25)
    rng = np.random.default_rng(1)
    worst = 0.0
    for i in range(2000):
        r = spec.rounded(rng.normal(size=7), rng, i)
        worst = max(worst, float(r @ r))
    assert worst <= spec.norm_bound_sq


def _conditional_rounding_moments(spec: DDGSpec, scaled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact mean and covariance of the conditionally rounded vector, by enumerating the 2^D roundings."""
    floor = np.floor(scaled)
    frac = scaled - floor
    outcomes, probs = [], []
    for bits in itertools.product((0, 1), repeat=scaled.size):
        b = np.array(bits, dtype=np.float64)
        r = floor + b
        if float(r @ r) <= spec.norm_bound_sq:
            outcomes.append(r)
            probs.append(float(np.prod(np.where(b == 1, frac, 1 - frac))))
    p = np.array(probs) / sum(probs)
    o = np.array(outcomes)
    mean = p @ o
    cov = (o - mean).T @ ((o - mean) * p[:, None])
    return mean, cov


def test_decoded_sum_has_the_exact_mean_and_variance_of_rounding_plus_noise() -> None:
    """Coarse ring (γ = 0.25, D = 4), where rounding is a large part of the error: the decoded sum's mean
    and per-coordinate variance over many seeds match the exact conditional-rounding moments (by
    enumeration) plus the noise γ²·n·Var N_Z(0, σ_ℓ²). Tolerance: 5 standard errors, SE(mean) = √(v/N),
    SE(variance) = √((m₄ − v²)/N) with m₄ the sample fourth central moment."""
    spec = DDGSpec(clip_norm=0.5, noise_stddev=0.2, clients=3, dim=3, bits=10, gamma=0.2)
    data = np.random.default_rng(2).normal(size=(3, 3))
    seed = 5
    mean = np.zeros(3)
    var = np.zeros(3)
    # decode: γ·unrotate(·) is linear with matrix γ·R, R the inverse rotation (orthonormal)
    R = np.column_stack([unrotate(e, seed) for e in np.eye(spec.padded_dim)])[: spec.dim]
    for x in data:
        m, c = _conditional_rounding_moments(spec, spec.scaled(x, seed))
        mean += spec.gamma * R @ m
        var += spec.gamma**2 * np.einsum("ij,jk,ik->i", R, c, R)
    var += spec.noise_variance()
    trials = 40000
    words = spec.encode(np.tile(data, (trials, 1)), np.random.default_rng(3), seed)
    totals = words.astype(np.int64).reshape(trials, 3, spec.padded_dim).sum(axis=1)
    out = spec.decode_sum(totals, seed)
    emp_mean = out.mean(axis=0)
    emp_var = out.var(axis=0, ddof=1)
    m4 = np.mean((out - emp_mean) ** 4, axis=0)
    assert np.all(np.abs(emp_mean - mean) <= 5 * np.sqrt(var / trials)), (emp_mean, mean)
    assert np.all(np.abs(emp_var - var) <= 5 * np.sqrt((m4 - var**2) / trials)), (emp_var, var)
    # the rounding term is not negligible here: a formula with the noise alone would be rejected
    assert np.all(np.abs(emp_var - spec.noise_variance()) > 5 * np.sqrt((m4 - var**2) / trials))


def test_decoded_sum_is_unbiased_with_the_noise_variance_at_16_bits() -> None:
    """A realistic ring (for_bits, 16 bits): over many seeds the decoded sum's error against the true sum
    of clipped updates has mean 0 and variance s² = γ²·n·σ_ℓ² plus the rounding variance
    γ²·(1/D)·Σ_u Σ_j p_uj(1 − p_uj) (unconditional rounding; the conditioning moves the mean by at most
    γ·n·√D·β/(1 − β), added to the tolerance). Tolerances: 5 standard errors as above."""
    n, d, c = 8, 5, 0.5
    spec = DDGSpec.for_bits(c, 1.0, n, d, 16)
    data = np.random.default_rng(4).normal(size=(n, d))
    clipped = np.array([x * min(1.0, c / np.linalg.norm(x)) for x in data])
    truth = clipped.sum(axis=0)
    trials, seeds = 2000, 10
    rng = np.random.default_rng(5)
    errs, rounding_var = [], []
    for seed in range(seeds):  # a few public rotations, many trials each
        words = spec.encode(np.tile(data, (trials, 1)), rng, seed)
        totals = words.astype(np.int64).reshape(trials, n, spec.padded_dim).sum(axis=1)
        errs.append(spec.decode_sum(totals, seed) - truth)
        fr = spec.scaled(data, seed) - np.floor(spec.scaled(data, seed))
        rounding_var.append(spec.gamma**2 * float(np.sum(fr * (1 - fr))) / spec.padded_dim)
    err = np.concatenate(errs)
    var = spec.noise_variance() + float(np.mean(rounding_var))
    assert math.isclose(spec.noise_variance(), 1.0, rel_tol=1e-5)  # the noise asked for, s = 1
    bias = spec.gamma * n * math.sqrt(spec.padded_dim) * spec.beta / (1 - spec.beta)
    pooled = err.reshape(-1)
    m4 = float(np.mean((pooled - pooled.mean()) ** 4))
    assert abs(float(pooled.mean())) <= 5 * math.sqrt(var / pooled.size) + bias
    emp = float(pooled.var(ddof=1))
    # coordinates of one trial are uncorrelated (the noise is isotropic after the orthonormal rotation), but
    # not independent: the SE is that of trials·seeds draws of one coordinate, not of the pooled count
    assert abs(emp - var) <= 5 * math.sqrt((m4 - var**2) / (trials * seeds)), (emp, var)


def test_bad_specs_are_refused_with_a_reason() -> None:
    with pytest.raises(SecAggError, match="bits"):
        DDGSpec(0.5, 1.0, 10, 5, 40, 0.01)
    with pytest.raises(SecAggError, match="no room"):
        DDGSpec.for_bits(0.5, 1.0, 300, 5, 8)
    with pytest.raises(SecAggError, match="below the range"):
        DDGSpec(0.5, 0.001, 10, 5, 16, 0.01)
    spec = DDGSpec.for_bits(0.5, 1.0, 4, 5, 16)
    with pytest.raises(SecAggError, match="finite"):
        spec.encode(np.array([1.0, np.nan, 0, 0, 0]), np.random.default_rng(0), 1)


# -- the accountant ------------------------------------------------------------------------------
def _exact_sum_dg_renyi(sigma2: float, shares: int, shift: int, alpha: float) -> float:
    """D_α(Z ‖ Z + shift) for Z the sum of ``shares`` N_Z(0, σ²) (one dimension), by convolving pmfs."""
    x = np.arange(-40, 41)
    p = np.exp(-(x**2) / (2 * sigma2))
    p /= p.sum()
    q = p
    for _ in range(shares - 1):
        q = np.convolve(q, p)
    P, Q = q[shift:], q[:-shift]
    ok = (P > 1e-250) & (Q > 1e-250)
    return float(logsumexp(alpha * np.log(P[ok]) + (1 - alpha) * np.log(Q[ok])) / (alpha - 1))


def test_sum_of_discrete_gaussians_bound_holds_against_the_exact_divergence() -> None:
    """KLS21 Prop. 14 checked against an independent calculation: the exact Rényi divergence of the sum
    of k discrete Gaussians and its shift, from the convolved pmf. The bound holds in every case, and the
    naive Gaussian formula α·v²/(2kσ²) (no τ term) is exceeded in some: the τ term is needed."""
    exceeded = 0
    for sigma2, k, v, alpha in itertools.product((0.25, 0.3, 0.5, 1.0), (2, 3, 5), (1, 2), (2.0, 5.0, 20.0)):
        exact = _exact_sum_dg_renyi(sigma2, k, v, alpha)
        assert exact <= float(sum_dg_rdp(alpha, v, v, k, sigma2, 1)) + 1e-9, (sigma2, k, v, alpha)
        exceeded += exact > alpha * v * v / (2 * k * sigma2) + 1e-9
    assert exceeded >= 10


def test_epsilon_matches_dp_accounting_where_tau_vanishes() -> None:
    """With large σ (τ ≈ 0) a round is a Gaussian of multiplier z = √k σ / Δ₂ in RDP; dp_accounting's RDP
    accountant on that Gaussian (its own orders and conversion) is an independent figure. Ours searches
    a finer grid of orders, so it may be slightly lower, never higher than theirs by more than 0.1 %."""
    import dp_accounting

    spec = DDGSpec.for_bits(0.5, 1.0, 10, 5, 16)
    acc = DDGAccountant(1e-5)
    for _ in range(100):
        acc.record(spec)
    ours = acc.epsilon()
    z = math.sqrt(spec.clients * spec.local_sigma2) / (2 * math.sqrt(spec.norm_bound_sq))
    ref = dp_accounting.rdp.RdpAccountant()
    ref.compose(dp_accounting.GaussianDpEvent(z), 100)
    theirs = ref.get_epsilon(1e-5)
    assert ours <= theirs * 1.001
    assert ours >= theirs * 0.98


def test_accountant_figures() -> None:
    spec = DDGSpec.for_bits(0.5, 1.0, 10, 5, 16)
    acc = DDGAccountant(1e-5)
    assert acc.epsilon() == 0.0
    for _ in range(10):
        acc.record(spec)
    full, faked = acc.epsilon(), acc.epsilon(shares=6)
    assert faked > full  # fewer shares summed, less noise
    assert 0 < acc.modular_clipping_bound() < 1e-4
    # the conversion is the CKS bound: never below the RDP curve's own ε at the best order minus log terms
    rdp = round_rdp(spec, 10)
    assert rdp_to_epsilon(rdp, 1e-5) < rdp_to_epsilon(2 * rdp, 1e-5)


def test_noise_for_epsilon_hits_the_target() -> None:
    spec = noise_for_epsilon(5.0, 1e-5, 20, clip_norm=0.5, clients=10, dim=5, bits=12)
    acc = DDGAccountant(1e-5)
    for _ in range(20):
        acc.record(spec)
    assert 5.0 * 0.99 <= acc.epsilon() <= 5.0


def test_secagg_in_a_small_ring_unmasks_only_the_sum_mod_m() -> None:
    """SecAgg with bits < 32: each masked word is below m = 2^bits, and the unmasked sum, read mod m, is
    the sum of the DDG encodings mod m, with a client dropping after sharing its keys."""
    from estimator.fl.secagg_server import SecAggServer, honest_unmask, make_config
    from ldp_core.fl.secagg import SecAggClient

    n, d, bits = 6, 5, 12
    spec = DDGSpec.for_bits(0.5, 1.0, n, d, bits)
    rng = np.random.default_rng(7)
    cfg = make_config(1, n, spec.padded_dim, rng)
    clients = {u: SecAggClient(u, cfg, rng.bytes) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items()})
    words = {u: spec.encode(rng.normal(size=d), rng, 11) for u in clients}
    for u in range(1, n):  # client n drops after sharing
        y = clients[u].masked_input(words[u], inbox.get(u, {}), bits=bits)
        assert int(y.max()) < spec.modulus
        server.receive_masked(u, y)
    surv, dropped = server.unmask_request()
    total = server.finish(honest_unmask(clients, surv, dropped))
    expect = np.sum([words[u].astype(np.int64) for u in surv], axis=0) % spec.modulus
    assert np.array_equal(total.astype(np.int64) % spec.modulus, expect)
    with pytest.raises(SecAggError, match="outside the ring"):
        clients[n].masked_input(np.full(spec.padded_dim, spec.modulus, np.uint32), inbox.get(n, {}), bits=bits)


def test_empirical_privacy_audit_stays_below_the_claimed_epsilon() -> None:
    """An empirical audit of one round: client 1 sends +C or −C (replace-one neighbours; the other two
    send 0), the decoded sum is released; a threshold test on it gives, at each threshold, a
    (1 − α)-confidence lower bound on ε from Clopper–Pearson bounds on the false-positive and
    false-negative rates (ε ≥ log((1 − FNR − δ)/FPR)). The best lower bound must stay below the
    accountant's ε (it would not if the devices added less noise than claimed, e.g. σ/n instead of
    σ/√n per share), and come within a factor 3 of it (the audit has power)."""
    from scipy.stats import beta as beta_dist

    c, n, delta = 1.0, 3, 1e-5
    spec = DDGSpec.for_bits(c, 4.0 * c, n, 1, 16)  # σ = 4: ε ≈ 1.9 for sensitivity 2C
    acc = DDGAccountant(delta)
    acc.record(spec)
    claimed = acc.epsilon()
    trials = 30000
    rng = np.random.default_rng(12)

    def release(x1: float) -> np.ndarray:
        xs = np.zeros((trials * n, 1))
        xs[::n, 0] = x1
        words = spec.encode(xs, rng, 0).astype(np.int64).reshape(trials, n, 1).sum(axis=1)
        return spec.decode_sum(words, 0)[:, 0]

    a, b = release(c), release(-c)
    best, conf = 0.0, 0.05 / 50  # Bonferroni over the 50 thresholds
    for t in np.quantile(np.concatenate([a, b]), np.linspace(0.5, 0.99, 50)):
        fp, fn = int(np.sum(b > t)), int(np.sum(a <= t))
        fpr_hi = float(beta_dist.ppf(1 - conf, fp + 1, trials - fp)) if fp < trials else 1.0
        fnr_hi = float(beta_dist.ppf(1 - conf, fn + 1, trials - fn)) if fn < trials else 1.0
        if 1 - fnr_hi - delta > 0:
            best = max(best, math.log((1 - fnr_hi - delta) / fpr_hi))
    assert best <= claimed, (best, claimed)
    assert best >= claimed / 3, (best, claimed)


def test_dropouts_leave_less_noise_and_the_accountant_charges_for_the_shares_summed() -> None:
    """Issue 13, dropout tolerance. n = 8 devices each add a share sized for 8; only k = 5 survive, so the
    decoded sum carries γ²·k·Var N_Z(0, σ_ℓ²) = (5/8)·s², not s². Measured: the decoded error's variance
    matches that (tolerance 5 standard errors of a sample variance, √((μ₄ − σ⁴)/N)), and is far from s².
    The accountant told the k shares actually summed (what the job records: it refuses to unmask below
    ``min_shares`` and charges min_shares) prints exactly the ε of a mechanism whose n = k devices add
    the measured noise (same γ, σ_ℓ and Δ), and more than the no-dropout figure."""
    n, k, d, c = 8, 5, 5, 0.5
    spec = DDGSpec.for_bits(c, 1.0, n, d, 16)
    data = np.random.default_rng(6).normal(size=(n, d))
    survivors = data[:k]
    truth = np.array([x * min(1.0, c / np.linalg.norm(x)) for x in survivors]).sum(axis=0)
    trials, seeds = 2000, 4
    rng = np.random.default_rng(7)
    errs, rounding_var = [], []
    for seed in range(seeds):
        words = spec.encode(np.tile(survivors, (trials, 1)), rng, seed)
        totals = words.astype(np.int64).reshape(trials, k, spec.padded_dim).sum(axis=1)
        errs.append(spec.decode_sum(totals, seed) - truth)
        fr = spec.scaled(survivors, seed) - np.floor(spec.scaled(survivors, seed))
        rounding_var.append(spec.gamma**2 * float(np.sum(fr * (1 - fr))) / spec.padded_dim)
    pooled = np.concatenate(errs).reshape(-1)
    var = spec.noise_variance(k) + float(np.mean(rounding_var))
    assert math.isclose(spec.noise_variance(k), k / n, rel_tol=1e-5)
    m4 = float(np.mean((pooled - pooled.mean()) ** 4))
    se = math.sqrt((m4 - var**2) / (trials * seeds))
    emp = float(pooled.var(ddof=1))
    assert abs(emp - var) <= 5 * se, (emp, var)
    assert abs(emp - spec.noise_variance()) > 10 * se  # the full noise s² is not what the sum holds

    realized = DDGSpec(c, spec.noise_stddev * math.sqrt(k / n), k, d, 16, spec.gamma, spec.beta)
    assert math.isclose(realized.local_sigma, spec.local_sigma, rel_tol=1e-12)
    assert math.isclose(realized.norm_bound_sq, spec.norm_bound_sq, rel_tol=1e-12)
    charged, equivalent, full = DDGAccountant(1e-5), DDGAccountant(1e-5), DDGAccountant(1e-5)
    for _ in range(20):
        charged.record(spec, k)
        equivalent.record(realized)
        full.record(spec)
    assert math.isclose(charged.epsilon(), equivalent.epsilon(), rel_tol=1e-9)
    assert charged.epsilon() > 1.1 * full.epsilon()
