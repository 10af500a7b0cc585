"""The client apps embed: ``record(metric, value)`` and nothing else to think about.

::

    client = TelemetryClient(storage_dir, "https://collector.example.org",
                             LocalPolicy(per_metric_daily=2.0, total_daily=8.0),
                             metrics="metrics.json",
                             config=ClientConfig(fetch_metrics=True))  # optional
    client.record("emoji_used", "😂")     # never raises, returns in microseconds
    client.close()                        # or use it as a context manager

**What record() does on the app's thread:** look the metric up, map the
value to a domain index, drop it at once if the metric already reached its
report limit or cap today, else append ``(metric, index)`` to a bounded
in-memory queue. Nothing can raise into the app: unknown metrics, bad
values, a full queue and internal errors are counted (:meth:`errors`).

**On the recorder thread**, queued items are persisted in batches, each
batch in one fsynced SQLite transaction: advance the clock's high-water
mark, charge each report's ε to the :class:`~client_sdk.ledger.BudgetLedger`
(refused reports stop here and are counted), privatize the accepted values
(vectorized per metric; RAPPOR metrics through the memoized permanent
randomized response), and append the records to the
:class:`~client_sdk.outbox.Outbox`. A spend and its report commit together
or not at all; no report reaches the uploader before its spend is durable.
True values exist only in memory, only until their batch is processed
(milliseconds), and are lost -- never leaked -- if the app dies first.

**On the uploader thread**, the :class:`~client_sdk.upload.uploader.Uploader` sends
batches by size and age, retries transient failures with backoff and
optionally refreshes metric definitions from ``GET /v1/metrics``; a server
definition that would exceed the local policy is refused and counted.

**Pinned definitions.** A memoized (RAPPOR) metric's first report pins its
definition (mechanism spec and domain; :func:`~client_sdk.memo.definition_pin`)
in the store. A later definition of it that differs -- from the server or a
new bundled file -- is refused (``metric_refused``, logged once), and the
metric stops being reported until a definition equal to the pin is served
again: it never gets a second permanent response (docs/SDK.md, "Pinned
definitions"). Sealing is pinned too (:mod:`client_sdk.seal_pin`): records
are sealed only to keys the bundled file names, and a served definition
cannot unseal a metric the bundle declares sealed.

**Configuration.** Four arguments say where the client keeps its state,
which collector it talks to, what it may spend and what it records; everything
else -- upload, batching, timing, modes, test hooks -- is one frozen
:class:`ClientConfig` (like Glean's ``Configuration``), checked when it is
made.

Construction fails loudly (:class:`ClientConfigError`, :class:`BudgetError`,
:class:`~ldp_core.metrics.MetricsFileError`) on configuration errors.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from client_sdk.ledger import BudgetLedger, DayBudget, SpendOutcome, boot_id, epsilon_of
from client_sdk.memo import (
    MemoStore,
    definition_pin,
    insert_pin_in,
    load_or_create_secret,
    load_pins,
    read_pins_in,
)
from client_sdk.outbox import Outbox
from client_sdk.policy import LocalPolicy, to_units
from client_sdk.seal_pin import SealPin
from client_sdk.store import Store
from client_sdk.upload.backoff import BackoffPolicy
from client_sdk.upload.uploader import Uploader, urllib_transport
from ldp_core.canonical import canonical_json
from ldp_core.days import utc_day
from ldp_core.domain import NumberRange
from ldp_core.errors import BudgetError, LDPError
from ldp_core.files import write_atomic
from ldp_core.metrics import MetricDefinition, MetricSet, MetricsFileError, load_metrics, parse_metrics
from ldp_core.privacy_events import local_event
from ldp_core.randomness import secure_generator, simulation_generator
from ldp_core.wire.sealing import AnalyzerPublicKey, seal_batch

if TYPE_CHECKING:  # tokens need `cryptography`, loaded only when a client is given an issuer
    from client_sdk.upload.token_wallet import TokenWallet
from client_sdk.config import ClientConfig
from client_sdk.urls import ClientConfigError
from client_sdk.urls import check_url as _check_url
from ldp_core.wire.frames import ReportBatch

__all__ = ["TelemetryClient", "ERROR_TALLIES", "STAT_TALLIES"]

#: Names that :meth:`TelemetryClient.errors` always reports.
ERROR_TALLIES = (
    "unknown_metric",  # record() of a metric not defined (or refused)
    "bad_value",  # value not in the metric's domain, or of a wrong type
    "expired_metric",  # record() after the metric's expiry date
    "queue_full",  # the in-memory queue was full: the recorder is behind
    "closed",  # record() after close() (or in a child process forked from the app)
    "internal_error",  # a bug caught on the hot path or the recorder thread
    "storage_error",  # the database refused a write (disk full, locked too long)
    "metric_refused",  # a definition above the local policy, unlike its memoized metric's pin, or unsealing
    "unsealing_refused",  # a served definition that would report a metric the app declared sealed in plain
    "analyzer_key_refused",  # a served analyzer key the app's bundled metrics file does not name
    "pin_conflict",  # reports dropped: their definition differs from the pin another process (or queue) set
    "metrics_fetch_failed",  # GET /v1/metrics failed or returned an invalid document
    "upload_failures",  # transient upload failures (each retried)
    "outbox_dropped",  # reports dropped, oldest first, because the outbox was full
    "outbox_unsendable",  # reports whose spec this SDK cannot rebuild
    "upload_rejected_batches",  # batches refused for good (4xx) and dropped
    "upload_rejected_reports",
    "tokens_exhausted",  # an upload held back: no token of its day (the batch waits; never sent without one)
    "token_fetch_failed",  # a request to the issuer failed (down, refused, or the device's K is used up)
    "tokens_refused",  # tokens the collector refused (401 token_*, 409 token_spent); the batch takes another
    "token_key_inconsistent",  # an issuer key unlike the collector's/mirrors' list or this device's pin: refused
)
#: Names that :meth:`TelemetryClient.stats` always reports.
STAT_TALLIES = (
    "recorded",  # reports privatized and queued in the outbox
    "clamped",  # numbers outside a numeric metric's range, clamped to it (out_of_range: clamp) and recorded
    "sampled_out",  # not reported: the metric already sent r reports today
    "over_budget",  # not reported: a daily ε cap would be exceeded
    "uploaded_batches",
    "uploaded_reports",
    "tokens_fetched",  # anonymous upload tokens obtained from the issuer
    "tokens_expired",  # tokens older than yesterday (UTC) dropped unused
)
_PERSISTED = {
    "outbox_dropped",
    "outbox_unsendable",
    "upload_rejected_batches",
    "upload_rejected_reports",
    "uploaded_batches",
    "uploaded_reports",
}

_SERVER_METRICS_FILE = "server_metrics.json"
_log = logging.getLogger("client_sdk")


def _differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted names of the fields in which two pinned definitions differ."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differences(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(f"{prefix}{key} ({x!r} -> {y!r})")
    return out


class _Marker:
    """A flush marker in the recorder queue."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


