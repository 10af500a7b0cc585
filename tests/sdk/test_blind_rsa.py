"""ldp_core.tokens.blind_rsa: the RFC 9474 vectors, its refusals, and blindness (the issuer's view is independent
of the message it signs)."""

from __future__ import annotations

import math
import pathlib
from typing import Any

import numpy as np
import pytest

from ldp_core.tokens import blind_rsa
from ldp_core.tokens.blind_rsa import BlindRSAError, PrivateKey, PublicKey
from tests.support.vectors import load_vectors

DOC = load_vectors("blind_rsa_rfc9474.json")
KEY = DOC["key"]


def h(s: str) -> bytes:
    return bytes.fromhex(s)


def vector_key() -> PrivateKey:
    return PrivateKey.from_numbers(*(int(KEY[k], 16) for k in ("p", "q", "e", "d")))


def seeded_bytes(seed: int) -> blind_rsa.RandomBytes:
    rng = np.random.default_rng(seed)
    return lambda k: rng.bytes(k)


@pytest.mark.parametrize("v", DOC["vectors"], ids=lambda v: v["name"])
def test_rfc9474_vectors(v: dict[str, Any]) -> None:
    """RFC 9474 Appendix A, every value byte for byte. The RFC lists ``inv``; the blinding factor is its inverse
    (§4.2 steps 6-7), and PSSZERO is salt length 0."""
    sk = vector_key()
    pk = sk.public_key
    assert pk.n == int(KEY["n"], 16)
    randomized = bool(v["msg_prefix"])
    salt = h(v["salt"])
    prefix = h(v["msg_prefix"])
    prepared = blind_rsa.prepare(h(v["msg"]), randomized=randomized, random_bytes=lambda k: prefix[:k])
    assert prepared == h(v["prepared_msg"])
    assert blind_rsa.emsa_pss_encode(prepared, pk.n.bit_length() - 1, salt) == h(v["encoded_msg"])
    r = pow(int(v["inv"], 16), -1, pk.n)
    blinded, inv = blind_rsa.blind(pk, prepared, salt_len=len(salt), salt=salt, r=r)
    assert blinded == h(v["blinded_msg"])
    assert inv == h(v["inv"])
    blind_sig = blind_rsa.blind_sign(sk, blinded, random_bytes=seeded_bytes(1))
    assert blind_sig == h(v["blind_sig"])
    sig = blind_rsa.finalize(pk, prepared, blind_sig, inv, salt_len=len(salt))
    assert sig == h(v["sig"])
    assert blind_rsa.verify(pk, prepared, sig, salt_len=len(salt))


def test_the_vectors_are_the_four_variants_of_rfc9474_appendix_a() -> None:
    got = {(v["section"], v["name"]) for v in DOC["vectors"]}
    assert got == {
        ("RFC 9474 Appendix A.1", "RSABSSA-SHA384-PSS-Randomized"),
        ("RFC 9474 Appendix A.2", "RSABSSA-SHA384-PSSZERO-Randomized"),
        ("RFC 9474 Appendix A.3", "RSABSSA-SHA384-PSS-Deterministic"),
        ("RFC 9474 Appendix A.4", "RSABSSA-SHA384-PSSZERO-Deterministic"),
    }
    for v in DOC["vectors"]:
        assert len(h(v["salt"])) == (0 if "PSSZERO" in v["name"] else blind_rsa.SALT_LEN)
        assert len(h(v["msg_prefix"])) == (blind_rsa.PREFIX_LEN if "Randomized" in v["name"] else 0)


def test_emsa_pss_encoding_matches_the_vector_after_unblinding() -> None:
    # encoded_msg = blinded · inv^e mod n: the encoding step alone, checked against the vector's numbers
    v, pk = DOC["vectors"][0], vector_key().public_key
    em = blind_rsa.emsa_pss_encode(h(v["prepared_msg"]), pk.n.bit_length() - 1, h(v["salt"]))
    z = int(v["blinded_msg"], 16) * pow(int(v["inv"], 16), pk.e, pk.n) % pk.n
    assert int.from_bytes(em, "big") == z


def test_verify_refuses_a_tampered_signature_or_another_message() -> None:
    v, pk = DOC["vectors"][0], vector_key().public_key
    sig = bytearray(h(v["sig"]))
    assert blind_rsa.verify(pk, h(v["prepared_msg"]), bytes(sig))
    assert not blind_rsa.verify(pk, h(v["msg"]), bytes(sig))  # the prefix is part of what is signed
    sig[100] ^= 1
    assert not blind_rsa.verify(pk, h(v["prepared_msg"]), bytes(sig))


def test_a_key_verifies_with_one_kept_openssl_key_and_still_pickles() -> None:
    """The OpenSSL key a public key verifies with is made once (its Montgomery context kept: a collector verifies
    a token per upload) and is left out of a pickle; the verdicts stay those of a fresh key."""
    import pickle

    v, pk = DOC["vectors"][0], vector_key().public_key
    sig, msg = h(v["sig"]), h(v["prepared_msg"])
    assert blind_rsa.verify(pk, msg, sig) and pk.verifier is pk.verifier
    again = pickle.loads(pickle.dumps(pk))
    assert again == pk and "verifier" not in again.__dict__
    assert blind_rsa.verify(again, msg, sig) and not blind_rsa.verify(again, msg, sig[:-1] + bytes([sig[-1] ^ 1]))
    assert again.verifier is not pk.verifier


