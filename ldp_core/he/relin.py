"""A collective relinearisation key for the multiparty CKKS of :mod:`ldp_core.he.threshold`, so that the
server can multiply ciphertexts (sums of squares, variances) under a key nobody holds.

The protocol is the two-round RKG of Mouchet, Troncoso-Pastoriza, Bossuat and Hubaux (PETS 2021, §4;
Lattigo's ``RKGProtocol``), laid out as SEAL's ``RelinKeys`` for the key s²: one key-switching key per
data prime q_i (SEAL's RNS decomposition), each a key-level ciphertext (b_i, a'_i), in NTT form over the
data primes and the special prime P, with b_i + a'_i·s = w_i·s² + e and the gadget w_i ≡ P (mod q_i),
≡ 0 (mod every other prime, P included) — what SEAL's ``KeyGenerator`` makes for one party
(``generate_one_kswitch_key``: P·s² added to limb i only). SEAL's key switching decomposes c2 into its
RNS digits [c2]_(q_i), sums [c2]_(q_i)·(b_i, a'_i) and divides by P, which leaves c2·s² plus
(Σ [c2]_(q_i)·e_i)/P.

For each i, with a public common polynomial a_i (SHAKE-256 of the context's seed and i):

* **Round 1.** Party j draws an ephemeral ternary u_j and errors and publishes
  h0_j = −u_j·a_i + s_j·w_i + e0_j and h1_j = s_j·a_i + e1_j. The sums are h0 = −u·a_i + s·w_i + e0 and
  h1 = s·a_i + e1 (u = Σ u_j, s = Σ s_j).
* **Round 2.** Party j publishes h0'_j = s_j·h0 + e2_j and h1'_j = (u_j − s_j)·h1 + e3_j.
* **Key.** (b_i, a'_i) = (Σ_j h0'_j + h1'_j, h1): b_i + a'_i·s = s·h0 + u·h1 + e2 + e3
  = s²·w_i + s·e0 + u·e1 + e2 + e3, the cross terms −s·u·a_i and u·s·a_i cancelling.

Every share is an RLWE sample under a party's secret (s_j or u_j) with fresh error, so it reveals neither;
the ternary u_j and every error come from SEAL's own samplers (a fresh ``KeyGenerator`` per party and
run: its secret key is u_j, its public keys' errors are the e's). The round runs among all n key parties,
like the collective public key; the result is an ordinary SEAL ``RelinKeys`` object used by SEAL's
``Evaluator.relinearize``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from ldp_core.he.threshold import CkksContext, HeError, KeyParty, _seal, _sealed, _u64

__all__ = ["RkgParty", "collective_relin_keys", "relin_keys_from_shares", "rkg_gadget_count"]


def rkg_gadget_count(ctx: CkksContext) -> int:
    """How many key-switching keys SEAL's relinearisation key holds: one per data prime."""
    return len(ctx.moduli) - 1


def _crp(ctx: CkksContext, i: int) -> np.ndarray:
    return ctx.common_random_poly(b"/rkg/" + str(i).encode())


