"""The Prio3 deployment on one machine: the collector (FastAPI) on the embedded log (or Kafka), the helper
and the leader aggregators as HTTP services, and the leader's feed from the log (docs/PRIO3.md).

:func:`new_deployment` makes what an operator makes once: the two aggregators' HPKE key pairs (``ldp keys
new``'s files), their shared VDAF verify key, and a metrics file naming both public keys.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ldp_core.metrics import MetricSet, load_metrics
from ldp_core.wire.sealing import load_key_file, new_key_file

__all__ = ["Deployment", "Prio3Stack", "new_deployment", "DEMO_METRICS"]

#: the demo's Prio3 metrics: a count, a sum, a histogram and a vector of sums
DEMO_METRICS: dict[str, dict[str, Any]] = {
    "prio3.crashed": {"type": "count"},
    "prio3.session_minutes": {"type": "sum", "max_measurement": 240},
    "prio3.theme": {"type": "histogram", "length": 8},
    "prio3.feature_uses": {"type": "sumvec", "max_measurement": 15, "length": 6},
}


@dataclasses.dataclass(frozen=True)
class Deployment:
    """Where an operator's Prio3 files are."""

    folder: Path
    metrics_path: Path
    leader_key: Path
    helper_key: Path
    verify_key: Path  #: the 32-byte VDAF verify key (hex), shared by the two aggregators only

    def metrics(self) -> MetricSet:
        return load_metrics(self.metrics_path, reject_expired=False)


def write_verify_key(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_bytes(32).hex() + "\n")


def read_verify_key(path: str | Path) -> bytes:
    key = bytes.fromhex(Path(path).read_text().strip())
    if len(key) != 32:
        raise ValueError(f"{path}: a VDAF verify key is 32 bytes (64 hex digits)")
    return key


def new_deployment(
    folder: str | Path, metrics: Mapping[str, Mapping[str, Any]] = DEMO_METRICS, *, expires: str = "2099-12-31"
) -> Deployment:
    d = Path(folder)
    lpath, lkey = new_key_file(d / "leader")
    hpath, hkey = new_key_file(d / "helper")
    vpath = d / "verify.key"
    write_verify_key(vpath)
    doc = {
        "format": "ldp-metrics/1",
        "metrics": {
            name: {
                "kind": "prio3",
                "description": f"demo Prio3 metric ({cfg['type']})",
                "owner": "demo@example.org",
                "expires": expires,
                "prio3": dict(cfg),
                "max_reports_per_day": 1,
            }
            for name, cfg in metrics.items()
        },
        "prio3_aggregators": {"leader": lkey.public.to_dict(), "helper": hkey.public.to_dict()},
    }
    mpath = d / "metrics-prio3.json"
    mpath.write_text(json.dumps(doc, indent=2) + "\n")
    return Deployment(d, mpath, lpath, hpath, vpath)


