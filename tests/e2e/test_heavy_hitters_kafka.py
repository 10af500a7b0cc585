"""A ``heavy_hitters`` metric (PEM over UTF-8 strings) through the pipeline on Kafka: devices -> HTTP
collector -> shuffler -> streaming estimator + Parquet sink -> ``ldp heavy-hitters``' batch discovery.

Every frame holds at least the crowd threshold, so every report is released: the streaming sums must
equal an offline pass over the uploaded reports exactly, and discovery over the sink's dataset must find
the same strings with the same estimates as discovery run directly over the uploaded reports (the sink
may reorder batches; discovery depends on the multiset of reports only)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from estimator.jobs.heavy_hitters import discover_dataset
from estimator.mechanisms.heavy_hitters import discover
from ldp_core.days import utc_day
from ldp_core.metrics import parse_metrics
from simulator.stack import LocalPipeline, demo_words, fleet_batches, upload
from tests.support.metrics_docs import dictionary, metric, metrics_doc
from tests.support.shuffled_data import offline

pytestmark = pytest.mark.kafka

STRING = {"kind": "string", "length": 8, "overflow": "truncate"}
METRICS = metrics_doc(
    search=metric("pem", 8.0, STRING, params={"start_bits": 12, "step_bits": 4}, kind="heavy_hitters"),
    tab=metric("grr", 1.0, dictionary("a", "b", "c")),
)
FRAME = 250


def test_heavy_hitters_on_kafka_exactly_once_and_discovered_from_the_dataset(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    metrics_path = tmp_path / "metrics.json"
    metrics_path.write_text(json.dumps(METRICS))
    metrics = parse_metrics(METRICS)
    assert metrics["search"].kind == "heavy_hitters"
    names = sorted(metrics)
    day = utc_day(time.time())
    fleet = fleet_batches(metrics, names, 3000, day, np.random.default_rng(515), frame_reports=FRAME)
    with LocalPipeline(
        tmp_path / "run",
        metrics_path,
        transport_url=f"kafka://{kafka_bootstrap}",
        min_batch=FRAME,
        partitions=2,
        checkpoint_interval=0.3,
    ) as pipe:
        stats = upload(pipe.collector_url, fleet.batches, clients=3)
        assert stats.batches == len(fleet.batches) and stats.rejected == 0
        expected = fleet.reports()
        pipe.wait_settled(sum(expected.values()), timeout=120)
        pipe.wait_sink(sum(expected.values()), timeout=120)
        assert pipe.counted() == expected
        counted = pipe.estimator.counted()
        dataset = pipe.dataset
    want = offline(fleet.batches)
    assert set(counted.keys) == set(want)
    for key, acc in want.items():
        for field, arr in acc.sums.items():
            np.testing.assert_array_equal(counted.keys[key].acc.sums[field], arr, err_msg=f"{key} {field}")
    spec = metrics["search"].spec
    records = np.concatenate([b.records for b in fleet.batches if b.metric == "search"])
    result = discover_dataset(dataset, "search", [day], top=5)
    direct = discover(spec, records, 5)  # type: ignore[arg-type]
    assert result.n == records.size == expected["search"]
    assert [h.value for h in result.discovery.top(5)] == [h.value for h in direct.top(5)]
    assert np.allclose([h.estimate for h in result.discovery.top(5)], [h.estimate for h in direct.top(5)])
    # the three most frequent true strings are found first, and each 95% interval covers its true count
    # (fixed seed: 3,000 devices at ε = 8; the counts 510, 264, 147 are far apart against the CIs' widths)
    counts = np.bincount(fleet.truth["search"])
    words = demo_words(8, 2000)
    order = np.argsort(-counts, kind="stable")[:3]
    top3 = result.discovery.top(3)
    assert [h.value for h in top3] == [words[i] for i in order]
    for h, i in zip(top3, order):
        assert h.ci_low <= counts[i] <= h.ci_high, (h, counts[i])
