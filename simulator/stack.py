"""The whole pipeline on one machine, and a fleet of simulated devices that feed it over HTTP.

:class:`LocalPipeline` runs the real components in one process, each on its
own thread and its own transport connection: the FastAPI collector under
uvicorn on 127.0.0.1, the shuffler, the streaming estimator (with its HTTP
API) and the Parquet sink. The transport is the embedded log by default or
Kafka. Topic and group names carry a run id, so runs on a shared broker do
not see each other's data.

:func:`fleet_batches` draws a seeded population and privatizes each
device's values with the SDK's encoders into wire-format batches;
:func:`upload` posts them to the collector as binary frames (several HTTP
clients, idempotency keys, retries honoring ``Retry-After``);
:func:`sdk_devices` drives a few real :class:`~client_sdk.client.TelemetryClient`
instances through record -> ledger -> outbox -> uploader.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ldp_core.domain import Dictionary, HashedDomain, NumberRange, StringDomain
from ldp_core.mechanisms import frequency_spec
from ldp_core.metrics import MetricSet, load_metrics
from ldp_core.wire.frames import ReportBatch, encode_frame
from simulator.numeric import NumericPopulation
from simulator.population import parse_distribution

#: how the demo's simulated devices hold a numeric metric's value: beta(2, 5) over its range (a right-skewed
#: quantity such as session minutes)
NUMERIC_POPULATION = "beta:2,5"


#: the search words of the demo's string metrics, most frequent first (then syllable words): ranks index this list
_SEARCH_WORDS = (
    "weather news maps recipes football music movies jobs hotels flights translate email games lyrics "
    "horoscope pizza bank shoes cinema trains tennis coffee dentist garden bitcoin cars laptop yoga"
).split()


def demo_words(length: int, vocabulary: int = 2000) -> list[str]:
    """``vocabulary`` distinct words of at most ``length`` bytes: real search words first, then syllables."""
    out = [w for w in _SEARCH_WORDS if len(w) <= length]
    seen = set(out)
    cons, vows = "bdfgklmnprstvz", "aeiou"
    i = 0
    while len(out) < vocabulary:
        w, k = "", i
        while len(w) + 2 <= length and (k or not w):
            w += cons[k % len(cons)] + vows[(k // len(cons)) % len(vows)]
            k //= len(cons) * len(vows)
        i += 1
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def empty_truth(metrics: MetricSet, name: str) -> np.ndarray:
    """The truth of no devices: zero counts per index for a frequency metric, no values for a numeric one."""
    m = metrics[name]
    if m.kind == "frequency":
        return np.zeros(frequency_spec(m.spec).domain_size, dtype=np.int64)
    return np.zeros(0, dtype=np.float64)


def add_truth(metrics: MetricSet, name: str, truth: np.ndarray, more: np.ndarray) -> np.ndarray:
    """``truth`` and ``more`` together: counts add, value lists concatenate."""
    return truth + more if metrics[name].kind == "frequency" else np.concatenate([truth, more])


def truth_reports(metrics: MetricSet, name: str, truth: np.ndarray) -> int:
    """How many reports ``truth`` stands for."""
    return int(truth.sum()) if metrics[name].kind == "frequency" else int(truth.size)


__all__ = [
    "Topics",
    "LocalPipeline",
    "FleetData",
    "fleet_batches",
    "demo_labels",
    "upload",
    "UploadStats",
    "sdk_devices",
    "serve_in_thread",
]

log = logging.getLogger("ldp.pipeline")


@dataclasses.dataclass(frozen=True)
class Topics:
    raw: str
    shuffled: str
    state: str

    @classmethod
    def for_run(cls, run_id: str | None) -> Topics:
        from pipeline.topics import RAW_TOPIC, SHUFFLED_TOPIC, SHUFFLER_STATE_TOPIC

        if not run_id:
            return cls(RAW_TOPIC, SHUFFLED_TOPIC, SHUFFLER_STATE_TOPIC)
        return cls(f"{RAW_TOPIC}.{run_id}", f"{SHUFFLED_TOPIC}.{run_id}", f"{SHUFFLER_STATE_TOPIC}.{run_id}")


def serve_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    lifespan: Literal["auto", "on", "off"] = "on",
    options: dict[str, Any] | None = None,
) -> tuple[Any, str, threading.Thread]:
    """Start ``app`` under uvicorn on a thread; returns (server, base URL, thread) once it accepts requests.
    ``options``: more ``uvicorn.Config`` keywords (the collector's protocol: :func:`collector.http.protocol.server_options`)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    url = f"http://{host}:{sock.getsockname()[1]}"
    # log_config=None: uvicorn's default dictConfig would rebind (and close) the process's logging handlers,
    # which breaks whoever runs the pipeline in-process (the demo inside a test run, a notebook)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            access_log=False,
            server_header=False,
            log_level="warning",
            lifespan=lifespan,
            log_config=None,
            **(options or {}),
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"uvicorn{url}")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the HTTP server for {url} did not start")
        time.sleep(0.01)
    return server, url, thread


