"""The transport contract against the Kafka broker started by ``ldp kafka up``."""

from __future__ import annotations

import pytest

from tests.transport_contract import TransportContract

pytestmark = pytest.mark.kafka


class TestKafkaTransport(TransportContract):
    @pytest.fixture
    def transport_url(self, kafka_bootstrap: str) -> str:
        return f"kafka://{kafka_bootstrap}"
