"""A round's phases: opening a round (its sample, and for SecAgg its configuration), and when each phase is over.

A plain round has one phase, ``train``, closed when every sampled client's update is in or at its deadline.
A SecAgg+ round goes ``advertise`` → ``share`` → ``masked`` → ``consistency`` → ``unmask``, each phase over
when every expected message is in or at its deadline, and fails (no release, no privacy spent) when too few
clients are left for the threshold t. The last round is followed by ``done``.

The functions here change the round's part of the :class:`~estimator.fl.checkpoint.JobState` and say what
the job does next (a :class:`Move`); publishing the round state and releasing the aggregate stay the job's
(:mod:`estimator.fl.job`, :mod:`estimator.fl.release`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from estimator.fl.checkpoint import JobState
from estimator.fl.ftrl import DPFTRL
from estimator.fl.sampling import Sampling
from estimator.fl.task import FLTaskSpec
from estimator.fl.uploads import REPLAY_WINDOW

__all__ = ["Move", "open_round", "next_move"]


@dataclasses.dataclass(frozen=True)
class Move:
    """What the job does next with its round: enter ``phase`` with a deadline ``timeout`` seconds away,
    fail the round for the reason ``fail``, or (``close``) release the round's aggregate."""

    phase: str | None = None
    timeout: float = 0.0
    fail: str | None = None
    close: bool = False


def open_round(
    st: JobState,
    spec: FLTaskSpec,
    r: int,
    sampling: Sampling,
    rng: np.random.Generator,
    ftrl: DPFTRL | None,
    payload_size: int,
) -> Move:
    """Make ``r`` the current round of ``st``: keep the closing round's accepted ids (to recognise a replay),
    clear the per-round state, sample the clients (with ``rng``) and, with SecAgg, configure the round.
    The move is the round's first phase (``done`` after the last round), or its failure."""
    if st.seen:  # the closing round's accepted ids, to recognise a replay of one of them later
        st.past_ids[st.round] = sorted(st.seen)
    st.past_ids = {k: v for k, v in st.past_ids.items() if r - REPLAY_WINDOW <= k < r}
    st.round = r
    st.updates, st.seen, st.adverts, st.shares, st.inbox, st.reveals = {}, set(), {}, {}, {}, {}
    st.advert_auth, st.consistency, st.commitments = {}, {}, {}
    st.survivors, st.dropped, st.masked_sum, st.secagg, st.indices = [], [], None, None, {}
    if r >= spec.rounds:
        st.selected = []
        return Move(phase="done", timeout=0.0)
    st.selected = [str(c) for c in sampling.sample(list(spec.clients), rng)]
    if spec.secagg and ftrl is not None:  # a masked sum cannot drop a repeat: leave it out of the round
        st.selected = ftrl.eligible(st.selected)
    if not spec.secagg:
        return Move(phase="train", timeout=spec.round_timeout)
    failure = _configure_secagg(st, spec, rng, payload_size)
    if failure is not None:
        return Move(fail=failure)
    return Move(phase="advertise", timeout=spec.phase_timeout)


