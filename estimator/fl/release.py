"""Closing a round: the three ways its aggregate is released, and what a release changes in the job's state.

* **Plain uploads**: the task's aggregator stack over the round's updates (:func:`close_plain`; the DP
  wrappers add their noise, a robust wrapper may refuse a round with too few updates).
* **SecAgg with central noise**: the survivors' masked sum is unmasked, decoded, and noised by the server
  (Gaussian noise of σ·C, DP-FTRL's tree increment, or a compressed ring's release) (:func:`close_secagg`).
* **SecAgg with distributed noise**: the unmasked sum already carries the devices' discrete Gaussian
  shares; the server only decodes it (:func:`close_secagg`, ``ddg`` rounds).

Each returns a :class:`Release` or the reason the round fails (nothing is released, no privacy spent);
:func:`record_release` applies a release to the model and the round history.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from estimator.fl.aggregator_specs import FLAccountant
from estimator.fl.aggregators import AggregateResult, Aggregator, RoundContext
from estimator.fl.checkpoint import JobState
from estimator.fl.checkpoint import json_float as _f
from estimator.fl.dp import AdaptiveClippingDP
from estimator.fl.ftrl import DPFTRL
from estimator.fl.privacy import ddg_accountant
from estimator.fl.strategies import Strategy
from estimator.fl.task import FLTaskSpec
from estimator.fl.uploads import REPLAY_WINDOW
from ldp_core.fl.errors import FLError, SecAggError
from ldp_core.fl.training import ClientUpdate

__all__ = ["Release", "close_plain", "close_secagg", "close_pate", "record_release", "VoteRelease"]

log = logging.getLogger("ldp.fl.job")


@dataclasses.dataclass(frozen=True)
class Release:
    """A round's released aggregate and what its history record adds to the aggregator's info."""

    result: AggregateResult
    extra: dict[str, Any]


def close_plain(st: JobState, aggregator: Aggregator, ctx: RoundContext) -> Release | str:
    """The aggregate of the sampled clients' updates; the reason when the aggregator refuses the round."""
    ups = [ClientUpdate(c, st.round, st.updates[c][1], st.updates[c][2]) for c in st.selected if c in st.updates]
    try:
        res = aggregator.aggregate(ups, ctx)
    except FLError as exc:  # a robust wrapper with too few updates for its f: nothing is released
        return f"aggregation refused the round: {exc}"
    return Release(res, {})


def _unmask(st: JobState) -> np.ndarray | str:
    """The survivors' sum mod 2^32 from the masked sum and the revealed shares; the reason when it fails.
    Shares that do not match their commitments are counted in ``st.rejected["bad_share"]``."""
    from estimator.fl.secagg_server import SecAggServer
    from ldp_core.fl.secagg import KeyAdvert, SecAggConfig, Share

    sa = st.secagg
    assert sa is not None and st.masked_sum is not None
    cfg = SecAggConfig(
        st.round,
        int(sa["num_clients"]),
        {int(u): tuple(vs) for u, vs in sa["neighbors"].items()},
        int(sa["threshold"]),
        int(sa["vector_length"]),
    )
    server = SecAggServer.resume(
        cfg,
        {u: KeyAdvert(u, a, b) for u, (a, b) in st.adverts.items()},
        set(sa["sharers"]),
        set(st.survivors),
        st.masked_sum,
    )
    reveals = {u: {v: (k, Share(x, y, t)) for v, (k, x, y, t) in per.items()} for u, per in st.reveals.items()}
    try:
        total = server.finish(reveals, st.commitments)
    except SecAggError as exc:
        return f"unmasking failed: {exc}"
    if server.bad_shares:
        st.rejected["bad_share"] += server.bad_shares
        log.warning("round %d: %d revealed shares did not match their commitments", st.round, server.bad_shares)
    return total


#: what a PATE task's job does with the unmasked vote histograms (queries × classes, the survivors' count):
#: answer and account (:class:`estimator.pate.fl_task.PateVoteRelease`); returns the published record
VoteRelease = Callable[[np.ndarray, int, int], dict[str, Any]]


