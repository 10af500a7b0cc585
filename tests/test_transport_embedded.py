"""The transport contract against the embedded SQLite log, and what only the embedded log does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.transport_contract import TransportContract


class TestEmbeddedTransport(TransportContract):
    @pytest.fixture
    def transport_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'log.sqlite3'}"
