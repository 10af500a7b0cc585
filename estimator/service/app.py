"""The streaming estimator's HTTP API (FastAPI, imported when an app is made) and its JSON answers."""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from estimator.errors import StateError
from estimator.result import NOISE_RULE, Estimate
from estimator.service.engine import StreamingEstimator, _partition_offsets
from estimator.service.peers import PEER_TIMEOUT, GroupView, gather, gather_json
from estimator.service.state import EstimatorState, Key, KeyState, Tally
from ldp_core.days import iso_day, parse_day
from ldp_core.metrics import MetricDefinition

__all__ = ["DEFAULT_PORT", "estimate_json", "create_app", "response_models"]

DEFAULT_PORT = 8090


def response_models() -> dict[str, Any]:
    """The pydantic models of the API's answers (built lazily: pydantic comes with the ``server`` extra).

    Keys: ``"estimate"``, ``"mean"``, ``"distribution"``, ``"available"``, ``"freshness"``, ``"metric_list"``,
    ``"health"``, ``"error"``. Each field is documented in the
    OpenAPI schema the app serves at ``/openapi.json``.
    """
    global _MODELS
    if _MODELS is None:
        _MODELS = _build_models()
    return _MODELS


_MODELS: dict[str, Any] | None = None


def _build_models() -> dict[str, Any]:

    from pydantic import BaseModel, ConfigDict, Field

    class ErrorDetail(BaseModel):
        """Every non-2xx answer (FastAPI's form)."""

        detail: Any = Field(description="what went wrong: a message, or a list of invalid parameters (422)")

    class Health(BaseModel):
        status: str = Field(description='"ok" while the process serves requests')

    class MissingPart(BaseModel):
        """Offsets of the shuffled topic that no member of a partial answer counted or reads (issue 31)."""

        model_config = ConfigDict(populate_by_name=True)

        topic: str
        partition: int
        from_: int = Field(alias="from", description="the first missing offset")
        to: int | None = Field(
            description="the first offset after the gap (null: everything from `from` on; no answering member "
            "reads the partition)"
        )

    missing_partitions_field: Any = Field(
        [],
        description="partial: the shuffled topic's partitions with a part no answering member counted; a plain "
        "metric-day is spread over every partition, so its batches there are missing from the figures",
    )
    missing_parts_field: Any = Field([], description="partial: per partition, the offset range that is missing")

    class Available(BaseModel):
        metric: str
        spec_id: str
        day: int = Field(description="days since 1970-01-01 (UTC)")
        n: int = Field(description="reports counted")
        batches: int = Field(description="shuffled batches counted")

    class AvailableList(BaseModel):
        estimates: list[Available]
        merged_instances: int = Field(1, description="how many estimator instances' states were listed together")
        partial: bool = Field(False, description="true when some --peer did not answer")
        missing_peers: list[str] = Field([], description="the peers' base URLs that did not answer")
        missing_partitions: list[int] = missing_partitions_field
        missing_parts: list[MissingPart] = missing_parts_field

    class EstimateBody(BaseModel):
        """One day's frequency estimate of a metric under one spec."""

        model_config = ConfigDict(extra="forbid")

        metric: str
        kind: Literal["frequency"] = Field(description="what the metric estimates")
        day: int = Field(description="days since 1970-01-01 (UTC)")
        date: str = Field(description="the day as an ISO date")
        spec_id: str = Field(description="the spec's id (RFC 8785 canonical JSON, hashed; see ARCHITECTURE.md)")
        mechanism: str = Field(description="the frequency oracle, e.g. olh, oue, hr")
        spec: dict[str, Any] = Field(description="the spec's parameters, as in the metrics file")
        n: int = Field(description="reports counted")
        batches: int = Field(description="shuffled batches counted")
        epsilon: float = Field(description="the local ε₀ of one report")
        epsilon0_reported: float | None = Field(description="ε₀ as the shuffler reported it")
        central_epsilon: float | None = Field(
            description="the weakest (largest) per-person central ε of the counted batches, if the shuffler attached one"
        )
        central_delta: float | None
        central_bound: str | None = Field(description="which amplification bound gave central_epsilon")
        confidence: float = Field(description="the confidence level of ci_low..ci_high")
        postprocessing: str = Field(
            description='"norm-sub" when the counts were projected (norm_sub=true), else "none"'
        )
        counts: list[float | None] = Field(description="unbiased count per domain index (null: not finite)")
        std_error: list[float | None] = Field(description="standard error per index, from the exact variance")
        ci_low: list[float | None]
        ci_high: list[float | None]
        adjusted_ci_low: list[float | None] = Field(
            description="lower end of each interval widened for all d items (Bonferroni), from the unbiased counts"
        )
        could_be_noise: list[bool] = Field(
            description="per index: adjusted_ci_low <= 0, the estimate does not tell the item from one nobody holds "
            "once all d items are compared (docs/ESTIMATE.md)"
        )
        noise_rule: str = Field(description='how could_be_noise is decided: "bonferroni" over the domain\'s items')
        labels: list[str] | None = Field(None, description="the dictionary's label per index, if the metric has one")
        merged_instances: int = Field(description="how many estimator instances' states were merged")
        partial: bool = Field(
            False, description="true when some --peer did not answer: the figures cover only the reachable members"
        )
        missing_peers: list[str] = Field([], description="the peers' base URLs that did not answer (partial)")
        missing_partitions: list[int] = missing_partitions_field
        missing_parts: list[MissingPart] = missing_parts_field

    class NumericCommon(BaseModel):
        model_config = ConfigDict(extra="forbid")

        metric: str
        day: int
        date: str
        spec_id: str
        mechanism: str
        spec: dict[str, Any]
        n: int
        batches: int
        epsilon: float
        epsilon0_reported: float | None
        central_epsilon: float | None
        central_delta: float | None
        central_bound: str | None
        confidence: float
        merged_instances: int
        partial: bool = False
        missing_peers: list[str] = []
        missing_partitions: list[int] = missing_partitions_field
        missing_parts: list[MissingPart] = missing_parts_field

    class MeanBody(NumericCommon):
        """One day's mean of a numeric metric (one entry per attribute), in the value's units."""

        kind: Literal["mean"]
        mean: list[float | None] = Field(description="unbiased mean per attribute")
        variance: list[float | None] = Field(description="estimated variance of the mean (sample variance / n)")
        std_error: list[float | None]
        ci_low: list[float | None]
        ci_high: list[float | None]

    class Quantile(BaseModel):
        value: float
        ci_low: float
        ci_high: float

    class DistributionBody(NumericCommon):
        """One day's distribution of a numeric metric: EMS histogram with basic-bootstrap bands, and quantiles."""

        kind: Literal["distribution"]
        edges: list[float] = Field(description="the bins + 1 bin edges, in the value's units")
        hist: list[float] = Field(description="estimated share of users per bin (sums to 1)")
        hist_low: list[float]
        hist_high: list[float]
        quantiles: dict[str, Quantile] = Field(description='keyed "p50", "p90", "p99"')
        iterations: int = Field(description="EM steps taken")
        bootstrap: int = Field(description="bootstrap resamples behind the intervals")

    class PartitionOffsets(BaseModel):
        topic: str
        partition: int
        committed: int = Field(description="offsets below this are counted, in the last snapshot and committed")
        read: int = Field(description="offsets below this are read and counted in the served figures")
        member: str | None = Field(None, description="the group member that counts the partition")

    class MemberFreshness(BaseModel):
        member: str
        url: str | None = Field(description="the peer's base URL (null: the member that answered)")
        state: str
        ready: bool
        snapshot_time: float | None
        partitions: int = Field(description="partitions this member counts")

    class Freshness(BaseModel):
        """How current the served figures are."""

        now: float = Field(description="the service's clock (POSIX seconds)")
        snapshot_time: float | None = Field(
            description="when the last snapshot was written and its offsets committed (POSIX seconds; null: none yet)"
        )
        state: str = Field(description="the consumer's run state (ready, waiting, lost, ...; fixed: a fixed state)")
        ready: bool
        group: str
        member: str
        partitions: list[PartitionOffsets]
        merged_instances: int = Field(1, description="how many members' answers were merged (this one included)")
        partial: bool = Field(False, description="true when some --peer did not answer: its partitions are missing")
        missing_peers: list[str] = Field([], description="the peers' base URLs that did not answer (partial)")
        members: list[MemberFreshness] = Field([], description="each member that answered, this one first")

    class MetricInfo(BaseModel):
        name: str
        kind: str = Field(description="frequency, mean, distribution or heavy_hitters")
        description: str
        mechanism: str
        epsilon: float = Field(description="the local ε₀ of one report")
        max_reports_per_day: int = Field(description="reports one device sends per day at most (its local ε is r·ε₀)")

    class MetricList(BaseModel):
        metrics: list[MetricInfo]

    class HeavyHittersBody(NumericCommon):
        """One day's counts of a heavy-hitter (string) metric; discovery of whole values is the batch job
        ``ldp heavy-hitters`` (docs/HEAVY_HITTERS.md)."""

        kind: Literal["heavy_hitters"]
        reports_per_part: list[int] = Field(description="reports per PEM level or SFP fragment position")
        first_level_prefixes: list[list[Any]] = Field(
            description="PEM: [prefix hex, bits, estimate, ci_low, ci_high, could_be_noise] of the most frequent "
            "first-level prefixes (could_be_noise: Bonferroni over all 2^bits prefixes)"
        )
        discovery: str
        discovery_url: str | None = Field(
            None,
            description="where this service discovers the day's whole values (GET; null: it serves no dataset)",
        )

    class DiscoveredValue(BaseModel):
        rank: int
        value: str = Field(description="the discovered string (UTF-8, padding removed)")
        estimate: float = Field(description="unbiased estimate of the number of reports holding it")
        std_error: float
        ci_low: float
        ci_high: float
        frequency: float = Field(description="estimate / n")
        adjusted_ci_low: float = Field(
            description="lower end of the interval widened for the selection (Bonferroni over `candidates`): "
            "above 0, the value is found even allowing for it being the best of many noisy candidates"
        )
        could_be_noise: bool = Field(description="adjusted_ci_low <= 0 (listed only with include_noise=true)")

    class DiscoveredBody(BaseModel):
        """One day's discovered values of a heavy-hitter metric, decoded from the Parquet dataset's part files
        (the batch job's :func:`estimator.jobs.heavy_hitters.discover_dataset`, cached per set of files)."""

        metric: str
        kind: Literal["heavy_hitters"]
        day: int
        date: str
        spec_id: str
        mechanism: str
        epsilon: float = Field(description="the local ε₀ of one report")
        n: int = Field(description="reports in the dataset's part files of that day")
        parts: int = Field(description="part files read")
        reports_per_part: list[int] = Field(description="reports per PEM level or SFP fragment position")
        top: int
        confidence: float
        candidates: int = Field(description="candidates ranked at the last level (PEM) or words ranked (SFP)")
        include_noise: bool = Field(description="whether values that could be noise are listed (flagged)")
        significant: int = Field(description="values that stand out from the noise (not could_be_noise)")
        noise_rule: str = Field(description='"bonferroni" over `candidates`')
        dataset_time: float = Field(description="when the newest part file read was written (POSIX seconds)")
        seconds: float = Field(description="the decode's wall time (0 when served from the cache)")
        cached: bool
        found: list[DiscoveredValue] = Field(description="the discovered values, best first")

    return {
        "freshness": Freshness,
        "metric_list": MetricList,
        "estimate": EstimateBody,
        "mean": MeanBody,
        "distribution": DistributionBody,
        "heavy_hitters": HeavyHittersBody,
        "discovered": DiscoveredBody,
        "any_estimate": EstimateBody | MeanBody | DistributionBody | HeavyHittersBody,
        "available": AvailableList,
        "health": Health,
        "error": ErrorDetail,
    }


