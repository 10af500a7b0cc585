"""The key-party committee of an HE aggregation: key generation (n-of-n, or t-of-n with the Shamir
sharing round, optionally the collective relinearisation key) and threshold decryption of aggregates."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ldp_core.he.relin import collective_relin_keys, rkg_gadget_count
from ldp_core.he.shamir import ShamirKeyParty, combine_threshold, setup_shamir
from ldp_core.he.threshold import CkksContext, HeError, KeyParty, MissingShareError, collective_public_key, combine

__all__ = ["decrypt_all", "setup_committee"]


def setup_committee(
    ctx: CkksContext, key_parties: int, threshold: int | None, key_dropouts: int, relin: bool = False
) -> tuple[list[KeyParty], Any, dict[str, Any], Any]:
    """Key generation (and, for t-of-n, the Shamir sharing round; with ``relin``, the collective
    relinearisation key, among all n parties); returns the parties that answer at decryption time (all
    but the last ``key_dropouts``), the collective public key, setup figures and the relinearisation key
    (or None)."""
    if threshold is None and key_dropouts:
        raise MissingShareError("n-of-n decryption cannot go without a key party: give a threshold t < n")
    if threshold is not None and not 2 <= threshold <= key_parties:
        raise HeError(f"the threshold must be between 2 and the {key_parties} key parties, not {threshold}")
    if not 0 <= key_dropouts <= key_parties - (threshold or key_parties):
        raise MissingShareError(
            f"{key_dropouts} of {key_parties} key parties absent leaves fewer than t = {threshold} to decrypt"
        )
    t0 = time.perf_counter()
    parties: list[KeyParty] = (
        [KeyParty(ctx) for _ in range(key_parties)]
        if threshold is None
        else [ShamirKeyParty(ctx, i) for i in range(key_parties)]
    )
    pk = collective_public_key(ctx, [p.public_share() for p in parties])
    keygen_s = time.perf_counter() - t0
    setup: dict[str, Any] = {"he_keygen_s": keygen_s, "he_sharing_s": 0.0, "he_sharing_bytes_per_party": 0}
    if threshold is not None:
        t0 = time.perf_counter()
        shamir = [p for p in parties if isinstance(p, ShamirKeyParty)]
        setup_shamir(shamir, threshold)
        setup["he_sharing_s"] = time.perf_counter() - t0
        # each party sends one share polynomial (all key-level primes) to each other party
        setup["he_sharing_bytes_per_party"] = (key_parties - 1) * 8 * len(ctx.moduli) * ctx.n
    rk = None
    if relin:
        t0 = time.perf_counter()
        rk = collective_relin_keys(ctx, parties)
        setup["he_rkg_s"] = time.perf_counter() - t0
        # each party publishes (h0, h1) in round 1 and (h0', h1') in round 2: one key-level polynomial each
        # per data prime
        setup["he_rkg_bytes_per_party"] = 4 * rkg_gadget_count(ctx) * 8 * len(ctx.moduli) * ctx.n
        setup["he_relin_key_bytes"] = len(ctx.serialize(rk))
    return parties[: key_parties - key_dropouts], pk, setup, rk


def decrypt_all(
    ctx: CkksContext, parties: Sequence[KeyParty], aggregates: Sequence[Any], threshold: int | None
) -> tuple[np.ndarray, int]:
    """Threshold decryption of each aggregate ciphertext (serialised as the key parties download it):
    n-of-n with every party in ``parties``, or the first t of them for a t-of-n committee. Returns the
    concatenated values and the partial-decryption bytes each answering party sent."""
    out, partial_bytes = [], 0
    for agg in aggregates:
        blob = ctx.serialize(agg)  # what each key party downloads
        if threshold is None:
            partials = {i: p.partial_decrypt(ctx.deserialize(blob)) for i, p in enumerate(parties)}
            out.append(combine(ctx, agg, partials, range(len(parties))))
        else:
            answering = [p for p in parties if isinstance(p, ShamirKeyParty)][:threshold]
            active = [p.point for p in answering]
            partials = {p.point: p.partial_decrypt_among(ctx.deserialize(blob), active) for p in answering}
            out.append(combine_threshold(ctx, agg, partials, threshold))
        partial_bytes += next(iter(partials.values())).nbytes
    return np.concatenate(out), partial_bytes
