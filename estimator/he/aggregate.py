"""Federated averaging under threshold CKKS, next to SecAgg and the plaintext mean, on the same rounds.

The clients of a round encrypt their model updates under the collective public key of a committee of
key parties (:class:`ldp_core.he.threshold.KeyParty`); the server multiplies each ciphertext by the
client's public FedAvg weight n_u / Σ n and adds them (a weighted sum, which SecAgg's masks only give
when the clients scale their own inputs); the committee returns partial decryptions of the one
aggregate and the server combines them. No party sees an individual update; the server sees only the
weighted mean, as with SecAgg. Unlike SecAgg, client dropouts cost nothing (nothing to unmask); a key
party that does not answer stops an n-of-n decryption, while a t-of-n committee
(:class:`ldp_core.he.shamir.ShamirKeyParty`) decrypts with any t of its n parties.

:func:`compare` trains the same softmax regression three times over the same client data and local
training randomness, aggregating with each method, and reports accuracy, bytes and time per round.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from estimator.fl.secagg_server import SecAggServer, honest_unmask, make_config
from estimator.he.committee import decrypt_all, setup_committee
from estimator.he.data import gaussian_classes
from estimator.he.moments import square_precision_bound, variance_bound, weighted_mean_of_squares
from ldp_core.fl.models import SoftmaxRegression, accuracy
from ldp_core.fl.secagg import Quantizer, SecAggClient
from ldp_core.fl.training import LocalTraining, local_sgd
from ldp_core.he.threshold import CkksContext, HeError, KeyParty, ThresholdParams

__all__ = ["HeAggregation", "STATS", "he_weighted_mean", "secagg_weighted_mean", "compare", "precision_bound"]

#: aggregated statistics: the weighted mean always; ``variance`` adds the per-coordinate weighted variance
STATS = ("mean", "variance")
SECAGG_REVEAL_BYTES = 1 + 4 + 4 + 66  # one unmasking reveal: kind, about-whom, x, y (as benchmarks/bench_secagg.py)


@dataclasses.dataclass
class HeAggregation:
    mean: np.ndarray
    upload_bytes_per_client: int
    partial_bytes_per_party: int
    public_share_bytes_per_party: int
    encrypt_s_per_client: float
    server_s: float
    decrypt_s: float
    #: with a relinearisation key: Σ n_u·x_u² / Σ n_u, and the server / decryption time it took
    mean_of_squares: np.ndarray | None = None
    square_server_s: float = 0.0
    square_decrypt_s: float = 0.0


def precision_bound(params: ThresholdParams, key_parties: int, sigmas: float = 7.0) -> float:
    """Absolute error bound on each decoded value of a weighted sum, from the flooding noise alone:
    the sum of ``key_parties`` uniform [−2^k, 2^k] coefficients has variance key_parties·4^k/3; a
    slot is a Fourier combination of the N coefficients divided by the scale Δ·Δ_w, so its error is
    about normal with standard deviation √(N·key_parties/3)·2^k/(Δ·Δ_w). ``sigmas`` = 7 keeps the
    chance that any of 4096 slots exceeds it below 1e-8. SEAL's own encryption noise adds about 1e-11."""
    scale = 2.0 ** (params.scale_bits + params.weight_scale_bits)
    sd = np.sqrt(params.poly_degree * key_parties / 3.0) * 2.0**params.smudge_bits / scale
    return float(sigmas * sd + 1e-9)


def he_weighted_mean(
    ctx: CkksContext,
    parties: Sequence[KeyParty],
    public_key: Any,
    updates: Sequence[np.ndarray],
    weights: np.ndarray,
    threshold: int | None = None,
    relin_keys: Any = None,
) -> HeAggregation:
    """Σ_u w_u·x_u / Σ_u w_u under threshold CKKS; every step on real SEAL ciphertexts, serialised
        between the roles as they would travel. With ``threshold`` t, ``parties`` are the key parties that
        answer (:class:`ShamirKeyParty`, after the sharing round): the first t of them decrypt; without it,
        every party of the n-of-n committee must be in ``parties``. With the collective ``relin_keys``
    (:func:`ldp_core.he.relin.collective_relin_keys`) the server also computes Σ n_u·x_u² / Σ n_u from
    the same uploads (:func:`estimator.he.moments.weighted_mean_of_squares`; integer weights n_u)."""
    d = updates[0].size
    share = weights / weights.sum()
    t0 = time.perf_counter()
    uploads = [[ctx.serialize(c) for c in ctx.encrypt(public_key, u)] for u in updates]
    enc_s = (time.perf_counter() - t0) / len(updates)
    t0 = time.perf_counter()
    chunks = len(uploads[0])
    aggregates = []
    for k in range(chunks):
        cts = [ctx.multiply_scalar(ctx.deserialize(up[k]), float(w)) for up, w in zip(uploads, share)]
        aggregates.append(ctx.add_many(cts))
    server_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out, partial_bytes = decrypt_all(ctx, parties, aggregates, threshold)
    dec_s = time.perf_counter() - t0
    extra: dict[str, Any] = {}
    if relin_keys is not None:
        extra = weighted_mean_of_squares(ctx, parties, relin_keys, uploads, weights, threshold)
        extra["mean_of_squares"] = extra["mean_of_squares"][:d]
    return HeAggregation(
        **extra,
        mean=out[:d],
        upload_bytes_per_client=sum(len(b) for b in uploads[0]),
        partial_bytes_per_party=partial_bytes,
        public_share_bytes_per_party=int(parties[0].public_share().nbytes),
        encrypt_s_per_client=enc_s,
        server_s=server_s,
        decrypt_s=dec_s,
    )


