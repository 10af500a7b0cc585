"""ldp_core.wire.hpke against RFC 9180's own test vectors, and against cryptography's HPKE (interop)."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ldp_core.wire import hpke
from tests.support.vectors import load_vectors

VECTORS = load_vectors("hpke_rfc9180.json")["vectors"]


def h(x: str) -> bytes:
    return bytes.fromhex(x)


@pytest.mark.parametrize("v", VECTORS, ids=[v["source"] for v in VECTORS])
def test_rfc9180_base_vectors(v: dict[str, Any]) -> None:
    assert (v["mode"], v["kem_id"], v["kdf_id"]) == (0, 0x20, 1)
    suite = hpke.Suite(v["aead_id"])
    skr, pkr = hpke.derive_key_pair(h(v["ikmR"]))
    assert (skr.hex(), pkr.hex()) == (v["skRm"], v["pkRm"])
    ske, pke = hpke.derive_key_pair(h(v["ikmE"]))
    assert (ske.hex(), pke.hex()) == (v["skEm"], v["pkEm"])
    shared, enc = suite.encap(pkr, h(v["ikmE"]))
    assert enc.hex() == v["enc"]
    assert shared.hex() == v["shared_secret"]
    assert suite.key_schedule_context(h(v["info"])).hex() == v["key_schedule_context"]
    key, base_nonce, secret = suite._schedule(shared, h(v["info"]))
    assert (key.hex(), base_nonce.hex(), secret.hex()) == (v["key"], v["base_nonce"], v["secret"])
    enc2, sender = suite.setup_sender(pkr, h(v["info"]), h(v["ikmE"]))
    receiver = suite.setup_receiver(enc2, X25519PrivateKey.from_private_bytes(skr), pkr, h(v["info"]))
    assert suite.decap(enc2, X25519PrivateKey.from_private_bytes(skr), pkr).hex() == v["shared_secret"]
    for e in v["encryptions"]:
        seq = e["sequence_number"]
        assert sender.nonce(seq).hex() == e["nonce"]
        assert sender.seal(h(e["pt"]), h(e["aad"]), seq=seq).hex() == e["ct"]
        assert receiver.open(h(e["ct"]), h(e["aad"]), seq=seq).hex() == e["pt"]
    for x in v["exports"]:
        assert sender.export(h(x["exporter_context"]), x["L"]).hex() == x["exported_value"]
        assert receiver.export(h(x["exporter_context"]), x["L"]).hex() == x["exported_value"]


def test_sequence_numbers_advance_like_the_vectors() -> None:
    v = VECTORS[0]
    suite = hpke.Suite(v["aead_id"])
    _, pkr = hpke.derive_key_pair(h(v["ikmR"]))
    _, sender = suite.setup_sender(pkr, h(v["info"]), h(v["ikmE"]))
    first = [e for e in v["encryptions"] if e["sequence_number"] in (0, 1, 2)]
    assert [sender.seal(h(e["pt"]), h(e["aad"])).hex() for e in first] == [e["ct"] for e in first]


def test_open_refuses_a_wrong_info_aad_key_or_altered_bytes() -> None:
    suite = hpke.Suite()
    skr = X25519PrivateKey.generate()
    pkr = skr.public_key().public_bytes_raw()
    msg = suite.seal(pkr, b"info", b"report", b"aad")
    assert suite.open(skr, pkr, b"info", msg, b"aad") == b"report"
    other = X25519PrivateKey.generate()
    for args in [
        (skr, pkr, b"inf0", msg, b"aad"),
        (skr, pkr, b"info", msg, b"aaD"),
        (other, other.public_key().public_bytes_raw(), b"info", msg, b"aad"),
        (skr, pkr, b"info", msg[:-1] + bytes([msg[-1] ^ 1]), b"aad"),
        (skr, pkr, b"info", bytes([msg[0] ^ 1]) + msg[1:], b"aad"),
    ]:
        with pytest.raises(hpke.HPKEError):
            suite.open(*args)


@pytest.mark.parametrize("aead", [hpke.AEAD_AES_128_GCM, hpke.AEAD_CHACHA20_POLY1305])
def test_interoperates_with_cryptography_hpke(aead: int) -> None:
    fast = hpke.fast_suite(aead)
    assert fast is not None, "this environment's cryptography has an HPKE module (>= 46): the interop must be tested"
    suite = hpke.Suite(aead)
    skr = X25519PrivateKey.generate()
    pkr = skr.public_key().public_bytes_raw()
    ours = suite.seal(pkr, b"ldp info", b"eight by")
    assert fast.decrypt(ours, skr, b"ldp info") == b"eight by"
    theirs = fast.encrypt(b"eight by", skr.public_key(), b"ldp info")
    assert suite.open(skr, pkr, b"ldp info", theirs) == b"eight by"
    assert len(ours) == len(theirs) == 32 + 8 + 16


def test_the_single_shot_opener_opens_what_both_implementations_seal_and_nothing_else() -> None:
    suite = hpke.Suite()
    skr = X25519PrivateKey.generate()
    pkr = skr.public_key().public_bytes_raw()
    open_ = hpke.single_shot_opener(suite, skr, pkr, b"ctx")
    assert open_(suite.seal(pkr, b"ctx", b"abc")) == b"abc"
    fast = hpke.fast_suite()
    assert fast is not None
    assert open_(fast.encrypt(b"xyz", skr.public_key(), b"ctx")) == b"xyz"
    for bad in [suite.seal(pkr, b"other ctx", b"abc"), suite.seal(pkr, b"ctx", b"abc", b"aad"), b"\x00" * 47]:
        with pytest.raises(hpke.HPKEError):
            open_(bad)
    # the RFC vector's first message, re-sealed under its key schedule with an empty aad, opens the same way
    v = VECTORS[0]
    skm, pkm = hpke.derive_key_pair(h(v["ikmR"]))
    enc, ctx = suite.setup_sender(pkm, h(v["info"]), h(v["ikmE"]))
    msg = enc + ctx.seal(h(v["encryptions"][0]["pt"]))
    opener = hpke.single_shot_opener(suite, X25519PrivateKey.from_private_bytes(skm), pkm, h(v["info"]))
    assert opener(msg).hex() == v["encryptions"][0]["pt"]


@pytest.mark.parametrize("aead", [hpke.AEAD_AES_128_GCM, hpke.AEAD_CHACHA20_POLY1305])
def test_the_single_shot_opener_agrees_with_suite_open(aead: int) -> None:
    suite = hpke.Suite(aead)
    skr = X25519PrivateKey.generate()
    pkr = skr.public_key().public_bytes_raw()
    open_ = hpke.single_shot_opener(suite, skr, pkr, b"info")
    for i in range(50):
        pt = bytes([i]) * (i % 9)
        msg = suite.seal(pkr, b"info", pt)
        assert open_(msg) == suite.open(skr, pkr, b"info", msg) == pt
        bad = bytearray(msg)
        bad[32 + i % (len(msg) - 32)] ^= 0x40  # one altered ciphertext or tag bit
        with pytest.raises(hpke.HPKEError):
            open_(bytes(bad))
    with pytest.raises(hpke.HPKEError):  # a low-order point as enc: the exchange's output would be zero
        open_(bytes(32) + bytes(16))
