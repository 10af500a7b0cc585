"""Data poisoning, measured (docs/PRIVACY.md, "Data poisoning"): what crafted reports do to an estimate.

These tests pin the figures the docs print: one crafted report moves its target's unbiased count by exactly
Δ = (1 − q*)/(p* − q*), and the collector accepts such reports today (nothing bounds how many).
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from collector.http.app import create_app
from collector.settings import CollectorSettings
from estimator.oracles import accumulator_for
from ldp_core.mechanisms import make_spec
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, ReportBatch, decode_frame, encode_frame
from pipeline.topics import RAW_TOPIC
from pipeline.transport import open_transport
from simulator.crafted import crafted_reports, influence
from simulator.scenarios.ldp.poisoning import TokenAttackResult, main, poisoning_run, token_attack_run
from tests.support.collector_support import TODAY, ServerThread, write_metrics


@pytest.mark.parametrize("mechanism", ["olh", "oue", "grr"])
def test_each_crafted_report_moves_its_target_by_exactly_delta(mechanism: str) -> None:
    rows = poisoning_run(mechanism, 1.0, 64, 5_000, [0, 1, 37, 400], np.random.default_rng(5), target=10)
    spec = make_spec(mechanism, epsilon=1.0, domain_size=64)
    p, q = spec.support_probabilities()  # type: ignore[attr-defined]
    delta = (1 - q) / (p - q)
    assert rows[0].influence == pytest.approx(delta, rel=1e-12)
    for r in rows:
        assert r.honest_estimate == rows[0].honest_estimate  # the same honest reports under every attack
        assert r.shift == pytest.approx(r.crafted * delta, rel=1e-9, abs=1e-6)


def test_olh_crafted_reports_leave_other_items_unbiased() -> None:
    """A crafted OLH report supports a non-target item with probability 1/g (its seed is random), so the other
    items' estimates move by (S_v − m/g)/(p − 1/g), S_v ~ Binomial(m, 1/g): zero on average. The mean shift over
    the d − 1 other items has standard deviation sqrt(m·(1/g)(1 − 1/g)/(d − 1))/(p − 1/g) (one report's
    hashes of different items are independent uniforms); the test allows 5 of them."""
    d, m = 256, 20_000
    spec = make_spec("olh", epsilon=1.0, domain_size=d)
    rng = np.random.default_rng(21)
    acc = accumulator_for(spec)
    acc.update(crafted_reports(spec, 7, m, rng))
    counts = acc.estimate().counts
    g, p = spec.hash_range, spec.p  # type: ignore[attr-defined]
    assert counts[7] == pytest.approx(m * influence(spec), rel=1e-9)
    others = np.delete(counts, 7)
    sd = np.sqrt(m * (1 / g) * (1 - 1 / g) / (d - 1)) / (p - 1 / g)
    assert abs(others.mean()) < 5 * sd


def test_crafting_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="outside the domain"):
        crafted_reports(make_spec("olh", epsilon=1.0, domain_size=8), 8, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="no crafting rule"):
        crafted_reports(make_spec("hr", epsilon=1.0, domain_size=8), 1, 1, np.random.default_rng(0))


def test_the_collector_accepts_crafted_uploads_and_they_move_the_estimate(tmp_path: Path) -> None:
    """The attack through a real collector (uvicorn on loopback, the embedded log): 20 uploads of 100 crafted
    OLH reports each, under fresh batch ids, are all answered 202, and the published reports move the target's
    estimate by 2,000·Δ. Nothing bounds an uploader's volume today (docs/PRIVACY.md)."""
    metrics = write_metrics(tmp_path / "metrics.json")
    spec = metrics["emoji_used"].spec
    settings = CollectorSettings(
        metrics_path=str(tmp_path / "metrics.json"),
        transport_url=f"sqlite:///{tmp_path}/log.sqlite3",
        dedup_path=str(tmp_path / "ids.sqlite3"),
        raw_partitions=1,
    )
    transport = open_transport(settings.transport_url)
    rng = np.random.default_rng(3)
    honest = spec.encode(rng.integers(0, spec.domain_size, 3_000), rng)
    target = 99
    try:
        with ServerThread(create_app(settings, transport=transport)) as srv:
            bodies = [encode_frame(ReportBatch("emoji_used", spec, TODAY, honest))]
            bodies += [
                encode_frame(ReportBatch("emoji_used", spec, TODAY, crafted_reports(spec, target, 100, rng)))
                for _ in range(20)
            ]
            for body in bodies:
                r = httpx.post(srv.url + "/v1/reports", content=body, headers={"content-type": FRAME_CONTENT_TYPE})
                assert r.status_code == 202, r.text
        clean, poisoned = accumulator_for(spec), accumulator_for(spec)
        clean.update(honest)
        with transport.consume(RAW_TOPIC, f"reader-{uuid.uuid4().hex[:8]}", session_timeout=2.0) as c:
            while got := c.poll(max_records=1000, timeout=0.3):
                for rec in got:
                    poisoned.update(decode_frame(rec.value, spec))
    finally:
        transport.close()
    assert poisoned.n == 3_000 + 2_000
    shift = poisoned.estimate().counts[target] - clean.estimate().counts[target]
    assert shift == pytest.approx(2_000 * influence(spec), rel=1e-9)