class Prio3Stack:
    """Collector, helper, leader and the leader's feed, each on its own thread; HTTP on 127.0.0.1.

    ``ports``: (collector, helper, leader); 0 means a free port.
    """

    def __init__(
        self,
        deployment: Deployment,
        workdir: str | Path,
        *,
        transport_url: str | None = None,
        ports: tuple[int, int, int] = (0, 0, 0),
        min_batch: int = 1,
        token: str | None = None,
        helper_wrapper: Any = None,
        central_epsilon: float | None = None,
        noise_seeds: tuple[Any, Any] | None = None,
    ) -> None:
        self.deployment = deployment
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.transport_url = transport_url or f"sqlite:///{self.workdir / 'transport.sqlite3'}"
        self.ports = ports
        self.min_batch = min_batch
        self.token = token if token is not None else secrets.token_hex(16)
        #: for tests that play a deviating helper: wraps the helper's job function
        self.helper_wrapper = helper_wrapper
        #: each aggregator adds discrete Laplace noise at this ε to the shares it releases (None: exact)
        self.central_epsilon = central_epsilon
        #: (helper, leader) seed sources for that noise (None: the OS CSPRNG); tests pass fixed ones
        self.noise_seeds = noise_seeds
        self.metrics = deployment.metrics()
        self.raw_topic = f"ldp.reports.raw.prio3-{uuid.uuid4().hex[:8]}"
        self.collector_url = self.leader_url = self.helper_url = ""
        self.leader: Any = None
        self.helper: Any = None
        self.feed: Any = None
        self._servers: list[Any] = []
        self._transports: list[Any] = []

    def start(self) -> Prio3Stack:
        from collector.aggregator.app import create_app as aggregator_app
        from collector.aggregator.app import http_helper
        from collector.aggregator.feed import LeaderFeed
        from collector.aggregator.service import Aggregator
        from collector.http.app import create_app
        from collector.http.protocol import server_options
        from collector.settings import CollectorSettings
        from pipeline.transport import open_transport
        from simulator.stack import serve_in_thread

        dep = self.deployment
        setup = open_transport(self.transport_url)
        self._transports.append(setup)
        setup.create_topic(self.raw_topic, 2)
        settings = CollectorSettings(
            metrics_path=str(dep.metrics_path),
            transport_url=self.transport_url,
            raw_topic=self.raw_topic,
            raw_partitions=2,
            dedup_path=str(self.workdir / "collector-ids.sqlite3"),
        )
        server, self.collector_url, _ = serve_in_thread(
            create_app(settings, metrics=self.metrics), port=self.ports[0], options=server_options(settings)
        )
        self._servers.append(server)
        vkey = read_verify_key(dep.verify_key)
        noise: list[dict[str, Any]] = [{"central_epsilon": self.central_epsilon} for _ in range(2)]
        for kw, seeds in zip(noise, self.noise_seeds or (None, None), strict=True):
            if seeds is not None:
                kw["noise_seed"] = seeds
        self.helper = Aggregator(
            "helper",
            self.metrics,
            load_key_file(dep.helper_key),
            vkey,
            self.workdir / "helper",
            min_batch=self.min_batch,
            **noise[0],
        )
        if self.helper_wrapper is not None:
            self.helper_wrapper(self.helper)
        server, self.helper_url, _ = serve_in_thread(aggregator_app(self.helper, token=self.token), port=self.ports[1])
        self._servers.append(server)
        self.leader = Aggregator(
            "leader",
            self.metrics,
            load_key_file(dep.leader_key),
            vkey,
            self.workdir / "leader",
            min_batch=self.min_batch,
            helper=http_helper(self.helper_url, token=self.token),
            **noise[1],
        )
        server, self.leader_url, _ = serve_in_thread(aggregator_app(self.leader, token=self.token), port=self.ports[2])
        self._servers.append(server)
        feed_transport = open_transport(self.transport_url)
        self._transports.append(feed_transport)
        self.feed = LeaderFeed(self.leader, feed_transport, self.raw_topic).start()
        return self

    def wait_settled(self, expected: int, timeout: float = 60.0) -> int:
        """Wait until the leader has taken ``expected`` new reports from the log (or replays of them) and
        settled every one; returns how many it took."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            c = self.leader.counts
            taken = c["received"] + c["replayed"] + c["rejected:malformed"]
            if taken >= expected and self.leader.pending() == 0:
                return int(taken)
            if self.feed.error:
                raise RuntimeError(f"the leader's feed stopped: {self.feed.error}")
            time.sleep(0.05)
        raise TimeoutError(f"the leader took {self.leader.counts} of {expected} reports in {timeout} s")

    def collect(self, metric: str, day: int) -> Any:
        from collector.aggregator.collect import collect

        return collect(self.metrics, metric, day, self.leader_url, self.helper_url, token=self.token)

    def audit_exact(self, metric: str, day: int) -> Any:
        """The exact aggregate, unsharded from both aggregators' unreleased shares read in process: only a
        simulation that plays every party can do this (the collector, over HTTP, gets the noised shares)."""
        from collector.aggregator.collect import Prio3Result

        (s0, n0), (s1, n1) = (a.unreleased_share(metric, day) for a in (self.leader, self.helper))
        if n0 != n1:
            raise RuntimeError(f"the aggregators hold {n0} and {n1} reports of {metric}/{day}")
        value = self.metrics.prio3[metric].config.vdaf().unshard([s0, s1], n0)
        return Prio3Result(metric, day, n0, value if isinstance(value, int) else [int(v) for v in value])

    def stop(self) -> None:
        if self.feed is not None:
            self.feed.stop()
        for s in self._servers:
            s.should_exit = True
        for t in self._transports:
            t.close()
        for a in (self.leader, self.helper):
            if a is not None:
                a.close()

    def __enter__(self) -> Prio3Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
