"""The set-up the tests of one metric-day spread over several members share (issue 31): the real shuffler run
over a list of uploads, sealed uploads made by the device's own code, and waiting for the members to count."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from collector.shuffler import Shuffler, ShufflerSettings
from ldp_core.metrics import MetricSet, parse_metrics
from ldp_core.wire.frames import ReportBatch, encode_frame
from ldp_core.wire.sealing import BatchOpener, KeyRing, ReplayGuard, new_key_file, seal_batch
from pipeline.topics import RAW_TOPIC, metric_day_key
from pipeline.transport import Transport
from tests.support.collector_support import TODAY
from tests.support.metrics_docs import hashed, metric, metrics_doc

__all__ = ["SealedPair", "run_shuffler", "sealed_word_metrics", "sealed_upload", "sealed_opener", "wait_until"]


def run_shuffler(
    tmp_path: Path,
    transport: Transport,
    metrics: MetricSet,
    uploads: Sequence[ReportBatch],
    *,
    min_batch: int,
    guarantee: Any = None,
    idle_exit: float = 0.5,
    **settings: Any,
) -> None:
    """Publish ``uploads`` to the raw topic as the collector does (keyed by metric-day), then run the real shuffler
    (4 raw partitions, batches of exactly ``min_batch``, ``settings`` over those) until it has been idle
    ``idle_exit`` s."""
    raw = settings.get("raw_topic", RAW_TOPIC)
    transport.ensure_topic(raw, 4)
    transport.publish_many(raw, [(metric_day_key(b.metric, b.day), encode_frame(b)) for b in uploads])
    opts: dict[str, Any] = {
        "min_batch": min_batch,
        "max_batch": min_batch,
        "partitions": 4,
        "checkpoint_interval": 0.05,
        "session_timeout": 2.0,
        "key_file": str(tmp_path / "shuffler.key"),
    }
    sh = Shuffler(transport, metrics, ShufflerSettings(**{**opts, **settings}), guarantee=guarantee)
    sh.run(idle_exit=idle_exit)
    sh.close()


def sealed_word_metrics(tmp_path: Path, size: int, epsilon: float = 1.5) -> tuple[MetricSet, Path]:
    """A metrics file with one sealed OLH metric ``word`` over ``size`` hashed values (also written to
    ``tmp_path/metrics.json``), and the folder of the analyzer's key it is sealed to."""
    folder = tmp_path / "analyzer-keys"
    _, key = new_key_file(folder)
    doc = metrics_doc(
        analyzer_keys=[key.public.to_dict()],
        word=metric("olh", epsilon, hashed(size, 4), sealed=True, description="word, sealed"),
    )
    (tmp_path / "metrics.json").write_text(json.dumps(doc))
    return parse_metrics(doc), folder


def sealed_upload(metrics: MetricSet, n: int, size: int, rng: np.random.Generator) -> ReportBatch:
    """What a device uploads: ``n`` reports of ``word`` encoded and sealed to the analyzer's key (the device's own
    code), under a fresh batch id."""
    spec = metrics["word"].spec
    plain = ReportBatch("word", spec, TODAY, spec.encode(rng.integers(0, size, n), rng), rng.bytes(16))
    assert metrics.analyzer_key is not None
    return seal_batch(plain, metrics.analyzer_key)


def sealed_opener(folder: Path) -> BatchOpener:
    """The analyzer's opener over the keys in ``folder``, with its own replay guard."""
    return BatchOpener(KeyRing.load(folder), replays=ReplayGuard(max_day_age=40))


def wait_until(cond: Callable[[], bool], timeout: float = 60, settle: float = 0.3) -> None:
    """Poll ``cond`` until it holds (or ``timeout`` s), then wait ``settle`` s: anything beyond what was waited for
    would show by then."""
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(settle)


class SealedPair:
    """One sealed metric ``word`` (``size`` hashed values), ``uploads`` device uploads of ``per_upload`` reports,
    an embedded log with a ``partitions``-partition shuffled topic, and two streaming-estimator members ``a`` and
    ``b`` of one group, each with its own replay set, joined (the embedded log gives partition p to member
    p mod 2) and running in threads until :meth:`stop`; :meth:`close` closes what is still open."""

    def __init__(
        self, tmp_path: Path, rng: np.random.Generator, *, uploads: int, per_upload: int, size: int, partitions: int = 4
    ) -> None:
        from estimator.service import StreamingEstimator
        from pipeline.catalog import SpecCatalog
        from pipeline.topics import SHUFFLED_TOPIC
        from pipeline.transport import open_transport

        self.metrics, self.folder = sealed_word_metrics(tmp_path, size)
        self.cat = SpecCatalog([self.metrics])
        self.uploads = [sealed_upload(self.metrics, per_upload, size, rng) for _ in range(uploads)]
        self.total = uploads * per_upload
        self.transport = open_transport(f"sqlite:///{tmp_path}/log.sqlite3", synchronous="NORMAL")
        self.transport.create_topic(RAW_TOPIC, 4)
        self.transport.create_topic(SHUFFLED_TOPIC, partitions)
        self.members = {
            name: StreamingEstimator(
                self.transport,
                tmp_path / name,
                self.cat,
                group="g",
                member=name,
                checkpoint_seconds=0.05,
                opener=sealed_opener(self.folder),
            )  # fmt: skip
            for name in ("a", "b")
        }
        self.members["a"].poll_once(timeout=0.5)
        self.members["b"].poll_once(timeout=0.5)  # b joins: the group splits the partitions
        self._stops = {name: threading.Event() for name in self.members}
        self._threads = {
            name: threading.Thread(target=m.run, kwargs={"stop": self._stops[name]}) for name, m in self.members.items()
        }
        for t in self._threads.values():
            t.start()
        self._closed: set[str] = set()

    @property
    def a(self) -> Any:
        return self.members["a"]

    @property
    def b(self) -> Any:
        return self.members["b"]

    def stop(self, *names: str) -> None:
        """Stop the running loops of ``names`` (default both); their state stays readable until :meth:`close`."""
        for name in names or tuple(self.members):
            self._stops[name].set()
            self._threads[name].join(30)

    def close(self, *names: str, transport: bool = False) -> None:
        """Stop and close the members ``names`` (default both), then the log if ``transport``."""
        for name in names or tuple(self.members):
            self.stop(name)
            if name not in self._closed:
                self._closed.add(name)
                self.members[name].close()
        if transport:
            self.transport.close()
