"""The collector's batch histogram update (:meth:`CollectorMetrics.observe_uploads`, used by the native front's
bridge) renders exactly what one ``observe`` per upload renders: it reaches into prometheus-client's histogram
child, so a change there fails here."""

from __future__ import annotations

import numpy as np
from prometheus_client import generate_latest

from collector.http.monitoring import CollectorMetrics
from pipeline.prometheus import LATENCY_BUCKETS


def test_observe_uploads_renders_what_one_observe_each_renders() -> None:
    rng = np.random.default_rng(4)
    # latencies around and on every bucket bound, and beyond the last finite one
    bounds = [b for b in LATENCY_BUCKETS if b != float("inf")]
    seconds = [*bounds, *(b * 1.0001 for b in bounds), *rng.exponential(0.05, 500), 10 * max(bounds), 0.0]
    one, many = CollectorMetrics(), CollectorMetrics()
    for s in seconds:
        one.observe_upload(float(s))
    for k in range(0, len(seconds), 64):  # in loop-iteration-sized groups, as the bridge flushes them
        many.observe_uploads([float(s) for s in seconds[k : k + 64]])
    rendered = generate_latest(one.registry)
    assert b'ldp_collector_request_duration_seconds_count{method="POST",route="/v1/reports"}' in rendered
    assert generate_latest(many.registry) == rendered
