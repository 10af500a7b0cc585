"""``ldp estimate --days A..B`` states the central ε per person over the days, not one day's batch.

A person reporting daily is in one shuffled batch a day. The dataset here has one batch a day for 7 days,
each carrying what the shuffler attaches (its ``_central`` with ``shuffler_guarantee``: FMT21's clone
reduction for ⌈N/R⌉ people of R·ε₀ each, R = 2 reports a person a day); the command's
per-person figure must equal the composition of the 7 days computed here independently: the clone pair
(P, Q) written out outcome by outcome from its definition and handed to ``dp_accounting``'s
``from_two_probability_mass_functions`` (a different construction of the PLD than the estimator's), composed
7 times and read at δ = 7·δ_day. Both are pessimistic discretizations on grids of 1e-4, so they agree to about
7·1e-4 (tolerance 2e-3). It must also lie between one day's ε and basic composition's 7·ε_day.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy import stats

from collector.shuffler import Shuffler
from collector.sinks.parquet import ParquetSink
from estimator.accounting.shuffle import grid_floor, shuffler_guarantee
from ldp_cli.main import main
from ldp_core.metrics import parse_metrics
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.envelope import ShuffleMeta, encode_envelope
from pipeline.topics import SHUFFLED_TOPIC, metric_day_key
from pipeline.transport import open_transport
from tests.support.metrics_docs import dictionary, metric, metrics_doc

DAYS = list(range(20400, 20407))
EPS0, N, DELTA, R = 1.0, 1000, 1e-6, 2  # R: reports a person may send a day (the shuffler bounds people)
METRICS = metrics_doc(tab=metric("grr", EPS0, dictionary("a", "b", "c", "d")))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("person")
    spec = parse_metrics(METRICS)["tab"].spec
    guarantee = shuffler_guarantee(DELTA)
    transport = open_transport(f"sqlite:///{root}/log.sqlite3", synchronous="NORMAL")
    transport.create_topic(SHUFFLED_TOPIC, 1)
    rng = np.random.default_rng(21)
    for day in DAYS:
        batch = ReportBatch("tab", spec, day, spec.encode(rng.integers(0, 4, N), rng), rng.bytes(16))
        # the figure and bound string the shuffler attaches (its own method, with its guarantee function)
        shuffler = types.SimpleNamespace(guarantee=guarantee, _guarantee_failed=False)
        eps, delta, bound = Shuffler._central(shuffler, N, EPS0, R)  # type: ignore[arg-type]
        meta = ShuffleMeta(batch.batch_id.hex(), N, EPS0, eps, delta, bound, 1)
        transport.publish(SHUFFLED_TOPIC, metric_day_key("tab", day), encode_envelope(meta, batch))
    cat = SpecCatalog([parse_metrics(METRICS)])
    sink = ParquetSink(transport, root / "ds", cat, flush_seconds=0.0)
    sink.run(idle_timeout=0.5, max_records=len(DAYS))
    sink.close()
    transport.close()
    return root / "ds"


def _clone_pair(e0: float, n: int) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    """P and Q of FMT21 (estimator/accounting/shuffle.py's docstring), as {(c, k): probability}: C ~ Bin(n-1,
    e^-ε0), A ~ Bin(C, 1/2), Δ ~ Bernoulli(e^ε0/(e^ε0+1)); P's first coordinate is A + Δ, Q's A + 1 − Δ.
    Outcomes below 1e-30 are left out (their mass is far below the tolerance)."""
    a = math.exp(e0) / (math.exp(e0) + 1)
    p, q = {}, {}
    for c in range(n):
        wc = stats.binom.pmf(c, n - 1, math.exp(-e0))
        if wc < 1e-30:
            continue
        ks = np.arange(c + 2)
        ak, ak1 = stats.binom.pmf(ks, c, 0.5), stats.binom.pmf(ks - 1, c, 0.5)  # Pr(A = k), Pr(A = k - 1)
        pk, qk = wc * (a * ak1 + (1 - a) * ak), wc * ((1 - a) * ak1 + a * ak)
        for k in np.flatnonzero((pk > 1e-30) & (qk > 1e-30)):
            p[(c, int(k))], q[(c, int(k))] = float(pk[k]), float(qk[k])
    return p, q


def test_the_printed_epsilon_is_the_composition_over_the_days(
    dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", "--dataset", str(dataset), "--metric", "tab", "--days", f"{DAYS[0]}..{DAYS[-1]}"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out.splitlines()[0])
    one_day = out["central_epsilon"]
    assert out["central_person_days"] == len(DAYS)
    assert out["central_delta_per_person"] == pytest.approx(len(DAYS) * DELTA, rel=1e-12)
    assert "replace-one" in out["central_neighbours"]

    p, q = _clone_pair(R * EPS0, grid_floor(-(-N // R)))  # a person's day: one R·ε0 randomizer among ⌈N/R⌉
    day = pld.from_two_probability_mass_functions(
        {o: math.log(v) for o, v in q.items()},
        {o: math.log(v) for o, v in p.items()},
        value_discretization_interval=1e-4,
    )
    want = day.self_compose(len(DAYS)).get_epsilon_for_delta(len(DAYS) * DELTA)
    assert day.get_epsilon_for_delta(DELTA) == pytest.approx(one_day, abs=2e-3)  # the pair is the day's bound
    assert out["central_epsilon_per_person"] == pytest.approx(want, abs=2e-3)
    assert one_day < out["central_epsilon_per_person"] < len(DAYS) * one_day
    assert out["central_epsilon_basic"] == pytest.approx(len(DAYS) * one_day, rel=1e-12)
    assert out["central_composition"] == "pld"
    assert "per person" in captured.err and f"{len(DAYS)} days" in captured.err


def test_one_day_is_one_days_epsilon(dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--dataset", str(dataset), "--metric", "tab", "--days", str(DAYS[2])]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[0])
    assert out["central_person_days"] == 1
    assert (out["central_epsilon_per_person"], out["central_delta_per_person"]) == (
        out["central_epsilon"],
        out["central_delta"],
    )
