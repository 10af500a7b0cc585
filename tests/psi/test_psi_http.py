"""Private set intersection over real HTTP (estimator.psi): exact results, and nothing beyond them.

The library's false-positive rate is the server's ``fpr`` (default 1e-9): the probability that any
item of the client's whole query is wrongly reported as common. So an exact comparison fails by chance
with probability at most 1e-9 per query.
"""

from __future__ import annotations

import hashlib

import httpx
import pytest

from estimator.psi.http import create_app, run_client
from estimator.psi.protocol import PsiClient, PsiError, PsiServer
from tests.support.collector_support import ServerThread


def _cohort(prefix: str, start: int, stop: int) -> list[str]:
    return [f"{prefix}-{i:07d}" for i in range(start, stop)]


class RecordingServer(PsiServer):
    """The real server, keeping every request body it received (what the server party sees)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.seen: list[bytes] = []

    def answer(self, request_bytes: bytes) -> bytes:
        self.seen.append(request_bytes)
        return super().answer(request_bytes)


CLIENT = _cohort("device", 0, 600)
COMMON = set(_cohort("device", 380, 600))
SERVER = _cohort("device", 380, 600) + _cohort("other-org-device", 0, 700)


def test_intersection_is_exact_over_http():
    with ServerThread(create_app(PsiServer(SERVER))) as srv:
        r = run_client(srv.url, CLIENT)
    assert set(r["intersection"]) == COMMON
    assert r["intersection_size"] == len(COMMON)
    assert r["request_bytes"] > 0 and r["answer_bytes"] > 0


def test_cardinality_mode_gives_only_the_size():
    with ServerThread(create_app(PsiServer(SERVER, mode="cardinality"))) as srv:
        r = run_client(srv.url, CLIENT, mode="cardinality")
    assert r["intersection_size"] == len(COMMON)
    assert r["intersection"] is None


def test_client_output_does_not_depend_on_the_servers_other_items():
    """Two servers with the same common items and the same number of others, but different others: the
    client's result is the same, so it learns nothing about the items outside the intersection."""
    others_b = [f"unrelated-{i}" for i in range(700)]
    outs = []
    for server_items in (SERVER, sorted(COMMON) + others_b):
        for mode in ("intersection", "cardinality"):
            with ServerThread(create_app(PsiServer(server_items, mode=mode))) as srv:
                r = run_client(srv.url, CLIENT, mode=mode)
            outs.append((mode, r["intersection_size"], r["intersection"]))
    assert outs[:2] == outs[2:]


def test_server_sees_neither_the_items_nor_their_plain_hashes():
    """The request bodies the server received over HTTP contain no item and no SHA-256/SHA-1/MD5/BLAKE2b
    of one, and two queries of the same items share no element: each is blinded by a fresh client key, so
    the server cannot match them against a dictionary of hashed candidates."""
    server = RecordingServer(SERVER)
    with ServerThread(create_app(server)) as srv:
        run_client(srv.url, CLIENT)
        run_client(srv.url, CLIENT)
    assert len(server.seen) == 2
    body = server.seen[0]
    for item in CLIENT[:200] + sorted(COMMON)[:200]:
        raw = item.encode()
        assert raw not in body
        for h in (hashlib.sha256, hashlib.sha1, hashlib.md5, hashlib.blake2b):
            assert h(raw).digest()[:16] not in body
    import private_set_intersection.python as psi

    first, second = psi.Request(), psi.Request()
    first.ParseFromString(server.seen[0])
    second.ParseFromString(server.seen[1])
    assert len(first.encrypted_elements) == len(CLIENT)
    assert not set(first.encrypted_elements) & set(second.encrypted_elements)


def test_a_client_cannot_ask_a_cardinality_server_for_the_items():
    """A client that sends an intersection-mode request straight to a cardinality-only server (skipping
    the mode check of the honest client) is refused with 409."""
    with ServerThread(create_app(PsiServer(SERVER, mode="cardinality"))) as srv:
        body = PsiClient(CLIENT, "intersection").request()
        resp = httpx.post(f"{srv.url}/v1/psi", content=body)
        assert resp.status_code == 409
        with pytest.raises(PsiError, match="cardinality mode"):
            run_client(srv.url, CLIENT, mode="intersection")


def test_bad_and_oversized_requests_are_refused():
    with ServerThread(create_app(PsiServer(SERVER, max_client_items=100))) as srv:
        assert httpx.post(f"{srv.url}/v1/psi", content=b"\x00garbage").status_code == 400
        big = PsiClient(CLIENT, "intersection").request()
        assert httpx.post(f"{srv.url}/v1/psi", content=big).status_code == 413
        with pytest.raises(PsiError, match="413"):
            run_client(srv.url, CLIENT)
