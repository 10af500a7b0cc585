"""Device enrollment (ldp_core/tokens/enrollment.py): credentials, request signatures, replay, key files.

Each check plays a forger: a credential edited after signing, one from another authority, an expired
one, a request replayed, re-targeted, re-timed or with another body."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from ldp_core.tokens.enrollment import (
    CREDENTIAL_HEADER,
    SIGNATURE_HEADER,
    Credential,
    DeviceIdentity,
    EnrollmentAuthority,
    EnrollmentError,
    RequestVerifier,
    verify_document,
)

NOW = 1_800_000_000.0


def _authority(seed: int = 1) -> EnrollmentAuthority:
    return EnrollmentAuthority(np.random.default_rng(seed).bytes(32))


def test_a_credential_verifies_only_unchanged_from_its_authority_and_in_time() -> None:
    auth = _authority()
    dev = auth.enroll("dev-1", now=NOW, lifetime=3600)
    cred = dev.credential
    cred.verify([auth.public_key], NOW + 10)
    assert Credential.from_header(cred.to_header()) == cred
    forged = [
        (dataclasses.replace(cred, device_id="dev-2"), "bad_signature"),
        (dataclasses.replace(cred, expires_at=cred.expires_at + 10**6), "bad_signature"),
        (dataclasses.replace(cred, public_key=os.urandom(32)), "bad_signature"),
        (_authority(2).enroll("dev-1", now=NOW).credential, "unknown_authority"),
    ]
    for c, reason in forged:
        with pytest.raises(EnrollmentError) as e:
            c.verify([auth.public_key], NOW)
        assert e.value.reason == reason
    with pytest.raises(EnrollmentError) as e:
        cred.verify([auth.public_key], NOW + 3600)
    assert e.value.reason == "expired"
    with pytest.raises(EnrollmentError, match="another key"):
        DeviceIdentity(os.urandom(32), cred, auth.public_key)


def test_a_device_that_makes_its_own_key_gets_it_certified_without_sending_it() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    auth = _authority()
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    dev = DeviceIdentity(raw, auth.certify("phone-7", pub, now=NOW), auth.public_key)
    dev.credential.verify([auth.public_key], NOW)


def test_request_signatures_refuse_replay_other_targets_bodies_and_old_timestamps() -> None:
    auth = _authority()
    dev = auth.enroll("dev-1", now=NOW)
    clock = [NOW]
    v = RequestVerifier([auth.public_key], max_skew=60, clock=lambda: clock[0])
    target = "/v1/fl/tasks/t/round?client_id=dev-1"
    h = dev.sign_request("GET", target, now=NOW)
    assert set(h) == {CREDENTIAL_HEADER, SIGNATURE_HEADER}
    assert v.verify("GET", target, b"", h).device_id == "dev-1"

    def reason(method: str, tgt: str, body: bytes, headers: dict[str, str]) -> str:
        with pytest.raises(EnrollmentError) as e:
            v.verify(method, tgt, body, headers)
        return e.value.reason

    assert reason("GET", target, b"", h) == "replayed"
    h2 = dev.sign_request("GET", target, now=NOW)
    assert reason("GET", target.replace("dev-1", "dev-2"), b"", h2) == "bad_signature"
    assert reason("POST", target, b"", h2) == "bad_signature"
    h3 = dev.sign_request("POST", "/up", b"body", now=NOW)
    assert reason("POST", "/up", b"bodx", h3) == "bad_signature"
    assert v.verify("POST", "/up", b"body", h3).device_id == "dev-1"
    clock[0] = NOW + 61
    assert reason("GET", target, b"", dev.sign_request("GET", target, now=NOW)) == "stale"
    assert reason("GET", target, b"", {}) == "missing"
    other = _authority(3).enroll("dev-1", now=NOW + 61)
    assert reason("GET", target, b"", other.sign_request("GET", target, now=NOW + 61)) == "unknown_authority"


def test_key_files_are_private_and_round_trip(tmp_path: Path) -> None:
    auth = _authority()
    auth.save(tmp_path / "authority.json")
    dev = auth.enroll("dev-1", now=NOW)
    dev.save(tmp_path / "dev.json")
    for f in ("authority.json", "dev.json"):
        assert stat.S_IMODE((tmp_path / f).stat().st_mode) & 0o077 == 0
    assert EnrollmentAuthority.load(tmp_path / "authority.json").public_key == auth.public_key
    back = DeviceIdentity.load(tmp_path / "dev.json")
    assert back.credential == dev.credential and back.authority_key == auth.public_key
    with pytest.raises(EnrollmentError) as e:
        DeviceIdentity.load(tmp_path / "missing.json")
    assert e.value.reason == "missing"
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(EnrollmentError, match="not an ldp-device-identity"):
        DeviceIdentity.load(tmp_path / "bad.json")


def test_documents_verify_only_unchanged() -> None:
    auth = _authority()
    doc = {"task": "t", "secagg_threshold": 3}
    sig = auth.sign_document(doc)
    assert verify_document(auth.public_key, doc, sig)
    assert not verify_document(auth.public_key, {**doc, "secagg_threshold": 2}, sig)
    assert not verify_document(_authority(2).public_key, doc, sig)
