"""What the job shows of itself: the public counters, the round state it publishes, the operator's status.

:func:`public_stats` are the counters every collector serves to anyone (``/status`` and every round view);
:func:`round_state` is the round document collectors serve to devices (:class:`ldp_core.fl.protocol.RoundState`,
each phase showing only what its devices need); :func:`status_document` is the job's JSON status for its
operator (``ldp fl job --status-file FILE``, ``JobSettings.status_path``), with the counters that depend on the round's sample.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from estimator.fl.checkpoint import JobState
from estimator.fl.checkpoint import json_float as _f
from estimator.fl.strategies import Strategy
from estimator.fl.task import FLTaskSpec
from ldp_core.fl.personalization import personalization_to_dict
from ldp_core.fl.protocol import RoundState, encode_vector

__all__ = ["PUBLIC_ROUND_KEYS", "ProcessorCounters", "public_stats", "round_line", "round_state", "status_document"]

#: the keys of a round's record that the public counters show (none depends on the sample)
PUBLIC_ROUND_KEYS = ("round", "epsilon", "noise_stddev", "clip_norm")


def public_stats(
    spec: FLTaskSpec,
    st: JobState,
    by_adversary: list[dict[str, Any]] | None,
    sample_level: dict[str, Any] | None,
) -> dict[str, Any]:
    """The counters every collector serves to anyone. Nothing that depends on the round's sample: no
    accepted, rejected or duplicate counts, no realized client count, no survivor lists, no failure reason
    (those stay in the operator's :func:`status_document`); the sampling amplification the accountant
    credits assumes an observer who does not know the sample. The figures for the other adversaries
    (``by_adversary``) and the devices' ``sample_level`` ε (:mod:`estimator.fl.privacy`) depend only on
    public task parameters."""
    last = st.history[-1] if st.history else None
    out = {
        "epsilon": _f(st.epsilon),
        "delta": spec.delta if spec.clip_norm is not None else None,
        "neighbors": _neighbors(by_adversary),
        "rounds_done": len(st.history),
        "last_round": None if last is None else {k: last[k] for k in PUBLIC_ROUND_KEYS if k in last},
        "aggregator": spec.aggregator.kind,
        "epsilon_by_adversary": by_adversary,
    }
    if sample_level is not None:
        out["sample_level"] = sample_level
    if last is not None and "failed" in last:
        out["last_round"]["failed"] = True
    if st.clip_norm is not None:
        out["clip_norm"] = st.clip_norm
    return out


def _neighbors(by_adversary: list[dict[str, Any]] | None) -> str | None:
    """The neighbouring relation of the job's ε (and of each round's in ``history``): that of the accountant
    behind ``by_adversary`` (add/remove one client for Poisson sampling and DP-FTRL, replace one client for
    fixed-count sampling and distributed noise); None without DP."""
    return None if not by_adversary else by_adversary[0].get("neighbors")


def round_state(spec: FLTaskSpec, st: JobState, strategy: Strategy, stats: dict[str, Any]) -> RoundState:
    """The round state to publish: the strategy's configuration of the round, the SecAgg material of the
    current phase only (adverts, inboxes, survivors, signatures), the public ``stats`` and the signed task
    configuration."""
    cfg = strategy.configure(st.round, st.params)
    phase = st.phase
    return RoundState(
        task=spec.task,
        seq=st.seq,
        round=st.round,
        phase=phase,
        rounds=spec.rounds,
        model=dict(spec.model),
        params=st.params,
        algorithm=cfg.algorithm,
        training=dataclasses.asdict(cfg.training),
        prox_mu=cfg.prox_mu,
        control=cfg.control,
        clip_norm=spec.device_clip_norm,
        selected=tuple(st.selected),
        opened_at=st.opened_at,
        deadline=st.deadline,
        secagg=st.secagg,
        indices=dict(st.indices),
        adverts=dict(st.adverts) if phase in ("share", "masked", "unmask") else {},
        inbox=st.inbox if phase == "masked" else {},
        survivors=tuple(st.survivors) if phase in ("consistency", "unmask") else (),
        dropped=tuple(st.dropped) if phase in ("consistency", "unmask") else (),
        stats=stats,
        enrollment_key=spec.authority_key,
        task_config=_task_config(spec),
        advert_auth=dict(st.advert_auth) if phase in ("share", "masked", "consistency", "unmask") else {},
        consistency=dict(st.consistency) if phase == "unmask" else {},
        personalization=personalization_to_dict(cfg.personalization),
    )


def _task_config(spec: FLTaskSpec) -> dict[str, Any] | None:
    sig = spec.task_signature
    return None if sig is None else {"config": spec.signed_config(), "signature": sig}


@dataclasses.dataclass(frozen=True)
class ProcessorCounters:
    """The job's own counters in its status, beside the task's state: its checkpoints and commits, and the
    processor's readiness (``state``, ``ready``: :mod:`pipeline.processor`)."""

    incomplete_checkpoints: int
    uncommitted: bool
    committed_offsets: dict[int, int]
    restores: int
    aborted_commits: int
    state: str
    ready: bool


def status_document(
    spec: FLTaskSpec,
    st: JobState,
    *,
    done: bool,
    by_adversary: list[dict[str, Any]] | None,
    sample_level: dict[str, Any] | None,
    counters: ProcessorCounters,
) -> dict[str, Any]:
    """The job's JSON status: round, phase, ε, counters (committed and pending), history."""
    return {
        "task": spec.task,
        "round": st.round,
        "phase": st.phase,
        "seq": st.seq,
        "rounds": spec.rounds,
        "done": done,
        "epsilon": _f(st.epsilon),
        "delta": spec.delta if spec.clip_norm is not None else None,
        "neighbors": _neighbors(by_adversary),
        "epsilon_by_adversary": by_adversary,
        "sample_level": sample_level,
        "rejected": dict(st.rejected),
        "accepted": dict(st.accepted),
        "duplicates": dict(st.duplicates),
        "clip_norm": st.clip_norm if st.clip_norm is not None else spec.device_clip_norm,
        "incomplete_checkpoints": counters.incomplete_checkpoints,
        "received_this_round": len(st.seen),
        "uncommitted": counters.uncommitted,
        "committed_offsets": {str(p): o for p, o in counters.committed_offsets.items()},
        "restores": counters.restores,
        "aborted_commits": counters.aborted_commits,
        "history": st.history,
        "params": encode_vector(st.params),
        "state": counters.state,  # readiness (pipeline.processor); `python -m pipeline.status FILE` checks it
        "ready": counters.ready,
        "updated": round(time.time(), 3),
    }


def round_line(record: Mapping[str, Any], rounds: int) -> str:
    """One progress line for a closed round's history record: its number of ``rounds``, the devices whose
    updates it accepted and the ε spent so far (or why it failed)."""
    head = f"round {int(record['round']) + 1}/{rounds}"
    if "failed" in record:
        return f"{head} failed: {record['failed']}"
    eps = record.get("epsilon")
    return f"{head}: {record.get('clients')} devices accepted" + ("" if eps is None else f", epsilon {eps:.3g}")
