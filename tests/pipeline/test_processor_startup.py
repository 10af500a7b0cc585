"""Start-up and recovery of the consume loop (StreamProcessor.connect / supervise): backoff with jitter, one log
line per state change, readiness, fatal errors not retried. The transport is the embedded log behind a switch
that plays a broker that is down (the real-broker version is tests/e2e/test_broker_startup.py)."""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.processor import Backoff
from pipeline.transport import TransportError
from pipeline.transport.embedded import EmbeddedTransport
from tests.pipeline.test_processor import Summer, _publish


class Switch(EmbeddedTransport):
    """The embedded log whose joins fail while ``down`` (as a Kafka transport's do while its broker is away)."""

    down = False
    attempts = 0

    def ensure_topic(self, name: str, partitions: int = 1, **kw: object) -> int:  # type: ignore[override]
        self.attempts += 1
        if self.down:
            raise TransportError("cannot reach Kafka at 127.0.0.1:1 (NoBrokersAvailable())")
        return super().ensure_topic(name, partitions, **kw)  # type: ignore[arg-type]


FAST = Backoff(initial=0.01, cap=0.04)


def _status_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ldp.status"]


def test_backoff_grows_to_its_cap_with_jitter_in_the_upper_half() -> None:
    b = Backoff(initial=0.5, cap=8.0)
    rng = np.random.default_rng(5)
    delays = [b.delay(k, rng) for k in range(12)]
    for k, d in enumerate(delays):
        step = min(8.0, 0.5 * 2**k)
        assert step / 2 <= d <= step
    assert delays == [Backoff(initial=0.5, cap=8.0).delay(k, r) for r in [np.random.default_rng(5)] for k in range(12)]
    with pytest.raises(ConfigError):
        Backoff(initial=2.0, cap=1.0)


def test_connect_waits_for_the_broker_logs_two_lines_and_becomes_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    t = Switch(tmp_path / "log.sqlite3")
    t.down = True
    topic = f"t-{uuid.uuid4().hex[:8]}"
    p = Summer(t, topic, "g", "m")
    seen: list[str] = []
    p.state_listeners.append(lambda _p, s: seen.append(s))
    stop = threading.Event()
    timer = threading.Timer(0.5, lambda: setattr(t, "down", False))
    timer.start()
    assert p.run_state == "starting" and not p.ready
    assert p.connect(stop, backoff=FAST, rng=np.random.default_rng(1))
    assert p.ready and seen == ["waiting", "ready"]
    assert t.attempts > 5  # it retried
    lines = _status_lines(caplog)
    assert len(lines) == 2, lines
    assert "unreachable (cannot reach Kafka" in lines[0] and "retrying every <= 0.04 s" in lines[0]
    assert "connected to" in lines[1]
    assert not any(r.exc_info for r in caplog.records if r.name == "ldp.status")
    _publish(t, topic, [1, 2, 3])
    p.run(stop=None, idle_timeout=0.5)
    assert p.total() == 6
    p.close()
    assert p.run_state == "stopped"
    t.close()


def test_connect_gives_up_when_stopped_and_raises_configuration_errors(tmp_path: Path) -> None:
    t = Switch(tmp_path / "log.sqlite3")
    t.down = True
    p = Summer(t, "t-x", "g", "m")
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert p.connect(stop, backoff=FAST, rng=np.random.default_rng(2)) is False
    assert p.run_state == "waiting"

    class Misconfigured(Summer):
        def ensure_topics(self) -> None:
            raise ConfigError("the state topic has 3 partitions but the raw topic 4")

    q = Misconfigured(t, "t-y", "g", "m")
    with pytest.raises(ConfigError):
        q.connect(threading.Event(), backoff=FAST)
    assert t.attempts < 100
    t.close()


def test_supervise_rejoins_after_a_failure_logs_lost_and_recovered_and_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    t = Switch(tmp_path / "log.sqlite3")
    topic = f"t-{uuid.uuid4().hex[:8]}"
    t.create_topic(topic, 2)
    _publish(t, topic, list(range(1, 11)))
    p = Summer(t, topic, "g", "m")
    stop = threading.Event()
    runs = []

    def body() -> int:
        runs.append(p.run_state)
        if len(runs) == 1:
            p.poll_once(timeout=0.5)  # state from records that were never committed
            t.down = True  # and the broker goes away: the rejoin's first attempts fail too
            threading.Timer(0.3, lambda: setattr(t, "down", False)).start()
            raise TransportError("the broker went away")
        p.run(stop=None, idle_timeout=0.5)
        return p.total()

    assert p.supervise(body, stop, backoff=FAST, rng=np.random.default_rng(3)) == sum(range(1, 11))
    lines = _status_lines(caplog)
    kinds = [next(w for w in ("recovered", "lost", "connected to") if w in line) for line in lines]
    assert kinds == ["connected to", "lost", "recovered"], lines
    assert len(lines) == 3 and p.stats.rejoins == 1
    p.close()
    t.close()
