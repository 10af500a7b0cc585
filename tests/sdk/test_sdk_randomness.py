"""The device's randomness: from the OS CSPRNG, traceable to ``os.urandom``, and fork-safe."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from ldp_core.randomness import UrandomBitGenerator, secure_generator
from tests.sdk.test_sdk_client import make_client


def test_a_non_simulation_client_draws_from_os_urandom(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's generator is the urandom bit generator, and its draws are exactly words that
    os.urandom returned: an entropy-seeded PCG64 (np.random.default_rng()) fails both checks."""
    calls: list[int] = []
    pattern = bytes(range(256)) * 16  # 4 KiB, the generator's read-ahead

    def fake_urandom(n: int) -> bytes:
        calls.append(n)
        return (pattern * (n // len(pattern) + 1))[:n]

    monkeypatch.setattr(os, "urandom", fake_urandom)
    client = make_client(tmp_path)
    try:
        assert isinstance(client._rng.bit_generator, UrandomBitGenerator), type(client._rng.bit_generator)
        calls.clear()
        words = client._rng.integers(0, 2**64, size=3, dtype=np.uint64, endpoint=False)
        assert calls, "no draw reached os.urandom"
        expected = struct.unpack("<3Q", pattern[:24])
        # integers(0, 2**64) over uint64 is the raw word itself (no rejection for the full range)
        assert [int(w) for w in words] == list(expected)
    finally:
        client.close()


def test_a_forked_child_does_not_repeat_its_parents_words() -> None:
    """Parent and child draw the next word after a fork: with the read-ahead shared (before the fix)
    both got the same 64 bits; the child must read fresh OS randomness instead. The chance that two
    independent 64-bit words collide is 2^-64."""
    gen = secure_generator()
    gen.integers(0, 2**63)  # fill the 4 KiB read-ahead
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.write(w, struct.pack("<Q", int(gen.integers(0, 2**63))))
        finally:
            os._exit(0)
    os.close(w)
    parent_word = int(gen.integers(0, 2**63))
    child_word = struct.unpack("<Q", os.read(r, 8))[0]
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_word != parent_word
