"""The Privacy Pass token type 0x0002 test vector of RFC 9578 Appendix A.2, byte for byte: the issuer key's
RFC 9578 §6.5 encoding and its ``token_key_id``, the blinded request, the issuer's response and the token.

The vector's ``token_request`` carries ``token_key_id[0]`` as its truncated key id, while RFC 9578 §6.1 defines it
as the last byte; this project follows the text (docs/TOKENS.md), and
:func:`test_the_vector_truncates_the_key_id_to_its_first_byte` records the difference so that it is not
mistaken for a bug on either side.
"""

from __future__ import annotations

import hashlib
import struct

import pytest

from ldp_core.tokens import blind_rsa
from ldp_core.tokens import privacy_pass as tokens
from ldp_core.tokens.blind_rsa import BlindRSAError, PrivateKey, PublicKey
from tests.support.vectors import load_vectors

V = load_vectors("privacypass_rfc9578.json")["vector"]


def h(name: str) -> bytes:
    return bytes.fromhex(V[name])


def key() -> PrivateKey:
    return PrivateKey.from_pem(h("skS"))


def test_the_issuer_key_encoding_is_rfc9578s_pkS() -> None:
    pk = key().public_key
    assert pk.to_pss_spki() == h("pkS")
    assert pk.to_der() != h("pkS")  # the rsaEncryption form hashes to another id
    assert PublicKey.from_der(h("pkS")) == pk


def test_token_key_id_is_sha256_of_pkS_and_the_token_carries_it() -> None:
    pk = key().public_key
    token = h("token")
    assert pk.key_id() == hashlib.sha256(h("pkS")).digest()
    assert tokens.Token.from_bytes(token).token_key_id == pk.key_id()


def test_the_whole_issuance_reproduces_the_vector() -> None:
    sk = key()
    pk = sk.public_key
    nonce, digest = h("nonce"), hashlib.sha256(h("token_challenge")).digest()
    msg = tokens.token_input(nonce, digest, pk.key_id())
    blinded, inv = blind_rsa.blind(pk, msg, salt=h("salt"), r=int(V["blind"], 16))
    assert blinded == h("token_request")[3:]
    assert struct.unpack(">H", h("token_request")[:2])[0] == tokens.TOKEN_TYPE
    blind_sig = blind_rsa.blind_sign(sk, blinded)
    assert blind_sig == h("token_response")
    pending = tokens.PendingToken("2026-01-01", nonce, digest, pk.key_id(), inv, h("token_request"))
    token = tokens.finish(pk, pending, blind_sig)
    assert token.to_bytes() == h("token")
    assert tokens.Token.from_bytes(h("token")).verify(pk)


def test_the_vector_truncates_the_key_id_to_its_first_byte() -> None:
    kid = key().public_key.key_id()
    truncated, _ = tokens.parse_token_request(h("token_request"))
    assert truncated == kid[0] == 0xF8 and kid[-1] == 0x21
    pending = tokens.begin(key().public_key, issuer_name="i", origin="o", day="2026-01-01")
    assert pending.request[2] == kid[-1]  # ours follows RFC 9578 §6.1's text


def test_a_pss_key_with_other_parameters_is_refused() -> None:
    other = bytearray(h("pkS"))
    i = other.index(bytes.fromhex("a203020130"))  # saltLength [2] 48
    other[i + 4] = 32
    with pytest.raises(BlindRSAError, match="salt length 48"):
        PublicKey.from_der(bytes(other))
    with pytest.raises(BlindRSAError, match="not an RSA public key"):
        PublicKey.from_der(h("pkS")[:-1])  # truncated
    with pytest.raises(BlindRSAError, match="bytes after"):
        PublicKey.from_der(h("pkS") + b"\x00")
