"""Non-linear aggregation under threshold CKKS: the weighted mean of squares Σ n_u·x_u² / Σ n_u of the
clients' updates (hence each coordinate's weighted variance), computed by the server with ciphertext ×
ciphertext products relinearised by the committee's collective key (:mod:`ldp_core.he.relin`), decrypted
only in aggregate.

Each client's fresh ciphertext (scale Δ = 2^55) is squared (size 3, scale Δ²), multiplied by its integer
weight n_u encoded at scale 1 (exact), the products are summed and the sum is relinearised once (size 2),
then threshold-decrypted at scale Δ² = 2^110 (no rescaling: the 140-bit data modulus holds
Σ n_u·x_u² < 2^28). Unlike SecAgg, the clients upload nothing more: the squares come from the same
ciphertexts as the mean.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from estimator.he.committee import decrypt_all
from ldp_core.he.threshold import CkksContext, HeError, KeyParty, ThresholdParams, _seal

__all__ = ["weighted_mean_of_squares", "square_precision_bound", "variance_bound", "SEAL_ERROR_VARIANCE"]

#: variance of SEAL's error sampler (centred binomial, σ = 3.2: 3.2² rounded up)
SEAL_ERROR_VARIANCE = 10.5


def square_precision_bound(
    params: ThresholdParams,
    key_parties: int,
    answering: int,
    max_abs: float,
    total_weight: float,
    sigmas: float = 7.0,
) -> float:
    """Absolute error bound on each decoded Σ n_u·x_u² / Σ n_u, from CKKS's noise terms:

    * fresh encryption under the collective key (s = Σ s_j, ternary, variance 2n/3 per coefficient;
      e_pk a sum of n errors, variance n·σ²): e = v·e_pk + e0 + e1·s has per-coefficient variance
      V = (4/3)·N·n·σ² + σ²; a slot's real part is a Fourier sum of N coefficients over Δ, so x carries
      an error δ with sd √(N·V/2)/Δ, and x² carries 2·x·δ + δ² (the decoding is a ring homomorphism);
    * relinearisation: (Σ_i [c2]_(q_i)·e_i)/P, with digits uniform in [0, q_i) (second moment q_i²/3)
      and key noise s·e0 + u·e1 + e2 + e3 of variance 2·N·(2n/3)·n·σ² + 2n·σ²: variance
      Σ_i N·q_i²·V_ksk/(3P²) per coefficient, at scale Δ²;
    * flooding noise of the ``answering`` parties: √(N·answering/6)·2^k / (Δ²·Σ n_u);
    * double-precision decoding: N·2^−52·(max|x|² + 1).

    ``sigmas`` standard deviations of each (7: any of 4096 slots exceeding it, below 1e-8)."""
    n, big_n = key_parties, params.poly_degree
    delta = 2.0**params.scale_bits
    v_fresh = (4.0 / 3.0) * big_n * n * SEAL_ERROR_VARIANCE + SEAL_ERROR_VARIANCE
    sd_x = math.sqrt(big_n * v_fresh / 2.0) / delta
    fresh = 2.0 * max_abs * sigmas * sd_x + (sigmas * sd_x) ** 2
    v_ksk = 2.0 * big_n * (2.0 * n / 3.0) * n * SEAL_ERROR_VARIANCE + 2.0 * n * SEAL_ERROR_VARIANCE
    data_bits = params.coeff_bits[:-1]
    special = 2.0 ** params.coeff_bits[-1]
    v_ks = sum(big_n * (2.0**b) ** 2 * v_ksk / (3.0 * special**2) for b in data_bits) + big_n * n / 18.0 + 1.0
    relin = sigmas * math.sqrt(big_n * v_ks / 2.0) / delta**2
    flood = sigmas * math.sqrt(big_n * answering / 6.0) * 2.0**params.smudge_bits / (delta**2 * total_weight)
    decode = big_n * 2.0**-52 * (max_abs**2 + 1.0)
    return float(fresh + relin + flood + decode)


def variance_bound(square_bound: float, mean_bound: float, max_abs_mean: float) -> float:
    """Bound on (E[x²] − mean²) from the two decrypted aggregates' bounds: ε_sq + 2·|μ|·ε_μ + ε_μ²."""
    return float(square_bound + 2.0 * max_abs_mean * mean_bound + mean_bound**2)


def weighted_mean_of_squares(
    ctx: CkksContext,
    parties: Sequence[KeyParty],
    relin_keys: Any,
    uploads: Sequence[Sequence[bytes]],
    weights: np.ndarray,
    threshold: int | None,
) -> dict[str, Any]:
    """Σ n_u·x_u² / Σ n_u from the clients' serialised ciphertexts (``uploads[u][chunk]``), with the
    collective relinearisation key; ``weights`` n_u must be whole numbers (sample counts)."""
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or not np.array_equal(w, np.round(w)) or w.sum() <= 0:
        raise HeError("the mean of squares under CKKS takes whole-number weights n_u (sample counts), not all 0")
    s = _seal()
    t0 = time.perf_counter()
    aggregates = []
    for k in range(len(uploads[0])):
        terms = []
        for up, n_u in zip(uploads, w):
            ct = ctx.deserialize(up[k])
            sq = s.Ciphertext()
            ctx.evaluator.square(ct, sq)  # size 3, scale Δ²
            pt = s.Plaintext()
            ctx.encoder.encode(float(n_u), sq.parms_id(), 1.0, pt)  # the integer n_u, exactly
            ctx.evaluator.multiply_plain_inplace(sq, pt)
            terms.append(sq)
        total = ctx.add_many(terms)
        ctx.evaluator.relinearize_inplace(total, relin_keys)  # size 2 under the collective key
        aggregates.append(total)
    server_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out, _ = decrypt_all(ctx, parties, aggregates, threshold)
    return {
        "mean_of_squares": out / w.sum(),
        "square_server_s": server_s,
        "square_decrypt_s": time.perf_counter() - t0,
    }