def _finite(x: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in np.asarray(x, dtype=np.float64)]


def estimate_json(
    metric: str,
    key: Key,
    ks: KeyState,
    *,
    confidence: float = 0.95,
    norm_sub: bool = False,
    definition: MetricDefinition | None = None,
) -> dict[str, Any]:
    """The JSON answer of ``GET /v1/estimates/{metric}``: a frequency estimate (``counts``...), or for a numeric
    metric its mean or distribution (``kind``; docs/NUMERIC.md)."""
    spec = ks.spec
    if spec.kind != "frequency":
        return _numeric_json(metric, key, ks, confidence)
    est: Estimate = ks.acc.estimate(confidence)
    if norm_sub:
        est = est.norm_sub()
    adjusted, noise = est.noise()
    out: dict[str, Any] = {
        "metric": metric,
        "kind": "frequency",
        "day": key[2],
        "date": iso_day(key[2]),
        "spec_id": key[1],
        "mechanism": spec.name,
        "spec": spec.to_dict(),
        "n": est.n,
        "batches": ks.batches,
        "epsilon": spec.epsilon,
        "epsilon0_reported": ks.epsilon0,
        "central_epsilon": ks.central_epsilon,
        "central_delta": ks.central_delta,
        "central_bound": ks.bound,
        "confidence": est.confidence,
        "postprocessing": est.postprocessing,
        "counts": _finite(est.counts),
        "std_error": _finite(est.std_error),
        "ci_low": _finite(est.ci_low),
        "ci_high": _finite(est.ci_high),
        "adjusted_ci_low": _finite(adjusted),
        "could_be_noise": [bool(x) for x in noise],
        "noise_rule": NOISE_RULE,
    }
    if definition is not None and hasattr(definition.domain, "values"):
        out["labels"] = [definition.domain.label(i) for i in range(est.counts.size)]
    return out


