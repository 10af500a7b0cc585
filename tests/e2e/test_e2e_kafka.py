"""End to end on the real broker: devices -> HTTP collector -> Kafka -> shuffler -> streaming estimator + Parquet sink.

The components are the real ones (:class:`simulator.stack.LocalPipeline`
runs them on threads, each with its own Kafka clients); topics and groups
carry a run id, so the shared broker's other tests do not interfere. Every
uploaded frame holds at least the shuffler's crowd threshold, so every
report is released; the estimates must then equal, bit for bit, what the
offline estimator computes from the uploaded reports, and each report must
be counted once (one frame is uploaded twice, as a retry after a lost
answer would be).
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
from simulator.stack import LocalPipeline, fleet_batches, upload
from tests.support.metrics_docs import dictionary, hashed, metric, metrics_doc
from tests.support.shuffled_data import offline

pytestmark = pytest.mark.kafka

METRICS = metrics_doc(
    tab=metric("grr", 1.0, dictionary("a", "b", "c", "d", "e")),
    color=metric("oue", 2.0, hashed(96, 3)),
    word=metric("olh", 1.5, hashed(256, 4)),
)
FRAME = 200


def test_devices_to_estimates_on_kafka_exactly_once(tmp_path: Path, kafka_bootstrap: str) -> None:
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(METRICS))
    metrics = parse_metrics(METRICS)
    names = sorted(metrics)
    day = utc_day(time.time())
    fleet = fleet_batches(metrics, names, 3000, day, np.random.default_rng(2024), frame_reports=FRAME)
    with LocalPipeline(
        tmp_path / "run",
        metrics_path,
        transport_url=f"kafka://{kafka_bootstrap}",
        min_batch=FRAME,
        partitions=3,
        checkpoint_interval=0.3,
    ) as pipe:
        stats = upload(pipe.collector_url, fleet.batches, clients=4)
        assert stats.batches == len(fleet.batches) and stats.rejected == 0
        again = upload(pipe.collector_url, fleet.batches[:1], clients=1)  # a retried upload
        assert again.batches == 1
        expected = fleet.reports()
        pipe.wait_settled(sum(expected.values()), timeout=90)
        pipe.wait_sink(sum(expected.values()), timeout=90)
        assert pipe.shuffler.stats.buffered_reports == 0
        assert pipe.counted() == expected
        live = {
            n: httpx.get(f"{pipe.estimator_url}/v1/estimates/{n}", params={"day": day}, timeout=60).json()
            for n in names
        }
        counted = pipe.estimator.counted()
        dataset = pipe.dataset
    want = offline(fleet.batches)
    assert set(counted.keys) == set(want)
    for key, acc in want.items():
        metric = key[0]
        got = counted.keys[key].acc
        for name, arr in acc.sums.items():
            np.testing.assert_array_equal(got.sums[name], arr, err_msg=f"{key} {name}")
        est = acc.estimate()
        body = live[metric]
        assert body["n"] == acc.n == expected[metric]
        assert body["counts"] == est.counts.tolist()
        assert body["ci_low"] == est.ci_low.tolist() and body["ci_high"] == est.ci_high.tolist()
        assert body["central_epsilon"] is not None and body["central_epsilon"] < metrics[metric].spec.epsilon
        batch = estimate_dataset(dataset, metric, [day], progress=False)
        assert batch.n == acc.n
        np.testing.assert_array_equal(batch.table["estimate"].to_numpy(), est.counts)
        np.testing.assert_array_equal(batch.table["ci_high"].to_numpy(), est.ci_high)
