"""Shared fixtures."""

from __future__ import annotations

import os
import tempfile

import pytest

# the shared helpers and contracts under tests/support assert too: have pytest show the values a failing assert saw
# (it rewrites only test modules and conftest files by itself; registered before any test module imports them)
pytest.register_assert_rewrite("tests.support")

# decoding designs cached on disk (estimator/oracles/rappor_design.py) go to a fresh folder per test run, never the
# user's cache; set before xdist starts its workers, which inherit it
os.environ.setdefault("LDP_CACHE_DIR", tempfile.mkdtemp(prefix="ldp-test-cache-"))


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """``host:port`` of a running Kafka broker (``$LDP_KAFKA_BOOTSTRAP``, default 127.0.0.1:9092).

    Fails, never skips, when no broker answers: ``scripts/test`` starts one
    with ``ldp kafka up``; by hand, run ``.venv/bin/ldp kafka up`` first.
    """
    from ldp_cli.broker import BrokerError, probe

    bootstrap = os.environ.get("LDP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    try:
        probe(bootstrap, timeout=10.0)
    except BrokerError as exc:
        pytest.fail(
            f"no Kafka broker answers on {bootstrap} ({exc}). Start the project's broker with "
            "`.venv/bin/ldp kafka up` (scripts/test does it), or point LDP_KAFKA_BOOTSTRAP at one.",
            pytrace=False,
        )
    return bootstrap


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that needs the project's broker (the ``kafka_bootstrap`` fixture, directly or through
    another fixture) carries the ``kafka`` marker, so that ``-m "not kafka"`` leaves out exactly those."""
    unmarked = [
        item.nodeid
        for item in items
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()) and item.get_closest_marker("kafka") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests that use the Kafka broker without the `kafka` marker:\n  " + "\n  ".join(unmarked)
        )