def _common(metric: str, key: Key, ks: KeyState) -> dict[str, Any]:
    spec = ks.spec
    return {
        "metric": metric,
        "kind": spec.kind,
        "day": key[2],
        "date": iso_day(key[2]),
        "spec_id": key[1],
        "mechanism": spec.name,
        "spec": spec.to_dict(),
        "n": ks.acc.n,
        "batches": ks.batches,
        "epsilon": spec.epsilon,
        "epsilon0_reported": ks.epsilon0,
        "central_epsilon": ks.central_epsilon,
        "central_delta": ks.central_delta,
        "central_bound": ks.bound,
    }


#: numeric estimates by (spec id, state digest, confidence): a distribution's costs an EMS run and its bootstrap
#: (about 5 s at 1,024 bins), and it is a pure function of the sums, so a repeated GET reuses it
_NUMERIC_CACHE: dict[tuple[str, bytes, float], dict[str, Any]] = {}
_NUMERIC_CACHE_SIZE = 64


def _numeric_body(ks: KeyState, confidence: float) -> dict[str, Any]:
    h = hashlib.blake2b(str(ks.acc.n).encode(), digest_size=16)
    for name in sorted(ks.acc.sums):
        h.update(name.encode())
        h.update(np.ascontiguousarray(ks.acc.sums[name]).tobytes())
    cache_key = (ks.spec.spec_id, h.digest(), float(confidence))
    body = _NUMERIC_CACHE.get(cache_key)
    if body is None:
        body = ks.acc.estimate(confidence).to_dict()
        body.pop("n", None)
        if len(_NUMERIC_CACHE) >= _NUMERIC_CACHE_SIZE:
            _NUMERIC_CACHE.pop(next(iter(_NUMERIC_CACHE)))
        _NUMERIC_CACHE[cache_key] = body
    return body


