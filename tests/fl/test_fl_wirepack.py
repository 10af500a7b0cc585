"""Packed ring words on the wire (issue 18): a compressed SecAgg round's masked input travels r bits per
word, r the signed ring width; the decoders refuse every other width, length or padding."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ldp_core.fl.errors import UpdateRejected
from ldp_core.fl.protocol import (
    RoundState,
    check_upload_against,
    encode_upload,
    encode_upload_binary,
    make_upload,
    pack_words,
    packed_size,
    parse_upload,
    unpack_words,
)
from ldp_core.wire.framing import unpack_headed


@settings(max_examples=300, deadline=None)
@given(bits=st.integers(1, 32), length=st.integers(1, 700), seed=st.integers(0, 2**32 - 1))
def test_pack_unpack_round_trip(bits: int, length: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 1 << bits, size=length, dtype=np.uint64).astype(np.uint32)
    raw = pack_words(w, bits)
    assert len(raw) == packed_size(length, bits) == -(-length * bits // 8)
    back = unpack_words(raw, length, bits)
    assert back.dtype == np.uint32 and np.array_equal(back, w)


def test_packing_is_little_endian_bit_order() -> None:
    """Word i's bit k is stream bit i·r + k, least significant bit first in each byte: 3-bit words 5, 3, 7
    are the stream bits 1,0,1 | 1,1,0 | 1,1,1 (each word LSB first), so byte 0 holds bits 0-7 of the stream,
    1 + 4 + 8 + 16 + 64 + 128 = 0b11011101, and byte 1 the last bit, 0b00000001."""
    assert pack_words(np.array([5, 3, 7], np.uint32), 3) == bytes([0b11011101, 0b00000001])
    # 32 bits is the raw little-endian uint32 form
    w = np.array([1, 2**32 - 1, 0x12345678], np.uint32)
    assert pack_words(w, 32) == w.astype("<u4").tobytes()


@pytest.mark.parametrize("bits", [1, 5, 9, 31])
def test_unpack_refuses_wrong_lengths_and_padding(bits: int) -> None:
    length = 13  # 13·bits is not a multiple of 8 for these widths: the last byte has padding bits
    assert (length * bits) % 8
    w = np.arange(length, dtype=np.uint32) % (1 << bits)
    raw = pack_words(w, bits)
    with pytest.raises(UpdateRejected, match="exactly") as e:
        unpack_words(raw[:-1], length, bits)
    assert e.value.reason == "wrong_shape"
    with pytest.raises(UpdateRejected, match="exactly"):
        unpack_words(raw + b"\0", length, bits)
    spoiled = raw[:-1] + bytes([raw[-1] | 0x80])  # the top bit of the last byte is padding
    with pytest.raises(UpdateRejected, match="padding bits") as e:
        unpack_words(spoiled, length, bits)
    assert e.value.reason == "malformed"


def test_pack_refuses_words_outside_the_ring() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        pack_words(np.array([0, 1 << 9], np.uint32), 9)
    with pytest.raises(ValueError, match="1 to 32"):
        pack_words(np.zeros(3, np.uint32), 0)


# -- uploads ------------------------------------------------------------------------------------
RING = 9
LENGTH = 5  # unrotated: the round masks the 5 parameters themselves; 45 bits, 6 bytes, 3 padding bits


def _state(compression: dict[str, Any] | None) -> RoundState:
    secagg: dict[str, Any] = {"neighbors": {"1": [2, 3]}, "vector_length": LENGTH, "sharers": [1, 2, 3]}
    if compression is not None:
        secagg["compression"] = compression
    return RoundState(
        task="wp",
        seq=1,
        round=0,
        phase="masked",
        rounds=1,
        model={"kind": "logistic", "n_features": 4, "l2": 0.0},
        params=np.zeros(LENGTH, np.float32),
        selected=("dev-0", "dev-1", "dev-2"),
        secagg=secagg,
        indices={"dev-0": 1, "dev-1": 2, "dev-2": 3},
    )


COMPRESSED = {"kind": "quantize", "bits": 6, "rotate": False, "clip": 0.5, "ring_bits": RING, "rotation_seed": 1}


def _words() -> np.ndarray:
    return np.array([0, 1, 2**RING - 1, 300, 77], np.uint32)


def test_packed_upload_round_trips_in_both_forms_and_passes_the_round() -> None:
    u = make_upload("wp", 0, "masked", "dev-0", {"vector": _words(), "ring_bits": RING})
    for body in (encode_upload_binary(u), encode_upload(u)):
        back = parse_upload(body, payload_size=LENGTH)
        assert back.upload_id == u.upload_id and back.payload["ring_bits"] == RING
        assert np.array_equal(back.payload["vector"], _words())
        check_upload_against(back, _state(COMPRESSED))
    head, raw = unpack_headed(encode_upload_binary(u), b"LDPU", "upload")
    assert json.loads(head)["payload"] == {"ring_bits": RING, "length": LENGTH}
    assert len(raw) == packed_size(LENGTH, RING) == 6  # ⌈5·9/8⌉, not 4·5 = 20


def _binary_with(u: Any, header_payload: dict[str, Any] | None = None, raw: bytes | None = None) -> bytes:
    head, body_raw = unpack_headed(encode_upload_binary(u), b"LDPU", "upload")
    h = json.loads(head)
    if header_payload is not None:
        h["payload"] = header_payload
    from ldp_core.wire.framing import pack_headed

    return pack_headed(b"LDPU", json.dumps(h).encode(), body_raw if raw is None else raw)


def test_adversarial_packed_uploads_are_refused() -> None:
    u = make_upload("wp", 0, "masked", "dev-0", {"vector": _words(), "ring_bits": RING})
    raw = pack_words(_words(), RING)
    cases = [
        (_binary_with(u, raw=raw[:-1]), "wrong_shape", "exactly 6"),  # truncated
        (_binary_with(u, raw=raw + b"\0"), "wrong_shape", "exactly 6"),  # a byte too many
        (_binary_with(u, raw=raw[:-1] + bytes([raw[-1] | 0x20])), "malformed", "padding bits"),
        (_binary_with(u, {"ring_bits": 33, "length": LENGTH}), "malformed", "ring_bits"),
        (_binary_with(u, {"ring_bits": 0, "length": LENGTH}), "malformed", "ring_bits"),
        (_binary_with(u, {"ring_bits": RING}), "malformed", "length"),
        (_binary_with(u, {"ring_bits": RING, "length": 9}), "wrong_shape", "declares 9 words"),
        # the same bytes read as 10-bit words are 48 bits of data for 50: the byte count no longer fits
        (_binary_with(u, {"ring_bits": 10, "length": LENGTH}), "wrong_shape", "exactly 7"),
    ]
    for body, reason, match in cases:
        with pytest.raises(UpdateRejected, match=match) as e:
            parse_upload(body, payload_size=LENGTH)
        assert e.value.reason == reason
    # the JSON form: a truncated base64 vector
    obj = json.loads(encode_upload(u))
    obj["payload"]["vector"] = base64.b64encode(raw[:-1]).decode()
    with pytest.raises(UpdateRejected, match="exactly 6") as e:
        parse_upload(json.dumps(obj).encode(), payload_size=LENGTH)
    assert e.value.reason == "wrong_shape"


def test_the_round_refuses_other_widths_and_words_outside_the_ring() -> None:
    comp = _state(COMPRESSED)
    wide = make_upload("wp", 0, "masked", "dev-0", {"vector": _words(), "ring_bits": RING + 1})
    wide = parse_upload(encode_upload_binary(wide), payload_size=LENGTH)  # well formed: 10-bit words
    with pytest.raises(UpdateRejected, match="packed at 10 bits.*ring is 9 bits") as e:
        check_upload_against(wide, comp)
    assert e.value.reason == "bad_secagg"
    # a well-formed packed input of another length (parsing allows up to the padding, 8: a count sketch
    # masks fewer words than the update has); the round holds it to its own
    other = make_upload("wp", 0, "masked", "dev-0", {"vector": np.arange(7, dtype=np.uint32), "ring_bits": RING})
    other = parse_upload(encode_upload_binary(other), payload_size=LENGTH)
    with pytest.raises(UpdateRejected, match="7 words; the round masks 5") as e:
        check_upload_against(other, comp)
    assert e.value.reason == "bad_secagg"
    # the unpacked uint32 form in a compressed round, with a word ≥ 2^9 (it would wrap into the ring sum)
    legacy = make_upload("wp", 0, "masked", "dev-0", {"vector": np.array([0, 1, 2**20, 3, 4], np.uint32)})
    legacy = parse_upload(encode_upload_binary(legacy), payload_size=LENGTH)
    with pytest.raises(UpdateRejected, match="unpacked uint32 words; this round's ring is Z_\\(2\\^9\\)"):
        check_upload_against(legacy, comp)
    # a packed input in a round that is not compressed (the unpacked form stays the only one there)
    packed = parse_upload(
        encode_upload_binary(make_upload("wp", 0, "masked", "dev-0", {"vector": _words(), "ring_bits": RING})),
        payload_size=LENGTH,
    )
    with pytest.raises(UpdateRejected, match="unpacked uint32 words") as e:
        check_upload_against(packed, _state(None))
    assert e.value.reason == "bad_secagg"
    check_upload_against(legacy, _state(None))  # the uncompressed path is unchanged
    # an in-process Upload object (never parsed) with a word outside the ring: refused, not reduced
    forged = make_upload("wp", 0, "masked", "dev-0", {"vector": _words(), "ring_bits": RING})
    bad = type(forged)(
        **{**forged.__dict__, "payload": {"vector": np.array([0, 1, 2**9, 3, 4], np.uint32), "ring_bits": RING}}
    )
    with pytest.raises(UpdateRejected, match="outside the ring"):
        check_upload_against(bad, comp)


def test_the_uncompressed_upload_format_is_unchanged() -> None:
    """No ``ring_bits``: 4 bytes per word, the header payload empty, the upload id of version 1."""
    w = np.array([1, 2**32 - 1, 7], np.uint32)
    u = make_upload("wp", 0, "masked", "dev-0", {"vector": w})
    head, raw = unpack_headed(encode_upload_binary(u), b"LDPU", "upload")
    assert json.loads(head)["payload"] == {} and raw == w.astype("<u4").tobytes()
    assert json.loads(encode_upload(u))["payload"] == {"vector": base64.b64encode(raw).decode()}