def secagg_weighted_mean(
    updates: Sequence[np.ndarray], weights: np.ndarray, rng: np.random.Generator, clip_range: float = 1.0
) -> dict[str, Any]:
    """The same weighted mean with the project's SecAgg+: each client scales its update by its public
    weight share, quantizes it (stochastic rounding, ``rng``) and masks it; the server unmasks the sum."""
    n, d = len(updates), updates[0].size
    share = weights / weights.sum()
    cfg = make_config(0, n, d, rng)
    clients = {u: SecAggClient(u, cfg) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    t0 = time.perf_counter()
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    shares = {u: c.share_keys(routed[u]) for u, c in clients.items()}
    inbox = server.route_shares(shares)
    q = Quantizer.for_clients(n, clip_range)
    masked = {u: clients[u].masked_input(q.quantize(updates[u - 1] * share[u - 1], rng), inbox[u]) for u in clients}
    client_s = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for u, y in masked.items():
        server.receive_masked(u, y)
    surv, drop = server.unmask_request()
    reveals = honest_unmask(clients, surv, drop)
    total = server.finish(reveals)
    server_s = time.perf_counter() - t0
    degree = len(cfg.neighbors[1])
    upload = 64 + sum(len(c) for c in shares[1].values()) + masked[1].nbytes + degree * SECAGG_REVEAL_BYTES
    return {
        "mean": q.decode_sum(total),
        "upload_bytes_per_client": upload,
        "client_s": client_s,
        "server_s": server_s,
        "quantization_step": 1.0 / q.scale,
    }


def _client_data(clients: int, per_client: int, rng: np.random.Generator) -> tuple[list, tuple]:
    X, y = gaussian_classes(clients * per_client + 2000, 32, 10, rng, separation=0.3)
    sizes = rng.integers(per_client // 2, per_client * 3 // 2, size=clients)  # unequal: weights matter
    parts, start = [], 0
    for s in sizes:
        parts.append((X[start : start + s], y[start : start + s]))
        start += s
    return parts, (X[-2000:], y[-2000:])


def _secagg_round(
    updates: list[np.ndarray], weights: np.ndarray, plain: np.ndarray, rng_seed: list[int], stat: str
) -> tuple[np.ndarray, dict[str, Any]]:
    sa = secagg_weighted_mean(updates, weights, np.random.default_rng(rng_seed))
    mean = sa.pop("mean")
    row = sa | {"max_abs_error": float(np.abs(mean - plain).max())}
    if stat == "variance":
        # SecAgg sums what clients send: the squares must be uploaded too (and cannot be checked)
        squares = secagg_weighted_mean([u**2 for u in updates], weights, np.random.default_rng([*rng_seed, 2]))
        truth = _weighted_variance(updates, weights)
        var = squares["mean"] - mean**2
        row |= {
            "square_upload_bytes_per_client": squares["upload_bytes_per_client"],
            "variance_max_abs_error": float(np.abs(var - truth).max()),
        }
    return mean, row


def _weighted_variance(updates: Sequence[np.ndarray], weights: np.ndarray) -> np.ndarray:
    x = np.stack(updates)
    mu = (weights[:, None] * x).sum(0) / weights.sum()
    return (weights[:, None] * (x - mu) ** 2).sum(0) / weights.sum()


def _he_round(
    ctx: CkksContext,
    parties: Sequence[KeyParty],
    pk: Any,
    rk: Any,
    updates: list[np.ndarray],
    weights: np.ndarray,
    plain: np.ndarray,
    threshold: int | None,
    key_parties: int,
) -> tuple[np.ndarray, dict[str, Any]]:
    he = he_weighted_mean(ctx, parties, pk, updates, weights, threshold, relin_keys=rk)
    row = dataclasses.asdict(he) | {"max_abs_error": float(np.abs(he.mean - plain).max())}
    del row["mean"], row["mean_of_squares"]
    if he.mean_of_squares is not None:
        answering = threshold or key_parties
        max_abs = float(np.abs(np.stack(updates)).max())
        sq_bound = square_precision_bound(ctx.params, key_parties, answering, max_abs, float(weights.sum()))
        var = he.mean_of_squares - he.mean**2
        truth_sq = (weights[:, None] * np.stack(updates) ** 2).sum(0) / weights.sum()
        row |= {
            "square_max_abs_error": float(np.abs(he.mean_of_squares - truth_sq).max()),
            "square_bound": sq_bound,
            "variance_max_abs_error": float(np.abs(var - _weighted_variance(updates, weights)).max()),
            "variance_bound": variance_bound(
                sq_bound, precision_bound(ctx.params, answering), float(np.abs(plain).max())
            ),
        }
    else:
        del row["square_server_s"], row["square_decrypt_s"]
    return he.mean, row


def compare(
    clients: int = 10,
    rounds: int = 5,
    key_parties: int = 3,
    seed: int = 0,
    params: ThresholdParams | None = None,
    threshold: int | None = None,
    key_dropouts: int = 0,
    stat: str = "mean",
) -> dict[str, Any]:
    """FedAvg with the plaintext weighted mean, SecAgg and threshold CKKS on the same clients and rounds.
    ``threshold`` t: a t-of-n committee (Shamir-shared key), of which ``key_dropouts`` never answer;
    without it, n-of-n (every party must answer). ``stat="variance"``: each round also aggregates the
    per-coordinate weighted variance of the updates (CKKS: squares computed by the server under the
    collective relinearisation key; SecAgg: squares uploaded by the clients as a second masked vector)."""
    if stat not in STATS:
        raise HeError(f"unknown statistic {stat!r}: one of {', '.join(STATS)}")
    rng = np.random.default_rng(seed)
    parts, (Xt, yt) = _client_data(clients, 120, rng)
    model = SoftmaxRegression(32, 10)
    init = model.init_params(rng)
    training = LocalTraining(epochs=1, batch_size=16, learning_rate=0.5)
    weights = np.array([len(p[1]) for p in parts], dtype=np.float64)
    ctx = CkksContext(params)
    parties, pk, setup, rk = setup_committee(ctx, key_parties, threshold, key_dropouts, relin=stat == "variance")
    theta = {m: init.copy() for m in ("plain", "secagg", "he")}
    per_round: list[dict[str, Any]] = []
    for r in range(rounds):
        row: dict[str, Any] = {"round": r}
        for method in ("plain", "secagg", "he"):
            local = np.random.default_rng([seed, r])  # the same local SGD randomness for every method
            updates = [
                (local_sgd(model, theta[method], X, y, training, local)[0] - theta[method]).astype(np.float64)
                for X, y in parts
            ]
            plain = (weights[:, None] * np.stack(updates)).sum(0) / weights.sum()
            if method == "plain":
                mean = plain
            elif method == "secagg":
                mean, row["secagg"] = _secagg_round(updates, weights, plain, [seed, r, 1], stat)
            else:
                mean, row["he"] = _he_round(ctx, parties, pk, rk, updates, weights, plain, threshold, key_parties)
            theta[method] = (theta[method] + mean).astype(np.float32)
            row[f"accuracy_{method}"] = accuracy(model, theta[method], Xt, yt)
        per_round.append(row)
    return {
        "clients": clients,
        "rounds": rounds,
        "key_parties": key_parties,
        "parameters": model.num_params,
        "plaintext_bytes_per_client": 4 * model.num_params,
        "ckks": dataclasses.asdict(ctx.params),
        "he_keygen_s": setup["he_keygen_s"],
        "he_precision_bound": precision_bound(ctx.params, threshold or key_parties),
        "threshold": threshold,
        "key_dropouts": key_dropouts,
        "he_sharing_s": setup["he_sharing_s"],
        "he_sharing_bytes_per_party": setup["he_sharing_bytes_per_party"],
        "stat": stat,
        **{k: v for k, v in setup.items() if k.startswith("he_r")},  # he_rkg_s, he_rkg_bytes_per_party, ...
        "per_round": per_round,
        "final_accuracy": {m: per_round[-1][f"accuracy_{m}"] for m in ("plain", "secagg", "he")},
    }
