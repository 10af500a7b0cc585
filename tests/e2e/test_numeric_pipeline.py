"""Numeric metrics end to end, on the embedded log and on Kafka: devices -> HTTP collector -> shuffler ->
streaming estimator + Parquet sink -> batch job (docs/NUMERIC.md).

The components are the real ones (:class:`simulator.stack.LocalPipeline`). Every frame holds at least the
crowd threshold, so every report is released; the live sums must then equal, exactly, what an offline pass over
the uploaded reports adds up (the numeric accumulators' sums are integers), the batch job must print the same
numbers, and the mean must lie within 5 of its standard errors of the devices' true mean.

The sealed run (embedded log) seals every numeric metric to an analyzer key (docs/SEALED.md): the
collector and shuffler carry ciphertexts of the fixed-point records, and the estimator and sink open
them after the shuffle, so the same exact equalities must hold.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from estimator.jobs.batch import estimate_dataset
from ldp_core.days import utc_day
from ldp_core.metrics import parse_metrics
from ldp_core.wire.sealing import SealedSpec, new_key_file, seal_batch
from simulator.stack import LocalPipeline, fleet_batches, upload
from tests.support.metrics_docs import dictionary, metric, metrics_doc
from tests.support.shuffled_data import offline

RANGE = {"kind": "range", "low": 0, "high": 120, "out_of_range": "clamp"}
METRICS = metrics_doc(
    minutes=metric("auto", 2.0, RANGE, kind="mean"),
    minutes_dist=metric(
        "sw", 2.0, RANGE, params={"bins": 32}, kind="distribution", description="minutes, distribution"
    ),
    app_opens=metric("1bitmean", 1.0, RANGE, description="app opens per day, a repeated counter (memoized 1BitMean)"),
    app_opens_hist=metric(
        "dbitflip",
        2.0,
        RANGE,
        params={"buckets": 16, "sample": 4},
        description="app opens per day, histogram (memoized dBitFlip)",
    ),
    theme=metric(
        "loloha", 2.0, dictionary("a", "b", "c", "d", "e", "f"), description="a frequently changing setting (LOLOHA)"
    ),
    latency=metric(
        "pm",
        4.0,
        RANGE,
        params={"dims": 4, "sample": 2},
        kind="mean",
        description="latency of 4 endpoints, 2 sampled per report (Wang et al.'s attribute sampling)",
    ),
    battery=metric(
        "duchi", 0.5, {"kind": "range", "low": 0, "high": 1}, description="battery drain, Duchi et al. by name"
    ),
)
FRAME = 250


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka), "embedded-sealed"])
def mode(request: pytest.FixtureRequest) -> tuple[str | None, bool]:
    """(transport URL or None for the embedded log, whether the numeric metrics are sealed)."""
    if request.param == "kafka":
        return f"kafka://{request.getfixturevalue('kafka_bootstrap')}", False
    return None, request.param.endswith("sealed")


def test_numeric_metrics_through_the_pipeline(tmp_path: Path, mode: tuple[str | None, bool]) -> None:
    transport_url, sealed = mode
    doc, key, keys_dir = METRICS, None, None
    if sealed:
        keys_dir = tmp_path / "analyzer-keys"
        _, key = new_key_file(keys_dir)
        numeric = {"mean", "distribution"}
        doc = {
            **METRICS,
            "analyzer_keys": [key.public.to_dict()],
            "metrics": {n: {**m, "sealed": m.get("kind") in numeric} for n, m in METRICS["metrics"].items()},
        }
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(doc))
    metrics = parse_metrics(doc)
    assert sealed == metrics["minutes"].sealed == metrics["minutes_dist"].sealed == metrics["latency"].sealed
    assert metrics["minutes"].spec.name == "hm"  # "auto" at ε = 2 picks the Hybrid Mechanism
    names = sorted(metrics)
    day = utc_day(time.time())
    fleet = fleet_batches(metrics, names, 4000, day, np.random.default_rng(77), frame_reports=FRAME)
    with LocalPipeline(
        tmp_path / "run",
        metrics_path,
        transport_url=transport_url,
        min_batch=FRAME,
        partitions=2,
        checkpoint_interval=0.3,
        analyzer_keys=keys_dir,
    ) as pipe:
        sent = [seal_batch(b, key.public) if key and metrics[b.metric].sealed else b for b in fleet.batches]
        n_sealed = sum(isinstance(b.spec, SealedSpec) for b in sent)
        assert n_sealed == sum(metrics[b.metric].sealed for b in fleet.batches) and (n_sealed > 0) == sealed
        stats = upload(pipe.collector_url, sent, clients=4)
        assert stats.batches == len(fleet.batches) and stats.rejected == 0
        expected = fleet.reports()
        pipe.wait_settled(sum(expected.values()), timeout=90)
        pipe.wait_sink(sum(expected.values()), timeout=90)
        assert pipe.counted() == expected
        live = {
            n: httpx.get(f"{pipe.estimator_url}/v1/estimates/{n}", params={"day": day}, timeout=60).json()
            for n in names
        }
        counted = pipe.estimator.counted()
        dataset = pipe.dataset
        assert pipe.estimator.stats.sealed_unopened == 0 and pipe.sink.stats.sealed_unopened == 0
    want = offline(fleet.batches)
    for key, acc in want.items():
        metric = key[0]
        for field, arr in acc.sums.items():
            np.testing.assert_array_equal(counted.keys[key].acc.sums[field], arr, err_msg=f"{key} {field}")
        body = live[metric]
        assert body["kind"] == metrics[metric].kind and body["n"] == acc.n == expected[metric]
        assert body["central_epsilon"] is not None and body["central_epsilon"] < metrics[metric].spec.epsilon
        batch = estimate_dataset(dataset, metric, [day], progress=False)
        truth = fleet.truth[metric]
        if body["kind"] == "frequency":
            est = acc.estimate()
            assert body["counts"] == est.counts.tolist()
            np.testing.assert_array_equal(batch.table["estimate"].to_numpy(), est.counts)
            z = (est.counts - truth) / np.sqrt(metrics[metric].spec.count_variance(truth))
            assert np.all(np.abs(z) < 5), z
        elif body["kind"] == "mean":
            est = acc.estimate()
            assert body["mean"] == est.mean.tolist() and body["ci_low"] == est.ci_low.tolist()
            np.testing.assert_array_equal(batch.table["mean"].to_numpy(), est.mean)
            true_means = truth.mean(axis=0) if truth.ndim == 2 else np.array([truth.mean()])
            assert len(body["mean"]) == true_means.size
            for got, se, want in zip(body["mean"], body["std_error"], true_means):
                assert abs(got - want) < 5 * se
        else:
            np.testing.assert_array_equal(batch.table["share"].to_numpy(), np.array(body["hist"]))
            true_counts = np.histogram(truth, bins=np.array(body["edges"]))[0]
            true_hist = true_counts / truth.size
            spec = metrics[metric].spec
            if hasattr(spec, "share_variance"):  # dBitFlip: linear shares with an exact variance, each within 5 sd
                sd = np.sqrt(spec.share_variance(true_counts, truth.size))
                assert np.all(np.abs(np.array(body["hist"]) - true_hist) < 5 * sd)
            else:  # Square Wave's EMS: within 0.15 in total variation (32 bins, 4,000 users at ε = 2)
                assert 0.5 * np.abs(np.array(body["hist"]) - true_hist).sum() < 0.15
            assert set(body["quantiles"]) == {"p10", "p25", "p50", "p75", "p90", "p99"}
