"""Anonymous upload tokens in the local pipeline: an issuer on a thread, enrolled devices, and a flood.

:class:`LocalIssuer` runs the real ``ldp issuer`` app (:mod:`collector.issuer`) under uvicorn on 127.0.0.1
with an enrollment authority of its own; :meth:`LocalIssuer.collector_options` are the collector settings that
make :class:`~simulator.stack.LocalPipeline`'s collector require its tokens (``--require-tokens``).
:func:`pay_fleet` enrolls one install per simulated device, fetches each device's tokens from the issuer (blind
RSA: the issuer signs what it cannot read) and pairs every upload with one of its device's tokens.

:func:`flood` plays one enrolled install that tries to upload far more than its allowance of crafted reports
for one item (the poisoning attack of docs/PRIVACY.md §6): it gets its K tokens of the day and no more, so at
most K uploads of at most ``max_reports_per_day`` reports each are accepted, whatever it sends. Every answer is
tallied by its status and reason, as the demo prints them.
"""

from __future__ import annotations

import collections
import dataclasses
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ldp_core.metrics import MetricSet
from ldp_core.tokens.enrollment import DeviceIdentity, EnrollmentAuthority
from ldp_core.tokens.privacy_pass import IssuerClient, Token, TokenError, authorization_header
from ldp_core.wire.frames import ReportBatch, encode_frame

__all__ = ["LocalIssuer", "PaidFleet", "pay_fleet", "FloodResult", "flood", "TOKEN_ORIGIN"]

#: the collector's name in the token challenge (``--token-origin``): the settings' default
TOKEN_ORIGIN = "ldp-collector"


class LocalIssuer:
    """The token issuer on a thread of this process, its state in ``state_dir`` (keys 0600, counts in SQLite).

    ``tokens_per_day`` is K. Use as a context manager; :meth:`stop` shuts the server down."""

    def __init__(self, state_dir: str | Path, *, tokens_per_day: int) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.tokens_per_day = int(tokens_per_day)
        self.authority = EnrollmentAuthority.generate()
        self.url = ""
        self._server: Any = None

    @property
    def public_dir(self) -> Path:
        """The issuer's public day keys: the collector's ``--token-keys`` folder."""
        return self.state_dir / "public"

    def start(self) -> LocalIssuer:
        from collector.issuer import IssuerKeys, IssuerSettings, create_issuer_app
        from ldp_core.days import utc_iso_day
        from simulator.stack import serve_in_thread

        settings = IssuerSettings(str(self.state_dir), (self.authority.public_key,), tokens_per_day=self.tokens_per_day)
        app = create_issuer_app(settings)
        IssuerKeys(self.state_dir).key(utc_iso_day(time.time()))  # today's key before the collector starts
        self._server, self.url, _ = serve_in_thread(app)
        return self

    def collector_options(self, spent_path: str | Path) -> dict[str, Any]:
        """The :class:`~collector.settings.CollectorSettings` fields of a collector that requires these tokens."""
        return {
            "require_tokens": True,
            "token_keys": str(self.public_dir),
            "token_origin": TOKEN_ORIGIN,
            "spent_path": str(spent_path),
        }

    def enroll(self, device_id: str) -> DeviceIdentity:
        return self.authority.enroll(device_id)

    def client(self, identity: DeviceIdentity) -> IssuerClient:
        return IssuerClient(self.url, identity, origin=TOKEN_ORIGIN)

    def issued(self) -> int:
        """Tokens the issuer granted, all devices and days (its own count, read from its database)."""
        with sqlite3.connect(self.state_dir / "counts.sqlite3") as conn:
            row = conn.execute("SELECT COALESCE(SUM(n), 0) FROM issued").fetchone()
        return int(row[0])

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True

    def __enter__(self) -> LocalIssuer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclasses.dataclass
class PaidFleet:
    """Every upload of a fleet with the token that pays for it (``headers`` is the :func:`upload` hook)."""

    tokens: dict[bytes, Token]  # batch id -> token
    devices: int
    fetched: int

    def headers(self, batch: ReportBatch) -> Mapping[str, str]:
        return {"Authorization": authorization_header(self.tokens[batch.batch_id])}