def close_pate(st: JobState, spec: FLTaskSpec, release_votes: VoteRelease) -> dict[str, Any] | str:
    """A PATE round: unmask only the sum of the teachers' vote vectors, read it as the histograms and hand them
    to ``release_votes`` (GNMax or Confident-GNMax and their ε); the history record it returns is published,
    the histograms are not (their digest is the operator's audit record, as for a model round)."""
    assert spec.pate is not None and st.secagg is not None
    total = _unmask(st)
    if isinstance(total, str):
        return total
    q, k = int(spec.pate["queries"]), int(spec.pate["classes"])
    hist = total.view(np.int32).astype(np.int64).reshape(q, k)  # signed: distributed noise may go below 0
    record = release_votes(hist, len(st.survivors), st.round)
    st.audit[st.round] = hashlib.sha256(total.astype("<u4").tobytes()).hexdigest()
    st.audit = {r: h for r, h in st.audit.items() if r > st.round - REPLAY_WINDOW}
    st.epsilon = record.get("epsilon")
    rec = {"round": st.round, "clients": len(st.survivors), "epsilon": _f(st.epsilon), **_secagg_extra(st)}
    rec["pate"] = record
    st.history.append(rec)
    return rec


def close_secagg(
    st: JobState,
    spec: FLTaskSpec,
    payload_size: int,
    ctx: RoundContext,
    accountant: FLAccountant | None,
    ftrl: DPFTRL | None,
) -> Release | str:
    """Unmask the survivors' sum with the revealed shares and release it (central noise, DP-FTRL, a compressed
    ring or distributed noise, as the task says); the reason when the round cannot be released. Shares that do
    not match their commitments are counted in ``st.rejected["bad_share"]``; a central-noise round keeps the
    digest of its un-noised sum in ``st.audit``."""
    from ldp_core.fl.secagg import Quantizer

    sa = st.secagg
    assert sa is not None and st.masked_sum is not None
    noise = spec.noise
    if "ddg" in sa and noise is not None and len(st.survivors) < noise.shares(spec):
        # fewer noise shares than the accountant assumes: the operator does not even unmask this sum
        return f"only {len(st.survivors)} survivors: fewer than {noise.shares(spec)} noise shares"
    total = _unmask(st)
    if isinstance(total, str):
        return total
    if "ddg" in sa and noise is not None:
        return _release_ddg(st, spec, payload_size, total, int(sa["ddg"]["rotation_seed"]), ctx, accountant)
    comp = spec.build_compression()
    if comp is not None and "compression" in sa:  # fedavg only: the task refuses other aggregators with it
        # σ relative to the codes' sensitivity (the bound B every honest device enforces, C + Δ·√D with
        # unbiased rounding, or the clipped sketch's), added where that bound holds: on the decoded codes, or
        # on the summed sketch before unsketching (RingQuantization / RingCountSketch.release)
        sensitivity = comp.sensitivity(float(spec.clip_norm), payload_size)  # type: ignore[arg-type]
        sd = float(spec.noise_multiplier) * sensitivity
        seed = int(sa["compression"]["rotation_seed"])
        noisy = comp.release(total, len(st.survivors), seed, payload_size, sd, ctx.rng)
        res = _gaussian_result(spec, accountant, noisy, sd, ctx, len(st.survivors))
    else:
        q = Quantizer(float(sa["clip_range"]), float(sa["scale"]), int(sa["max_clients"]))
        s = q.decode_sum(total)
        if ftrl is not None:  # DP-FTRL: the tree's increment on the unmasked sum (central noise)
            by_index = {i: c for c, i in st.indices.items()}
            res = ftrl.release_sum(s, [by_index[u] for u in st.survivors], ctx)
        else:  # σ relative to C, so the accountant's ε holds
            sd = float(spec.noise_multiplier) * float(spec.clip_norm)  # type: ignore[arg-type]
            noisy = s + (ctx.rng.normal(0.0, sd, size=s.shape) if sd > 0 else 0.0)
            res = _gaussian_result(spec, accountant, noisy, sd, ctx, len(st.survivors))
    # the digest of the un-noised sum is an integrity record for the operator's audit, kept in the checkpoint
    # only: published, it would let anyone who knows the other inputs test a hypothesis about one client's
    # update with certainty (issue 13), voiding the DP guarantee of the noised release
    st.audit[st.round] = hashlib.sha256(total.astype("<u4").tobytes()).hexdigest()
    st.audit = {r: h for r, h in st.audit.items() if r > st.round - REPLAY_WINDOW}
    return Release(res, _secagg_extra(st))


