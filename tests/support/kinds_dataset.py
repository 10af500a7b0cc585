"""A Parquet dataset holding every kind of metric: those of metrics/example.json (frequency, mean,
distribution, heavy hitters) and three repeated counters (1BitMean, dBitFlip, LOLOHA).

Written by the real pipeline pieces: the devices' encoders (``spec.encode``), report batches published on the
shuffled topic of an embedded log, and the Parquet sink reading that topic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from collector.sinks.parquet import ParquetSink
from ldp_core.mechanisms.heavy_hitters import pad_values
from ldp_core.metrics import parse_metrics
from ldp_core.wire.frames import ReportBatch
from pipeline.catalog import SpecCatalog
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport import open_transport
from tests.support.metrics_docs import dictionary, metric
from tests.support.shuffled_data import publish

__all__ = ["DAYS", "METRICS", "REPEATED", "WORDS", "write_kinds_dataset"]

ROOT = Path(__file__).resolve().parents[2]
DAYS = [20400, 20401]
RANGE = {"kind": "range", "low": 0, "high": 240, "out_of_range": "clamp"}
REPEATED = {
    "app_opens": metric("1bitmean", 1.0, RANGE, description="app opens a day (1BitMean)"),
    "app_opens_hist": metric(
        "dbitflip", 2.0, RANGE, params={"buckets": 16, "sample": 4}, description="app opens a day (dBitFlip)"
    ),
    "theme": metric("loloha", 2.0, dictionary("light", "dark", "sepia", "contrast"), description="theme (LOLOHA)"),
}
WORDS = {"weather": 3000, "news": 2000, "maps": 1200}


def _values(spec: Any, n: int, rng: np.random.Generator) -> Any:
    if spec.kind == "heavy_hitters":
        words = np.repeat(np.array(list(WORDS), dtype=object), list(WORDS.values()))
        return pad_values(words[rng.permutation(words.size)][:n], spec.length)
    if spec.kind == "frequency":
        return rng.integers(0, spec.domain_size, n)
    return np.clip(rng.gamma(2.0, 20.0, n), 0, 240)  # minutes, a skewed distribution inside the range


def write_kinds_dataset(tmp: Path) -> dict[str, Any]:
    """metrics/example.json plus :data:`REPEATED` in ``tmp/metrics.json``, and every metric's reports in the
    Parquet dataset ``tmp/ds`` (2 days, 2 files a day), written by the real sink from the shuffled topic."""
    doc = json.loads((ROOT / "metrics" / "example.json").read_text(encoding="utf-8"))
    doc["metrics"].update(REPEATED)
    metrics_path = tmp / "metrics.json"
    metrics_path.write_text(json.dumps(doc), encoding="utf-8")
    specs = {name: m.spec for name, m in parse_metrics(doc).items()}
    rng = np.random.default_rng(2030)
    batches: list[ReportBatch] = []
    for name, spec in specs.items():
        n = sum(WORDS.values()) if spec.kind == "heavy_hitters" else 1500
        recs = spec.encode(_values(spec, n, rng), rng)
        for i, chunk in enumerate(np.array_split(recs, 4)):
            batches.append(ReportBatch(name, spec, DAYS[i % 2], chunk, rng.bytes(16)))
    t = open_transport(f"sqlite:///{tmp}/log.sqlite3", synchronous="NORMAL")
    t.create_topic(SHUFFLED_TOPIC, 2)
    publish(t, SHUFFLED_TOPIC, batches)
    sink = ParquetSink(t, tmp / "ds", SpecCatalog(specs=list(specs.items())), flush_seconds=0.0)
    sink.run(idle_timeout=0.6)
    sink.close()
    t.close()
    records = {name: np.concatenate([b.records for b in batches if b.metric == name]) for name in specs}
    return {"root": tmp / "ds", "metrics": metrics_path, "specs": specs, "records": records}


#: every metric of the dataset
METRICS = [
    "emoji_used",
    "settings_tab",
    "dark_mode",
    "search_word",
    "session_minutes",
    "session_minutes_distribution",
    *REPEATED,
]