def _numeric_json(metric: str, key: Key, ks: KeyState, confidence: float) -> dict[str, Any]:
    """A numeric metric's answer: ``mean`` (per attribute) with ``variance`` and the interval, or the
    distribution's histogram with bands and quantiles with intervals (seeded from the state: one answer)."""
    out = _common(metric, key, ks)
    body = dict(_numeric_body(ks, confidence))
    if ks.spec.kind == "mean":
        for k in ("mean", "variance", "ci_low", "ci_high"):
            body[k] = [v if math.isfinite(v) else None for v in body[k]]
        body["std_error"] = [None if v is None else math.sqrt(v) for v in body["variance"]]
    out.update(body)
    out["confidence"] = confidence
    return out


#: discoveries by (root, metric, spec, day, top, confidence, the part files' (path, size, mtime)): a decode reads
#: every report of the day, and its answer is a pure function of those files
_DISCOVERED: dict[tuple[Any, ...], dict[str, Any]] = {}
_DISCOVERED_SIZE = 32
_DISCOVERED_LOCK = threading.Lock()


def discovered_json(
    root: str | os.PathLike[str],
    metric: str,
    day: str | None,
    spec_id: str | None,
    top: int,
    confidence: float,
    include_noise: bool = False,
) -> dict[str, Any]:
    """The answer of ``GET /v1/heavy-hitters/{metric}``: the batch discovery over one day's part files (only the
    values that stand out from the noise unless ``include_noise``)."""
    from fastapi import HTTPException

    from estimator.errors import BatchError, SpecChoiceError
    from estimator.jobs.heavy_hitters import discover_dataset
    from pipeline.dataset import list_parts

    parts = list_parts(root, metric)
    if not parts:
        raise HTTPException(404, f"the dataset holds no part files of metric {metric!r} yet")
    if day is None:
        d = max(p.day for p in parts)
    else:
        try:
            d = parse_day(day)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
    files, day_parts = [], []
    for p in parts:
        if p.day != d:
            continue
        try:
            st = p.path.stat()
        except FileNotFoundError:  # replaced by the sink's compaction meanwhile: the next request sees the new one
            continue
        files.append((str(p.path), st.st_size, st.st_mtime_ns))
        day_parts.append(p)
    if not files:
        raise HTTPException(404, f"the dataset holds no part files of metric {metric!r} on day {d}")
    key = (str(root), metric, spec_id, d, top, float(confidence), include_noise, tuple(files))
    with _DISCOVERED_LOCK:
        hit = _DISCOVERED.get(key)
    if hit is not None:
        return {**hit, "seconds": 0.0, "cached": True}
    t0 = time.perf_counter()
    try:
        res = discover_dataset(
            root,
            metric,
            [d],
            top=top,
            spec_id=spec_id,
            confidence=confidence,
            parts=day_parts,
            include_noise=include_noise,
        )
    except SpecChoiceError as exc:
        raise HTTPException(409, str(exc)) from None
    except BatchError as exc:
        raise HTTPException(400, str(exc)) from None
    t = res.table
    summary = res.summary()
    body: dict[str, Any] = {
        "metric": metric,
        "kind": "heavy_hitters",
        "day": d,
        "date": iso_day(d),
        "spec_id": res.spec.spec_id,
        "mechanism": res.spec.name,
        "epsilon": res.spec.epsilon,
        "n": int(res.n),
        "parts": int(res.files),
        "reports_per_part": [int(x) for x in res.parts],
        "top": top,
        "confidence": float(confidence),
        "candidates": int(summary["candidates"]),
        "include_noise": include_noise,
        "significant": int(summary["significant"]),
        "noise_rule": summary["noise_rule"],
        "dataset_time": max(f[2] for f in files) / 1e9,
        "seconds": time.perf_counter() - t0,
        "cached": False,
        "found": [
            {
                "rank": int(r.rank),
                "value": str(r.value),
                "estimate": float(r.estimate),
                "std_error": float(r.std_error),
                "ci_low": float(r.ci_low),
                "ci_high": float(r.ci_high),
                "frequency": float(r.frequency),
                "adjusted_ci_low": float(r.adjusted_ci_low),
                "could_be_noise": bool(r.could_be_noise),
            }
            for r in t.itertuples(index=False)
        ],
    }
    with _DISCOVERED_LOCK:
        if len(_DISCOVERED) >= _DISCOVERED_SIZE:
            _DISCOVERED.pop(next(iter(_DISCOVERED)))
        _DISCOVERED[key] = body
    return body


