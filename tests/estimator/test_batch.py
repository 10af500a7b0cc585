"""Batch estimation over the sink's Parquet dataset, and ``ldp estimate``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collector.sinks.parquet import ParquetSink
from estimator.jobs.batch import BatchError, estimate_dataset, parse_day_range
from ldp_cli.main import main
from ldp_core.days import parse_day
from ldp_core.mechanisms import make_spec
from ldp_core.metrics import parse_metrics
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import open_transport
from tests.support.metrics_docs import dictionary, hashed, metric, metrics_doc
from tests.support.shuffled_data import envelope_of, make_batches, offline, publish

DAYS = [20400, 20401, 20402]
METRICS = metrics_doc(
    tab=metric("grr", 1.0, dictionary("a", "b", "c", "d")),
    word=metric("hr", 2.0, hashed(64, 1)),
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("batch")
    metrics_path = root / "metrics.json"
    metrics_path.write_text(json.dumps(METRICS))
    ms = parse_metrics(METRICS)
    specs = {name: m.spec for name, m in ms.items()}
    transport = open_transport(f"sqlite:///{root}/log.sqlite3", synchronous="NORMAL")
    transport.create_topic(SHUFFLED_TOPIC, 3)
    batches = make_batches(specs, DAYS, 48, np.random.default_rng(11))
    other = make_spec("grr", epsilon=0.5, domain_size=5)
    rng = np.random.default_rng(12)
    extra = ReportBatch("tab", other, DAYS[2], other.encode(rng.integers(0, 5, 90), rng))
    publish(transport, SHUFFLED_TOPIC, batches)
    transport.publish(SHUFFLED_TOPIC, b"tab/x", envelope_of(extra))
    cat = SpecCatalog([ms])
    cat.add("tab", other)
    sink = ParquetSink(transport, root / "ds", cat, flush_seconds=0.0)
    sink.run(idle_timeout=0.5, max_records=5)
    sink.close()
    transport.close()
    return {"root": root / "ds", "metrics": metrics_path, "batches": batches, "specs": specs, "other": other}


def test_range_estimate_equals_the_offline_estimator(dataset) -> None:  # type: ignore[no-untyped-def]
    spec = dataset["specs"]["word"]
    days = range(DAYS[0], DAYS[1] + 1)
    res = estimate_dataset(dataset["root"], "word", days, progress=False)
    acc = None
    for a in offline([b for b in dataset["batches"] if b.metric == "word" and b.day in days]).values():
        acc = a if acc is None else acc.merge(a)
    assert acc is not None
    want = acc.estimate()
    assert res.n == want.n and res.spec == spec and res.days == list(days)
    t = res.table
    assert list(t.columns) == [
        "item",
        "estimate",
        "std_error",
        "ci_low",
        "ci_high",
        "frequency",
        "adjusted_ci_low",
        "could_be_noise",
    ]
    low, noise = want.noise()
    np.testing.assert_array_equal(t["adjusted_ci_low"].to_numpy(), low)
    assert t["could_be_noise"].tolist() == noise.tolist()
    np.testing.assert_array_equal(t["estimate"].to_numpy(), want.counts)
    np.testing.assert_array_equal(t["std_error"].to_numpy(), want.std_error)
    np.testing.assert_array_equal(t["ci_low"].to_numpy(), want.ci_low)
    np.testing.assert_array_equal(t["ci_high"].to_numpy(), want.ci_high)
    np.testing.assert_array_equal(t["frequency"].to_numpy(), want.counts / want.n)
    assert res.central_epsilon == 0.25


def test_per_day_and_labels_and_norm_sub(dataset) -> None:  # type: ignore[no-untyped-def]
    ms = parse_metrics(METRICS)
    tab = dataset["specs"]["tab"]
    res = estimate_dataset(
        dataset["root"],
        "tab",
        None,
        spec_id=tab.spec_id,
        per_day=True,
        definition=ms["tab"],
        norm_sub=True,
        progress=False,
    )
    t = res.table
    assert list(t.columns) == [
        "day",
        "item",
        "label",
        "estimate",
        "std_error",
        "ci_low",
        "ci_high",
        "frequency",
        "adjusted_ci_low",
        "could_be_noise",
    ]
    assert t["label"].tolist()[:5] == ["a", "b", "c", "d", "(other)"]
    for day in DAYS:
        ((_, acc),) = offline([b for b in dataset["batches"] if b.metric == "tab" and b.day == day]).items()
        want = acc.estimate().norm_sub()
        rows = t[t["day"] == day]
        np.testing.assert_array_equal(rows["estimate"].to_numpy(), want.counts)
        np.testing.assert_array_equal(rows["ci_high"].to_numpy(), want.ci_high)
        assert abs(rows["estimate"].sum() - acc.n) < 1e-9 * acc.n and rows["estimate"].min() >= 0


def test_several_specs_need_a_choice(dataset) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BatchError, match="several specs"):
        estimate_dataset(dataset["root"], "tab", None, progress=False)
    res = estimate_dataset(dataset["root"], "tab", None, spec_id=dataset["other"].spec_id, progress=False)
    assert res.n == 90
    with pytest.raises(BatchError, match="no part files"):
        estimate_dataset(dataset["root"], "word", range(1, 3), progress=False)


def test_day_ranges() -> None:
    assert parse_day_range("20400..20402") == range(20400, 20403)
    assert parse_day_range("2025-11-08..2025-11-09") == range(parse_day("2025-11-08"), parse_day("2025-11-09") + 1)
    assert parse_day_range(start="20401", end="20401") == range(20401, 20402)
    assert parse_day_range() is None
    with pytest.raises(BatchError):
        parse_day_range("5..4")
    with pytest.raises(BatchError):
        parse_day_range("1..2", start="1")
    with pytest.raises(ValueError):
        parse_day_range("monday..friday")


def test_ldp_estimate_writes_table_and_plot(dataset, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out, png = tmp_path / "t.parquet", tmp_path / "p.png"
    code = main(
        [
            "estimate",
            "--dataset",
            str(dataset["root"]),
            "--metric",
            "word",
            "--days",
            f"{DAYS[0]}..{DAYS[2]}",
            "--out",
            str(out),
            "--plot",
            str(png),
            "--metrics",
            str(dataset["metrics"]),
            "--no-progress",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["n"] == sum(len(b) for b in dataset["batches"] if b.metric == "word")
    table = pd.read_parquet(out)
    res = estimate_dataset(dataset["root"], "word", None, progress=False)
    pd.testing.assert_frame_equal(table, res.table, check_like=False)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv = tmp_path / "t.csv"
    assert (
        main(
            [
                "estimate",
                "--dataset",
                str(dataset["root"]),
                "--metric",
                "tab",
                "--spec-id",
                dataset["specs"]["tab"].spec_id,
                "--out",
                str(csv),
                "--metrics",
                str(dataset["metrics"]),
            ]
        )
        == 0
    )
    assert pd.read_csv(csv)["label"].tolist()[:2] == ["a", "b"]
    assert main(["estimate", "--dataset", str(dataset["root"]), "--metric", "nope"]) == 2
    assert "no part files" in capsys.readouterr().err
    assert (
        main(["estimate", "--dataset", str(dataset["root"]), "--metric", "word", "--out", str(tmp_path / "x.txt")]) == 2
    )