def pay_fleet(
    issuer: LocalIssuer,
    batches: Sequence[ReportBatch],
    devices: int,
    on_device: Callable[[int], object] | None = None,
) -> PaidFleet:
    """Enroll ``devices`` installs, fetch each one's tokens and give each of its batches one.
    ``on_device(i)``, if given, is called after device ``i`` has its tokens (progress display).

    ``batches`` are one batch per device and metric, metric by metric (what
    :func:`~simulator.stack.fleet_batches` makes with ``frame_reports=1``): batch ``k·devices + i`` is
    device ``i``'s. A device needs one token per metric; it asks for exactly that many (at most K)."""
    if len(batches) % devices:
        raise ValueError(f"{len(batches)} batches are not one per device and metric for {devices} devices")
    per_device = len(batches) // devices
    if per_device > issuer.tokens_per_day:
        raise ValueError(
            f"each device uploads {per_device} batches a day but the issuer grants {issuer.tokens_per_day} tokens: "
            "raise --tokens-per-day"
        )
    paid: dict[bytes, Token] = {}
    fetched = 0
    for i in range(devices):
        got = issuer.client(issuer.enroll(f"device-{i:06d}")).fetch(per_device)
        fetched += len(got)
        if len(got) < per_device:
            raise RuntimeError(f"device {i} got {len(got)} of its {per_device} tokens")
        for k, tok in enumerate(got):
            paid[batches[k * devices + i].batch_id] = tok
        if on_device is not None:
            on_device(i)
    return PaidFleet(paid, devices, fetched)


@dataclasses.dataclass
class FloodResult:
    """What one install's flood achieved: ``outcomes`` counts the collector's answers by ``"status reason"``."""

    metric: str
    target: int
    attempts: int
    reports_per_upload: int
    tokens: int
    issuer_refusals: dict[str, int]
    outcomes: dict[str, int]
    accepted_reports: int

    @property
    def accepted(self) -> int:
        return self.outcomes.get("202 accepted", 0)

    @property
    def refused(self) -> int:
        return sum(n for k, n in self.outcomes.items() if not k.startswith("202"))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "accepted": self.accepted, "refused": self.refused}


def flood(
    collector_url: str,
    issuer: LocalIssuer,
    metrics: MetricSet,
    metric: str,
    day: int,
    attempts: int,
    rng: np.random.Generator,
    *,
    target: int | None = None,
) -> FloodResult:
    """One enrolled install floods ``metric`` with ``attempts`` uploads of crafted reports for ``target``.

    It takes all K tokens it can get, asks the issuer again (refused: 429 ``token_limit``), tries one batch
    larger than ``max_reports_per_day`` (422 ``too_many_reports``; its token is not spent), then sends
    ``attempts`` uploads of ``max_reports_per_day`` crafted reports: the first K each with a fresh token, the
    rest alternately with no token (401 ``token_missing``) and with a token it already spent (409
    ``token_spent``)."""
    import httpx

    from client_sdk.upload.uploader import FRAME_CONTENT_TYPE
    from ldp_core.mechanisms import frequency_spec
    from simulator.crafted import crafted_reports

    m = metrics[metric]
    spec = frequency_spec(m.spec)
    t = spec.domain_size // 2 if target is None else int(target)
    r = m.max_reports_per_day
    client = issuer.client(issuer.enroll("flooder"))
    tokens = client.fetch(issuer.tokens_per_day)
    refusals: collections.Counter[str] = collections.Counter()
    try:
        client.fetch(1)
    except TokenError as exc:
        refusals["429 token_limit" if exc.reason == "limit" else exc.reason] += 1
    outcomes: collections.Counter[str] = collections.Counter()
    accepted_reports = 0

    def post(http: httpx.Client, n: int, token: Token | None) -> bool:
        batch = ReportBatch(metric, spec, day, crafted_reports(spec, t, n, rng), rng.bytes(16))
        headers = {"Content-Type": FRAME_CONTENT_TYPE, "Idempotency-Key": batch.batch_id.hex()}
        if token is not None:
            headers["Authorization"] = authorization_header(token)
        resp = http.post("/v1/reports", content=encode_frame(batch), headers=headers)
        reason = "accepted" if resp.status_code == 202 else str(resp.json().get("error", "?"))
        outcomes[f"{resp.status_code} {reason}"] += 1
        return resp.status_code == 202

    with httpx.Client(base_url=collector_url, timeout=30.0) as http:
        if tokens:
            post(http, r + 1, tokens[0])
        for j in range(attempts):
            if j < len(tokens):
                token: Token | None = tokens[j]
            else:
                token = tokens[j % len(tokens)] if tokens and j % 2 else None
            if post(http, r, token):
                accepted_reports += r
    return FloodResult(
        metric, t, attempts, r, len(tokens), dict(refusals), dict(sorted(outcomes.items())), accepted_reports
    )