def test_scenario_command_prints_the_table_and_draws_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "p.png"
    assert (
        main(["--mechanisms", "olh", "--users", "2000", "--domain", "32", "--crafted", "0,50", "--plot", str(png)]) == 0
    )
    out = capsys.readouterr().out
    assert "| olh | 50 |" in out and png.stat().st_size > 10_000


def _check_bounded(rows: list[TokenAttackResult]) -> None:
    """The claim of docs/PRIVACY.md §6: k installs get at most k·K uploads of r reports accepted, so the target
    moves by at most k·K·r·Δ (and, OLH crafting being exact for the target, by exactly accepted·Δ)."""
    for r in rows:
        cap = r.attackers * r.tokens_per_day * r.reports_per_upload
        assert r.accepted <= cap, f"{r.accepted} crafted reports accepted from {r.attackers} installs, cap {cap}"
        assert r.shift == pytest.approx(r.accepted * r.influence, rel=1e-9, abs=1e-6)
        assert r.shift <= cap * r.influence + 1e-6


def test_the_poisoning_attack_through_a_token_requiring_collector_is_bounded(tmp_path: Path) -> None:
    """The attack played against the real services: k enrolled installs (k = 1 and 3) of a real issuer (K = 4
    tokens a day) try to get 60 crafted OLH reports accepted by a real collector run with --require-tokens, in
    uploads of r = 2 (the metric's max_reports_per_day). Exactly k·K uploads are accepted (k·K·r reports), every
    other one is refused 401 token_missing, and the target moves by exactly accepted·Δ. The same attack against
    the same collector without --require-tokens gets all 60 accepted, and the bound check fails on it."""
    common = dict(reports_per_day=2, target=10, workdir=tmp_path)
    rows = token_attack_run("olh", 1.0, 64, 3_000, 60, [1, 3], 4, np.random.default_rng(7), **common)  # type: ignore[arg-type]
    _check_bounded(rows)
    for r in rows:
        assert r.accepted == r.attackers * 4 * 2
        assert r.outcomes == {"202 accepted": r.attackers * 4, "401 token_missing": 30 - r.attackers * 4}
    assert rows[0].honest_estimate == rows[1].honest_estimate  # the same honest reports under both attacks
    (control,) = token_attack_run(
        "olh",
        1.0,
        64,
        3_000,
        60,
        [1],
        4,
        np.random.default_rng(7),
        require_tokens=False,
        **common,  # type: ignore[arg-type]
    )
    assert control.accepted == 60 and control.outcomes == {"202 accepted": 30}
    assert control.honest_estimate == rows[0].honest_estimate
    with pytest.raises(AssertionError, match="cap 8"):
        _check_bounded([dataclasses.replace(control, require_tokens=True)])


def test_the_token_attack_command_prints_both_collectors(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--mechanisms", "olh", "--users", "1000", "--domain", "32", "--crafted", "20"]
    assert main(args + ["--attackers", "1", "--tokens-per-day", "3"]) == 0
    out = capsys.readouterr().out
    assert "| olh | no tokens | 1 | 20 | 20 |" in out and "| olh | tokens, K = 3 | 1 | 20 | 3 |" in out
