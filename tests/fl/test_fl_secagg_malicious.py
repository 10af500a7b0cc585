"""SecAgg against a malicious server (issue 13; Bonawitz et al. CCS 2017, Bell et al. CCS 2020).

Each test runs the attack in process, the server's side played by the test."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from client_sdk.fl import SecAggError
from client_sdk.fl.secagg import SecAggClient, SecAggConfig, Share, add_masks, pairwise_seed, shamir_combine
from estimator.fl.secagg_server import SecAggServer, make_config


def _complete(n: int) -> dict[int, tuple[int, ...]]:
    return {u: tuple(v for v in range(1, n + 1) if v != u) for u in range(1, n + 1)}


def _unmask_by_splitting(t: int) -> np.ndarray | None:
    """The server asks for threshold t on the complete graph of 5 (4 share holders each), tells holders
    2, 3 "client 1 survived" (they reveal shares of b_1) and holders 4, 5 "client 1 dropped" (they reveal
    shares of s_1), rebuilds b_1 and s_1 and strips every mask from y_1. Returns x_1 as the server
    recovered it, or None when honest clients refused."""
    n, d = 5, 64
    rng = np.random.default_rng(0)
    xs = {u: rng.integers(0, 2**32, size=d, dtype=np.uint32) for u in range(1, n + 1)}
    cfg = SecAggConfig(0, n, _complete(n), t, d)
    clients = {u: SecAggClient(u, cfg, os.urandom) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    try:
        inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items()})
    except SecAggError:
        return None
    y1 = clients[1].masked_input(xs[1], inbox[1])
    for u in range(2, n + 1):
        clients[u].masked_input(xs[u], inbox[u])
    everyone = set(range(1, n + 1))
    b_shares, s_shares = [], []
    try:
        for u in (2, 3):
            b_shares.append(clients[u].unmask(everyone, set())[1][1])
        for u in (4, 5):
            s_shares.append(clients[u].unmask(everyone - {1}, {1})[1][1])
        b1 = shamir_combine(b_shares).to_bytes(32, "little")
        s1 = X25519PrivateKey.from_private_bytes(shamir_combine(s_shares).to_bytes(32, "little"))
    except SecAggError:
        return None
    masks = [(b1, -1)]
    for v in range(2, n + 1):
        seed = pairwise_seed(s1, X25519PublicKey.from_public_bytes(server.adverts[v].mask_key), 0, 1, v)
        masks.append((seed, -1 if v > 1 else 1))
    out = add_masks(y1.copy(), masks)
    return out if np.array_equal(out, xs[1]) else None


def test_a_server_asking_for_t_2_cannot_unmask_one_client() -> None:
    """On the old code the attack at t = 2 returned client 1's input exactly (clients accepted any
    2 ≤ t ≤ degree). Clients now share only when 2t > their share holders, so at t = 2 with 4 holders
    they refuse; at t = 3 the split needs a holder to reveal both seeds, which honest clients refuse."""
    assert _unmask_by_splitting(2) is None
    assert _unmask_by_splitting(3) is None


def test_clients_refuse_a_threshold_other_than_the_signed_one_and_too_few_survivors() -> None:
    cfg = SecAggConfig(0, 5, _complete(5), 3, 8)
    with pytest.raises(SecAggError, match="signed task configuration fixes t = 4"):
        SecAggClient(1, cfg, os.urandom, required_threshold=4)
    clients = {u: SecAggClient(u, cfg, os.urandom, required_threshold=3) for u in range(1, 6)}
    server = SecAggServer(cfg)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items()})
    clients[1].masked_input(np.zeros(8, np.uint32), inbox[1])
    with pytest.raises(SecAggError, match="fewer than t = 3"):
        clients[1].unmask({1, 2}, {3, 4, 5})


def test_a_bad_share_of_a_self_mask_seed_is_detected_and_excluded() -> None:
    """A survivor reveals a wrong share of a neighbour's self-mask seed. Without the seed commitments the
    released sum is garbage and nothing says so (the old behaviour, shown first); with them the bad share
    is excluded, counted, and the sum is exact from the remaining honest shares."""
    n, d = 7, 200
    rng = np.random.default_rng(3)
    cfg = make_config(0, n, d, rng)  # complete graph of 7: 6 holders, t = 4
    xs = {u: rng.integers(0, 2**32, size=d, dtype=np.uint32) for u in range(1, n + 1)}
    clients = {u: SecAggClient(u, cfg, rng.bytes) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items()})
    for u in range(1, n + 1):
        server.receive_masked(u, clients[u].masked_input(xs[u], inbox[u]))
    surv, dropped = server.unmask_request()
    reveals = {u: clients[u].unmask(surv, dropped) for u in surv}
    kind, good = reveals[2][1]
    reveals[2][1] = (kind, Share(good.x, (good.y + 1) % ((1 << 521) - 1), good.threshold))
    truth = np.sum([xs[u].astype(np.uint64) for u in surv], axis=0) % (1 << 32)
    # shamir_combine uses the first t distinct points: put the bad one first, as an attacker would
    order = {2: reveals[2], **{u: r for u, r in reveals.items() if u != 2}}
    assert not np.array_equal(server.finish(order), truth)  # silently wrong without commitments
    commitments = {u: c.commitments for u, c in clients.items()}
    total = server.finish(order, commitments)
    assert server.bad_shares == 1
    np.testing.assert_array_equal(total, truth)