def _secagg_extra(st: JobState) -> dict[str, Any]:
    return {"secagg_survivors": list(st.survivors), "secagg_dropped": list(st.dropped)}


def _gaussian_result(
    spec: FLTaskSpec,
    accountant: FLAccountant | None,
    noisy: np.ndarray,
    sd: float,
    ctx: RoundContext,
    survivors: int,
) -> AggregateResult:
    """A SecAgg round's central-noise release (the noised sum over the expected count), told to the accountant."""
    if accountant is not None:
        accountant.record(spec.noise_multiplier)
    return AggregateResult(
        noisy / ctx.expected_clients,
        ctx.expected_clients,
        survivors,
        {"noise_stddev": sd, "clip_norm": spec.clip_norm},
    )


def _release_ddg(
    st: JobState,
    spec: FLTaskSpec,
    payload_size: int,
    total: np.ndarray,
    rotation_seed: int,
    ctx: RoundContext,
    accountant: FLAccountant | None,
) -> Release:
    """Release a distributed-DG round: the unmasked sum mod 2^bits already carries the devices' noise;
    the server only decodes it (nothing is added, nothing un-noised was ever in its hands)."""
    noise = spec.noise
    assert noise is not None
    ddg = noise.build(spec, payload_size)
    s = ddg.decode_sum(total.astype(np.int64), rotation_seed)
    if accountant is not None:
        accountant.record(spec.noise_multiplier)
    acc = ddg_accountant(spec, payload_size, len(st.noise_history) + 1)
    info = {
        "noise_stddev": math.sqrt(ddg.noise_variance()),
        "clip_norm": spec.clip_norm,
        "noise": noise.kind,
        "bits": ddg.bits,
        "modular_clipping_bound": acc.modular_clipping_bound(),
        "epsilon": acc.epsilon(),
        # beside it, the figure when only the task's assumed honest share of the sample adds noise the operator
        # does not know (the operator enrolls devices and draws the sample: docs/fl/SECAGG.md)
        "epsilon_assumed_honest": acc.epsilon(shares=noise.honest_shares(spec)),
        "assumed_honest_shares": noise.honest_shares(spec),
    }
    res = AggregateResult(s / ctx.expected_clients, ctx.expected_clients, len(st.survivors), info)
    return Release(res, _secagg_extra(st))


def record_release(
    st: JobState,
    spec: FLTaskSpec,
    strategy: Strategy,
    release: Release,
    expected_clients: float,
    accountant: FLAccountant | None,
    adaptive: AdaptiveClippingDP | None,
) -> None:
    """Apply a release: the server step on the model (and SCAFFOLD's control), ε after the round, adaptive
    clipping's new C, and the round's history record (without what would reveal part of the sample)."""
    res = release.result
    if spec.algorithm == "scaffold":
        strategy.control = None if st.control is None else st.control.copy()  # type: ignore[attr-defined]
    st.params = np.asarray(strategy.apply(st.params, res, expected_clients / len(spec.clients)), np.float32)
    if spec.algorithm == "scaffold":
        st.control = np.asarray(strategy.control, np.float32)  # type: ignore[attr-defined]
    if spec.clip_norm is not None:
        st.noise_history.append(float(spec.noise_multiplier))
        if "epsilon" in res.info:
            st.epsilon = float(res.info["epsilon"])
        elif accountant is not None:
            st.epsilon = accountant.epsilon()
    info = {k: v for k, v in res.info.items() if isinstance(v, (int, float, str, dict, list)) or v is None}
    info.pop("epsilon", None)
    selected = info.get("selected")
    if isinstance(selected, list):  # Krum's kept client ids would reveal part of the sample
        info.pop("selected")
        info["kept"] = len(selected)
    trust = info.get("trust_scores")
    if isinstance(trust, dict):  # FLTrust's scores by client id: kept as a sorted list, without the ids
        info["trust_scores"] = sorted((float(t) for t in trust.values()), reverse=True)
    if adaptive is not None:
        st.clip_norm = float(adaptive.clip_norm)
    rec = {"round": st.round, "clients": res.num_clients, "epsilon": _f(st.epsilon), **release.extra, **info}
    st.history.append(rec)
