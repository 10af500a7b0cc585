"""A member polling in short slices must finish its group join (kafka-python 3.0.12's join bookkeeping).

kafka-python 3 runs a JoinGroup/SyncGroup round as a task on its network thread and applies the result (the
assignment, the heartbeats, the stable state) only in a ``poll()`` that awaits the task. A round that completes
between two polls is dropped: if ``rejoin_needed`` asked for it, the next poll sends another JoinGroup (one more
rebalance of the group); if a change of the topics' metadata asked for it (the usual case for a member that
joins right after it subscribed: its first assignment is made before its client knows the topic's partitions),
the leader's assignment has refreshed the metadata snapshot that asked, nothing asks again, and the member
keeps no partitions and sends no heartbeats until the group expels it. Found on kafka-python 3.0.12 with the
transport contract's 0.1 s polls (1 run in 3 received nothing for 45 s).

The transport fetches the topics' metadata right after subscribing (the first join then assigns from it) and
does not return from ``poll()`` while a join of its member is under way (up to a session timeout). Played
here with the shortest polls there are, ``timeout=0`` with 50 ms of other work between them, so that the
join's answers always arrive outside ``poll()``; on kafka-python 3.0.12 without the two measures the member
received nothing.
"""

from __future__ import annotations

import time
import uuid

import pytest

from pipeline.transport.kafka import KafkaTransport

pytestmark = pytest.mark.kafka

N = 20


def _poll_in_slices(consumers: list, want: int, timeout: float = 20.0) -> list[list[bytes]]:  # type: ignore[type-arg]
    got: list[list[bytes]] = [[] for _ in consumers]
    end = time.monotonic() + timeout
    while sum(map(len, got)) < want and time.monotonic() < end:
        for i, c in enumerate(consumers):
            got[i].extend(r.value for r in c.poll(max_records=100, timeout=0))
        time.sleep(0.05)  # the worker's own work between polls
    return got


def test_a_new_member_polling_in_short_slices_gets_its_partitions(kafka_bootstrap: str) -> None:
    transport = KafkaTransport(kafka_bootstrap, request_timeout=15.0)
    try:
        for _ in range(3):
            topic = f"join-{uuid.uuid4().hex[:8]}"
            transport.create_topic(topic, 3)
            transport.publish_many(topic, [(b"k%d" % i, b"v%d" % i) for i in range(N)])
            with transport.consume(topic, f"g-{topic}", session_timeout=5.0) as c:
                (got,) = _poll_in_slices([c], N)
                assert sorted(got) == sorted(b"v%d" % i for i in range(N)), f"received {len(got)} of {N}"
                assert len(c.assignment()) == 3
    finally:
        transport.close()


def test_two_members_polling_in_short_slices_share_the_partitions(kafka_bootstrap: str) -> None:
    transport = KafkaTransport(kafka_bootstrap, request_timeout=15.0)
    topic = f"join2-{uuid.uuid4().hex[:8]}"
    try:
        transport.create_topic(topic, 4)
        transport.publish_many(topic, [(b"k%d" % i, b"v%d" % i) for i in range(N)])
        with (
            transport.consume(topic, f"g-{topic}", member="a", session_timeout=5.0) as a,
            transport.consume(topic, f"g-{topic}", member="b", session_timeout=5.0) as b,
        ):
            want = {b"v%d" % i for i in range(N)}
            seen: set[bytes] = set()
            end = time.monotonic() + 30
            while time.monotonic() < end and (seen != want or {len(a.assignment()), len(b.assignment())} != {2}):
                for part in _poll_in_slices([a, b], N, timeout=0.5):
                    seen.update(part)
            assert seen == want, f"received {len(seen)} of {N}"
            assert len(a.assignment()) == len(b.assignment()) == 2
    finally:
        transport.close()
