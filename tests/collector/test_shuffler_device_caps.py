"""The per-person shuffle figure holds against a hostile metrics server when it is based on the devices' own caps.

The adversary is the metrics server (docs/PRIVACY.md's threat table): it serves a definition of the app's metric
with a larger ``max_reports_per_day`` than the shuffler's metrics file says. A real :class:`TelemetryClient` adopts
it (its ``r·ε₀`` still fits the device's local policy) and sends that many reports a day, so a figure computed with
the file's ``r`` counts too many people per batch. With ``--device-epsilon-cap`` the shuffler assumes what devices
enforce whatever a server says, ``r = ⌊cap / ε₀⌋``, and the released batch's central ε is the bound for that
many reports per person, checked here against an independent evaluation of the same bound.
"""

from __future__ import annotations

import http.server
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client_sdk.client import TelemetryClient
from client_sdk.config import ClientConfig
from client_sdk.policy import LocalPolicy
from collector.shuffler import DeviceCaps, Shuffler
from collector.shuffler.settings import ShufflerSettings
from estimator.accounting.shuffle import grid_floor, numerical_epsilon, shuffler_guarantee
from ldp_core.errors import ConfigError
from ldp_core.metrics import FORMAT, parse_metrics
from ldp_core.wire.frames import decode_frame, read_header
from tests.collector.test_shuffler import Topics, publish, read_shuffled, run_until_idle
from tests.support.collector_support import TODAY, olh_batch, write_metrics

DAY = 86400.0
CAP = 4.0  # the app's per-metric daily cap (LocalPolicy.per_metric_daily)
DELTA = 1e-6


def tab(reports_per_day: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "metrics": {
            "settings_tab": {
                "description": "tab",
                "owner": "b@example.org",
                "expires": "2099-12-31",
                "mechanism": {"mechanism": "grr", "epsilon": 1.0},
                "domain": {"kind": "dictionary", "values": ["a", "b", "c", "d"]},
                "max_reports_per_day": reports_per_day,
            }
        },
    }


class MetricsServer:
    """A hostile collector on loopback: ``GET /v1/metrics`` serves ``document``, ``POST`` keeps the frames."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.frames: list[bytes] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 -- http.server's spelling
                self._answer(200, json.dumps(document).encode())

            def do_POST(self) -> None:  # noqa: N802
                owner.frames.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                self._answer(202)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hostile() -> Iterator[MetricsServer]:
    server = MetricsServer(tab(reports_per_day=4))  # the file says 1; r·ε₀ = 4 fits the device's cap
    yield server
    server.stop()


def test_a_hostile_metrics_server_gets_more_reports_a_day_than_the_file_says(tmp_path: Path, hostile) -> None:
    """The attack the default assumption does not survive: the device sends 4 reports a day, the file says 1;
    the device's cap bounds it, and ``DeviceCaps`` says exactly that bound."""
    clock = lambda: TODAY * DAY + 3600.0  # noqa: E731
    policy = LocalPolicy(per_metric_daily=CAP, total_daily=CAP)
    cfg = ClientConfig(fetch_metrics=True, clock=clock, mode="simulation", simulation_seed=3)
    with TelemetryClient(tmp_path / "sdk", hostile.url, policy, tab(reports_per_day=1), config=cfg) as c:
        assert c.flush(30)  # the uploader adopts the served definitions first
        for v in ["a", "b", "c", "d", "a", "b"]:
            c.record("settings_tab", v)
        assert c.flush(30)
    spec = parse_metrics(tab(1), reject_expired=False)["settings_tab"].spec
    sent = sum(len(decode_frame(f, spec).records) for f in hostile.frames if read_header(f).spec_id == spec.spec_id)
    assert sent == 4  # the served r, not the file's 1: two of the six recordings were refused by the ledger
    file_r = parse_metrics(tab(1), reject_expired=False)["settings_tab"].max_reports_per_day
    assert file_r < sent
    assert DeviceCaps(default=CAP).reports("settings_tab", spec.epsilon, file_r) == math.floor(CAP / spec.epsilon)
    assert DeviceCaps(default=CAP).reports("settings_tab", spec.epsilon, file_r) >= sent


def test_the_shuffler_attaches_the_figure_for_what_devices_enforce(tmp_path: Path) -> None:
    """emoji_used (OLH, ε₀ = 1, file r = 1) with devices capped at 4 a day: a released batch of 1,000 reports is
    bounded for ⌈1000 / 4⌉ = 250 people, each a 4·ε₀ randomizer, and the figure equals an independent
    evaluation of the FMT21 numerical bound at that crowd (the shuffler evaluates it at grid_floor(people))."""
    metrics = write_metrics(tmp_path / "metrics.json")
    tp = Topics()
    with open_log(tmp_path) as transport:
        publish(transport, tp.raw, [olh_batch(metrics, 250, first_seed=250 * i) for i in range(4)])
        guarantee = shuffler_guarantee(DELTA)
        sh = Shuffler(
            transport,
            metrics,
            tp.settings(min_batch=1000, max_batch=1000),
            guarantee=guarantee,
            device_caps=DeviceCaps(per_metric={"emoji_used": CAP}),
        )
        run_until_idle(sh)
        sh.close()
        (out,) = [sb for _, sb in read_shuffled(transport, tp.shuffled, metrics)]
    assert out.meta.n == 1000
    people = 250
    assert out.meta.central_epsilon == pytest.approx(numerical_epsilon(4 * 1.0, grid_floor(people), DELTA), rel=1e-9)
    assert "per person: 250 people of up to 4 report(s) each" in (out.meta.bound or "")
    # the default (file r = 1) would have printed the smaller, wrong figure for this fleet
    assert numerical_epsilon(1.0, grid_floor(1000), DELTA) < out.meta.central_epsilon


def test_device_caps_parse_and_refuse_nonsense() -> None:
    caps = DeviceCaps.parse(["2", "emoji_used=0.5"])
    assert caps is not None and caps.cap("other") == 2.0 and caps.cap("emoji_used") == 0.5
    assert caps.reports("emoji_used", 0.25, 1) == 2 and caps.reports("other", 0.5, 1) == 4
    assert caps.reports("other", 0.5, 9) == 9  # never below the file's r
    assert DeviceCaps.parse(None) is None
    with pytest.raises(ConfigError, match="EPS or METRIC=EPS"):
        DeviceCaps.parse(["emoji_used=lots"])
    with pytest.raises(ConfigError, match="positive"):
        DeviceCaps.parse(["-1"])
    assert isinstance(ShufflerSettings(), ShufflerSettings)


class open_log:  # noqa: N801 -- a context manager used like a function
    def __init__(self, tmp_path: Path) -> None:
        from pipeline.transport import open_transport

        self.transport = open_transport(f"sqlite:///{tmp_path}/log.sqlite3")

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self.transport

    def __exit__(self, *exc: object) -> None:
        self.transport.close()