def _load_metric_set(metrics: Any) -> MetricSet:
    if isinstance(metrics, MetricSet):
        return metrics
    if isinstance(metrics, (str, os.PathLike)):
        text = os.fspath(metrics)
        if text.lstrip().startswith("{"):
            return parse_metrics(text, reject_expired=False)
        return load_metrics(text, reject_expired=False)
    if isinstance(metrics, (bytes, bytearray)):
        return parse_metrics(bytes(metrics), reject_expired=False)
    if isinstance(metrics, Mapping):
        return parse_metrics(metrics, reject_expired=False)
    raise ClientConfigError(
        "metrics must be a MetricSet, a path to a metrics file, or a metrics document (JSON text or dict)"
    )


class TelemetryClient:
    """The SDK's public entry point (see the module docstring).

    Parameters
    ----------
    storage_dir:
        A private directory for the database and the device secret. Several
        processes of one app may share it; caps then hold for them jointly.
    collector_url:
        Base URL of the collector (``/v1/reports`` and ``/v1/metrics`` are
        appended). May be ``None`` only with ``upload=False``.
    policy:
        The device's :class:`~client_sdk.policy.LocalPolicy`.
    metrics:
        Bundled metric definitions: a :class:`~ldp_core.metrics.MetricSet`,
        a path to a metrics file, or the document itself.
    config:
        Everything else (:class:`ClientConfig`; default ``ClientConfig()``).
    """

    def __init__(
        self,
        storage_dir: str | os.PathLike[str],
        collector_url: str | None,
        policy: LocalPolicy,
        metrics: MetricSet | str | os.PathLike[str] | Mapping[str, Any] | bytes,
        config: ClientConfig | None = None,
    ) -> None:
        if config is None:
            config = ClientConfig()
        elif not isinstance(config, ClientConfig):
            raise ClientConfigError(f"config must be a ClientConfig, got {type(config).__name__}")
        if not isinstance(policy, LocalPolicy):
            raise ClientConfigError(f"policy must be a LocalPolicy, got {type(policy).__name__}")
        if config.upload or config.fetch_metrics or collector_url is not None:
            collector_url = _check_url(collector_url)
        bundled = _load_metric_set(metrics)
        for m in bundled.values():
            policy.check_metric(m)  # BudgetError: the app's own files disagree

        self.config = config
        self.policy = policy
        self.mode = config.mode
        self.collector_url = collector_url
        self._clock = config.clock if config.clock is not None else time.time
        seed = config.simulation_seed
        self._rng = simulation_generator(seed) if seed is not None else secure_generator()
        try:
            self._store = Store(storage_dir)
            self._secret = load_or_create_secret(self._store.directory)
            self._pins: dict[str, str] = load_pins(self._store.connection())
        except (OSError, sqlite3.Error, ValueError, TypeError) as exc:
            raise ClientConfigError(f"cannot use storage_dir {storage_dir!r}: {exc}") from exc
        self.storage_dir = self._store.directory
        self._ledger = BudgetLedger(
            self._store,
            policy,
            clock=self._clock,
            monotonic=config.monotonic,
            boot=config.boot_id or boot_id,
        )
        self._outbox = Outbox(
            self._store, max_reports=config.max_outbox_reports, lease_seconds=2 * config.upload_timeout + 10
        )
        self._memo = MemoStore(self._secret)
        self._bundled = bundled
        self._tally: collections.Counter[str] = collections.Counter()
        self._tally_lock = threading.Lock()
        self._exhausted: dict[str, tuple[int, str]] = {}
        self._metrics: dict[str, MetricDefinition] = {}
        self._server: MetricSet | None = None
        self._defs_lock = threading.RLock()
        self._units: dict[str, int] = {}
        #: sealed metrics in effect -> the analyzer key their records are sealed to at upload (ldp_core.wire.sealing)
        self._sealing: dict[str, AnalyzerPublicKey] = {}
        self._outbox.sealer = self._seal
        self._refused: set[tuple[str, str]] = set()
        self._seal_pin = SealPin(bundled, self._count)
        self._fetch = bool(config.fetch_metrics)
        self._refresh_interval = float(config.metrics_refresh_interval)
        self._next_refresh = 0.0
        if self._fetch:
            self._load_cached_server_metrics()
        try:
            self._pin_reported_metrics()
        except sqlite3.Error as exc:
            raise ClientConfigError(f"cannot use storage_dir {storage_dir!r}: {exc}") from exc
        self._rebuild()

        self._queue: collections.deque[Any] = collections.deque()
        self._max_queue = config.max_queue
        self._floor_day = utc_day(self._ledger.high_water() or 0.0)
        self._closed = False
        self._stopping = False
        self._wake = threading.Event()
        self._upload_wake = threading.Event()
        self._flush_requests: list[threading.Event] = []
        self._flush_lock = threading.Lock()

        self._wallet: TokenWallet | None = None
        if config.issuer_url is not None and config.upload:
            from client_sdk.upload.token_wallet import TokenWallet
            from ldp_core.tokens.enrollment import DeviceIdentity
            from ldp_core.tokens.privacy_pass import IssuerClient

            try:
                identity = DeviceIdentity.load(config.enrollment_path)  # type: ignore[arg-type]
            except (OSError, ValueError, LDPError) as exc:
                raise ClientConfigError(f"cannot read the enrollment bundle {config.enrollment_path!r}: {exc}") from exc
            self._wallet = TokenWallet(
                self._store,
                IssuerClient(
                    config.issuer_url,
                    identity,
                    origin=str(config.token_origin),
                    timeout=config.upload_timeout,
                    clock=self._clock,
                    # the issuer's key of a day must be the one the collector (and each mirror) lists for it
                    key_sources=(
                        str(collector_url).rstrip("/") + "/v1/token-keys",
                        *config.token_key_mirrors,
                    ),
                ),
                stock=config.token_stock,
                clock=self._clock,
                backoff=config.backoff if config.backoff is not None else BackoffPolicy(),
            )
        self._uploader: Uploader | None = None
        if config.upload or config.fetch_metrics:
            self._uploader = Uploader(
                self._outbox,
                collector_url,  # type: ignore[arg-type]
                transport=config.transport if config.transport is not None else urllib_transport,
                batch_size=config.batch_size,
                max_age=config.batch_max_age,
                timeout=config.upload_timeout,
                backoff=config.backoff if config.backoff is not None else BackoffPolicy(),
                clock=self._clock,
                wallet=self._wallet,
            )
        self._upload_enabled = bool(config.upload)
        self._recorder = threading.Thread(target=self._recorder_loop, name="ldp-recorder", daemon=True)
        self._recorder.start()
        self._upload_thread: threading.Thread | None = None
        if self._uploader is not None:
            self._upload_thread = threading.Thread(target=self._uploader_loop, name="ldp-uploader", daemon=True)
            self._upload_thread.start()
        ref = weakref.ref(self)

        def at_exit() -> None:
            c = ref()
            if c is not None:
                c._persist_at_exit()

        self._atexit = at_exit
        atexit.register(self._atexit)
        if hasattr(os, "register_at_fork"):  # a forked child has no SDK threads: it must not queue

            def in_child() -> None:
                c = ref()
                if c is not None:
                    c._forked()

            os.register_at_fork(after_in_child=in_child)

    # ------------------------------------------------------------------ hot path
    def _count(self, name: str, n: int = 1) -> None:
        with self._tally_lock:
            self._tally[name] += n

    def record(self, metric: str, value: Any) -> None:
        """Privately report that ``metric`` took ``value``. Never raises; never blocks on I/O."""
        try:
            if self._closed:
                self._count("closed")
                return
            try:
                m = self._metrics.get(metric)
            except TypeError:  # an unhashable "name"
                m = None
            if m is None:
                self._count("unknown_metric")
                return
            index: Any
            try:
                if isinstance(m.domain, NumberRange):
                    index, clamped = m.domain.prepare(value)
                    if clamped:  # a numeric metric's value clamped into its range (out_of_range: clamp)
                        self._count("clamped")
                else:
                    index = m.domain.index_of(value)
            except Exception:  # noqa: BLE001 -- DomainError, or a value whose __hash__/__eq__ raises
                self._count("bad_value")
                return
            now = self._clock()
            day = utc_day(now)
            if day < self._floor_day:
                day = self._floor_day
            if day > m.expires_day:
                self._count("expired_metric")
                return
            ex = self._exhausted.get(metric)
            if ex is not None and ex[0] == day:
                self._count(ex[1])
                return
            if len(self._queue) >= self._max_queue:
                self._count("queue_full")
                return
            self._queue.append((m, index, now))
            if not self._wake.is_set():
                self._wake.set()
        except Exception:  # noqa: BLE001 -- the host app must never see our bugs
            try:
                self._count("internal_error")
            except Exception:  # noqa: BLE001
                pass

    # ------------------------------------------------------------------ recorder
    def _units_of(self, m: MetricDefinition) -> int:
        u = self._units.get(m.spec.spec_id)
        if u is None:
            u = self._units[m.spec.spec_id] = to_units(epsilon_of(local_event(m.spec)), round_up=True)
        return u

    def _encode(self, m: MetricDefinition, indices: list[Any]) -> np.ndarray:
        """Privatize ``indices``: domain indices of a frequency metric, numbers of a numeric one,
        padded bytes of a heavy-hitter one (a PEM device reports at its level for good)."""
        if m.kind == "heavy_hitters":
            padded = np.frombuffer(b"".join(indices), dtype=np.uint8).reshape(len(indices), -1)
            level_for = getattr(m.spec, "level_for_device", None)
            if level_for is not None:
                levels = np.full(len(indices), level_for(self._secret))
                return m.spec.encode(padded, self._rng, levels=levels)  # type: ignore[call-arg]
            return m.spec.encode(padded, self._rng)
        values = np.asarray(indices, dtype=np.int64 if m.kind == "frequency" else np.float64)
        if self._memo.supports(m.spec):
            return self._memo.encode(m.name, m.spec, values, self._rng)
        return m.spec.encode(values, self._rng)

    def _pin_in(
        self, conn: sqlite3.Connection, items: list[tuple[MetricDefinition, int, float]], now: float
    ) -> tuple[list[tuple[MetricDefinition, int, float]], dict[str, str], int]:
        """Inside the recorder's transaction, before any spend: pin each memoized metric
        reported for the first time to its definition, and keep only the items whose
        definition equals their metric's pin. Returns (kept items, pins learned, conflicts)."""
        distinct = {id(m): m for m, _, _ in items}
        memo_defs = {k: m for k, m in distinct.items() if MemoStore.supports(m.spec)}
        if not memo_defs:
            return items, {}, 0
        with self._defs_lock:
            pins = dict(self._pins)
        unknown = {m.name for m in memo_defs.values()} - pins.keys()
        if unknown:  # pins are never changed, so only those this process has not seen need reading
            pins.update(read_pins_in(conn, unknown))
        wanted = {k: definition_pin(m) for k, m in memo_defs.items()}
        kept: list[tuple[MetricDefinition, int, float]] = []
        conflicts = 0
        for item in items:
            m = item[0]
            want = wanted.get(id(m))
            if want is None:
                kept.append(item)
                continue
            pin = pins.get(m.name)
            if pin is None:
                pin = pins[m.name] = insert_pin_in(conn, m.name, want, now)
            if pin == want:
                kept.append(item)
            else:
                conflicts += 1
        return kept, {n: pins[n] for n in unknown}, conflicts

    def _persist(self, items: list[tuple[MetricDefinition, int, float]]) -> None:
        conn = self._store.connection()
        groups: dict[tuple[str, str], tuple[MetricDefinition, list[int]]] = {}
        refused: collections.Counter[str] = collections.Counter()
        newly_exhausted: dict[str, tuple[int, str]] = {}
        try:
            with self._store.transaction(conn):
                now = max(t for _, _, t in items)
                high = self._ledger.observe_time_in(conn, now, *self._ledger.reading(now))
                day = utc_day(high)
                items, learned, conflicts = self._pin_in(conn, items, now)
                outcomes = self._ledger.spend_many_in(
                    conn, day, [(m.name, self._units_of(m), m.max_reports_per_day) for m, _, _ in items]
                )
                for (m, index, _t), outcome in zip(items, outcomes):
                    if outcome is SpendOutcome.OK:
                        groups.setdefault((m.name, m.spec.spec_id), (m, []))[1].append(index)
                    else:
                        reason = "sampled_out" if outcome is SpendOutcome.REPORT_LIMIT else "over_budget"
                        refused[reason] += 1
                        newly_exhausted[m.name] = (day, reason)
                for m, indices in groups.values():
                    records = self._encode(m, indices)
                    self._outbox.put_in(conn, m.name, m.spec, day, records, now)
        except sqlite3.Error:
            self._count("storage_error", len(items))
            return
        except Exception:  # noqa: BLE001
            self._count("internal_error", len(items))
            return
        self._floor_day = max(self._floor_day, day)
        if learned:
            with self._defs_lock:
                changed = any(self._pins.get(n) != p for n, p in learned.items())
                self._pins.update(learned)
            if changed or conflicts:  # another process pinned first: drop definitions unlike its pins
                self._rebuild()
        self._exhausted.update(newly_exhausted)
        with self._tally_lock:
            self._tally.update(refused)
            self._tally["recorded"] += sum(len(ix) for _, ix in groups.values())
            if conflicts:
                self._tally["pin_conflict"] += conflicts

    def _drain(self, limit: int = 2048) -> None:
        while self._queue:
            items: list[tuple[MetricDefinition, int, float]] = []
            markers: list[_Marker] = []
            while self._queue and len(items) < limit:
                item = self._queue.popleft()
                if isinstance(item, _Marker):
                    markers.append(item)
                    break
                items.append(item)
            if items:
                self._persist(items)
            for mk in markers:
                mk.done.set()

    def _recorder_loop(self) -> None:
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self._drain()
            except Exception:  # noqa: BLE001
                self._count("internal_error")
            if self._stopping and not self._queue:
                return

    def _forked(self) -> None:
        self._closed = True
        self._stopping = True
        self._queue = collections.deque()

    def _persist_at_exit(self) -> None:
        if not self._closed:
            self.close(timeout=2.0, upload=False)

    # ------------------------------------------------------------------ uploader
    def _uploader_loop(self) -> None:
        up = self._uploader
        assert up is not None
        while not self._stopping:
            with self._flush_lock:
                requests, self._flush_requests = self._flush_requests, []
            try:
                if self._fetch and self._clock() >= self._next_refresh:
                    self._refresh_metrics()
                if self._upload_enabled:
                    if self._wallet is not None:
                        self._wallet.refill()  # in the background: only when the stock is low and no backoff holds
                    before, waits = up.failures_total, up.token_waits
                    up.upload_all(force=bool(requests), deadline=time.monotonic() + 30.0)
                    if up.failures_total > before:
                        self._count("upload_failures", up.failures_total - before)
                    if up.token_waits > waits:
                        self._count("tokens_exhausted", up.token_waits - waits)
            except Exception:  # noqa: BLE001
                self._count("internal_error")
            if self._wallet is not None:
                for name, n in self._wallet.take_tallies().items():
                    self._count(name, n)
            for r in requests:
                r.set()
            if self._flush_requests:
                continue
            wait = 60.0
            try:
                nxt = up.next_wakeup() if self._upload_enabled else None
                if nxt is not None:
                    wait = min(wait, max(0.05, nxt - self._clock()))
                if self._fetch:
                    wait = min(wait, max(0.05, self._next_refresh - self._clock()))
            except Exception:  # noqa: BLE001
                pass
            self._upload_wake.wait(wait)
            self._upload_wake.clear()

    def _pin_refusal(self, m: MetricDefinition) -> str | None:
        """Why ``m`` may not be used because its memoized metric is pinned to another definition, or None."""
        if not MemoStore.supports(m.spec):
            return None
        pin, want = self._pins.get(m.name), definition_pin(m)
        if pin is None or pin == want:
            return None
        return (
            f"metric {m.name!r} keeps the permanent response it drew under the definition it was first "
            f"reported under; this one differs in {', '.join(_differences(json.loads(pin), json.loads(want)))}, "
            "which would draw a second one of the same value, so it is refused and the metric is not reported "
            "until its pinned definition is served again (rename the metric to change its definition)"
        )

    def _merge(self) -> tuple[dict[str, MetricDefinition], list[tuple[MetricDefinition, str]]]:
        """The definitions in effect and those refused (with why): bundled ones unless unlike their pin;
        a server one replaces the bundled one if it passes the policy and its pin, drops it if it
        passes the policy but not its pin (the collector serving it would not take the pinned one),
        and leaves it if it fails the policy."""
        merged: dict[str, MetricDefinition] = {}
        refused: list[tuple[MetricDefinition, str]] = []
        for name, m in self._bundled.items():
            reason = self._pin_refusal(m)
            if reason is None:
                merged[name] = m
            else:
                refused.append((m, reason))
        for name, m in (self._server or MetricSet()).items():
            try:
                self.policy.check_metric(m)
            except BudgetError as exc:
                refused.append((m, str(exc)))
                continue
            reason = self._pin_refusal(m) or self._seal_pin.unsealing_refusal(m)
            if reason is None:
                merged[name] = m
            else:
                refused.append((m, reason))
                merged.pop(name, None)
        return merged, refused

    def _rebuild(self) -> None:
        """Recompute the definitions in effect; count (and log, once each) the refused ones."""
        with self._defs_lock:
            merged, refused = self._merge()
            self._metrics = merged
            self._sealing = self._seal_pin.sealing(merged, self._server)
            self._exhausted = {}
            for m, reason in refused:
                key = (m.name, canonical_json(m.to_dict()).decode("utf-8"))
                if key not in self._refused:
                    self._refused.add(key)
                    self._count("metric_refused")
                    if self._pin_refusal(m) is None and self._seal_pin.unsealing_refusal(m) is not None:
                        self._count("unsealing_refused")
                    _log.warning("refused a definition of metric %r: %s", m.name, reason)

    def _pin_reported_metrics(self) -> None:
        """Pin memoized metrics that were reported before this store had pins (schema 1) to the
        definition in effect now: the last one adopted, hence the one they were reported under."""
        merged, _ = self._merge()
        todo = {n: m for n, m in merged.items() if MemoStore.supports(m.spec) and n not in self._pins}
        if not todo:
            return
        conn = self._store.connection()
        marks = ",".join("?" * len(todo))
        names = sorted(todo)
        seen = {
            str(r[0])
            for r in conn.execute(
                f"SELECT DISTINCT metric FROM ledger WHERE metric IN ({marks}) "
                f"UNION SELECT DISTINCT metric FROM outbox WHERE metric IN ({marks})",
                names + names,
            )
        }
        if not seen:
            return
        with self._store.transaction(conn):
            for n in sorted(seen):
                self._pins[n] = insert_pin_in(conn, n, definition_pin(todo[n]), self._clock())

    def _seal(self, batch: ReportBatch) -> ReportBatch:
        """Called by the outbox as it forms a batch (on the uploader thread): a sealed metric's records are
        sealed to the current analyzer key, each under its own ephemeral key."""
        key = self._sealing.get(batch.metric) or self._seal_pin.key_for(batch.metric)
        return seal_batch(batch, key) if key is not None else batch

    def _adopt(self, server: MetricSet) -> None:
        self._server = server
        self._rebuild()

    def _load_cached_server_metrics(self) -> None:
        path = os.path.join(self.storage_dir, _SERVER_METRICS_FILE)
        try:
            with open(path, "rb") as f:
                self._server = parse_metrics(f.read(), reject_expired=False)
        except FileNotFoundError:
            pass
        except (OSError, MetricsFileError):
            self._count("metrics_fetch_failed")

    def _refresh_metrics(self) -> None:
        assert self._uploader is not None and self.collector_url is not None
        self._next_refresh = self._clock() + self._refresh_interval
        body = self._uploader.fetch_metrics_document(self.collector_url + "/v1/metrics")
        if body is None:
            self._count("metrics_fetch_failed")
            self._next_refresh = self._clock() + min(self._refresh_interval, 300.0)
            return
        try:
            server = parse_metrics(body, reject_expired=False)
        except MetricsFileError:
            self._count("metrics_fetch_failed")
            return
        self._adopt(server)
        try:
            write_atomic(
                os.path.join(self.storage_dir, _SERVER_METRICS_FILE), server.to_json().encode("utf-8"), mode=0o600
            )
        except OSError:
            self._count("storage_error")

    # ------------------------------------------------------------------ control
    def flush(self, timeout: float = 30.0) -> bool:
        """Persist everything recorded so far, then upload every waiting report
        now (ignoring batch age, honoring backoff). ``True`` if nothing is left."""
        deadline = time.monotonic() + timeout
        try:
            if not self._persist_pending(deadline):
                return False
            if self._uploader is None or not self._upload_enabled:
                return True
            done = threading.Event()
            with self._flush_lock:
                self._flush_requests.append(done)
            self._upload_wake.set()
            if not done.wait(max(0.0, deadline - time.monotonic())):
                return False
            return self._outbox.size() == 0
        except Exception:  # noqa: BLE001
            self._count("internal_error")
            return False

    def _persist_pending(self, deadline: float) -> bool:
        if not self._recorder.is_alive():
            return not self._queue
        marker = _Marker()
        self._queue.append(marker)
        self._wake.set()
        return marker.done.wait(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float = 10.0, *, upload: bool = True) -> None:
        """Persist what is queued, try one upload round (unless ``upload=False``),
        stop the threads and release the database. Idempotent."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout
        if upload:
            self.flush(timeout)
        else:
            self._persist_pending(deadline)
        self._closed = True
        self._stopping = True
        self._wake.set()
        self._upload_wake.set()
        self._recorder.join(max(0.1, deadline - time.monotonic()))
        if self._upload_thread is not None:
            self._upload_thread.join(max(0.1, deadline - time.monotonic()))
        self._store.close()
        try:
            atexit.unregister(self._atexit)
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> TelemetryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ views
    @property
    def metrics(self) -> Mapping[str, MetricDefinition]:
        """The metric definitions in effect (bundled plus adopted server ones)."""
        return dict(self._metrics)

    def privacy_spent(self, day: int | None = None) -> DayBudget:
        """ε spent and remaining on ``day`` (default: today, UTC), per metric and in total."""
        return self._ledger.day_budget(day)

    def privacy_history(self) -> list[DayBudget]:
        """:meth:`privacy_spent` for every day with spending on record."""
        return [self._ledger.day_budget(d) for d in self._ledger.days()]

    def _tallies(self, names: tuple[str, ...]) -> dict[str, int]:
        with self._tally_lock:
            out = {n: int(self._tally.get(n, 0)) for n in names}
        if any(n in _PERSISTED for n in names) and not self._store_closed():
            try:
                stored = self._store.counters()
            except sqlite3.Error:
                stored = {}
            for n in names:
                if n in _PERSISTED:
                    out[n] = stored.get(n, 0)
        return out

    def _store_closed(self) -> bool:
        return self._store._closed  # noqa: SLF001

    def errors(self) -> dict[str, int]:
        """What went wrong, by kind (see :data:`ERROR_TALLIES`). Hot-path tallies count
        since this client started; outbox and upload tallies are persisted and
        count since the storage directory was created (for every process using it)."""
        return self._tallies(ERROR_TALLIES)

    def stats(self) -> dict[str, int]:
        """What happened, by kind (see :data:`STAT_TALLIES`), counted as in :meth:`errors`."""
        return self._tallies(STAT_TALLIES)

    def pending_reports(self) -> int:
        """Reports in the outbox, waiting for upload."""
        return self._outbox.size()
