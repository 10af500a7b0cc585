"""The shared binary framing of headed records (ldp_core/wire/framing.py)."""

from __future__ import annotations

import pytest

from ldp_core.wire.framing import HEAD_SIZE, FramingError, has_magic, pack_headed, unpack_headed


def test_a_frame_round_trips_and_keeps_its_layout() -> None:
    frame = pack_headed(b"TEST", b'{"a":1}', b"\x00\x01payload")
    assert frame[:4] == b"TEST" and frame[4] == 1 and frame[5] == 0
    assert int.from_bytes(frame[6:10], "little") == 7 and HEAD_SIZE == 10
    head, payload = unpack_headed(frame, b"TEST", "test record")
    assert head == b'{"a":1}' and bytes(payload) == b"\x00\x01payload"
    assert has_magic(frame, b"TEST") and not has_magic(frame, b"LDPU")
    head, payload = unpack_headed(pack_headed(b"TEST", b"{}"), b"TEST", "test record")
    assert head == b"{}" and bytes(payload) == b""


@pytest.mark.parametrize(
    "bad, message",
    [
        (b"TES", "truncated"),
        (pack_headed(b"ELSE", b"{}"), "not a test record"),
        (pack_headed(b"TEST", b"{}", version=2), "version 2"),
        (pack_headed(b"TEST", b'{"a":1}')[:-1], "runs past the record"),
    ],
)
def test_bad_frames_are_refused_with_what_is_wrong(bad: bytes, message: str) -> None:
    with pytest.raises(FramingError, match=message):
        unpack_headed(bad, b"TEST", "test record")


def test_magic_must_be_four_bytes() -> None:
    with pytest.raises(ValueError, match="4 bytes"):
        pack_headed(b"LONGER", b"{}")


def test_framing_errors_sit_in_the_project_tree() -> None:
    from ldp_core.errors import FrameError, LDPError

    assert issubclass(FramingError, FrameError) and issubclass(FramingError, LDPError)
    assert issubclass(FramingError, ValueError)  # callers that catch ValueError keep catching it


def test_a_caller_can_have_its_own_error_raised_directly() -> None:
    class OwnError(ValueError):
        pass

    with pytest.raises(OwnError, match="not a test record") as info:
        unpack_headed(pack_headed(b"ELSE", b"{}"), b"TEST", "test record", error=OwnError)
    assert info.value.__context__ is None  # raised once, not caught and raised again
    with pytest.raises(OwnError, match="truncated"):
        unpack_headed(b"TES", b"TEST", "test record", error=lambda m: OwnError(m))
