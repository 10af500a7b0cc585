"""``ldp heavy-hitters`` over a Parquet dataset written by the real sink from shuffled batches."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from collector.sinks.parquet import ParquetSink
from estimator.jobs.heavy_hitters import discover_dataset
from estimator.mechanisms.heavy_hitters import discover
from ldp_core.mechanisms import make_spec
from ldp_core.mechanisms.heavy_hitters import PEMSpec, SFPSpec, pad_values
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import open_transport
from tests.support.shuffled_data import publish

LDP = Path(sys.executable).with_name("ldp")
DAYS = [20400, 20401, 20402]
WORDS = {"weather": 9000, "news": 6000, "café": 4000, "maps": 2500}
SPECS = {
    "search": PEMSpec(epsilon=6.0, length=8, start_bits=12, step_bits=4),
    "emoji": SFPSpec(epsilon=8.0, length=8, num_hashes=16, width=2048, hash_bits=4),
    "tab": make_spec("grr", epsilon=1.0, domain_size=4),
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[ReportBatch]]]:
    tmp = tmp_path_factory.mktemp("hh")
    rng = np.random.default_rng(17)
    values = np.repeat(pad_values(list(WORDS), 8), list(WORDS.values()), axis=0)
    batches: dict[str, list[ReportBatch]] = {}
    for metric in ("search", "emoji"):
        spec = SPECS[metric]
        recs = spec.encode(values[rng.permutation(values.shape[0])], rng)
        for i, chunk in enumerate(np.array_split(recs, 9)):
            b = ReportBatch(metric, spec, DAYS[i % 3], chunk, rng.bytes(16))
            batches.setdefault(metric, []).append(b)
    tab = SPECS["tab"]
    batches["tab"] = [ReportBatch("tab", tab, DAYS[0], tab.encode(rng.integers(0, 4, 300), rng), rng.bytes(16))]
    t = open_transport(f"sqlite:///{tmp}/log.sqlite3", synchronous="NORMAL")
    t.create_topic(SHUFFLED_TOPIC, 2)
    publish(t, SHUFFLED_TOPIC, [b for bs in batches.values() for b in bs])
    root = tmp / "ds"
    sink = ParquetSink(t, root, SpecCatalog(specs=list(SPECS.items())), flush_seconds=0.0)
    sink.run(idle_timeout=0.6)
    sink.close()
    t.close()
    return root, batches


@pytest.mark.parametrize("metric", ["search", "emoji"])
def test_discovery_over_the_dataset_equals_discovery_over_its_reports(
    dataset: tuple[Path, dict[str, list[ReportBatch]]], metric: str
) -> None:
    root, batches = dataset
    result = discover_dataset(root, metric, DAYS, top=4)
    records = np.concatenate([b.records for b in batches[metric]])
    assert result.n == records.size
    # the sink may reorder batches across partitions; discovery depends on the multiset of reports only
    direct = discover(SPECS[metric], records, 4)  # type: ignore[arg-type]
    assert [h.value for h in result.discovery.top(4)] == [h.value for h in direct.top(4)]
    assert np.allclose([h.estimate for h in result.discovery.top(4)], [h.estimate for h in direct.top(4)])
    assert set(result.table["value"]) == set(WORDS)


def test_cli_writes_table_and_plot(dataset: tuple[Path, dict[str, list[ReportBatch]]], tmp_path: Path) -> None:
    root, _ = dataset
    out, plot = tmp_path / "hh.csv", tmp_path / "hh.png"
    days = f"{DAYS[0]}..{DAYS[-1]}"
    args = ["heavy-hitters", "--dataset", str(root), "--metric", "search", "--days", days, "--top", "3"]
    run = subprocess.run(
        [str(LDP), *args, "--out", str(out), "--plot", str(plot)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.splitlines()[0])
    assert summary["metric"] == "search" and summary["mechanism"] == "pem" and summary["reports"] == sum(WORDS.values())
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert [r["value"] for r in rows] == ["weather", "news", "café"]
    assert list(rows[0]) == [
        "rank",
        "value",
        "estimate",
        "std_error",
        "ci_low",
        "ci_high",
        "frequency",
        "adjusted_ci_low",
        "could_be_noise",
    ]
    assert all(r["could_be_noise"] == "False" and float(r["adjusted_ci_low"]) > 0 for r in rows)
    for r in rows:
        assert float(r["ci_low"]) <= WORDS[r["value"]] <= float(r["ci_high"]) or abs(
            float(r["estimate"]) - WORDS[r["value"]]
        ) < 5 * float(r["std_error"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "extra,word",
    [
        (["--metric", "tab"], "use `ldp estimate`"),
        (["--metric", "nothing"], "no part files"),
        (["--metric", "search", "--days", "20500..20501"], "no part files"),
        (["--metric", "search", "--top", "0"], "--top"),
        (["--metric", "emoji", "--ranking", "estimate"], "applies to pem metrics only"),
    ],
)
def test_cli_errors_exit_2(dataset: tuple[Path, dict[str, list[ReportBatch]]], extra: list[str], word: str) -> None:
    root, _ = dataset
    run = subprocess.run(
        [str(LDP), "heavy-hitters", "--dataset", str(root), *extra], capture_output=True, text=True, check=False
    )
    assert run.returncode == 2 and word in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_several_specs_on_a_day_are_a_choice_the_api_answers_with_409(tmp_path: Path) -> None:
    """A day of ``search`` under two PEM specs: the batch job raises :class:`SpecChoiceError` (a
    :class:`BatchError`), ``GET /v1/heavy-hitters/{metric}`` turns it into 409, and a ``spec_id`` chooses."""
    from fastapi.testclient import TestClient

    from estimator.errors import BatchError, SpecChoiceError
    from estimator.service import EstimatorState, Tally, create_app

    rng = np.random.default_rng(23)
    values = np.repeat(pad_values(list(WORDS), 8), [v // 10 for v in WORDS.values()], axis=0)
    first, second = SPECS["search"], PEMSpec(epsilon=4.0, length=8, start_bits=12, step_bits=4)
    batches = [ReportBatch("search", s, DAYS[0], s.encode(values, rng), rng.bytes(16)) for s in (first, second)]
    t = open_transport(f"sqlite:///{tmp_path}/log.sqlite3", synchronous="NORMAL")
    t.create_topic(SHUFFLED_TOPIC, 1)
    publish(t, SHUFFLED_TOPIC, batches)
    root = tmp_path / "ds"
    sink = ParquetSink(t, root, SpecCatalog(specs=[("search", first), ("search", second)]), flush_seconds=0.0)
    sink.run(idle_timeout=0.6)
    sink.close()
    t.close()

    with pytest.raises(SpecChoiceError, match="several specs") as raised:
        discover_dataset(root, "search", [DAYS[0]], top=3)
    assert isinstance(raised.value, BatchError)
    state = EstimatorState(Tally(), {}, [], "shuffled", "g", "m")
    client = TestClient(create_app(state=lambda: state, dataset=root))
    r = client.get("/v1/heavy-hitters/search", params={"day": DAYS[0], "top": 3})
    assert r.status_code == 409 and "several specs" in r.json()["detail"], r.text
    r = client.get("/v1/heavy-hitters/search", params={"day": DAYS[0], "top": 3, "spec_id": second.spec_id})
    assert r.status_code == 200, r.text
    assert r.json()["n"] == values.shape[0] and r.json()["epsilon"] == second.epsilon
    # another BatchError stays a 400: a heavy-hitter request for a day whose spec is not one of the choices
    r = client.get("/v1/heavy-hitters/search", params={"day": DAYS[0], "spec_id": "no-such-spec"})
    assert r.status_code == 400 and "no reports under spec" in r.json()["detail"], r.text


@pytest.mark.parametrize("ranking", ["posterior", "estimate"])
def test_cli_ranking_is_the_decode_it_names(dataset: tuple[Path, dict[str, list[ReportBatch]]], ranking: str) -> None:
    """``--ranking`` picks PEM's decode: the JSON says which, and its values and estimates are those of
    ``discover_pem(..., ranking=...)`` over the same reports (the default is the posterior ranking)."""
    from estimator.mechanisms.heavy_hitters import discover_pem

    root, batches = dataset
    flags = [] if ranking == "posterior" else ["--ranking", ranking]
    args = ["heavy-hitters", "--dataset", str(root), "--metric", "search", "--top", "4", "--json", *flags]
    run = subprocess.run([str(LDP), *args], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["ranking"] == ranking
    records = np.concatenate([b.records for b in batches["search"]])
    direct = discover_pem(SPECS["search"], records, 4, ranking=ranking)  # type: ignore[arg-type]
    want = {h.value: h.estimate for h in direct.top(4)}
    got = {row["value"]: row["estimate"] for row in answer["rows"]}
    assert set(got) == set(WORDS) and all(np.isclose(got[v], want[v]) for v in got)
