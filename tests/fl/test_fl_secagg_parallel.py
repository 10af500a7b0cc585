"""Unmasking on several processes (estimator.fl.parallel_masks) and masks that start
mid-vector (add_masks ``start``): both must reproduce the one-pass masks word for word."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.fl.parallel_masks import add_masks_parallel, add_masks_server, slices
from estimator.fl.secagg_server import SecAggServer, honest_unmask, make_config
from ldp_core.fl import SecAggError
from ldp_core.fl.secagg import SecAggClient, add_masks, prg_words, shamir_combine, shamir_split


def _reference(acc: np.ndarray, masks, start: int = 0) -> np.ndarray:
    """Whole keystreams from word 0, cut at ``start``, added and subtracted in int64."""
    n = acc.shape[0]
    ref = acc.astype(np.int64)
    for seed, sign in masks:
        ref += sign * prg_words(seed, start + n)[start:].astype(np.int64)
    return (ref % (1 << 32)).astype(np.uint32)


@pytest.mark.parametrize("start,n", [(0, 9), (4, 37), (32_764, 40), (32_768, 70_001), (4 * 12_345, 1)])
def test_masks_from_an_offset_equal_the_tail_of_the_whole_keystream(start: int, n: int) -> None:
    rng = np.random.default_rng(start + n)
    acc = rng.integers(0, 2**32, size=n, dtype=np.uint32)
    masks = [(rng.bytes(32), s) for s in (1, -1, 1)]
    np.testing.assert_array_equal(add_masks(acc.copy(), masks, start=start), _reference(acc, masks, start))


@pytest.mark.parametrize("k,start,n", [(1, 0, 5), (3, 8, 32_770), (4, 0, 65_536), (9, 32_768, 70_001)])
def test_server_kernel_accumulation_equals_the_device_masks(k: int, start: int, n: int) -> None:
    """The server adds keystreams four at a time in a numba kernel (multipliers 1, 2^32 − 1,
    and 0 for padding when k is not a multiple of 4); the sum must equal the device's add_masks."""
    rng = np.random.default_rng(k * 7 + n)
    acc = rng.integers(0, 2**32, size=n, dtype=np.uint32)
    masks = [(rng.bytes(32), int(s)) for s in rng.choice([-1, 1], size=k)]
    np.testing.assert_array_equal(
        add_masks_server(acc.copy(), masks, start=start), add_masks(acc.copy(), masks, start=start)
    )
    np.testing.assert_array_equal(add_masks_server(acc.copy(), [], start=start), acc)


@pytest.mark.parametrize("start", [1, 6, -4, 4.0, True])
def test_offset_must_be_a_whole_aes_block(start) -> None:
    with pytest.raises(SecAggError, match="multiple of 4"):
        add_masks(np.zeros(8, np.uint32), [(bytes(32), 1)], start=start)
    with pytest.raises(SecAggError, match="multiple of 4"):
        add_masks_server(np.zeros(8, np.uint32), [(bytes(32), 1)], start=start)


@pytest.mark.parametrize("d,parts", [(1, 2), (7, 2), (8, 3), (70_001, 2), (1_000_000, 3), (5, 8)])
def test_slices_cover_the_vector_once_at_block_boundaries(d: int, parts: int) -> None:
    sl = slices(d, parts)
    assert len(sl) <= parts and sl[0][0] == 0 and sl[-1][1] == d
    assert all(s % 4 == 0 and s < e for s, e in sl)
    assert all(a[1] == b[0] for a, b in zip(sl, sl[1:]))


@pytest.mark.parametrize("workers", [2, 3])
def test_parallel_unmasking_equals_one_process(workers: int) -> None:
    rng = np.random.default_rng(workers)
    d = 70_001
    acc = rng.integers(0, 2**32, size=d, dtype=np.uint32)
    masks = [(rng.bytes(32), int(s)) for s in rng.choice([-1, 1], size=9)]
    expected = _reference(acc, masks)
    np.testing.assert_array_equal(add_masks_parallel(acc.copy(), masks, workers), expected)
    np.testing.assert_array_equal(add_masks_parallel(acc.copy(), masks, 1), expected)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_worker_count_is_checked(workers) -> None:
    with pytest.raises(SecAggError, match="workers"):
        add_masks_parallel(np.zeros(8, np.uint32), [], workers)
    with pytest.raises(SecAggError, match="workers"):
        SecAggServer(make_config(0, 5, 8, np.random.default_rng(0)), workers=workers)


def test_round_with_two_unmasking_processes_is_exact_with_dropouts() -> None:
    n, d = 24, 5_003
    rng = np.random.default_rng(21)
    cfg = make_config(1, n, d, rng)
    xs = {u: rng.integers(0, 2**32, size=d, dtype=np.uint32) for u in range(1, n + 1)}
    clients = {u: SecAggClient(u, cfg, rng.bytes) for u in range(1, n + 1)}
    server = SecAggServer(cfg, workers=2)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items() if u != 6})
    for u in sorted(server.shared - {2, 13, 20}):
        server.receive_masked(u, clients[u].masked_input(xs[u], inbox.get(u, {})))
    surv, dropped = server.unmask_request()
    assert dropped == {2, 13, 20}
    total = server.finish(honest_unmask(clients, surv, dropped))
    expected = np.sum([xs[u].astype(np.uint64) for u in surv], axis=0) % (1 << 32)
    np.testing.assert_array_equal(total, expected.astype(np.uint32))


@pytest.mark.parametrize("t,k", [(2, 3), (11, 20), (21, 21)])
def test_shamir_combine_with_one_inversion_reconstructs_from_any_t(t: int, k: int) -> None:
    """shamir_combine inverts the product of the t Lagrange denominators once; any t of k
    shares must still give the secret, and t − 1 must be refused."""
    rng = np.random.default_rng(t * 100 + k)
    secret = int.from_bytes(rng.bytes(32), "little")
    shares = shamir_split(secret, t, list(range(1, k + 1)), rng.bytes)
    for _ in range(5):
        assert shamir_combine([shares[i] for i in rng.choice(k, size=t, replace=False)]) == secret
    with pytest.raises(SecAggError, match=f"need {t}"):
        shamir_combine(shares[: t - 1])