def _configure_secagg(st: JobState, spec: FLTaskSpec, rng: np.random.Generator, payload_size: int) -> str | None:
    """The SecAgg+ configuration of the sampled round (neighbour graph, threshold, quantizer, the public
    rotation seeds of distributed noise or compression) into ``st``; the reason when none is possible."""
    if len(st.selected) < 3:
        return f"secure aggregation needs at least 3 clients, {len(st.selected)} were sampled"
    from estimator.fl.secagg_server import default_degree, make_config
    from ldp_core.fl.secagg import Quantizer, threshold_for_colluders

    r, n = st.round, len(st.selected)
    deg = default_degree(n) if spec.secagg_degree is None else min(spec.secagg_degree, n - 1)
    c = spec.max_colluders
    t = spec.secagg_threshold
    if t is not None:  # the signed t: devices refuse any other, and any degree k with 2t <= k + c
        ok = [k for k in range(t, min(2 * t - c - 1, n - 1) + 1) if k == n - 1 or k % 2 == 0]
        if not ok:
            return f"no neighbour graph on {n} clients has a degree k with t = {t} <= k and 2t > k + {c} colluders"
        deg = max([k for k in ok if k <= deg] or [min(ok)])
    else:  # t = ⌊(k + c)/2⌋ + 1, which must not exceed k (k > c); the job takes k >= c + 2 when it can
        deg = max(deg, min(c + 2, n - 1))
        if deg < n - 1 and deg % 2:
            deg += 1
        if threshold_for_colluders(deg, c) > deg:
            return (
                f"secure aggregation on {n} clients cannot withstand max_colluders = {c}: the largest degree "
                f"{n - 1} needs t = {threshold_for_colluders(n - 1, c)} > k"
            )
        t = threshold_for_colluders(deg, c)
    ddg = None if spec.noise is None else spec.noise.build(spec, payload_size)
    comp = spec.build_compression()
    length = payload_size if ddg is None else ddg.padded_dim  # DDG rotates a power-of-two padding
    if comp is not None:  # b-bit codes summed in Z_{2^ring_bits} (issue 18), padded when rotated
        length = comp.length(payload_size)
    cfg = make_config(r, n, length, rng, deg, t)
    st.indices = {c: i + 1 for i, c in enumerate(st.selected)}
    st.secagg = {
        "num_clients": n,
        "neighbors": {str(u): list(vs) for u, vs in cfg.neighbors.items()},
        "threshold": cfg.threshold,
        "vector_length": cfg.vector_length,
    }
    if spec.pate is not None:  # whole vote counts: no quantizer (the devices' words are 0/1, or noised integers)
        st.secagg["pate"] = {"queries": int(spec.pate["queries"]), "classes": int(spec.pate["classes"])}
    else:
        q = Quantizer.for_clients(n, float(spec.clip_norm))  # type: ignore[arg-type]
        st.secagg.update(clip_range=q.clip_range, scale=q.scale, max_clients=q.max_clients)
    if ddg is not None:  # the rotation is public (the server inverts it); the devices' noise is not
        st.secagg["ddg"] = {"rotation_seed": int(rng.integers(0, 2**62)), "bits": ddg.bits}
    if comp is not None:  # the rotation seed is public; the devices pack their words ring_bits each
        st.secagg["compression"] = {"rotation_seed": int(rng.integers(0, 2**62)), **comp.to_dict()}
    st.masked_sum = np.zeros(length, np.uint32)
    return None


def next_move(st: JobState, spec: FLTaskSpec, late: bool) -> Move | None:
    """The move out of the current phase if it is over (every expected message in, or ``late``: past the
    deadline), else None (wait). Entering ``masked`` routes the shares to their recipients' inboxes;
    entering ``consistency`` fixes the survivors and the dropped."""
    phase, sa = st.phase, st.secagg
    if phase == "train":
        return Move(close=True) if late or set(st.updates) >= set(st.selected) else None
    if phase == "advertise":
        if not (late or len(st.adverts) == len(st.selected)):
            return None
        if len(st.adverts) < int(sa["threshold"]) + 1:  # type: ignore[index]
            return Move(fail=f"only {len(st.adverts)} clients advertised keys")
        return Move(phase="share", timeout=spec.phase_timeout)
    if phase == "share":
        if not (late or set(st.shares) >= set(st.adverts)):
            return None
        _route_shares(st)
        return Move(phase="masked", timeout=spec.phase_timeout)
    if phase == "masked":
        sharers = set(sa["sharers"])  # type: ignore[index]
        if not (late or set(st.survivors) >= sharers):
            return None
        if len(st.survivors) < int(sa["threshold"]):  # type: ignore[index]
            return Move(fail=f"only {len(st.survivors)} masked inputs arrived")
        st.dropped = sorted(sharers - set(st.survivors))
        st.survivors = sorted(st.survivors)
        st.inbox = {}
        st.consistency = {}
        return Move(phase="consistency", timeout=spec.phase_timeout)
    if phase == "consistency":
        if not (late or set(st.consistency) >= set(st.survivors)):
            return None
        if len(st.consistency) < int(sa["threshold"]) + 1:  # type: ignore[index]
            # each survivor reveals only with t signatures from *other* survivors
            return Move(fail=f"only {len(st.consistency)} survivors signed the survivor set")
        return Move(phase="unmask", timeout=spec.phase_timeout)
    if phase == "unmask":
        return Move(close=True) if late or set(st.reveals) >= set(st.survivors) else None
    return None


def _route_shares(st: JobState) -> None:
    """Turn the sharers' ciphertexts (by sender) into each recipient's inbox, and record who shared."""
    inbox: dict[int, dict[int, bytes]] = {}
    for u, per in st.shares.items():
        for v, ct in per.items():
            inbox.setdefault(v, {})[u] = ct
    st.inbox, st.shares = inbox, {}
    st.survivors = []
    st.secagg["sharers"] = sorted(set().union(*[set(per) for per in inbox.values()]) if inbox else set())  # type: ignore[index]