def _select(
    tally: Tally,
    metric: str,
    day: str | None,
    spec_id: str | None,
    missing: Sequence[str] = (),
    partitions: Sequence[int] = (),
) -> tuple[Key, KeyState]:
    from fastapi import HTTPException

    lacking = f"; partitions {', '.join(map(str, partitions))} are missing" if partitions else ""
    where = f" (partial: peers {', '.join(missing)} did not answer{lacking})" if missing else ""
    keys = [k for k in tally.keys if k[0] == metric]
    if not keys:
        raise HTTPException(404, f"no reports of metric {metric!r} were counted yet{where}")
    if day is None:
        d = max(k[2] for k in keys)
    else:
        try:
            d = parse_day(day)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
    keys = [k for k in keys if k[2] == d and (spec_id is None or k[1] == spec_id)]
    if not keys:
        raise HTTPException(
            404, f"no reports of metric {metric!r} on day {d}" + (f" under spec {spec_id}" if spec_id else "") + where
        )
    if len(keys) > 1:
        raise HTTPException(
            409,
            f"metric {metric!r} has reports under several specs on day {d}: "
            f"{sorted(k[1] for k in keys)}; choose one with ?spec_id=",
        )
    return keys[0], tally.keys[keys[0]]


#: the streaming estimator's stats (:class:`~estimator.service.engine.EstimatorStats`) on ``GET /metrics``: a
#: counter per field (``ldp_estimator_<field>_total``) but the wall-clock time of the last checkpoint (a gauge)
_STATS_HELP = {
    "records": "Shuffled records consumed",
    "reports": "Reports counted into the estimates",
    "undecodable": "Shuffled records that did not decode (not counted)",
    "sealed_unopened": "Sealed records that did not open (counted per delivery)",
    "sealed_replays_dropped": "Opened sealed records dropped as replays of an already counted record",
    "sealed_misrouted": "Sealed records dropped because their encapsulated key routes them to another partition",
    "sealed_route_mismatch": "Of the misrouted sealed records, those in parts routed consistently under another "
    "N than this member's (the shuffler and the group disagree on --shuffled-spread, --shuffled-key or partitions)",
    "checkpoints": "Checkpoints written (snapshot, then offset commit)",
    "commit_failures": "Offset commits reported failed (their tails are kept as uncertain until the partition is "
    "counted again)",
    "rejoins": "Rejoins of the consumer group after a transport failure",
    "dropped_tails": "Uncommitted partition tails dropped (read again from the committed offsets)",
    "restored_uncertain": "Pending tails from before a restart counted (the group's offset had reached their end)",
    "discarded_pending": "Pending tails from before a restart discarded (read again)",
    "unsure_commits": "Tails of a commit reported failed, kept as uncertain (it may have landed; the next count of "
    "the partition settles it)",
    "last_checkpoint": "Wall-clock time of the last successful checkpoint (seconds since 1970)",
}