class RkgParty:
    """A key party's side of the RKG protocol (its secret s_j stays in the :class:`KeyParty`)."""

    def __init__(self, party: KeyParty) -> None:
        s = _seal()
        self.party = party
        self.ctx = party.ctx
        self._keygen = s.KeyGenerator(self.ctx.seal)
        self._u_key = self._keygen.secret_key()
        self._u_plain = self._u_key.data()
        self._u = self.ctx.read_plaintext(self._u_plain)  # the ephemeral ternary u_j (SEAL's sampler)
        self._round1_done = False

    def _error(self) -> np.ndarray:
        """A fresh error polynomial from SEAL's sampler: p0 + p1·u_j of a new public key under u_j."""
        pk = _seal().PublicKey()
        self._keygen.create_public_key(pk)
        data = pk.data()
        p = self.ctx.read_ciphertext(data)
        return self.ctx.add(p[0], self.ctx.mul(p[1], self._u))

    def _gadget_times(self, poly: np.ndarray, i: int) -> np.ndarray:
        """w_i·poly: P·poly on the limb of data prime i, zero on every other limb (the special one included)."""
        ctx = self.ctx
        out = np.zeros_like(poly)
        q = ctx.moduli[i]
        out[i] = ((poly[i].astype(object) * (ctx.moduli[-1] % q)) % q).astype(np.uint64)
        return out

    def round1(self) -> tuple[np.ndarray, np.ndarray]:
        """(h0_j, h1_j), each (gadgets, limbs, N): −u_j·a_i + s_j·w_i + e0 and s_j·a_i + e1."""
        ctx, s_j = self.ctx, self.party._s
        h0, h1 = [], []
        for i in range(rkg_gadget_count(ctx)):
            a = _crp(ctx, i)
            h0.append(ctx.add(ctx.add(ctx.neg(ctx.mul(a, self._u)), self._gadget_times(s_j, i)), self._error()))
            h1.append(ctx.add(ctx.mul(a, s_j), self._error()))
        self._round1_done = True
        return np.stack(h0), np.stack(h1)

    def round2(self, h0_sum: np.ndarray, h1_sum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(h0'_j, h1'_j): s_j·h0 + e2 and (u_j − s_j)·h1 + e3, for the sums of every party's round 1."""
        if not self._round1_done:
            raise HeError("round 2 of the relinearisation key needs this party's round 1 first")
        ctx, s_j = self.ctx, self.party._s
        want = (rkg_gadget_count(ctx), len(ctx.moduli), ctx.n)
        if h0_sum.shape != want or h1_sum.shape != want:
            raise HeError(f"round-1 sums of shape {h0_sum.shape}, {h1_sum.shape}; expected {want}")
        u_minus_s = ctx.add(self._u, ctx.neg(s_j))
        out0, out1 = [], []
        for i in range(want[0]):
            out0.append(ctx.add(ctx.mul(s_j, h0_sum[i]), self._error()))
            out1.append(ctx.add(ctx.mul(u_minus_s, h1_sum[i]), self._error()))
        return np.stack(out0), np.stack(out1)


def _sum(ctx: CkksContext, shares: Sequence[np.ndarray]) -> np.ndarray:
    if not shares:
        raise HeError("no relinearisation key shares")
    acc = shares[0]
    for sh in shares[1:]:
        acc = np.stack([ctx.add(x, y) for x, y in zip(acc, sh)])
    return acc


def relin_keys_from_shares(
    ctx: CkksContext, h1_sum: np.ndarray, round2: Sequence[tuple[np.ndarray, np.ndarray]]
) -> Any:
    """SEAL ``RelinKeys`` (b_i, a'_i) = (Σ h0'_j + h1'_j, h1), written as SEAL's uncompressed
    serialisation of ``KSwitchKeys`` (parms id, one key vector of one public key per data prime) and
    loaded with SEAL's ``load``, which checks it against the context."""
    b = _sum(ctx, [ctx_add_pair(ctx, h0p, h1p) for h0p, h1p in round2])
    parms_id = ctx.seal.key_parms_id()
    keys = [ctx._ciphertext_blob(parms_id, np.stack([b[i], h1_sum[i]]), 1.0) for i in range(b.shape[0])]
    payload = _u64(parms_id) + struct.pack("<QQ", 1, len(keys)) + b"".join(keys)
    return ctx._load(_seal().RelinKeys(), _sealed(payload))


def ctx_add_pair(ctx: CkksContext, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.stack([ctx.add(a, b) for a, b in zip(x, y)])


def collective_relin_keys(ctx: CkksContext, parties: Sequence[KeyParty]) -> Any:
    """Runs both rounds among ``parties`` (every key party) and returns the collective ``RelinKeys``."""
    rkg = [RkgParty(p) for p in parties]
    first = [r.round1() for r in rkg]
    h0_sum = _sum(ctx, [f[0] for f in first])
    h1_sum = _sum(ctx, [f[1] for f in first])
    return relin_keys_from_shares(ctx, h1_sum, [r.round2(h0_sum, h1_sum) for r in rkg])
