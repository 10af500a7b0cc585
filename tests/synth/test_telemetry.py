"""Synthetic telemetry end to end: real SDK clients and encoded frames through the collector and the
shuffler on the embedded log, the streaming estimator's estimates over HTTP, the synthetic table from them."""

from __future__ import annotations

import numpy as np

from estimator.synth.data import marginal, population
from estimator.synth.telemetry import joint_codes, metrics_document, pairs_of, synthesize
from simulator.synth_telemetry import collect_pairs


def test_pairs_collected_under_ldp_give_a_consistent_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = population(1500, 21).select(["platform", "network", "crashes"])
    est, info = collect_pairs(table, 3.0, np.random.default_rng(9), sdk_clients=6, workdir=tmp_path)
    assert info["sdk_devices"] == 6 and info["buffered_reports"] == 0
    assert sum(e.n for e in est) == table.rows  # every device's one report was counted, the SDK's included
    assert len(est) == len(pairs_of(table)) == 3
    for e in est:
        truth = np.bincount(joint_codes(table, e.pair), minlength=e.counts.size)
        # the rows that reported this pair: a uniform random share n/N of the table, so the truth of those
        # n devices is about truth·n/N; the estimate's own error has std_error per cell, and the share's
        # (hypergeometric) error is below sqrt(truth·n/N): 6 of their combined std is a < 1e-8 false alarm
        expect = truth * e.n / table.rows
        sd = np.sqrt(e.std_error**2 + expect)
        assert np.all(np.abs(e.counts - expect) <= 6.0 * sd), e.pair
    syn, report = synthesize(table, est, np.random.default_rng(10))
    assert syn.rows == table.rows and report["reports"] == table.rows
    for p in report["pairs"]:
        # the model's marginals are a least-squares-like projection of the estimates onto one distribution:
        # the residual's std per cell is at most the estimate's, so 6 is a < 1e-8 false alarm per cell;
        # the synthetic table rounds the model's counts (randomized rounding, a few counts per cell)
        assert p["max_abs_z_model"] <= 6.0
        assert p["max_abs_z_synthetic"] <= 6.0
    # and the table is about the population's: every 2-way marginal within the LDP noise of the truth
    for e in est:
        x = marginal(syn, e.pair)
        sd = float(np.sqrt(np.mean(e.std_error**2))) * table.rows / e.n
        assert np.all(np.abs(x - marginal(table, e.pair)) <= 8.0 * sd)


def test_the_metrics_file_is_one_oracle_metric_per_pair() -> None:
    table = population(10, 1).select(["platform", "age", "tier"])
    doc = metrics_document(table, 2.0, "olh")
    assert sorted(doc["metrics"]) == ["synth.age.tier", "synth.platform.age", "synth.platform.tier"]
    m = doc["metrics"]["synth.platform.age"]
    assert m["mechanism"] == {"mechanism": "olh", "epsilon": 2.0} and m["max_reports_per_day"] == 1
    assert len(m["domain"]["values"]) == 3 * 5 and m["domain"]["values"][0] == "android|18-24"
