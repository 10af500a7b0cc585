"""Secure aggregation speed and communication (ldp_core.fl.secagg, estimator.fl.secagg_server).

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
  ``finish`` is timed with one process and with two (``SecAggServer(workers=2)``,
  the vector split between this process and a helper started beforehand); its
  CPU time includes the helper's (read from /proc).
* **communication** per client: bytes uploaded (key advert, encrypted shares,
  masked vector, unmasking reveals) and downloaded, against a plaintext upload
  of d float32 values (target ≤ 1.1×).

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_secagg.py           # a few minutes
    .venv/bin/python benchmarks/bench_secagg.py --quick   # 200 clients, d = 10^5

Results print as Markdown and are written to ``benchmarks/results/secagg.json``.
The side-by-side comparison with Flower's SecAgg+ is ``benchmarks/bench_flwr_secagg.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import time

import numpy as np

from estimator.fl.parallel_masks import warm_pool
from estimator.fl.secagg_server import SecAggServer, honest_unmask, make_config
from ldp_core.fl.secagg import Quantizer, SecAggClient

RESULTS = pathlib.Path(__file__).parent / "results" / "secagg.json"
SHARE_REVEAL_BYTES = 1 + 4 + 4 + 66  # kind, about-whom, x, y


def _descendants_cpu() -> float:
    """CPU seconds (user + system) of this process's live descendants (Linux /proc)."""
    me, parent, ticks = os.getpid(), {}, {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(pid)], ticks[int(pid)] = int(f[1]), int(f[11]) + int(f[12])
    total = 0
    for pid in parent:
        p = parent[pid]
        while p > 1 and p != me:
            p = parent.get(p, 0)
        if p == me:
            total += ticks[pid]
    return total / os.sysconf("SC_CLK_TCK")


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
    down = (
        20 * 64 + sum(len(ct) for ct in inbox[1].values()) + 4 * n
    )  # neighbours' keys, their shares, the survivor list
    return {
        "d": d,
        "neighbors": len(cfg.neighbors[1]),
        "mask_ms": mw * 1e3,
        "mask_cpu_ms": mc * 1e3,
        "quantize_ms": qw * 1e3,
        "quantize_cpu_ms": qc * 1e3,
        "share_keys_ms": share_s * 1e3,
        "upload_bytes": up,
        "download_bytes": down,
        "plaintext_bytes": 4 * d,
        "upload_ratio": up / (4 * d),
    }


def bench_server(n: int, d: int, drop_frac: float, rng: np.random.Generator, repeats: int) -> dict:
    warm_pool(2)
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
    reveals = honest_unmask(clients, surv, drop)
    out = {
        "clients": n,
        "d": d,
        "degree": len(cfg.neighbors[1]),
        "threshold": cfg.threshold,
        "dropped": len(drop),
        "receive_s": recv,
        "receive_cpu_s": recv_cpu,
        "clients_masking_total_s": t_clients,
        "share_keys_ms_per_client": share_s * 1e3,
        "finish_repeats": repeats,
    }
    for workers in (1, 2):
        server.workers = workers
        walls, cpus = [], []
        for _ in range(repeats):
            w, c, k = time.perf_counter(), time.process_time(), _descendants_cpu()
            total = server.finish(reveals)
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c + _descendants_cpu() - k)
            assert not total.any(), "the unmasked sum of zero inputs must be zero"
        fin_w, fin_c = statistics.median(walls), statistics.median(cpus)
        sfx = "" if workers == 1 else f"_{workers}w"
        out |= {
            f"finish_s{sfx}": fin_w,
            f"finish_cpu_s{sfx}": fin_c,
            f"finish_all_s{sfx}": walls,
            f"round_server_s{sfx}": recv + fin_w,
            f"round_server_cpu_s{sfx}": recv_cpu + fin_c,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    load_start = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    client = [bench_client(d, rng, 5 if args.quick else 9) for d in (10**5, 10**6)]
    server = bench_server(200, 10**5, 0.1, rng, 2) if args.quick else bench_server(1000, 10**6, 0.1, rng, 3)
    out = {
        "started": started,
        "machine": platform.platform(),
        "processor": platform.processor(),
        "quick": args.quick,
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "client": client,
        "server": server,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    if not args.quick:
        RESULTS.write_text(json.dumps(out, indent=2))
    print("| d | neighbours | mask (ms) | mask CPU (ms) | quantize (ms) | share_keys (ms) | upload / plaintext |")
    print("|---|---|---|---|---|---|---|")
    for r in client:
        print(
            f"| {r['d']:,} | {r['neighbors']} | {r['mask_ms']:.1f} | {r['mask_cpu_ms']:.1f} | {r['quantize_ms']:.1f} | "
            f"{r['share_keys_ms']:.1f} | {r['upload_ratio']:.4f} |"
        )
    s = server
    for sfx, label in (("", "1 process"), ("_2w", "2 processes")):
        print(
            f"\nserver ({label}): {s['clients']} clients, d = {s['d']:,}, degree {s['degree']}, t = {s['threshold']}, "
            f"{s['dropped']} dropped: receive {s['receive_s']:.2f} s (CPU {s['receive_cpu_s']:.2f}) + finish "
            f"{s['finish_s' + sfx]:.2f} s (CPU {s['finish_cpu_s' + sfx]:.2f}) "
            f"= {s['round_server_s' + sfx]:.2f} s per round "
            f"(CPU {s['round_server_cpu_s' + sfx]:.2f} s)"
        )
    print(f"\nload average {out['load_start']} → {out['load_end']}")


if __name__ == "__main__":
    main()
