"""t-of-n threshold decryption for the multiparty CKKS of :mod:`ldp_core.he.threshold`.

The n-of-n scheme needs every key party's partial decryption; one absent party stops the round. Here any
t of the n parties decrypt and t − 1 cannot, following the t-out-of-N construction of Mouchet,
Troncoso-Pastoriza, Bossuat and Hubaux ("Multiparty homomorphic encryption from ring-learning-with-errors",
PETS 2021, §5; Lattigo's ``Thresholdizer`` / ``Combiner``):

* **Sharing (once, after key generation).** Party i Shamir-shares its secret-key share s_i: it draws a
  polynomial f_i(X) = s_i + r_1·X + … + r_(t−1)·X^(t−1) whose coefficients r_k are ring elements uniform
  mod each RNS prime (the operating system's CSPRNG), and sends f_i(x_j) to party j over a private channel
  (x_j = j + 1, the party's public point). Party j keeps S_j = Σ_i f_i(x_j) = F(x_j), a point of the
  degree-(t−1) polynomial F with F(0) = Σ_i s_i = s. The arithmetic is coefficient-wise in each RNS
  prime's field Z_q; it is done on SEAL's NTT form, which is a linear bijection per prime, so sharing the
  NTT values is sharing the coefficients.
* **Decryption by any t parties T.** Each j ∈ T turns its point into an additive share with its Lagrange
  coefficient λ_j^T = Π_(k∈T, k≠j) x_k / (x_k − x_j) (mod each prime): Σ_(j∈T) λ_j^T·S_j = F(0) = s. It then
  answers exactly as in the n-of-n scheme, d_j = c1·λ_j^T·S_j + E_j with fresh flooding noise E_j; the
  coefficient is applied *before* the noise is added (applied after, it would multiply the noise by a
  number of the size of q). c0 + Σ_(j∈T) d_j decodes to the message.
* **Fewer than t.** Any t − 1 points of F are consistent with every value of F(0): the t − 1 parties'
  shares are independent of s (Shamir's perfect secrecy, per coefficient and prime), so what they can
  compute, c0 + c1·s' for any s' of their choosing, is c0 + c1·s plus c1·(s' − s), uniform mod Q.

Honest-but-curious parties: a dealer that sends inconsistent shares is not detected (no verifiable secret
sharing), as in the paper's passive model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ldp_core.he.threshold import (
    CkksContext,
    HeError,
    KeyParty,
    MissingShareError,
    RandomBytes,
    _smudge,
    decode_sum,
)

__all__ = [
    "ShamirKeyParty",
    "combine_threshold",
    "lagrange_at_zero",
    "point_of",
    "setup_shamir",
    "share_polynomial",
    "uniform_poly",
]


def point_of(index: int) -> int:
    """The public Shamir point of party ``index`` (0-based): x = index + 1, never 0 (F(0) is the secret)."""
    return int(index) + 1


def uniform_poly(ctx: CkksContext, random_bytes: RandomBytes, limbs: int | None = None) -> np.ndarray:
    """A ring element uniform mod each prime (rejection sampling on CSPRNG words: exactly uniform)."""
    rows = []
    for q in ctx.moduli[: limbs or len(ctx.moduli)]:
        mask = np.uint64((1 << q.bit_length()) - 1)
        got: list[np.ndarray] = []
        need = ctx.n
        while need > 0:
            cand = np.frombuffer(random_bytes(8 * 2 * ctx.n), dtype="<u8") & mask
            ok = cand[cand < np.uint64(q)][:need]
            got.append(ok)
            need -= ok.size
        rows.append(np.concatenate(got))
    return np.stack(rows)


def _scale_rows(ctx: CkksContext, a: np.ndarray, factors: Sequence[int]) -> np.ndarray:
    """a · factors[j] mod q_j, row by row (factors already reduced mod each prime)."""
    out = np.empty_like(a)
    for j in range(a.shape[0]):
        q = ctx.moduli[j]
        out[j] = ((a[j].astype(object) * int(factors[j])) % q).astype(np.uint64)
    return out


def share_polynomial(
    ctx: CkksContext, secret: np.ndarray, points: Sequence[int], threshold: int, random_bytes: RandomBytes
) -> dict[int, np.ndarray]:
    """Shamir shares f(x) for each x in ``points`` of f(X) = secret + Σ_(k=1..t−1) r_k·X^k, r_k uniform."""
    if not 1 <= threshold <= len(points):
        raise HeError(f"threshold must be between 1 and the {len(points)} parties, not {threshold}")
    if len(set(points)) != len(points) or any(x <= 0 for x in points):
        raise HeError("Shamir points must be distinct and positive")
    coeffs = [uniform_poly(ctx, random_bytes, secret.shape[0]) for _ in range(threshold - 1)]
    out = {}
    for x in points:
        acc = np.zeros_like(secret)
        for c in reversed(coeffs):  # Horner: ((r_(t−1)·x + r_(t−2))·x + … + r_1)·x + secret
            acc = _scale_rows(ctx, ctx.add(acc, c), [x % q for q in ctx.moduli[: secret.shape[0]]])
        out[x] = ctx.add(acc, secret)
    return out


def lagrange_at_zero(ctx: CkksContext, point: int, active: Sequence[int], limbs: int | None = None) -> list[int]:
    """λ = Π_(k ∈ active, k ≠ point) x_k / (x_k − point) mod each prime: the weight of F(point) in F(0)."""
    if point not in active:
        raise HeError(f"point {point} is not among the active parties {list(active)}")
    if len(set(active)) != len(active):
        raise HeError("active points must be distinct")
    out = []
    for q in ctx.moduli[: limbs or len(ctx.moduli)]:
        num, den = 1, 1
        for k in active:
            if k != point:
                num = num * k % q
                den = den * (k - point) % q
        out.append(num * pow(den, -1, q) % q)
    return out


class ShamirKeyParty(KeyParty):
    """A key party of a t-of-n committee: an n-of-n :class:`KeyParty` (same key generation, same collective
    public key) that also holds a Shamir point S_j of the collective secret after :meth:`deal` /
    :meth:`receive`, and decrypts with any t − 1 others (:meth:`partial_decrypt_among`)."""

    def __init__(self, ctx: CkksContext, index: int, random_bytes: RandomBytes = os.urandom) -> None:
        super().__init__(ctx, random_bytes)
        self.index = int(index)
        self.point = point_of(index)
        self.threshold: int | None = None
        self._point_share: np.ndarray | None = None

    def deal(self, points: Sequence[int], threshold: int) -> dict[int, np.ndarray]:
        """f_i(x_j) for every party's point x_j (one goes to each party, privately; its own included)."""
        self.threshold = threshold
        return share_polynomial(self.ctx, self._s, points, threshold, self._random_bytes)

    def receive(self, shares: Mapping[int, np.ndarray], threshold: int) -> None:
        """S_j = Σ_i f_i(x_j) from every dealer i (all n must have dealt: the sharing is a setup step)."""
        if not shares:
            raise HeError("no Shamir shares received")
        acc = None
        for sh in shares.values():
            if sh.shape != self._s.shape:
                raise HeError(f"Shamir share of shape {sh.shape}, expected {self._s.shape}")
            acc = sh if acc is None else self.ctx.add(acc, sh)
        self._point_share = acc
        self.threshold = threshold

    def partial_decrypt_among(self, ct: Any, active: Sequence[int]) -> np.ndarray:
        """d_j = c1·λ_j·S_j + E_j for the active set of points ``active`` (exactly t of them, this one included)."""
        if self._point_share is None or self.threshold is None:
            raise HeError("this party holds no Shamir share yet (deal and receive first)")
        if len(active) != self.threshold:
            raise HeError(f"a t-of-n decryption takes exactly t = {self.threshold} active parties, got {len(active)}")
        self._check_decryptable(ct)
        c1 = self.ctx.read_ciphertext(ct, polys=[1])[0]
        limbs = c1.shape[0]
        lam = lagrange_at_zero(self.ctx, self.point, active, limbs)
        key = _scale_rows(self.ctx, self._point_share[:limbs], lam)
        noise = self.ctx.small_to_ntt(_smudge(self.ctx.n, self.ctx.params.smudge_bits, self._random_bytes), limbs)
        return self.ctx.add(self.ctx.mul(c1, key), noise)


def setup_shamir(parties: Sequence[ShamirKeyParty], threshold: int) -> None:
    """Runs the sharing round among ``parties`` (each deals to all, each sums what it receives)."""
    points = [p.point for p in parties]
    dealt = {p.point: p.deal(points, threshold) for p in parties}
    for p in parties:
        p.receive({i: dealt[i][p.point] for i in points}, threshold)


def combine_threshold(
    ctx: CkksContext,
    ct: Any,
    partials: Mapping[int, np.ndarray],
    threshold: int,
    length: int | None = None,
) -> np.ndarray:
    """c0 + Σ d_j over the t answers (keyed by point), decoded. Refuses fewer than t: they cannot decrypt.
    The answers must all have been computed for this same active set (``partial_decrypt_among``)."""
    if len(partials) < threshold:
        raise MissingShareError(
            f"t-of-n decryption needs {threshold} key parties' shares; got {len(partials)} ({sorted(partials)})"
        )
    if len(partials) > threshold:
        raise HeError(f"{len(partials)} answers for a threshold of {threshold}: each must be for one active set of t")
    return decode_sum(ctx, ct, list(partials.values()), length)
