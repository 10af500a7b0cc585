"""SecAgg against a malicious server (issue 13; Bonawitz et al. CCS 2017, Bell et al. CCS 2020).

Each test runs the attack in process, the server's side played by the test."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from estimator.fl.secagg_server import SecAggServer, honest_unmask, make_config
from ldp_core.fl import SecAggError
from ldp_core.fl.secagg import (
    SURVIVORS_TAG,
    SecAggClient,
    SecAggConfig,
    Share,
    add_masks,
    pairwise_seed,
    shamir_combine,
    survivors_message,
)


def _complete(n: int) -> dict[int, tuple[int, ...]]:
    return {u: tuple(v for v in range(1, n + 1) if v != u) for u in range(1, n + 1)}


def _keys(n: int) -> tuple[dict[int, Ed25519PrivateKey], dict[int, bytes]]:
    keys = {u: Ed25519PrivateKey.generate() for u in range(1, n + 1)}
    return keys, {u: k.public_key().public_bytes_raw() for u, k in keys.items()}


def _signer(key: Ed25519PrivateKey):  # type: ignore[no-untyped-def]
    return lambda m: key.sign(SURVIVORS_TAG + b"\x00" + m)


def _unmask_by_splitting(t: int, colluders: tuple[int, ...] = ()) -> np.ndarray | None:
    """The server asks for threshold t on the complete graph of 5 (4 share holders each) and shows
    inconsistent views: the honest holders in ``b_side`` are told "client 1 survived" (they reveal shares
    of b_1), those in ``s_side`` "client 1 dropped" (shares of s_1). ``colluders`` are clients the server
    controls: it reads their inboxes (so it holds their shares of both b_1 and s_1) and they sign any
    survivor set it asks for. The server passes every signature made on a set to each client shown that
    set (the consistency round, played by a lying server). It rebuilds b_1 and s_1 and strips every mask
    from y_1. Returns x_1 as the server recovered it, or None when honest clients refused."""
    n, d = 5, 64
    rng = np.random.default_rng(0)
    xs = {u: rng.integers(0, 2**32, size=d, dtype=np.uint32) for u in range(1, n + 1)}
    cfg = SecAggConfig(0, n, _complete(n), t, d)
    clients = {u: SecAggClient(u, cfg, os.urandom) for u in range(1, n + 1)}
    keys, pubs = _keys(n)
    server = SecAggServer(cfg)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    try:
        inbox = server.route_shares({u: c.share_keys(routed[u]) for u, c in clients.items()})
    except SecAggError:
        return None
    y1 = clients[1].masked_input(xs[1], inbox[1])
    for u in range(2, n + 1):
        clients[u].masked_input(xs[u], inbox[u])
    honest = [u for u in (2, 3, 4, 5) if u not in colluders]
    need = t - len(colluders)  # honest shares of each kind the server still needs
    b_side, s_side = honest[:need], honest[-need:] if need > 0 else []
    everyone, without_1 = set(range(1, n + 1)), set(range(2, n + 1))
    shown = {1: everyone, **{u: everyone for u in b_side}, **{u: without_1 for u in s_side}}
    sigs: dict[frozenset[int], dict[int, bytes]] = {frozenset(everyone): {}, frozenset(without_1): {}}
    try:
        for u, view in shown.items():  # honest clients sign the one set they are shown
            sigs[frozenset(view)][u] = clients[u].sign_survivors(view, _signer(keys[u]))
    except SecAggError:
        return None
    for c in colluders:  # the server's clients sign both sets
        for view in (everyone, without_1):
            sigs[frozenset(view)][c] = _signer(keys[c])(survivors_message("", 0, sorted(view)))
    b_shares = [clients[c]._held[1].b for c in colluders]
    s_shares = [clients[c]._held[1].s for c in colluders]
    try:
        for u in b_side:
            b_shares.append(clients[u].unmask(everyone, set(), sigs[frozenset(everyone)], pubs)[1][1])
        for u in s_side:
            s_shares.append(clients[u].unmask(without_1, {1}, sigs[frozenset(without_1)], pubs)[1][1])
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


def test_inconsistent_survivor_sets_with_colluders_below_t_get_no_shares() -> None:
    """t = 3 on the complete graph of 5 (2t = 6 > 4 holders, so the threshold check passes) and two
    colluding clients, fewer than t as the protocol assumes. The colluders give the server their shares
    of b_1 and s_1; it shows honest holder 2 "1 survived" and honest holder 3 "1 dropped". Before the
    consistency round both revealed and the server recovered x_1 exactly (checked against the old code:
    that attack returned x_1). Now holder 3 sees only the colluders' two signatures on its set, fewer than
    t from other survivors, and reveals nothing."""
    assert _unmask_by_splitting(3, colluders=(4, 5)) is None


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
        clients[1].sign_survivors({1, 2}, lambda m: b"")
    with pytest.raises(SecAggError, match="fewer than t = 3"):
        clients[1].unmask({1, 2}, {3, 4, 5}, {}, {})


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
    reveals = honest_unmask(clients, surv, dropped)
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