def test_finalize_refuses_a_blind_signature_of_something_else() -> None:
    sk = vector_key()
    pk = sk.public_key
    rb = seeded_bytes(2)
    m1, m2 = blind_rsa.prepare(b"one", random_bytes=rb), blind_rsa.prepare(b"two", random_bytes=rb)
    b1, inv1 = blind_rsa.blind(pk, m1, random_bytes=rb)
    b2, _ = blind_rsa.blind(pk, m2, random_bytes=rb)
    with pytest.raises(BlindRSAError, match="does not verify"):
        blind_rsa.finalize(pk, m1, blind_rsa.blind_sign(sk, b2, random_bytes=rb), inv1)
    assert blind_rsa.verify(pk, m1, blind_rsa.finalize(pk, m1, blind_rsa.blind_sign(sk, b1, random_bytes=rb), inv1))


def test_blind_sign_refuses_out_of_range_and_wrong_length() -> None:
    sk = vector_key()
    k = sk.public_key.modulus_len
    with pytest.raises(BlindRSAError, match="out of range"):
        blind_rsa.blind_sign(sk, b"\xff" * k)
    with pytest.raises(BlindRSAError, match="bytes for this key"):
        blind_rsa.blind_sign(sk, b"\x01" * (k - 1))


def test_small_keys_are_refused() -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(BlindRSAError, match="at least 2048"):
        PublicKey.from_cryptography(small.public_key())


def test_key_files_are_0600_and_round_trip(tmp_path: pathlib.Path) -> None:
    sk = vector_key()
    path = tmp_path / "issuer.pem"
    sk.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert PrivateKey.load(path).public_key == sk.public_key
    assert PublicKey.from_der(sk.public_key.to_der()) == sk.public_key
    with pytest.raises(BlindRSAError, match="cannot read"):
        PrivateKey.load(tmp_path / "missing.pem")


# -- blindness ----------------------------------------------------------------------------------
def _jacobi(a: int, n: int) -> int:
    a %= n
    result = 1
    while a:
        while a % 2 == 0:
            a //= 2
            if n % 8 in (3, 5):
                result = -result
        a, n = n, a
        if a % 4 == 3 and n % 4 == 3:
            result = -result
        a %= n
    return result if n == 1 else 0


def test_blindness_structural_every_blinded_value_fits_every_message() -> None:
    """The issuer sees z = m·r^e. For any other message m', r' = r·(m/m')^d gives the same z: the view is
    consistent with every message, with exactly one blinding factor each (r ↦ r^e is a bijection)."""
    sk = vector_key()
    pk = sk.public_key
    d = int(KEY["d"], 16)
    rb = seeded_bytes(3)
    salt = rb(48)
    m1, m2 = b"token message one", b"token message two"
    z, _ = blind_rsa.blind(pk, m1, salt=salt, random_bytes=rb)
    e1 = int.from_bytes(blind_rsa.emsa_pss_encode(m1, pk.n.bit_length() - 1, salt), "big")
    e2 = int.from_bytes(blind_rsa.emsa_pss_encode(m2, pk.n.bit_length() - 1, salt), "big")
    r1 = int.from_bytes(z, "big") * pow(e1, -1, pk.n) % pk.n  # r1^e
    r2 = pow(r1 * pow(e1, 1, pk.n) * pow(e2, -1, pk.n) % pk.n, d, pk.n)  # the r that blinds m2 to the same z
    z2, _ = blind_rsa.blind(pk, m2, salt=salt, r=r2)
    assert z2 == z


def test_blindness_statistical_two_messages_are_indistinguishable() -> None:
    """Blinded values of two fixed messages (fixed salt, so their encodings differ by a known factor) under fresh
    r: their Jacobi symbols and their residues mod 16 and their top byte have the same distribution (the
    distinguishers a curious issuer would try first: the Jacobi symbol passes through m·r^e unless r is uniform).
    Two-sample chi-square at the 0.1% level."""
    pk = vector_key().public_key
    rb = seeded_bytes(4)
    msgs = [b"a" * 48, b"b" * 48]
    while (
        True
    ):  # a salt under which the two encodings have opposite Jacobi symbols: unblinded, one bit tells them apart
        salt = rb(48)
        encs = [int.from_bytes(blind_rsa.emsa_pss_encode(m, pk.n.bit_length() - 1, salt), "big") for m in msgs]
        if _jacobi(encs[0], pk.n) != _jacobi(encs[1], pk.n):
            break
    n_draws = 800
    feats: list[list[tuple[int, int, int]]] = [[], []]
    for i, m in enumerate(msgs):
        for _ in range(n_draws):
            z = int.from_bytes(blind_rsa.blind(pk, m, salt=salt, random_bytes=rb)[0], "big")
            feats[i].append((_jacobi(z, pk.n), z % 16, z >> (pk.n.bit_length() - 4)))
    crit = {1: 10.83, 15: 37.70}  # chi-square 99.9% quantiles for 1 and 15 degrees of freedom
    for j, bins in ((0, [-1, 1]), (1, list(range(16)))):
        counts = np.array([[sum(1 for f in feats[i] if f[j] == b) for b in bins] for i in range(2)], dtype=float)
        expected = counts.sum(axis=0) / 2
        chi2 = float((((counts - expected) ** 2) / np.where(expected > 0, expected, 1)).sum())
        assert chi2 < crit[len(bins) - 1], (j, counts)
    # and each sample's Jacobi symbols are balanced (binomial, 4 standard deviations)
    for i in range(2):
        plus = sum(1 for f in feats[i] if f[0] == 1)
        assert abs(plus - n_draws / 2) < 4 * math.sqrt(n_draws / 4)
