"""Secure aggregation, server side (SecAgg+ style; the device side and the
protocol are described in :mod:`ldp_core.fl.secagg`).

The server picks the round's public parameters: a random neighbour graph of
degree k = O(log n) (B20: a Harary graph — each client joined to the k/2
nearest on each side of a ring — on a uniformly random relabelling of the
clients) and the threshold t. It routes keys and encrypted shares, adds the
masked inputs into one running sum as they arrive (memory O(d), not O(n·d)),
and at the end removes the masks: the self mask PRG(b_u) of every survivor u
and, for every client v that dropped after sharing its keys, the pairwise
masks its surviving neighbours added for it, recomputed from v's mask key
s_v rebuilt from t shares (and checked against v's advertised public key).

Assumptions (see the device module): a server that draws the graph honestly.
Against a server that lies about who survived, clients run B17's consistency
round (signed survivor sets, :meth:`SecAggClient.sign_survivors`, checked in
:meth:`SecAggClient.unmask`); :func:`honest_unmask` plays it in process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from estimator.fl.parallel_masks import add_masks_parallel, warm_pool
from ldp_core.fl.errors import SecAggError
from ldp_core.fl.secagg import (
    KeyAdvert,
    SecAggClient,
    SecAggConfig,
    Share,
    pairwise_seed,
    public_bytes,
    shamir_combine,
    share_commitment,
)

__all__ = ["default_degree", "default_threshold", "neighbor_graph", "make_config", "SecAggServer", "honest_unmask"]


def default_degree(n: int) -> int:
    """k = 2⌈log₂ n⌉, even, capped at n − 1 (the complete graph for small n)."""
    if n < 3:
        raise SecAggError(f"secure aggregation needs at least 3 clients, got {n}")
    k = 2 * math.ceil(math.log2(n))
    return n - 1 if k >= n - 1 else k


def default_threshold(degree: int, colluders: int = 0) -> int:
    """t = ⌊(k + c)/2⌋ + 1: the smallest t with 2t > k + c, so that no split of a client's k share holders
    with c of them colluding yields both its secrets (``ldp_core.fl.secagg.split_attack_possible``);
    c = 0 gives a majority of the neighbours. Raises when that t exceeds k (no such graph is usable)."""
    from ldp_core.fl.secagg import threshold_for_colluders

    t = threshold_for_colluders(degree, colluders)
    if t > degree:
        raise SecAggError(
            f"degree {degree} cannot withstand {colluders} colluding neighbours: 2t > k + c needs t = {t} > k"
        )
    return t


def neighbor_graph(n: int, degree: int, rng: np.random.Generator) -> dict[int, tuple[int, ...]]:
    """A random k-regular graph on 1..n: the Harary graph H(k, n) with k even on a
    random permutation of the clients (B20 §3), or the complete graph if k = n − 1."""
    if not 2 <= degree <= n - 1:
        raise SecAggError(f"degree must be in [2, n − 1 = {n - 1}], got {degree}")
    if degree == n - 1:
        return {u: tuple(v for v in range(1, n + 1) if v != u) for u in range(1, n + 1)}
    if degree % 2:
        raise SecAggError(f"a Harary graph needs an even degree below n − 1, got {degree}")
    order = rng.permutation(n) + 1
    nbrs: dict[int, set[int]] = {u: set() for u in range(1, n + 1)}
    for i in range(n):
        for j in range(1, degree // 2 + 1):
            a, b = int(order[i]), int(order[(i + j) % n])
            nbrs[a].add(b)
            nbrs[b].add(a)
    return {u: tuple(sorted(vs)) for u, vs in nbrs.items()}


def make_config(
    round: int,
    n: int,
    d: int,
    rng: np.random.Generator,
    degree: int | None = None,
    threshold: int | None = None,
    colluders: int = 0,
) -> SecAggConfig:
    """The round's parameters with the defaults above (t for ``colluders`` colluding neighbours)."""
    k = default_degree(n) if degree is None else degree
    t = default_threshold(k, colluders) if threshold is None else threshold
    return SecAggConfig(round, n, neighbor_graph(n, k, rng), t, d)


