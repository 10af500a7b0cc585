"""Secure aggregation (SecAgg+ style): exact sums with and without dropouts, masked
inputs indistinguishable from uniform, Shamir sharing, quantization, refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from estimator.fl.secagg_server import SecAggServer, default_degree, honest_unmask, make_config, neighbor_graph
from ldp_core.fl import SecAggError
from ldp_core.fl.secagg import PRIME, Quantizer, SecAggClient, Share, add_masks, prg_words, shamir_combine, shamir_split


def run_round(n, d, xs, drop_before_share=(), drop_after_share=(), seed=0, degree=None):
    rng = np.random.default_rng(seed)
    cfg = make_config(3, n, d, rng, degree)
    rb = rng.bytes  # a seeded byte source (tests only; devices use os.urandom)
    clients = {u: SecAggClient(u, cfg, rb) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items() if u not in drop_before_share})
    masked = {}
    for u in sorted(server.shared):
        if u not in drop_after_share:
            masked[u] = clients[u].masked_input(xs[u], inbox.get(u, {}))
            server.receive_masked(u, masked[u])
    surv, dropped = server.unmask_request()
    total = server.finish(honest_unmask(clients, surv, dropped))
    return total, surv, masked, cfg


def _inputs(n, d, seed=1):
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, 2**32, size=d, dtype=np.uint32) for u in range(1, n + 1)}


def _ring_sum(xs, who):
    return np.sum([xs[u].astype(np.uint64) for u in who], axis=0).astype(np.uint64) % (1 << 32)


def test_sum_is_exact_without_dropouts_on_a_sparse_graph() -> None:
    n, d = 30, 1000
    xs = _inputs(n, d)
    total, surv, _, cfg = run_round(n, d, xs)
    assert len(cfg.neighbors[1]) == default_degree(30) == 10 and surv == set(range(1, n + 1))
    np.testing.assert_array_equal(total, _ring_sum(xs, surv))


def test_sum_is_exact_with_dropouts_before_and_after_masking() -> None:
    n, d = 30, 1000
    xs = _inputs(n, d, seed=2)
    total, surv, _, _ = run_round(n, d, xs, drop_before_share={4, 17}, drop_after_share={1, 9, 22}, seed=5)
    assert surv == set(range(1, n + 1)) - {4, 17, 1, 9, 22}
    np.testing.assert_array_equal(total, _ring_sum(xs, surv))


def test_too_many_dropouts_fail_loudly() -> None:
    n, d = 8, 10
    xs = _inputs(n, d)
    with pytest.raises(SecAggError, match="survivors|shares"):
        run_round(n, d, xs, drop_after_share={1, 2, 3, 4, 5})


def test_quantized_float_sum_round_trip() -> None:
    """Stochastic rounding adds at most 1/s per client, so |decoded − Σ clip(x)| ≤ n/s;
    values at ±R for every client reach the overflow bound without wrapping."""
    n, d, R = 12, 500, 0.5
    q = Quantizer.for_clients(n, R)
    rng = np.random.default_rng(3)
    floats = {u: rng.normal(scale=0.3, size=d) for u in range(1, n + 1)}
    floats[1][:5] = [R, -R, 2.0, -2.0, 0.0]
    xs = {u: q.quantize(v, rng) for u, v in floats.items()}
    total, surv, _, _ = run_round(n, d, xs, seed=4)
    exact = np.sum([np.clip(floats[u], -R, R) for u in surv], axis=0)
    assert np.max(np.abs(q.decode_sum(total) - exact)) <= n / q.scale
    top = {u: q.quantize(np.full(d, R), rng) for u in range(1, n + 1)}
    total, _, _, _ = run_round(n, d, top, seed=4)
    assert q.decode_sum(total) == pytest.approx(np.full(d, n * R), abs=n / q.scale)
    with pytest.raises(SecAggError, match="wrap"):
        Quantizer(R, 2 * q.scale, n)


def test_stochastic_rounding_is_unbiased() -> None:
    """E[q] = x·s: the mean of 200,000 roundings of x·s = 0.3 + k has sd sqrt(0.21/2e5) ≈ 0.001."""
    q = Quantizer(1.0, 10.0, 2)
    x = np.full(200_000, 0.73)
    vals = q.quantize(x, np.random.default_rng(6)).view(np.int32)
    assert abs(vals.mean() - 7.3) < 5 * np.sqrt(0.21 / 200_000)
    assert set(np.unique(vals)) == {7, 8}


def _chi2_p(values, bins):
    counts = np.bincount(values, minlength=bins)
    return stats.chisquare(counts).pvalue


def test_single_masked_input_looks_uniform() -> None:
    """A masked input y_u is x_u plus AES-CTR keystream words mod 2^32, hence uniform.
    Chi-square on the 4·d bytes (255 df) and on the top byte of each word: with a
    fixed seed the p-values must not be tiny (threshold 1e-4). The same test on the
    plaintext quantized update (small values around 0) gives p ≈ 0: the test has power."""
    n, d = 12, 50_000
    q = Quantizer.for_clients(n, 1.0)
    rng = np.random.default_rng(7)
    xs = {u: q.quantize(rng.normal(scale=1e-4, size=d), rng) for u in range(1, n + 1)}
    _, _, masked, _ = run_round(n, d, xs, seed=8)
    y = masked[1]
    assert _chi2_p(np.frombuffer(y.tobytes(), np.uint8), 256) > 1e-4
    assert _chi2_p((y >> 24).astype(np.int64), 256) > 1e-4
    assert _chi2_p((y & 0xFF).astype(np.int64), 256) > 1e-4
    x = xs[1]
    assert _chi2_p(np.frombuffer(x.tobytes(), np.uint8), 256) < 1e-100
    assert _chi2_p((x >> 24).astype(np.int64), 256) < 1e-100


def test_prg_is_aes_ctr_keystream_and_seed_dependent() -> None:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    seed = bytes(range(32))
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    ref = np.frombuffer(enc.update(bytes(40)), "<u4")
    np.testing.assert_array_equal(prg_words(seed, 10), ref)
    assert not np.array_equal(prg_words(bytes(32), 10), ref)
    with pytest.raises(SecAggError, match="32 bytes"):
        prg_words(b"\x01" * 4, 10)


def test_chunked_mask_accumulation_equals_whole_vector_masks() -> None:
    """add_masks walks the vector in chunks of 2^15 words; d = 70,001 spans three chunks
    and a ragged end. Reference: whole-vector keystreams added and subtracted in uint64."""
    rng = np.random.default_rng(13)
    d = 70_001
    acc = rng.integers(0, 2**32, size=d, dtype=np.uint32)
    masks = [(rng.bytes(32), int(sign)) for sign in (1, -1, -1, 1, 1)]
    ref = acc.astype(np.int64)
    for seed, sign in masks:
        ref += sign * prg_words(seed, d).astype(np.int64)
    np.testing.assert_array_equal(add_masks(acc.copy(), masks), (ref % (1 << 32)).astype(np.uint32))


def test_shamir_reconstructs_from_any_t_and_refuses_fewer() -> None:
    rng = np.random.default_rng(9)
    secret = int.from_bytes(rng.bytes(32), "little")
    shares = shamir_split(secret, 4, list(range(1, 8)), rng.bytes)
    for _ in range(10):
        pick = [shares[i] for i in rng.choice(7, size=4, replace=False)]
        assert shamir_combine(pick) == secret
    with pytest.raises(SecAggError, match="need 4"):
        shamir_combine(shares[:3])
    forged = [Share(s.x, s.y, 3) for s in shares[:3]]  # lying about the threshold yields garbage, not the secret
    assert shamir_combine(forged) != secret
    with pytest.raises(SecAggError):
        shamir_split(PRIME, 2, [1, 2])


def test_fewer_than_t_shares_are_independent_of_the_secret() -> None:
    """Over GF(257) with shares at x = 1, 2, the Lagrange combination L = 2·y1 − y2 is
    f(0) for a line (t = 2): constant, equal to the secret. For t = 3 the two shares are
    uniform on GF(257)², so L is uniform whatever the secret: chi-square (256 df) on
    5,000 draws (19.5 expected per cell) for secrets 0 and 200 must not reject (p > 1e-4), and the t = 2 case
    shows the statistic does see the secret when enough shares exist."""
    p = 257
    rng = np.random.default_rng(10)
    for secret in (0, 200):
        ls = []
        for _ in range(5_000):
            s1, s2 = shamir_split(secret, 3, [1, 2, 3], rng.bytes, prime=p)[:2]
            ls.append((2 * s1.y - s2.y) % p)
        assert _chi2_p(np.array(ls), p) > 1e-4
        s1, s2 = shamir_split(secret, 2, [1, 2], rng.bytes, prime=p)
        assert (2 * s1.y - s2.y) % p == secret


def test_client_never_reveals_both_secrets_of_a_neighbor() -> None:
    n, d = 6, 4
    rng = np.random.default_rng(11)
    cfg = make_config(0, n, d, rng)
    clients = {u: SecAggClient(u, cfg, rng.bytes) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items()})
    for u, c in clients.items():
        server.receive_masked(u, c.masked_input(np.zeros(d, np.uint32), inbox[u]))
    everyone = set(clients)
    first = honest_unmask(clients, everyone, set())[1]
    assert {k for k, _ in first.values()} == {"b"}
    with pytest.raises(SecAggError, match="second, different survivor set"):
        clients[1].sign_survivors(everyone - {2}, lambda m: b"", "")  # a lying server now claims 2 dropped
    with pytest.raises(SecAggError, match="not the one this client signed"):
        clients[1].unmask(everyone - {2}, {2}, {}, {})
    with pytest.raises(SecAggError, match="both a survivor and dropped"):
        clients[3].unmask(everyone, {2}, {}, {})


def test_tampered_share_and_bad_inputs_refused() -> None:
    n, d = 5, 4
    rng = np.random.default_rng(12)
    cfg = make_config(0, n, d, rng)
    clients = {u: SecAggClient(u, cfg, rng.bytes) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items()})
    bad = dict(inbox[1])
    v = next(iter(bad))
    bad[v] = bad[v][:-1] + bytes([bad[v][-1] ^ 1])
    with pytest.raises(SecAggError, match="decrypt"):
        clients[1].masked_input(np.zeros(d, np.uint32), bad)
    with pytest.raises(SecAggError, match="uint32"):
        clients[2].masked_input(np.zeros(d, np.float32), inbox[2])
    with pytest.raises(SecAggError, match="never be unmasked"):
        clients[3].masked_input(np.zeros(d, np.uint32), dict(list(inbox[3].items())[:2]))
    y = clients[2].masked_input(np.zeros(d, np.uint32), inbox[2])
    server.receive_masked(2, y)
    with pytest.raises(SecAggError, match="second"):
        server.receive_masked(2, y)
    with pytest.raises(SecAggError, match="shape"):
        server.receive_masked(3, np.zeros(d + 1, np.uint32))


def test_neighbor_graph_is_regular_symmetric_and_random() -> None:
    g1 = neighbor_graph(100, 14, np.random.default_rng(0))
    g2 = neighbor_graph(100, 14, np.random.default_rng(1))
    assert all(len(vs) == 14 for vs in g1.values())
    assert all(u in g1[v] for u, vs in g1.items() for v in vs)
    assert g1 != g2
    assert default_degree(1000) == 20 and default_degree(5) == 4


def test_importing_client_sdk_fl_does_not_import_cryptography() -> None:
    code = "import sys, client_sdk, client_sdk.fl; print(json.dumps('cryptography' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) is False


def test_secure_sum_of_clipped_updates_matches_plaintext_dp_fedavg() -> None:
    """Devices clip to C and quantize with R = C; the server decodes the secure sum and
    divides by the expected count: the same aggregate as FixedClippingDP with σ = 0,
    up to the rounding error of at most n/s per coordinate (before the division)."""
    from estimator.fl.aggregators import RoundContext, WeightedMean
    from estimator.fl.dp import FixedClippingDP
    from ldp_core.fl import ClientUpdate, clip_to_norm

    n, d, C = 10, 300, 0.5
    rng = np.random.default_rng(14)
    deltas = {u: rng.normal(scale=0.1, size=d).astype(np.float32) for u in range(1, n + 1)}
    q = Quantizer.for_clients(n, C)
    xs = {u: q.quantize(clip_to_norm(v, C)[0], rng) for u, v in deltas.items()}
    total, surv, _, _ = run_round(n, d, xs, seed=15)
    secure = q.decode_sum(total) / n
    plain = FixedClippingDP(WeightedMean(), C, 0.0).aggregate(
        [ClientUpdate(str(u), 0, deltas[u], 1) for u in surv], RoundContext(0, d, rng, float(n))
    )
    assert np.max(np.abs(secure - plain.delta)) <= n / q.scale / n
    assert np.max(np.abs(plain.delta)) > 1e3 / q.scale  # the comparison is not vacuous
