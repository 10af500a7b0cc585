"""The telemetry client's settings: :class:`ClientConfig` (one frozen dataclass, range-checked when made),
checked against the device's URL rule (:mod:`client_sdk.urls`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Literal

from client_sdk.outbox import DEFAULT_MAX_REPORTS
from client_sdk.upload.backoff import BackoffPolicy
from client_sdk.upload.uploader import HttpTransport
from client_sdk.urls import ClientConfigError, check_url

__all__ = ["ClientConfig", "ClientConfigError"]


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """How a :class:`TelemetryClient` runs: every setting besides its four arguments (see the module docstring).

    Checked when made (:class:`ClientConfigError`); change one field with ``dataclasses.replace``.

    Attributes
    ----------
    fetch_metrics:
        Also adopt definitions from ``GET {collector_url}/v1/metrics`` (at
        start and every ``metrics_refresh_interval`` seconds), each checked
        against the policy; the last good document is kept on disk.
    mode:
        ``"device"`` (default): a CSPRNG, no seeds. ``"simulation"``: allows
        ``simulation_seed`` for reproducible runs. Never ship simulation mode.
    simulation_seed:
        The seed of the randomization (``mode="simulation"`` only).
    upload:
        Send reports to the collector (``False``: record and keep them only).
    transport:
        The HTTP function (:data:`~client_sdk.upload.uploader.HttpTransport`; default ``urllib``).
    clock:
        Wall-clock time source (default ``time.time``), for tests.
    monotonic, boot_id:
        The monotonic time source (default ``time.monotonic``) and the id of the boot its readings belong
        to (default :func:`client_sdk.ledger.boot_id`), for tests: the ledger lets the wall clock advance
        its days no faster than monotonic time passes within one boot (docs/PRIVACY.md). With ``clock``
        injected and ``monotonic`` not, the monotonic time follows ``clock`` (a simulated world where both
        move together); inject both to test a clock moved against real time.
    batch_size, batch_max_age:
        A batch is sent when it holds ``batch_size`` reports or its oldest is
        ``batch_max_age`` seconds old.
    upload_timeout:
        Seconds one HTTP request may take.
    backoff:
        The retry waits (default: a :class:`~client_sdk.upload.backoff.BackoffPolicy` with its defaults).
    max_outbox_reports:
        The outbox's cap; the oldest reports are dropped (and counted) beyond it.
    max_queue:
        The in-memory queue's cap; ``record()`` drops (and counts) beyond it.
    metrics_refresh_interval:
        Seconds between two ``GET /v1/metrics`` (with ``fetch_metrics``).
    issuer_url, enrollment_path, token_origin:
        Pay each upload with an anonymous token (a collector run with ``--require-tokens``; docs/TOKENS.md):
        the ``ldp issuer`` base URL, the device's enrollment bundle (``ldp issuer enroll``, a
        :class:`~ldp_core.tokens.enrollment.DeviceIdentity` file) and the collector's ``--token-origin``. All
        three or none.
    token_stock:
        How many tokens the SDK keeps in stock (fetched on the uploader thread when a quarter is left).
    token_key_mirrors:
        URLs of further token-key documents (the ``GET /v1/token-keys`` shape, e.g. served by a third party the
        operator does not run). Before asking for tokens of a day the device checks that the issuer's key of
        that day is the one the collector and every mirror list (docs/TOKENS.md, "Key consistency"); each URL
        is https, or http on loopback.
    """

    fetch_metrics: bool = False
    mode: Literal["device", "simulation"] = "device"
    simulation_seed: int | None = None
    upload: bool = True
    transport: HttpTransport | None = None
    clock: Callable[[], float] | None = None
    monotonic: Callable[[], float] | None = None
    boot_id: Callable[[], str] | None = None
    batch_size: int = 500
    batch_max_age: float = 3600.0
    upload_timeout: float = 30.0
    backoff: BackoffPolicy | None = None
    max_outbox_reports: int = DEFAULT_MAX_REPORTS
    max_queue: int = 10_000
    metrics_refresh_interval: float = 86400.0
    issuer_url: str | None = None
    enrollment_path: str | os.PathLike[str] | None = None
    token_origin: str | None = None
    token_stock: int = 16
    token_key_mirrors: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in ("device", "simulation"):
            raise ClientConfigError(f"mode must be 'device' or 'simulation', got {self.mode!r}")
        if self.simulation_seed is not None and self.mode != "simulation":
            raise ClientConfigError(
                "simulation_seed makes the randomization predictable; it is accepted only with mode='simulation' "
                "(tests and simulations), never on a device"
            )
        given = [x is not None for x in (self.issuer_url, self.enrollment_path, self.token_origin)]
        if any(given) and not all(given):
            raise ClientConfigError("tokens need issuer_url, enrollment_path and token_origin together")
        if self.issuer_url is not None:
            check_url(self.issuer_url, "issuer_url")
        mirrors: object = self.token_key_mirrors
        if isinstance(mirrors, str) or not isinstance(mirrors, (list, tuple)):
            raise ClientConfigError(f"token_key_mirrors is a list of URLs, got {mirrors!r}")
        object.__setattr__(self, "token_key_mirrors", tuple(mirrors))
        for url in self.token_key_mirrors:
            check_url(url, "token_key_mirrors")
        for name in ("max_queue", "batch_size", "max_outbox_reports", "token_stock"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ClientConfigError(f"{name} must be a positive integer, got {val!r}")
        if not self.batch_max_age >= 0 or not self.upload_timeout > 0 or not self.metrics_refresh_interval > 0:
            raise ClientConfigError("batch_max_age must be >= 0; upload_timeout and metrics_refresh_interval > 0")