def _stat_name(field: str) -> str:
    return f"ldp_estimator_{field}" if field == "last_checkpoint" else f"ldp_estimator_{field}_total"


_STATS_FAMILIES: dict[str, tuple[Literal["counter", "gauge"], str]] = {
    _stat_name(k): ("gauge" if k == "last_checkpoint" else "counter", h) for k, h in _STATS_HELP.items()
}


def create_app(
    estimator: StreamingEstimator | None = None,
    *,
    state: Any = None,
    peers: Sequence[str] = (),
    metrics: Mapping[str, MetricDefinition] | None = None,
    dataset: str | os.PathLike[str] | None = None,
    peer_timeout: float = PEER_TIMEOUT,
) -> Any:
    """The estimator's HTTP API (FastAPI).

    ``GET /v1/estimates/{metric}?day=&spec_id=&confidence=&norm_sub=&merged=``,
    ``GET /v1/estimates`` (what is available), ``GET /v1/freshness`` (snapshot time and offsets),
    ``GET /v1/metrics`` (the metric definitions), ``GET /`` (the dashboard: :mod:`estimator.service.dashboard`),
    ``GET /v1/state`` (this
    instance's state, for :func:`merge_states`), ``/healthz``, ``/readyz`` (503 until the
    consumer is joined, see :attr:`pipeline.processor.StreamProcessor.ready`), ``/metrics``.
    With ``peers`` (base URLs of the other instances of the group) every read answers for the whole group
    (:mod:`estimator.service.peers`): ``merged`` defaults to true, peers that do not answer within
    ``peer_timeout`` seconds are left out and named (``partial``, ``missing_peers``); ``merged=false`` answers
    from this member's partitions only.
    Without an ``estimator``, ``state`` (a callable returning an
    :class:`EstimatorState`) serves a fixed state.
    With ``dataset`` (the Parquet sink's folder), ``GET /v1/heavy-hitters/{metric}?day=&spec_id=&top=``
    discovers a heavy-hitter metric's values from that day's part files (docs/DASHBOARD.md).
    """
    from fastapi import FastAPI, HTTPException, Query
    from fastapi.responses import Response

    from pipeline.prometheus import CONTENT_TYPE, Readings, new_registry, render

    models = response_models()
    err = {"model": models["error"]}
    app = FastAPI(
        title="ldp estimator",
        version="1",
        description="Live frequency estimates with confidence intervals from the shuffled report stream.",
    )
    defs = dict(metrics or (estimator.metrics if estimator is not None else {}))

    def local_state() -> EstimatorState:
        if estimator is not None:
            return estimator.state()
        return state()

    def view(metric: str | None, merged: bool | None) -> GroupView:
        """The tally a read answers from: the whole group's (the default with peers), or this member's."""
        if merged is False or not peers:
            t = estimator.counted(metric) if estimator is not None else local_state().counted()
            return GroupView(t, 1, [], {})
        try:
            return gather(local_state, peers, timeout=peer_timeout)
        except StateError as exc:
            raise HTTPException(409, str(exc)) from None

    @app.get("/healthz", response_model=models["health"])
    def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        summary="Readiness: joined to the group, consuming (503 while the broker is unreachable)",
        responses={503: {"description": "not ready: the same body, with ready false"}},
    )
    def readyz() -> Any:
        from fastapi.responses import JSONResponse

        if estimator is None:  # a fixed state: always ready
            return JSONResponse({"ready": True, "state": "fixed"})
        body = estimator.run_status()
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @app.get("/v1/estimates", response_model=models["available"])
    def available(merged: bool | None = None) -> dict[str, Any]:
        v = view(None, merged)
        return {
            "estimates": [
                {"metric": k[0], "spec_id": k[1], "day": k[2], "n": ks.acc.n, "batches": ks.batches}
                for k, ks in sorted(v.tally.keys.items())
            ],
            **v.marks(),
        }

    @app.get(
        "/v1/estimates/{metric}",
        response_model=models["any_estimate"],
        response_model_exclude_unset=True,
        responses={
            400: {**err, "description": "a malformed day"},
            404: {**err, "description": "no reports of that metric (on that day, under that spec)"},
            409: {**err, "description": "several specs on that day (choose one with spec_id), or peers' states differ"},
            422: {**err, "description": "an invalid query parameter"},
        },
    )
    def estimates(
        metric: str,
        day: str | None = None,
        spec_id: str | None = None,
        confidence: float = Query(0.95, gt=0.0, lt=1.0),
        norm_sub: bool = False,
        merged: bool | None = None,
        postprocess: Literal["none", "norm-sub"] = "none",
    ) -> dict[str, Any]:
        v = view(metric, merged)
        key, ks = _select(v.tally, metric, day, spec_id, v.missing, v.missing_partitions)
        out = estimate_json(
            metric,
            key,
            ks,
            confidence=confidence,
            norm_sub=norm_sub or postprocess == "norm-sub",
            definition=defs.get(metric),
        )
        out.update(v.marks())
        if out["kind"] == "heavy_hitters":
            out["discovery_url"] = None if dataset is None else f"v1/heavy-hitters/{metric}"
            if dataset is None:
                out["discovery"] = (
                    "this estimator serves no dataset (start it with --dataset DIR); run `ldp heavy-hitters` "
                    "over the dataset for whole values"
                )
        return out

    @app.get(
        "/v1/heavy-hitters/{metric}",
        response_model=models["discovered"],
        responses={
            400: {**err, "description": "a malformed day, or not a heavy-hitter metric"},
            404: {**err, "description": "no dataset is served, or no part files of that metric on that day"},
            409: {**err, "description": "several specs on that day: choose one with spec_id"},
            422: {**err, "description": "an invalid query parameter"},
        },
    )
    def heavy_hitters(
        metric: str,
        day: str | None = None,
        spec_id: str | None = None,
        top: int = Query(20, ge=1, le=1000),
        confidence: float = Query(0.95, gt=0.0, lt=1.0),
        include_noise: bool = False,
    ) -> dict[str, Any]:
        if dataset is None:
            raise HTTPException(
                404,
                "this estimator serves no dataset: discovery of whole values reads the Parquet sink's part files; "
                "start it with --dataset DIR (ldp demo does), or run `ldp heavy-hitters`",
            )
        return discovered_json(dataset, metric, day, spec_id, top, confidence, include_noise)

    @app.get("/v1/freshness", response_model=models["freshness"])
    def freshness(merged: bool | None = None) -> dict[str, Any]:
        """This member's freshness, merged with every peer's (with peers, unless ``merged=false``): the
        partitions of all members, the oldest snapshot time (the merged figures are as current as their least
        current member), ``ready`` only if every member that answered is; ``state``, ``group`` and ``member``
        stay this member's; ``members`` lists each one, ``partial``/``missing_peers`` those that did not answer."""
        body = own_freshness()
        mine = {"url": None, **body}
        if merged is False or not peers:
            return _group_freshness(mine, [], [])
        bodies, missing = gather_json(peers, "/v1/freshness", timeout=peer_timeout)
        return _group_freshness(mine, [{"url": u, **b} for u, b in bodies.items()], missing)

    def own_freshness() -> dict[str, Any]:
        if estimator is not None:
            body = estimator.freshness()
        else:
            st = local_state()
            uncertain = [t for t in st.tails if t.status == "uncertain"]
            opened = {t.tp: t for t in st.tails if t.status == "open"}
            body = {
                "snapshot_time": None,
                "partitions": _partition_offsets(st.segments, uncertain, opened),
                "state": "fixed",
                "ready": True,
                "group": st.group,
                "member": st.member,
            }
        for part in body["partitions"]:
            part.setdefault("member", body["member"])
        return {**body, "now": time.time()}

    @app.get("/v1/metrics", response_model=models["metric_list"])
    def metric_list() -> dict[str, Any]:
        return {
            "metrics": [
                {
                    "name": name,
                    "kind": d.spec.kind,
                    "description": d.description,
                    "mechanism": d.spec.name,
                    "epsilon": d.spec.epsilon,
                    "max_reports_per_day": d.max_reports_per_day,
                }
                for name, d in sorted(defs.items())
            ]
        }

    @app.get("/v1/state")
    def get_state() -> dict[str, Any]:
        return local_state().to_json_obj()

    registry = new_registry()  # the app's own: several apps in one process keep apart
    if estimator is not None:
        live = estimator
        Readings(
            _STATS_FAMILIES,
            lambda: {_stat_name(k): v for k, v in live.stats.to_json_obj().items()},
            registry=registry,
        )

    @app.get("/metrics", summary="Prometheus metrics", responses={200: {"content": {"text/plain": {}}}})
    def prometheus() -> Any:
        return Response(render(registry), media_type=CONTENT_TYPE)

    from estimator.service.dashboard import add_dashboard

    add_dashboard(app)
    return app


def _group_freshness(mine: dict[str, Any], others: list[dict[str, Any]], missing: list[str]) -> dict[str, Any]:
    """``GET /v1/freshness`` over the members that answered (``mine`` first); see ``freshness`` in :func:`create_app`."""
    everyone = [mine, *others]
    parts = [{**p, "member": p.get("member") or m["member"]} for m in everyone for p in m.get("partitions", [])]
    snaps = [m["snapshot_time"] for m in everyone if m.get("snapshot_time") is not None]
    return {
        **{k: v for k, v in mine.items() if k != "url"},
        "snapshot_time": min(snaps) if snaps else None,
        "ready": all(bool(m.get("ready")) for m in everyone),
        "partitions": sorted(parts, key=lambda p: (p["topic"], p["partition"], p["member"])),
        "merged_instances": len(everyone),
        "partial": bool(missing),
        "missing_peers": list(missing),
        "members": [
            {
                "member": m["member"],
                "url": m.get("url"),
                "state": m["state"],
                "ready": bool(m["ready"]),
                "snapshot_time": m.get("snapshot_time"),
                "partitions": len(m.get("partitions", [])),
            }
            for m in everyone
        ],
    }
