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
from estimator.he.data import gaussian_classes
from ldp_core.fl.models import SoftmaxRegression, accuracy
from ldp_core.fl.secagg import Quantizer, SecAggClient
from ldp_core.fl.training import LocalTraining, local_sgd
from ldp_core.he.shamir import ShamirKeyParty, combine_threshold, setup_shamir
from ldp_core.he.threshold import (
    CkksContext,
    HeError,
    KeyParty,
    MissingShareError,
    ThresholdParams,
    collective_public_key,
    combine,
)

__all__ = ["HeAggregation", "he_weighted_mean", "secagg_weighted_mean", "compare", "precision_bound"]

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
) -> HeAggregation:
    """Σ_u w_u·x_u / Σ_u w_u under threshold CKKS; every step on real SEAL ciphertexts, serialised
    between the roles as they would travel. With ``threshold`` t, ``parties`` are the key parties that
    answer (:class:`ShamirKeyParty`, after the sharing round): the first t of them decrypt; without it,
    every party of the n-of-n committee must be in ``parties``."""
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
    dec_s = time.perf_counter() - t0
    return HeAggregation(
        mean=np.concatenate(out)[:d],
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


def _committee(
    ctx: CkksContext, key_parties: int, threshold: int | None, key_dropouts: int
) -> tuple[list[KeyParty], Any, dict[str, Any]]:
    """Key generation (and, for t-of-n, the Shamir sharing round); returns the parties that answer at
    decryption time (all but the last ``key_dropouts``), the collective public key and setup figures."""
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
    return parties[: key_parties - key_dropouts], pk, setup


def compare(
    clients: int = 10,
    rounds: int = 5,
    key_parties: int = 3,
    seed: int = 0,
    params: ThresholdParams | None = None,
    threshold: int | None = None,
    key_dropouts: int = 0,
) -> dict[str, Any]:
    """FedAvg with the plaintext weighted mean, SecAgg and threshold CKKS on the same clients and rounds.
    ``threshold`` t: a t-of-n committee (Shamir-shared key), of which ``key_dropouts`` never answer;
    without it, n-of-n (every party must answer)."""
    rng = np.random.default_rng(seed)
    parts, (Xt, yt) = _client_data(clients, 120, rng)
    model = SoftmaxRegression(32, 10)
    init = model.init_params(rng)
    training = LocalTraining(epochs=1, batch_size=16, learning_rate=0.5)
    weights = np.array([len(p[1]) for p in parts], dtype=np.float64)
    ctx = CkksContext(params)
    parties, pk, setup = _committee(ctx, key_parties, threshold, key_dropouts)
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
                sa = secagg_weighted_mean(updates, weights, np.random.default_rng([seed, r, 1]))
                mean = sa.pop("mean")
                row["secagg"] = sa | {"max_abs_error": float(np.abs(mean - plain).max())}
            else:
                he = he_weighted_mean(ctx, parties, pk, updates, weights, threshold)
                mean = he.mean
                row["he"] = dataclasses.asdict(he) | {"max_abs_error": float(np.abs(mean - plain).max())}
                del row["he"]["mean"]
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
        "per_round": per_round,
        "final_accuracy": {m: per_round[-1][f"accuracy_{m}"] for m in ("plain", "secagg", "he")},
    }