class SecAggServer:
    """The server's side of one round.

    ``workers`` > 1 removes the masks in :meth:`finish` on that many processes
    (:mod:`estimator.fl.parallel_masks`; the helper processes start here and are
    reused by later rounds)."""

    def __init__(self, config: SecAggConfig, workers: int = 1) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise SecAggError(f"workers must be an integer >= 1, got {workers!r}")
        self.config = config
        self.workers = workers
        if workers > 1:
            warm_pool(workers)
        self.adverts: dict[int, KeyAdvert] = {}
        self.shared: set[int] = set()
        self.survivors: set[int] = set()
        self.bad_shares = 0
        self._sum = np.zeros(config.vector_length, np.uint32)

    @classmethod
    def resume(
        cls,
        config: SecAggConfig,
        adverts: Mapping[int, KeyAdvert],
        shared: set[int],
        survivors: set[int],
        masked_sum: np.ndarray,
    ) -> SecAggServer:
        """A server in the state these values describe (a job restoring a round from its checkpoint):
        ``masked_sum`` is Σ y_u over ``survivors`` (mod 2^32)."""
        s = cls(config)
        d = config.vector_length
        total = np.asarray(masked_sum)
        if total.dtype != np.uint32 or total.shape != (d,):
            raise SecAggError(f"the masked sum must be uint32 of shape ({d},), got {total.dtype} {total.shape}")
        if not survivors <= shared <= set(adverts) <= set(config.neighbors):
            raise SecAggError("survivors must have shared, sharers advertised, advertisers be in the graph")
        s.adverts = dict(adverts)
        s.shared = set(shared)
        s.survivors = set(survivors)
        s._sum = total.copy()
        return s

    def collect_adverts(self, adverts: list[KeyAdvert]) -> dict[int, dict[int, KeyAdvert]]:
        """Record round-0 keys; return, for each advertiser, its neighbours' adverts."""
        for a in adverts:
            if a.index not in self.config.neighbors or a.index in self.adverts:
                raise SecAggError(f"unexpected or repeated key advert from {a.index}")
            self.adverts[a.index] = a
        nb = self.config.neighbors
        return {u: {v: self.adverts[v] for v in nb[u] if v in self.adverts} for u in self.adverts}

    def route_shares(self, shares: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[int, bytes]]:
        """Record who shared (U2) and deliver each ciphertext to its recipient."""
        out: dict[int, dict[int, bytes]] = {}
        for u, per in shares.items():
            if u not in self.adverts:
                raise SecAggError(f"shares from {u}, who advertised no keys")
            self.shared.add(u)
            for v, ct in per.items():
                if v not in self.config.neighbors[u] or v not in self.adverts:
                    raise SecAggError(f"{u} addressed a share to {v}, not a neighbour with keys")
                out.setdefault(v, {})[u] = ct
        return out

    def receive_masked(self, u: int, y: np.ndarray) -> None:
        """Add y_u into the running sum (mod 2^32)."""
        d = self.config.vector_length
        if u not in self.shared:
            raise SecAggError(f"masked input from {u}, who did not share keys")
        if u in self.survivors:
            raise SecAggError(f"a second masked input from {u}")
        y = np.asarray(y)
        if y.dtype != np.uint32 or y.shape != (d,):
            raise SecAggError(f"masked input of {u}: expected uint32 of shape ({d},), got {y.dtype} of shape {y.shape}")
        self._sum += y
        self.survivors.add(u)

    def unmask_request(self) -> tuple[set[int], set[int]]:
        """(survivors U3, dropped U2 − U3), sent to every survivor."""
        return set(self.survivors), self.shared - self.survivors

    def finish(
        self,
        reveals: Mapping[int, Mapping[int, tuple[str, Share]]],
        commitments: Mapping[int, Mapping[int, bytes]] | None = None,
    ) -> np.ndarray:
        """The sum of the survivors' quantized inputs in Z_{2^32}^d.

        ``commitments[v][w]`` (what v sent with its shares: SHA-256 of the b share ‖ of the s share it gave
        w, :func:`~ldp_core.fl.secagg.share_commitment`): a revealed share that does not match is
        excluded and counted in :attr:`bad_shares`, so one bad share cannot turn the sum into garbage."""
        survivors, dropped = self.unmask_request()
        self.bad_shares = 0
        if len(survivors) < self.config.threshold:
            raise SecAggError(f"{len(survivors)} survivors, fewer than t = {self.config.threshold}")
        b_sh: dict[int, list[Share]] = {}
        s_sh: dict[int, list[Share]] = {}
        for sender, per in reveals.items():
            if sender not in survivors:
                continue
            for v, (kind, share) in per.items():
                if v not in self.config.neighbors[sender]:
                    continue
                if commitments is not None and v in commitments:  # v committed to its shares: check each
                    c = commitments[v].get(sender)
                    part = None if c is None or len(c) != 64 else (c[:32] if kind == "b" else c[32:])
                    if part != share_commitment(self.config.round, v, sender, kind, share):
                        self.bad_shares += 1
                        continue
                if kind == "b" and v in survivors:
                    b_sh.setdefault(v, []).append(share)
                elif kind == "s" and v in dropped:
                    s_sh.setdefault(v, []).append(share)
        masks: list[tuple[bytes, int]] = []
        for u in sorted(survivors):
            shares = b_sh.get(u, [])
            if len(shares) < self.config.threshold:
                raise SecAggError(
                    f"only {len(shares)} shares of client {u}'s self-mask seed; need {self.config.threshold}"
                )
            masks.append((shamir_combine(shares).to_bytes(32, "little"), -1))
        nb = self.config.neighbors
        for v in sorted(dropped):
            shares = s_sh.get(v, [])
            if len(shares) < self.config.threshold:
                raise SecAggError(
                    f"only {len(shares)} shares of dropped client {v}'s mask key; need {self.config.threshold}"
                )
            sk = X25519PrivateKey.from_private_bytes(shamir_combine(shares).to_bytes(32, "little"))
            if public_bytes(sk.public_key()) != self.adverts[v].mask_key:
                raise SecAggError(f"the mask key rebuilt for client {v} does not match its advertised key: bad shares")
            for u in nb[v]:
                if u in survivors:
                    seed = pairwise_seed(
                        sk, X25519PublicKey.from_public_bytes(self.adverts[u].mask_key), self.config.round, v, u
                    )
                    masks.append((seed, -1 if v > u else 1))  # u added +PRG when v > u
        total = self._sum.copy()
        return add_masks_parallel(total, masks, self.workers)


def honest_unmask(
    clients: Mapping[int, SecAggClient], survivors: set[int], dropped: set[int], context: str = ""
) -> dict[int, dict[int, tuple[str, Share]]]:
    """In-process simulation of an honest server's last two rounds: every survivor signs the same survivor
    set with its own (fresh) Ed25519 device key, receives every signature and reveals its shares. The
    pipeline does this with the enrolled device keys (estimator/fl/job.py, client_sdk/fl/device.py)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ldp_core.fl.secagg import SURVIVORS_TAG

    keys = {u: Ed25519PrivateKey.generate() for u in survivors}
    pubs = {u: k.public_key().public_bytes_raw() for u, k in keys.items()}

    def signer(u: int) -> Callable[[bytes], bytes]:
        return lambda m: keys[u].sign(SURVIVORS_TAG + b"\x00" + m)

    sigs = {u: clients[u].sign_survivors(survivors, signer(u), context) for u in survivors}
    return {u: clients[u].unmask(survivors, dropped, sigs, pubs, context) for u in survivors}
