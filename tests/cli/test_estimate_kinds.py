"""``ldp estimate`` answers every kind of metric: the metrics of metrics/example.json (frequency, mean,
distribution, heavy hitters) and the repeated counters (1BitMean, dBitFlip, LOLOHA), each through ``--json``,
the printed table, ``--out`` CSV and ``--plot``; and ``ldp heavy-hitters --json``.

The dataset is written by the real pipeline pieces (:mod:`tests.support.kinds_dataset`). Every answer is
compared with the estimator run directly over the same reports (the accumulator of the spec, or heavy-hitter
discovery over the concatenated records): they are the same computation, so they must agree exactly.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from estimator.errors import BatchError
from estimator.jobs.batch import estimate_dataset
from estimator.mechanisms.heavy_hitters import discover
from estimator.oracles import state_for
from ldp_cli.main import main
from tests.support.kinds_dataset import DAYS, METRICS, WORDS, write_kinds_dataset

PNG = b"\x89PNG\r\n\x1a\n"
COLUMNS = {
    "frequency": [
        "item",
        "estimate",
        "std_error",
        "ci_low",
        "ci_high",
        "frequency",
        "adjusted_ci_low",
        "could_be_noise",
    ],
    "mean": ["attribute", "mean", "std_error", "ci_low", "ci_high", "n"],
    "distribution": ["bin", "low", "high", "share", "share_low", "share_high"],
    "heavy_hitters": [
        "rank",
        "value",
        "estimate",
        "std_error",
        "ci_low",
        "ci_high",
        "frequency",
        "adjusted_ci_low",
        "could_be_noise",
    ],
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return write_kinds_dataset(tmp_path_factory.mktemp("kinds"))


def _run(capsys: pytest.CaptureFixture[str], dataset: dict[str, Any], metric_name: str, *extra: str) -> str:
    args = ["estimate", "--dataset", str(dataset["root"]), "--metric", metric_name]
    assert main([*args, "--metrics", str(dataset["metrics"]), "--no-progress", *extra]) == 0
    return capsys.readouterr().out


def _offline(spec: Any, records: np.ndarray) -> Any:
    acc = state_for(spec)
    acc.update(records)
    return acc.estimate()


@pytest.mark.parametrize("name", METRICS)
def test_json_answers_every_kind_as_the_estimator_does(
    name: str, dataset: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    spec, records = dataset["specs"][name], dataset["records"][name]
    out = _run(capsys, dataset, name, "--json")
    obj = json.loads(out)  # one object: the whole of stdout
    assert obj["kind"] == spec.kind and obj["metric"] == name and obj["spec_id"] == spec.spec_id
    assert obj["days"] == DAYS and obj["n"] == records.shape[0] and obj["confidence"] == 0.95
    rows = obj["rows"]
    want_cols = list(COLUMNS[spec.kind])
    if name in ("settings_tab", "dark_mode", "theme"):
        want_cols.insert(1, "label")
    assert rows and list(rows[0]) == want_cols
    if spec.kind == "heavy_hitters":
        disc = discover(spec, records, 30)
        _, noise = disc.noise(0.95)
        found = [h for h, z in zip(disc.found, noise, strict=True) if not z][:30]  # only what stands out
        assert obj["candidates"] == disc.tested and obj["noise_rule"] == "bonferroni"
        assert not any(r["could_be_noise"] for r in rows)
        assert [r["value"] for r in rows] == [h.value for h in found]
        assert [r["estimate"] for r in rows] == [h.estimate for h in found]
        assert set(WORDS) <= {r["value"] for r in rows}
        assert obj["reports"] == records.shape[0]
        return
    est = _offline(spec, records)
    if spec.kind == "frequency":
        assert [r["item"] for r in rows] == list(range(spec.domain_size))
        np.testing.assert_array_equal([r["estimate"] for r in rows], est.counts)
        np.testing.assert_array_equal([r["ci_high"] for r in rows], est.ci_high)
        low, noise = est.noise()
        assert [r["could_be_noise"] for r in rows] == noise.tolist()
        np.testing.assert_array_equal([r["adjusted_ci_low"] for r in rows], low)
        assert obj["postprocessing"] == "none" and obj["noise_rule"] == "bonferroni"
    elif spec.kind == "mean":
        np.testing.assert_array_equal([r["mean"] for r in rows], est.mean)
        np.testing.assert_array_equal([r["ci_low"] for r in rows], est.ci_low)
    else:
        np.testing.assert_array_equal([r["share"] for r in rows], est.hist)
        np.testing.assert_array_equal([r["low"] for r in rows], est.edges[:-1])
        qs = obj["quantiles"]
        assert [q["q"] for q in qs] == list(est.quantile_levels)
        np.testing.assert_array_equal([q["value"] for q in qs], est.quantiles)
        assert all(q["ci_low"] <= q["value"] <= q["ci_high"] for q in qs)
        assert [q["q"] for q in qs] == [0.1, 0.25, 0.5, 0.75, 0.9, 0.99]  # p10, p25, p50, p75, p90, p99


@pytest.mark.parametrize("name", METRICS)
def test_table_csv_and_plot_for_every_kind(
    name: str, dataset: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    kind = dataset["specs"][name].kind
    text = _run(capsys, dataset, name)
    lines = text.splitlines()
    summary = json.loads(lines[0])
    assert summary["metric"] == name
    header = lines[1].split()
    assert [c for c in COLUMNS[kind] if c in header] == COLUMNS[kind]
    if kind == "distribution":
        assert "quantiles:" in lines and any(ln.strip().startswith("p50:") for ln in lines)
    answer = json.loads(_run(capsys, dataset, name, "--json"))
    csv_path, png = tmp_path / "t.csv", tmp_path / "p.png"
    out = _run(capsys, dataset, name, "--out", str(csv_path), "--plot", str(png))
    assert f"plot: {png}" in out
    with csv_path.open(newline="", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    extra = len(answer.get("quantiles", []))  # a distribution's CSV: its bins, then its quantiles
    assert f"table: {csv_path} ({len(answer['rows']) + extra} rows)" in out
    assert list(table[0])[: len(answer["rows"][0])] == list(answer["rows"][0])
    assert len(table) == len(answer["rows"]) + extra
    key = "value" if kind == "heavy_hitters" else list(answer["rows"][0])[0]
    assert [r[key] for r in table[: len(answer["rows"])]] == [str(r[key]) for r in answer["rows"]]
    if kind == "distribution":
        assert [r["row"] for r in table] == ["bin"] * len(answer["rows"]) + ["quantile"] * extra
        for r, q in zip(table[len(answer["rows"]) :], answer["quantiles"], strict=True):
            assert (float(r["q"]), float(r["q_value"])) == (q["q"], q["value"])
            assert float(r["q_low"]) <= float(r["q_value"]) <= float(r["q_high"])
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 1000
    # --json with --out and --plot: stdout stays one JSON object, the notes go to stderr
    assert (
        main(["estimate", "--dataset", str(dataset["root"]), "--metric", name, "--json", "--out", str(csv_path)]) == 0
    )
    cap = capsys.readouterr()
    assert json.loads(cap.out)["metric"] == name and "table:" in cap.err


def test_per_day_for_a_distribution_and_a_mean(dataset: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("session_minutes", "session_minutes_distribution"):
        obj = json.loads(_run(capsys, dataset, name, "--json", "--per-day"))
        assert obj["per_day"] is True and sorted({r["day"] for r in obj["rows"]}) == DAYS
        if name == "session_minutes_distribution":
            assert sorted({q["day"] for q in obj["quantiles"]}) == DAYS


def test_heavy_hitters_json_is_the_estimate_json(dataset: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--dataset", str(dataset["root"]), "--metric", "search_word", "--top", "10", "--json"]
    assert main(["heavy-hitters", *args]) == 0
    hh = json.loads(capsys.readouterr().out)
    assert main(["estimate", *args, "--no-progress"]) == 0
    est = json.loads(capsys.readouterr().out)
    hh.pop("seconds"), est.pop("seconds")
    assert hh == est and len(hh["rows"]) == hh["found"] <= 10


@pytest.mark.parametrize(
    ("name", "flag", "says"),
    [
        ("session_minutes", "--norm-sub", "--norm-sub is for frequency metrics"),
        ("search_word", "--norm-sub", "--norm-sub is for frequency metrics"),
        ("search_word", "--per-day", "--per-day: heavy-hitter discovery"),
    ],
)
def test_options_a_kind_cannot_take_are_clear_errors(
    name: str, flag: str, says: str, dataset: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", "--dataset", str(dataset["root"]), "--metric", name, flag]) == 2
    assert says in capsys.readouterr().err


def test_the_summing_path_refuses_a_heavy_hitter_metric_clearly(dataset: dict[str, Any]) -> None:
    with pytest.raises(BatchError, match="heavy-hitter metric"):
        estimate_dataset(dataset["root"], "search_word", progress=False)


def test_postprocess_norm_sub_is_one_flag_away(dataset: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """``--postprocess norm-sub`` (and its alias ``--norm-sub``): non-negative counts summing to n; the
    intervals and could_be_noise stay the unbiased estimate's; refused for another kind (exit 2)."""
    plain = json.loads(_run(capsys, dataset, "emoji_used", "--json"))
    ns = json.loads(_run(capsys, dataset, "emoji_used", "--json", "--postprocess", "norm-sub"))
    alias = json.loads(_run(capsys, dataset, "emoji_used", "--json", "--norm-sub"))
    assert ns == alias and plain["postprocessing"] == "none" and ns["postprocessing"] == "norm-sub"
    est = np.array([r["estimate"] for r in ns["rows"]])
    assert est.min() >= 0 and abs(est.sum() - ns["n"]) < 1e-6 * ns["n"]
    assert min(r["estimate"] for r in plain["rows"]) < 0  # the unbiased counts had negatives to remove
    for key in ("std_error", "ci_low", "ci_high", "adjusted_ci_low", "could_be_noise"):
        assert [r[key] for r in ns["rows"]] == [r[key] for r in plain["rows"]], key
    args = ["estimate", "--dataset", str(dataset["root"]), "--metric", "session_minutes", "--postprocess", "norm-sub"]
    assert main([*args, "--no-progress"]) == 2
    assert "for frequency metrics" in capsys.readouterr().err
