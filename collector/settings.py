"""The collector's configuration: one frozen, validated value.

Every field can come from the command line (``ldp collector --max-records
...``), from the environment (``LDP_COLLECTOR_<FIELD>``, e.g.
``LDP_COLLECTOR_MAX_RECORDS=100000``; the transport URL also from
``LDP_TRANSPORT`` and the metrics file from ``LDP_METRICS``) or from code;
explicit values win over the environment, the environment over defaults.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from collector.cors import parse_origins
from ldp_core.days import DAY_SECONDS, DAY_WINDOW_ENV, DEFAULT_MAX_DAY_AGE, DEFAULT_MAX_DAYS_AHEAD, DayWindow
from pipeline.errors import ConfigError
from pipeline.settings import check_ranges, check_topics, settings_from_env
from pipeline.topics import DEFAULT_PARTITIONS, FL_ROUNDS_TOPIC, FL_UPDATES_TOPIC, RAW_TOPIC
from pipeline.transport import DEFAULT_URL

__all__ = ["CollectorSettings", "DEFAULT_DEDUP_PATH", "DEFAULT_SPENT_PATH", "ENV_PREFIX"]

ENV_PREFIX = "LDP_COLLECTOR_"
DEFAULT_DEDUP_PATH = "ldp-data/collector-batch-ids.sqlite3"
DEFAULT_SPENT_PATH = "ldp-data/collector-spent-tokens.sqlite3"
_ALIASES = {"transport_url": "LDP_TRANSPORT", "metrics_path": "LDP_METRICS", **DAY_WINDOW_ENV}


@dataclasses.dataclass(frozen=True)
class CollectorSettings:
    """What one collector process needs.

    ``max_body_bytes`` is checked against ``Content-Length`` before the body
    is read and again while it is read; ``max_records`` against the frame
    header before the records are decoded. A body must arrive whole within
    ``body_timeout`` seconds of its headers and, from ``body_grace`` seconds
    after them, at ``min_body_rate`` bytes a second on average (else 408 and
    the connection is closed); at most ``max_reading`` bodies are read at
    once, and a newcomer takes the place of a reader below that rate
    (:mod:`collector.http.bodies`). A connection must deliver a complete
    request line and headers within ``header_timeout`` seconds of opening or
    of its previous answer (idle keep-alive included), else it is closed;
    beyond ``max_connections`` open connections the oldest one still waiting
    for its headers is closed (:mod:`collector.http.protocol`). ``max_in_flight``
    bounds the uploads being processed at once, counted from when their
    body has been read: one more is answered 503 with ``Retry-After:
    retry_after``. JSON bodies above ``offload_json_bytes`` and frames above
    ``offload_frame_bytes`` are decoded off the event loop: JSON in
    ``decode_workers`` decode processes, frames on a thread. A group commit still running after ``probe_after``
    seconds, or one that failed, makes the collector probe the transport
    (``Transport.health``); while a probe fails, uploads are answered 503 at
    once, and the transport is probed every ``probe_interval`` seconds until
    it answers again. A batch's day must lie in
    ``[today - max_day_age, today + max_days_ahead]`` (UTC days): the
    :class:`~ldp_core.days.DayWindow` the shuffler keeps too, read from
    ``$LDP_MAX_DAY_AGE`` / ``$LDP_MAX_DAYS_AHEAD`` (``$LDP_COLLECTOR_MAX_DAY_AGE``
    and ``--max-day-age`` still win).
    Batch ids stay in the dedup store (``dedup_path``, SQLite) for
    ``dedup_ttl`` seconds, rounded up to whole UTC days (the store keeps days, not times). ``publishers`` threads publish group commits of
    up to ``max_group`` uploads each (:mod:`collector.ingest`).
    ``fl_enabled`` adds the federated-learning routes (:mod:`collector.fl.routes`),
    which follow ``fl_rounds_topic`` and publish to ``fl_updates_topic``.
    Operational metrics (Prometheus) are served on a listener of their own at ``metrics_host:metrics_port``
    (``0`` picks a free port), not on the device-facing port, which answers 404 at ``/metrics``; only
    ``public_metrics`` puts them back on the device-facing port (and opens no second listener).
    ``require_tokens`` makes every upload carry an anonymous token (:mod:`collector.tokens`, docs/TOKENS.md)
    of the issuer ``token_issuer`` whose day keys are in ``token_keys``, made for ``token_origin`` (this
    collector's name); redeemed tokens are kept in ``spent_path`` (SQLite, shared by the workers).
    ``allow_origins`` lists the web pages' origins (``https://app.example``, or ``*``) whose browsers may
    upload and fetch the metrics cross-origin (CORS, :mod:`collector.cors`); empty: no CORS answers.
    ``front`` is what serves the device-facing socket: ``python`` (uvicorn) or ``native`` (the native upload
    front, :mod:`collector.http.frontend`, which hands uploads to the app in batches and proxies the rest).
    """

    metrics_path: str
    transport_url: str = DEFAULT_URL
    raw_topic: str = RAW_TOPIC
    raw_partitions: int = DEFAULT_PARTITIONS
    dedup_path: str = DEFAULT_DEDUP_PATH
    dedup_ttl: float = 3.0 * DAY_SECONDS
    max_body_bytes: int = 4 << 20
    max_records: int = 1 << 16
    max_in_flight: int = 256
    max_reading: int = 1024
    body_timeout: float = 15.0
    min_body_rate: float = 1024.0
    body_grace: float = 2.0
    header_timeout: float = 5.0
    max_connections: int = 8192
    offload_json_bytes: int = 2048
    offload_frame_bytes: int = 1 << 20
    decode_workers: int = 1
    probe_after: float = 1.0
    probe_interval: float = 1.0
    retry_after: int = 2
    max_days_ahead: int = DEFAULT_MAX_DAYS_AHEAD
    max_day_age: int = DEFAULT_MAX_DAY_AGE
    publish_timeout: float = 30.0
    max_group: int = 512
    publishers: int = 2
    fl_enabled: bool = False
    fl_rounds_topic: str = FL_ROUNDS_TOPIC
    fl_updates_topic: str = FL_UPDATES_TOPIC
    require_tokens: bool = False
    token_keys: str = ""
    token_issuer: str = "ldp-issuer"
    token_origin: str = "ldp-collector"
    spent_path: str = DEFAULT_SPENT_PATH
    allow_origins: tuple[str, ...] = ()
    public_metrics: bool = False
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    front: str = "python"

    def __post_init__(self) -> None:
        # a comma-separated $LDP_COLLECTOR_ALLOW_ORIGINS, a list from JSON or a tuple from code
        object.__setattr__(self, "allow_origins", parse_origins(self.allow_origins, what="allow_origins"))
        if not isinstance(self.metrics_path, str) or not self.metrics_path:
            raise ConfigError("metrics_path must name the metrics file (--metrics FILE or $LDP_METRICS)")
        if not isinstance(self.transport_url, str) or "://" not in self.transport_url:
            raise ConfigError(f"transport_url must be sqlite:///path or kafka://host:port, got {self.transport_url!r}")
        check_topics(self, "raw_topic", "fl_rounds_topic", "fl_updates_topic")
        if not isinstance(self.fl_enabled, bool):
            raise ConfigError(f"fl_enabled must be true or false, got {self.fl_enabled!r}")
        if not isinstance(self.public_metrics, bool):
            raise ConfigError(f"public_metrics must be true or false, got {self.public_metrics!r}")
        if not isinstance(self.metrics_host, str) or not self.metrics_host:
            raise ConfigError("metrics_host must be an address to listen on, such as 127.0.0.1")
        if self.front not in ("python", "native"):
            raise ConfigError(f"front must be python or native, got {self.front!r}")
        if not isinstance(self.require_tokens, bool):
            raise ConfigError(f"require_tokens must be true or false, got {self.require_tokens!r}")
        if self.require_tokens and not self.token_keys:
            raise ConfigError("require_tokens needs token_keys: the issuer's public key folder (--token-keys DIR)")
        if not isinstance(self.dedup_path, str) or not self.dedup_path:
            raise ConfigError("dedup_path must be a file path (or ':memory:' for tests)")
        check_ranges(
            self,
            {
                "raw_partitions": (1, 10_000),
                "dedup_ttl": (1.0, 365.0 * DAY_SECONDS),
                "max_body_bytes": (64, 1 << 30),
                "max_records": (1, 1 << 24),
                "max_in_flight": (1, 1 << 20),
                "max_reading": (1, 1 << 20),
                "body_timeout": (0.05, 3600.0),
                "min_body_rate": (0.0, 1e12),
                "body_grace": (0.0, 3600.0),
                "header_timeout": (0.05, 3600.0),
                "max_connections": (16, 1 << 22),
                "offload_json_bytes": (0, 1 << 30),
                "offload_frame_bytes": (0, 1 << 30),
                "decode_workers": (1, 64),
                "probe_after": (0.01, 3600.0),
                "probe_interval": (0.01, 3600.0),
                "retry_after": (1, 3600),
                "max_days_ahead": (0, 366),
                "max_day_age": (0, 3660),
                "publish_timeout": (0.1, 3600.0),
                "max_group": (1, 1 << 16),
                "publishers": (1, 64),
                "metrics_port": (0, 65535),
            },
        )

    @property
    def day_window(self) -> DayWindow:
        """The accepted days as the shared :class:`~ldp_core.days.DayWindow`."""
        return DayWindow(self.max_day_age, self.max_days_ahead)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> CollectorSettings:
        """Settings from ``overrides`` (``None`` values ignored), then ``environ`` (default ``os.environ``), then defaults."""
        values = {k: v for k, v in overrides.items() if v is not None}
        env = os.environ if environ is None else environ
        if "metrics_path" not in values and not env.get(ENV_PREFIX + "METRICS_PATH") and not env.get("LDP_METRICS"):
            raise ConfigError("no metrics file: pass --metrics FILE or set $LDP_METRICS")
        return settings_from_env(cls, ENV_PREFIX, env, values, aliases=_ALIASES)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CollectorSettings:
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"collector settings JSON is invalid: {exc}") from None