class LocalPipeline:
    """Collector, shuffler, streaming estimator and Parquet sink on threads of this process.

    ``transport_url`` is ``sqlite:///...`` (default: a log in ``workdir``) or
    ``kafka://host:port``. ``min_batch`` is the shuffler's crowd threshold.
    Use as a context manager; :meth:`stop` shuts everything down in order.
    """

    def __init__(
        self,
        workdir: str | Path,
        metrics_path: str | Path,
        *,
        transport_url: str | None = None,
        run_id: str | None = None,
        min_batch: int = 1000,
        partitions: int = 4,
        checkpoint_interval: float = 0.25,
        guarantee_delta: float | None = 1e-6,
        sink: bool = True,
        analyzer_keys: str | Path | None = None,
        collector_options: Mapping[str, Any] | None = None,
        estimator_port: int = 0,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = Path(metrics_path).resolve()
        self.transport_url = transport_url or f"sqlite:///{self.workdir / 'transport.sqlite3'}"
        self.run_id = run_id if run_id is not None else uuid.uuid4().hex[:8]
        self.topics = Topics.for_run(self.run_id)
        self.min_batch = int(min_batch)
        self.partitions = int(partitions)
        self.checkpoint_interval = float(checkpoint_interval)
        self.guarantee_delta = guarantee_delta
        self.with_sink = sink
        #: the analyzer's key folder: the estimator and the sink open sealed metrics' records with it
        self.analyzer_keys = analyzer_keys
        #: more :class:`~collector.settings.CollectorSettings` fields (``require_tokens``, ``token_keys``, ...)
        self.collector_options = dict(collector_options or {})
        #: the estimator API's (and dashboard's) port; 0: a free one
        self.estimator_port = int(estimator_port)
        self.metrics: MetricSet = load_metrics(self.metrics_path, reject_expired=False)
        self.dataset = self.workdir / "dataset"
        self.collector_url = ""
        self.estimator_url = ""
        self.stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._servers: list[Any] = []
        self._transports: list[Any] = []
        self.errors: list[BaseException] = []
        self.shuffler: Any = None
        self.estimator: Any = None
        self.sink: Any = None

    def _transport(self) -> Any:
        from pipeline.transport import open_transport

        t = open_transport(self.transport_url)
        self._transports.append(t)
        return t

    def _worker(self, name: str, fn: Callable[[], Any]) -> None:
        def body() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - surfaced by check()
                log.exception("%s failed", name)
                self.errors.append(exc)

        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def start(self) -> LocalPipeline:
        from collector.http.app import create_app
        from collector.http.protocol import server_options
        from collector.settings import CollectorSettings
        from collector.shuffler import DeviceCaps, Shuffler, ShufflerSettings
        from collector.sinks.parquet import ParquetSink
        from estimator.service import StreamingEstimator
        from estimator.service import create_app as estimator_app
        from pipeline.catalog import SpecCatalog

        setup = self._transport()
        for topic in (self.topics.raw, self.topics.shuffled, self.topics.state):
            setup.create_topic(topic, self.partitions)
        settings = CollectorSettings(
            metrics_path=str(self.metrics_path),
            transport_url=self.transport_url,
            raw_topic=self.topics.raw,
            raw_partitions=self.partitions,
            dedup_path=str(self.workdir / f"collector-ids-{self.run_id}.sqlite3"),
            **self.collector_options,
        )
        server, self.collector_url, _ = serve_in_thread(
            create_app(settings, metrics=self.metrics), options=server_options(settings)
        )
        self._servers.append(server)

        guarantee = None
        if self.guarantee_delta is not None:
            from estimator.accounting.shuffle import shuffler_guarantee

            guarantee = shuffler_guarantee(self.guarantee_delta)
        self.shuffler = Shuffler(
            self._transport(),
            self.metrics,
            ShufflerSettings(
                min_batch=self.min_batch,
                raw_topic=self.topics.raw,
                shuffled_topic=self.topics.shuffled,
                state_topic=self.topics.state,
                partitions=self.partitions,
                group=f"ldp-shuffler-{self.run_id}",
                member="shuffler-0",
                checkpoint_interval=self.checkpoint_interval,
                session_timeout=10.0,
                key_file=str(self.workdir / f"shuffler-{self.run_id}.key"),
            ),
            guarantee=guarantee,
            # the simulated devices' local policy caps each metric at its r·ε (run_sdk_devices)
            device_caps=DeviceCaps(per_metric={n: m.daily_epsilon for n, m in self.metrics.items()}),
        )
        self._worker("shuffler", lambda: self.shuffler.run(self.stop_event))

        catalog = SpecCatalog([self.metrics])
        opener: Callable[[], Any] = lambda: None  # noqa: E731
        if self.analyzer_keys is not None:
            from ldp_core.wire.sealing import BatchOpener, KeyRing

            ring = KeyRing.load(self.analyzer_keys)
            opener = lambda: BatchOpener(ring)  # noqa: E731
        self.estimator = StreamingEstimator(
            self._transport(),
            self.workdir / f"estimator-{self.run_id}",
            catalog,
            topic=self.topics.shuffled,
            group=f"ldp-estimator-{self.run_id}",
            checkpoint_seconds=self.checkpoint_interval,
            partitions=self.partitions,
            opener=opener(),
        )
        self._worker("estimator", lambda: self.estimator.run(stop=self.stop_event, max_records=100))
        server, self.estimator_url, _ = serve_in_thread(
            estimator_app(self.estimator, dataset=self.dataset if self.with_sink else None),
            port=self.estimator_port,
            lifespan="off",
        )
        self._servers.append(server)

        if self.with_sink:
            self.sink = ParquetSink(
                self._transport(),
                self.dataset,
                catalog,
                topic=self.topics.shuffled,
                group=f"ldp-parquet-sink-{self.run_id}",
                flush_seconds=self.checkpoint_interval,
                partitions=self.partitions,
                opener=opener(),
            )
            self._worker("sink", lambda: self.sink.run(stop=self.stop_event))
        return self

    def check(self) -> None:
        """Raise the first failure of a component thread, if any."""
        if self.errors:
            raise RuntimeError(f"a pipeline component failed: {self.errors[0]!r}") from self.errors[0]

    def counted(self) -> dict[str, int]:
        """Reports the streaming estimator has counted, by metric."""
        out: dict[str, int] = {}
        for (metric, _, _), ks in self.estimator.counted().keys.items():
            out[metric] = out.get(metric, 0) + ks.acc.n
        return out

    def wait_counted(self, expected: Mapping[str, int], timeout: float = 60.0) -> float:
        """Wait until the estimator counted ``expected`` reports per metric; return the seconds waited."""
        t0 = time.monotonic()
        while True:
            self.check()
            got = self.counted()
            if all(got.get(m, 0) >= n for m, n in expected.items()):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"after {timeout:g} s the estimator counted {got}, expected {dict(expected)}")
            time.sleep(0.05)

    def wait_settled(self, uploaded: int, timeout: float = 60.0) -> tuple[float, int]:
        """Wait until the shuffler committed all ``uploaded`` reports and the estimator counted every
        released one; return (seconds waited, reports the shuffler holds below its crowd threshold)."""
        t0 = time.monotonic()
        while True:
            self.check()
            st = self.shuffler.stats
            if (
                st.input_reports + st.duplicate_reports >= uploaded
                and sum(self.counted().values()) >= st.released_reports
            ):
                return time.monotonic() - t0, st.buffered_reports
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(
                    f"after {timeout:g} s the shuffler took {st.input_reports} of {uploaded} reports "
                    f"and released {st.released_reports}; the estimator counted {self.counted()}"
                )
            time.sleep(0.05)

    def wait_sink(self, total: int, timeout: float = 60.0) -> None:
        """Wait until the sink committed ``total`` reports to the dataset."""
        t0 = time.monotonic()
        while self.sink is not None:
            self.check()
            if self.sink.stats.commits and self._dataset_reports() >= total:
                return
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(
                    f"after {timeout:g} s the dataset holds {self._dataset_reports()} of {total} reports"
                )
            time.sleep(0.1)

    def _dataset_reports(self) -> int:
        import pyarrow.parquet as pq

        n = 0
        for f in self.dataset.rglob("part-*.parquet"):
            try:
                n += pq.read_metadata(f).num_rows
            except OSError:
                pass
        return n

    def stop(self) -> None:
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout=60)
        for s in self._servers:
            s.should_exit = True
        time.sleep(0.1)
        for comp in (self.estimator, self.sink, self.shuffler):
            if comp is not None:
                try:
                    comp.close()
                except Exception as exc:  # noqa: BLE001 - best effort at shutdown
                    log.warning("closing %s: %r", type(comp).__name__, exc)
        for t in self._transports:
            try:
                t.close()
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> LocalPipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- devices ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class FleetData:
    """What a simulated fleet sent: batches, and the true count of each domain index per metric."""

    batches: list[ReportBatch]
    truth: dict[str, np.ndarray]
    devices: int

    def reports(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.batches:
            out[b.metric] = out.get(b.metric, 0) + len(b)
        return out


def true_indices(
    metrics: MetricSet,
    name: str,
    devices: int,
    rng: np.random.Generator,
    distribution: str = "zipf:1.1",
    vocabulary: int = 2000,
) -> np.ndarray:
    """Each device's true value of ``name`` as a domain index, through the metric's own domain mapping.

    Dictionary domains draw their entries from ``distribution``; hashed
    domains draw words ``"w<rank>"`` from a vocabulary of ``vocabulary`` words
    and hash them with the SDK's :class:`HashedDomain`.
    """
    m = metrics[name]
    dom = m.domain
    if isinstance(dom, NumberRange):  # a numeric metric: the values themselves (devices x dims with several)
        values = NumericPopulation(NUMERIC_POPULATION, dom.low, dom.high).sample(devices * dom.dims, rng)
        return values if dom.dims == 1 else values.reshape(devices, dom.dims)
    if isinstance(dom, Dictionary):
        return parse_distribution(distribution, dom.size).sample(devices, rng)
    if isinstance(dom, HashedDomain):
        ranks = parse_distribution(distribution, vocabulary).sample(devices, rng)
        bucket = np.array([dom.index_of(f"w{r}") for r in range(vocabulary)], dtype=np.int64)
        return bucket[ranks]
    if isinstance(dom, StringDomain):  # a heavy-hitter metric: ranks into demo_words (the truth is the ranks)
        return parse_distribution(distribution, vocabulary).sample(devices, rng)
    raise TypeError(f"unknown domain {dom!r}")


def string_values(dom: StringDomain, ranks: np.ndarray, vocabulary: int = 2000) -> np.ndarray:
    """The padded bytes of the words at ``ranks`` of :func:`demo_words` (what devices privatize)."""
    words = demo_words(dom.length, vocabulary)
    table = np.frombuffer(b"".join(dom.index_of(w) for w in words), dtype=np.uint8).reshape(len(words), dom.length)
    return table[np.asarray(ranks, dtype=np.int64)]


def demo_labels(metrics: MetricSet, name: str, vocabulary: int = 2000) -> dict[int, str]:
    """Readable labels of a hashed metric's buckets: the most frequent simulated word in each (``#b (wR)``)."""
    dom = metrics[name].domain
    if not isinstance(dom, HashedDomain):
        return {}
    out: dict[int, str] = {}
    for r in range(vocabulary):
        out.setdefault(dom.index_of(f"w{r}"), f"#{dom.index_of(f'w{r}')} (w{r})")
    return out


def _draw_value(
    metrics: MetricSet, name: str, rng: np.random.Generator, distribution: str, vocabulary: int = 2000
) -> tuple[Any, Any]:
    """One device's true value of ``name``, as the app would record it, and its domain index (a numeric
    metric's: the number itself, or a tuple of numbers with several attributes)."""
    dom = metrics[name].domain
    if isinstance(dom, NumberRange):
        xs = NumericPopulation(NUMERIC_POPULATION, dom.low, dom.high).sample(dom.dims, rng)
        x: Any = float(xs[0]) if dom.dims == 1 else tuple(float(v) for v in xs)
        return x, x
    if isinstance(dom, StringDomain):
        rank = int(parse_distribution(distribution, vocabulary).sample(1, rng)[0])
        return rank, demo_words(dom.length, vocabulary)[rank]
    if isinstance(dom, Dictionary):
        idx = int(parse_distribution(distribution, dom.size).sample(1, rng)[0])
        value: Any = dom.values[idx] if idx < len(dom.values) else f"undeclared-{idx}"
        return dom.index_of(value), value
    rank = int(parse_distribution(distribution, vocabulary).sample(1, rng)[0])
    return dom.index_of(f"w{rank}"), f"w{rank}"


def fleet_batches(
    metrics: MetricSet,
    names: Sequence[str],
    devices: int,
    day: int,
    rng: np.random.Generator,
    *,
    frame_reports: int = 250,
    distribution: str = "zipf:1.1",
) -> FleetData:
    """``devices`` devices each report one value of every metric in ``names`` on ``day``.

    Values are privatized with each metric's spec (the SDK's batch encoder:
    the same randomizer a device applies to its one value) and cut into
    wire-format batches of ``frame_reports`` to ``2 * frame_reports - 1``
    reports, as a batching gateway would upload them. With ``frame_reports``
    at least the shuffler's crowd threshold every frame releases its group,
    so nothing stays buffered at the end of a run.
    """
    batches: list[ReportBatch] = []
    truth: dict[str, np.ndarray] = {}
    for name in names:
        spec = metrics[name].spec
        idx = true_indices(metrics, name, devices, rng, distribution)
        truth[name] = (
            np.bincount(idx, minlength=frequency_spec(spec).domain_size) if metrics[name].kind == "frequency" else idx
        )
        dom = metrics[name].domain
        recs = spec.encode(string_values(dom, idx) if isinstance(dom, StringDomain) else idx, rng)
        cuts = list(range(0, devices, frame_reports))[1:]
        if cuts and devices - cuts[-1] < frame_reports:
            cuts.pop()  # the remainder joins the last frame: every frame holds at least frame_reports
        for part in np.split(recs, cuts):
            batches.append(ReportBatch(name, spec, day, part.copy(), rng.bytes(16)))
    return FleetData(batches, truth, devices)


@dataclasses.dataclass
class UploadStats:
    batches: int = 0
    reports: int = 0
    retries: int = 0
    rejected: int = 0
    seconds: float = 0.0
    accepted_at: list[float] = dataclasses.field(default_factory=list)  # monotonic time each batch was accepted

    @property
    def rate(self) -> float:
        return self.reports / self.seconds if self.seconds else 0.0


def upload(
    collector_url: str,
    batches: Sequence[ReportBatch],
    *,
    clients: int = 4,
    timeout: float = 60.0,
    max_attempts: int = 50,
    on_accepted: Callable[[ReportBatch, float], None] | None = None,
    headers: Callable[[ReportBatch], Mapping[str, str]] | None = None,
) -> UploadStats:
    """POST every batch as a binary frame from ``clients`` threads; retry 408/429/5xx and network errors.

    The ``Idempotency-Key`` is the batch id, so a retry after a lost answer is
    not counted twice. A permanent rejection (other 4xx) raises. ``headers`` adds a batch's own headers (the
    ``Authorization`` token that pays for it, sent again on each retry).
    """
    import httpx

    from client_sdk.upload.uploader import FRAME_CONTENT_TYPE, USER_AGENT, parse_retry_after

    stats = UploadStats()
    lock = threading.Lock()
    queue = list(batches)
    errors: list[BaseException] = []
    t0 = time.monotonic()

    def work() -> None:
        with httpx.Client(base_url=collector_url, timeout=timeout, headers={"User-Agent": USER_AGENT}) as http:
            while True:
                with lock:
                    if not queue or errors:
                        return
                    b = queue.pop()
                body = encode_frame(b)
                own = {"Content-Type": FRAME_CONTENT_TYPE, "Idempotency-Key": b.batch_id.hex()}
                if headers is not None:
                    own.update(headers(b))
                for attempt in range(max_attempts):
                    try:
                        r = http.post("/v1/reports", content=body, headers=own)
                    except httpx.TransportError:
                        wait = min(2.0, 0.05 * 2**attempt)
                    else:
                        if r.status_code in (202, 409) or 200 <= r.status_code < 300:
                            now = time.monotonic()
                            with lock:
                                stats.batches += 1
                                stats.reports += len(b)
                                stats.accepted_at.append(now)
                            if on_accepted is not None:
                                on_accepted(b, now)
                            break
                        if r.status_code in (408, 429) or r.status_code >= 500:
                            wait = parse_retry_after(r.headers.get("retry-after"), time.time()) or min(
                                2.0, 0.05 * 2**attempt
                            )
                        else:
                            with lock:
                                stats.rejected += 1
                                errors.append(RuntimeError(f"the collector rejected a batch: {r.status_code} {r.text}"))
                            return
                    with lock:
                        stats.retries += 1
                    time.sleep(min(wait, 5.0))
                else:
                    with lock:
                        errors.append(RuntimeError(f"a batch was not accepted after {max_attempts} attempts"))
                    return

    threads = [threading.Thread(target=work, daemon=True) for _ in range(max(1, clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats.seconds = time.monotonic() - t0
    if errors:
        raise errors[0]
    return stats


def sdk_devices(
    collector_url: str,
    metrics_path: str | Path,
    names: Sequence[str],
    count: int,
    rng: np.random.Generator,
    *,
    workdir: str | Path | None = None,
    distribution: str = "zipf:1.1",
    timeout: float = 60.0,
    client_options: Callable[[int, Path], Mapping[str, Any]] | None = None,
) -> dict[str, np.ndarray]:
    """``count`` real SDK clients record one value of each metric and upload it; returns the truth per metric.

    Each is a :class:`~client_sdk.client.TelemetryClient` in simulation mode
    (seeded) with its own storage folder: the value goes through the ledger,
    the encoder, the outbox and the uploader like on a device. ``client_options(i, folder)`` gives device
    ``i`` more :class:`~client_sdk.config.ClientConfig` fields (its token issuer and enrollment bundle).
    """
    from client_sdk.client import TelemetryClient
    from client_sdk.config import ClientConfig
    from client_sdk.policy import LocalPolicy

    metrics = load_metrics(metrics_path, reject_expired=False)
    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ldp-sdk-"))
    truth = {n: empty_truth(metrics, n) for n in names}
    values: dict[str, list[Any]] = {n: [] for n in names if metrics[n].kind != "frequency"}
    # each metric capped at exactly its own r·ε: what the shuffler's per-person figure assumes (device_caps)
    policy = LocalPolicy(
        per_metric_daily=max(m.daily_epsilon for m in metrics.values()),
        total_daily=sum(m.daily_epsilon for m in metrics.values()),
        per_metric_overrides={n: m.daily_epsilon for n, m in metrics.items()},
    )
    seeds = rng.integers(0, 2**31, count)
    for i in range(count):
        with TelemetryClient(
            base / f"device-{i}",
            collector_url,
            policy,
            metrics,
            config=ClientConfig(
                mode="simulation",
                simulation_seed=int(seeds[i]),
                batch_max_age=0.0,
                **(client_options(i, base / f"device-{i}") if client_options is not None else {}),
            ),
        ) as client:
            for name in names:
                idx, value = _draw_value(metrics, name, rng, distribution)
                client.record(name, value)
                if name in values:
                    values[name].append(idx)  # a number, or a tuple of them with several attributes
                else:
                    truth[name][int(idx)] += 1
            if not client.flush(timeout=timeout):
                raise RuntimeError(f"SDK device {i} did not upload within {timeout:g} s: {client.errors()}")
            if client.pending_reports():
                raise RuntimeError(f"SDK device {i} still holds {client.pending_reports()} reports: {client.errors()}")
    for name, vals in values.items():
        truth[name] = np.asarray(vals, dtype=np.float64)
    return truth
