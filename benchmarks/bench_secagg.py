"""Secure aggregation speed and communication (client_sdk.fl.secagg, estimator.fl.secagg_server).

Measured on this machine, with the real protocol objects (X25519, HKDF,
AES-256-GCM share encryption, AES-256-CTR masks, Shamir over GF(2^521 − 1)):

* **client masking**: ``masked_input`` for d = 10^5 and 10^6 parameters with 20
  neighbours (self mask + 20 pairwise masks; targets ≤ 10 ms and ≤ 50 ms), plus
  quantization and ``share_keys`` (key agreement, Shamir, encryption) separately;
  median of repeats, process CPU time alongside wall time (the machine is shared).
* **server unmasking**: 1,000 clients, d = 10^6, degree 20, 10 % of clients drop
  after sharing keys: time to add the 900 masked inputs into the running sum
  and time of ``finish`` (rebuild 900 self-mask seeds and 100 mask keys, expand
  900 self masks and the pairwise masks of the dropped clients); target ≤ 5 s
  per round. The clients of this round are run for real (about a minute).
* **communication** per client: bytes uploaded (key advert, encrypted shares,
  masked vector, unmasking reveals) and downloaded, against a plaintext upload
  of d float32 values (target ≤ 1.1×).

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_secagg.py           # a few minutes
    .venv/bin/python benchmarks/bench_secagg.py --quick   # 200 clients, d = 10^5

Results print as Markdown and are written to ``benchmarks/results/secagg.json``.
Flower's SecAgg+ (``flwr``) is not installed here; no side-by-side figures.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time

import numpy as np

from client_sdk.fl.secagg import Quantizer, SecAggClient
from estimator.fl.secagg_server import SecAggServer, make_config

RESULTS = pathlib.Path(__file__).parent / "results" / "secagg.json"
SHARE_REVEAL_BYTES = 1 + 4 + 4 + 66  # kind, about-whom, x, y


def _timed(fn, repeats: int) -> tuple[float, float, object]:
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - w)
    return statistics.median(walls), statistics.median(cpus), out


def _setup(n: int, d: int, degree: int, rng: np.random.Generator, drop_before: set[int] = frozenset()):
    cfg = make_config(0, n, d, rng, degree)
    clients = {u: SecAggClient(u, cfg) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    adverts = [c.advertise_keys() for c in clients.values()]
    routed = server.collect_adverts(adverts)
    t0 = time.perf_counter()
    shares = {u: c.share_keys(routed[u]) for u, c in clients.items() if u not in drop_before}
    share_s = (time.perf_counter() - t0) / len(shares)
    inbox = server.route_shares(shares)
    return cfg, clients, server, routed, inbox, shares, share_s


def bench_client(d: int, rng: np.random.Generator, repeats: int) -> dict:
    n = 21  # degree 20: the complete graph on 21 clients
    cfg, clients, server, routed, inbox, shares, share_s = _setup(n, d, 20, rng)
    q = Quantizer.for_clients(1000, 1.0)
    upd = rng.normal(scale=0.01, size=d).astype(np.float32)
    qw, qc, x = _timed(lambda: q.quantize(upd, rng), repeats)
    c1 = clients[1]
    mw, mc, y = _timed(lambda: c1.masked_input(x, inbox[1]), repeats)
    up = 64 + sum(len(ct) for ct in shares[1].values()) + y.nbytes + 20 * SHARE_REVEAL_BYTES
    down = 20 * 64 + sum(len(ct) for ct in inbox[1].values()) + 4 * n  # neighbours' keys, their shares, the survivor list
    return {"d": d, "neighbors": len(cfg.neighbors[1]), "mask_ms": mw * 1e3, "mask_cpu_ms": mc * 1e3,
            "quantize_ms": qw * 1e3, "quantize_cpu_ms": qc * 1e3, "share_keys_ms": share_s * 1e3,
            "upload_bytes": up, "download_bytes": down, "plaintext_bytes": 4 * d, "upload_ratio": up / (4 * d)}


def bench_server(n: int, d: int, drop_frac: float, rng: np.random.Generator) -> dict:
    dropped = set(int(u) for u in rng.choice(np.arange(1, n + 1), size=int(drop_frac * n), replace=False))
    cfg, clients, server, routed, inbox, shares, share_s = _setup(n, d, 20, rng)
    x = np.zeros(d, np.uint32)
    recv = recv_cpu = 0.0
    t_clients = time.perf_counter()
    for u in sorted(server.shared - dropped):
        y = clients[u].masked_input(x, inbox.get(u, {}))
        t0, c0 = time.perf_counter(), time.process_time()
        server.receive_masked(u, y)
        recv += time.perf_counter() - t0
        recv_cpu += time.process_time() - c0
    t_clients = time.perf_counter() - t_clients - recv
    surv, drop = server.unmask_request()
    reveals = {u: clients[u].unmask(surv, drop) for u in surv}
    w, c = time.perf_counter(), time.process_time()
    total = server.finish(reveals)
    fin_w, fin_c = time.perf_counter() - w, time.process_time() - c
    assert not total.any(), "the unmasked sum of zero inputs must be zero"
    return {"clients": n, "d": d, "degree": len(cfg.neighbors[1]), "threshold": cfg.threshold, "dropped": len(drop),
            "receive_s": recv, "receive_cpu_s": recv_cpu, "finish_s": fin_w, "finish_cpu_s": fin_c, "round_server_s": recv + fin_w, "round_server_cpu_s": recv_cpu + fin_c,
            "clients_masking_total_s": t_clients, "share_keys_ms_per_client": share_s * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    client = [bench_client(d, rng, 5 if args.quick else 9) for d in (10**5, 10**6)]
    server = bench_server(200, 10**5, 0.1, rng) if args.quick else bench_server(1000, 10**6, 0.1, rng)
    out = {"machine": platform.platform(), "processor": platform.processor(), "quick": args.quick,
           "client": client, "server": server}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2))
    print("| d | neighbours | mask (ms) | mask CPU (ms) | quantize (ms) | share_keys (ms) | upload / plaintext |")
    print("|---|---|---|---|---|---|---|")
    for r in client:
        print(f"| {r['d']:,} | {r['neighbors']} | {r['mask_ms']:.1f} | {r['mask_cpu_ms']:.1f} | {r['quantize_ms']:.1f} | "
              f"{r['share_keys_ms']:.1f} | {r['upload_ratio']:.4f} |")
    s = server
    print(f"\nserver: {s['clients']} clients, d = {s['d']:,}, degree {s['degree']}, t = {s['threshold']}, "
          f"{s['dropped']} dropped: receive {s['receive_s']:.2f} s (CPU {s['receive_cpu_s']:.2f}) + finish "
          f"{s['finish_s']:.2f} s (CPU {s['finish_cpu_s']:.2f}) = {s['round_server_s']:.2f} s per round "
          f"(CPU {s['round_server_cpu_s']:.2f} s)")


if __name__ == "__main__":
    main()
