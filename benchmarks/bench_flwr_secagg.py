"""Our SecAgg+ (ldp_core.fl.secagg, estimator.fl.secagg_server) next to Flower's (flwr 1.42.0).

Runs inside ``.bench-flwr-venv`` (made by ``benchmarks/flwr_env.sh``), where
flwr and this project are both installed, so both sides run in one process,
in one run, on the same inputs, alternating repeat by repeat:

1. **mask PRG**, d = 10^5 and 10^6 words: ours ``prg_words`` (AES-256-CTR
   keystream as uint32) against Flower's ``pseudo_rand_gen``
   (``flwr/common/secure_aggregation/secaggplus_utils.py``: the seed's 32-bit
   words XOR-ed into one 32-bit seed of ``numpy.random.RandomState``,
   Mersenne Twister, ``randint`` into int64).
2. **client masking** with 20 neighbours: (a) the mask arithmetic alone,
   21 mask streams (self + 20 pairwise) added into a d-vector, ours
   ``add_masks`` against Flower's ``pseudo_rand_gen`` +
   ``parameters_addition``/``parameters_subtraction`` + ``parameters_mod``;
   (b) the client's whole masking step, ours ``Quantizer.quantize`` +
   ``SecAggClient.masked_input`` (decrypt 20 shares, 20 X25519 + HKDF, masks)
   against Flower's own stage function ``_collect_masked_vectors``
   (``flwr/client/mod/secure_aggregation/secaggplus_mod.py``: decrypt 20
   Fernet shares, quantize, 20 ECDH P-384 + HKDF, masks, mod).
3. **server**, n clients, 10 % dropped after sharing keys: adding the
   survivors' masked vectors, then unmasking. Ours ``receive_masked`` and
   ``finish``. Flower's unmasking lives inside ``SecAggPlusWorkflow.unmask_stage``,
   which needs a running Flower grid, so its steps are called here one by one
   on the same data: ``combine_shares`` per client, then for a survivor
   ``pseudo_rand_gen`` of its seed subtracted, for a dropped client
   ``generate_shared_key`` with each neighbour and that mask added or
   subtracted, then ``parameters_mod``; adding inputs is ``bytes_to_ndarray``
   + ``parameters_addition`` + ``parameters_mod`` as in its
   ``collect_masked_vectors_stage``. Both sides' clients run for real
   (Flower's through ``_setup``, ``_share_keys``, ``_collect_masked_vectors``,
   ``_unmask``) and both unmasked sums are checked exactly.
   At the largest size (``--full``: 1,000 × 10^6) running 900 Flower clients
   would take minutes, so there Flower's keys and shares are real but its
   aggregate is a zero vector: its unmasking does the same work whatever the
   aggregate holds (one PRG stream per survivor, one per dropped client and
   neighbour), but that result is not checked.
4. **communication** per client: every payload a client uploads in the four
   stages, as bytes, against a plaintext float32 upload of d values.

Times are medians of repeats, wall clock and process CPU time (all threads);
the machine is shared, so the load average is recorded at the start and end.

Usage (from the repository root)::

    PY=$(bash benchmarks/flwr_env.sh)             # once; idempotent
    $PY benchmarks/bench_flwr_secagg.py            # a few minutes
    $PY benchmarks/bench_flwr_secagg.py --full     # adds 1,000 × 10^6 (several more minutes)

Results print as Markdown and go to ``benchmarks/results/flwr_secagg.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import importlib

    import flwr
    from flwr.app import ConfigRecord
    from flwr.common import Parameters, bytes_to_ndarray, ndarray_to_bytes
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        get_parameters_shape,
        parameters_addition,
        parameters_mod,
        parameters_subtraction,
    )
    from flwr.common.secure_aggregation.secaggplus_constants import Key
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

    # the package re-exports a function of the module's name; the stage functions live in the module
    fmod = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
except ImportError as e:  # pragma: no cover
    raise SystemExit(
        f"flwr is not importable ({e}); run with the python printed by `bash benchmarks/flwr_env.sh`"
    ) from e

from estimator.fl.secagg_server import SecAggServer, honest_unmask, make_config
from ldp_core.fl.secagg import Quantizer, SecAggClient, add_masks, prg_words

__all__ = ["main"]

RESULTS = pathlib.Path(__file__).parent / "results" / "flwr_secagg.json"
SHARE_REVEAL_BYTES = 1 + 4 + 4 + 66  # ours: kind, about-whom, x, y
MOD = 2**32
TARGET_RANGE = 2**22  # Flower's defaults (SecAggPlusWorkflow)
CLIP = 8.0
MAX_WEIGHT = 1000.0


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _clock(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def _side_by_side(
    ours: Callable[[], Any], theirs: Callable[[], Any], repeats: int, theirs_repeats: int | None = None
) -> dict[str, Any]:
    """Median wall and CPU seconds of each, alternating ours/theirs every repeat
    (Flower's only in the first ``theirs_repeats`` rounds when that is smaller)."""
    k = repeats if theirs_repeats is None else min(repeats, theirs_repeats)
    t: dict[str, list[float]] = {"ours_wall": [], "ours_cpu": [], "flwr_wall": [], "flwr_cpu": []}
    for i in range(repeats):
        for name, fn in (("ours", ours), ("flwr", theirs)):
            if name == "flwr" and i >= k:
                continue
            w, c, _ = _clock(fn)
            t[f"{name}_wall"].append(w)
            t[f"{name}_cpu"].append(c)
    out: dict[str, Any] = {key: statistics.median(v) for key, v in t.items()}
    out["ratio_wall"] = out["ours_wall"] / out["flwr_wall"]
    out["ratio_cpu"] = out["ours_cpu"] / out["flwr_cpu"]
    out["repeats"], out["flwr_repeats"] = repeats, k
    out["all"] = t
    return out


# -- Flower's clients, driven through its own stage functions ---------------------------
class FlowerRound:
    """One SecAgg+ round of Flower clients 1..n on a ring of ``num_shares`` (self included),
    set up through secaggplus_mod's stage functions as its server workflow would."""

    def __init__(
        self,
        n: int,
        d: int,
        num_shares: int,
        threshold: int,
        rng: np.random.Generator,
        drop_after_share: set[int] = frozenset(),
    ) -> None:
        self.n, self.d = n, d
        ids = [int(i) for i in rng.permutation(np.arange(1, n + 1))]
        half = num_shares // 2
        self.nbrs = {nid: {ids[(i + o) % n] for o in range(-half, half + 1)} for i, nid in enumerate(ids)}
        setup = {
            Key.SAMPLE_NUMBER: n,
            Key.SHARE_NUMBER: num_shares,
            Key.THRESHOLD: threshold,
            Key.CLIPPING_RANGE: CLIP,
            Key.TARGET_RANGE: TARGET_RANGE,
            Key.MOD_RANGE: MOD,
            Key.MAX_WEIGHT: MAX_WEIGHT,
        }
        self.states: dict[int, Any] = {}
        self.pks: dict[int, tuple[bytes, bytes]] = {}
        self.up: dict[int, int] = {}
        for nid in range(1, n + 1):
            st = fmod.SecAggPlusState()
            st.nid = nid
            res = fmod._setup(st, ConfigRecord(dict(setup)))
            self.states[nid], self.pks[nid] = st, (res[Key.PUBLIC_KEY_1], res[Key.PUBLIC_KEY_2])
            self.up[nid] = len(res[Key.PUBLIC_KEY_1]) + len(res[Key.PUBLIC_KEY_2])
        self.fwd: dict[int, tuple[list[int], list[bytes]]] = {nid: ([], []) for nid in range(1, n + 1)}
        t0 = time.perf_counter()
        for nid in range(1, n + 1):
            cfg = {str(v): list(self.pks[v]) for v in self.nbrs[nid]}
            res = fmod._share_keys(self.states[nid], ConfigRecord(cfg))
            for dst, ct in zip(res[Key.DESTINATION_LIST], res[Key.CIPHERTEXT_LIST]):
                self.fwd[dst][0].append(nid)
                self.fwd[dst][1].append(ct)
            self.up[nid] += sum(len(ct) for ct in res[Key.CIPHERTEXT_LIST]) + 8 * len(res[Key.DESTINATION_LIST])
        self.share_keys_s = (time.perf_counter() - t0) / n
        self.active = set(range(1, n + 1)) - set(drop_after_share)
        self.dead = set(drop_after_share)

    def masked(self, nid: int, params: list[np.ndarray], num_examples: int = 1) -> list[bytes]:
        srcs, cts = self.fwd[nid]
        res = fmod._collect_masked_vectors(
            self.states[nid],
            ConfigRecord({Key.CIPHERTEXT_LIST: list(cts), Key.SOURCE_LIST: list(srcs)}),
            num_examples,
            Parameters(tensors=[ndarray_to_bytes(p) for p in params], tensor_type="numpy.ndarray"),
        )
        return list(res[Key.MASKED_PARAMETERS])

    def reveal(self, nid: int) -> tuple[list[int], list[bytes]]:
        nb = self.nbrs[nid]
        res = fmod._unmask(
            self.states[nid],
            ConfigRecord(
                {Key.ACTIVE_NODE_ID_LIST: sorted(nb & self.active), Key.DEAD_NODE_ID_LIST: sorted(nb & self.dead)}
            ),
        )
        return list(res[Key.NODE_ID_LIST]), list(res[Key.SHARE_LIST])


def flwr_sum(masked: list[list[bytes]]) -> list[np.ndarray]:
    """Flower's collect_masked_vectors_stage: decode, add, reduce mod 2^32."""
    acc = None
    for blobs in masked:
        vec = [bytes_to_ndarray(b) for b in blobs]
        acc = vec if acc is None else parameters_addition(acc, vec)
    return parameters_mod(acc, MOD)


def flwr_unmask(
    rnd: FlowerRound, aggregate: list[np.ndarray], reveals: dict[int, tuple[list[int], list[bytes]]]
) -> list[np.ndarray]:
    """The mask removal of Flower's unmask_stage, step by step with its primitives."""
    shares: dict[int, list[bytes]] = {nid: [] for nid in rnd.active | rnd.dead}
    for nids, sh in reveals.values():
        for owner, s in zip(nids, sh):
            shares[owner].append(s)
    vec = aggregate
    shapes = get_parameters_shape(vec)
    for nid, sl in shares.items():
        secret = combine_shares(sl)
        if nid in rnd.active:
            vec = parameters_subtraction(vec, pseudo_rand_gen(secret, MOD, shapes))
            continue
        sk = bytes_to_private_key(secret)
        for v in rnd.nbrs[nid] - {nid}:
            m = pseudo_rand_gen(generate_shared_key(sk, bytes_to_public_key(rnd.pks[v][0])), MOD, shapes)
            vec = parameters_addition(vec, m) if nid > v else parameters_subtraction(vec, m)
    return parameters_mod(vec, MOD)


# -- ours -------------------------------------------------------------------------------
def ours_round(n: int, d: int, degree: int, rng: np.random.Generator, drop_after_share: set[int] = frozenset()):
    cfg = make_config(0, n, d, rng, degree)
    clients = {u: SecAggClient(u, cfg) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    routed = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    t0 = time.perf_counter()
    shares = {u: c.share_keys(routed[u]) for u, c in clients.items()}
    share_s = (time.perf_counter() - t0) / n
    inbox = server.route_shares(shares)
    return cfg, clients, server, inbox, shares, share_s


# -- the four comparisons ---------------------------------------------------------------
def bench_prg(d: int, repeats: int) -> dict:
    seed = os.urandom(32)
    fseed = generate_shared_key(*_p384_pair())  # Flower's pairwise seeds: 44 bytes of base64
    buf = np.empty(d + 4, np.uint32)
    r = _side_by_side(lambda: prg_words(seed, d, buf), lambda: pseudo_rand_gen(fseed, MOD, [(d,)]), repeats)
    return {"d": d, **r}


def _p384_pair():
    from cryptography.hazmat.primitives.asymmetric import ec

    a, b = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    return a, b.public_key()


def bench_client(d: int, rng: np.random.Generator, repeats: int) -> dict:
    n = 21  # 20 neighbours: the complete graph (ours) / a ring of 21 shares on 21 nodes (Flower)
    cfg, clients, server, inbox, shares, share_s = ours_round(n, d, 20, rng)
    frnd = FlowerRound(n, d, 21, 11, rng)
    upd = rng.normal(scale=0.01, size=d).astype(np.float32)
    q = Quantizer.for_clients(1000, CLIP)
    x = q.quantize(upd, rng)

    # (a) mask arithmetic: 21 streams into a d-vector
    seeds = [(os.urandom(32), 1 if i % 2 else -1) for i in range(21)]
    fseeds = [(generate_shared_key(*_p384_pair()), i % 2) for i in range(21)]
    fx = [np.array([4194]), x.astype(np.int64)]

    def flwr_masks():
        vec, shapes = fx, get_parameters_shape(fx)
        for s, add in fseeds:
            m = pseudo_rand_gen(s, MOD, shapes)
            vec = parameters_addition(vec, m) if add else parameters_subtraction(vec, m)
        return parameters_mod(vec, MOD)

    arith = _side_by_side(lambda: add_masks(x.copy(), seeds), flwr_masks, repeats)
    # (b) the client's whole masking step
    c1 = clients[1]
    whole = _side_by_side(
        lambda: c1.masked_input(q.quantize(upd, rng), inbox[1]), lambda: frnd.masked(1, [upd]), repeats
    )

    # communication (every upload of the four stages)
    y = c1.masked_input(x, inbox[1])
    ours_up = 64 + sum(len(ct) for ct in shares[1].values()) + y.nbytes + 20 * SHARE_REVEAL_BYTES
    fmasked = frnd.masked(1, [upd])
    nids, fsh = frnd.reveal(1)
    flwr_up = frnd.up[1] + sum(len(b) for b in fmasked) + sum(len(s) for s in fsh) + 8 * len(nids)
    plain = 4 * d
    comm = {
        "ours_upload_bytes": ours_up,
        "flwr_upload_bytes": flwr_up,
        "plaintext_float32_bytes": plain,
        "ours_ratio": ours_up / plain,
        "flwr_ratio": flwr_up / plain,
        "flwr_masked_vector_bytes": sum(len(b) for b in fmasked),
        "ours_masked_vector_bytes": y.nbytes,
        "flwr_masked_dtype": str(bytes_to_ndarray(fmasked[1]).dtype),
    }
    return {
        "d": d,
        "neighbors": 20,
        "mask_arithmetic": arith,
        "client_step": whole,
        "communication": comm,
        "share_keys_ms": {"ours": share_s * 1e3, "flwr": frnd.share_keys_s * 1e3},
    }


def bench_server(n: int, d: int, rng: np.random.Generator, repeats: int, flwr_real: bool = True) -> dict:
    dropped = {int(u) for u in rng.choice(np.arange(1, n + 1), size=n // 10, replace=False)}
    surv = sorted(set(range(1, n + 1)) - dropped)
    zero32 = np.zeros(d, np.float32)
    # ours: real clients, zero inputs, so the unmasked sum must be zero
    cfg, clients, server, inbox, _, _ = ours_round(n, d, 20, rng, dropped)
    ys = {}
    if flwr_real:  # keep the masked inputs to time adding them, side by side, several times
        ys = {u: clients[u].masked_input(np.zeros(d, np.uint32), inbox.get(u, {})) for u in surv}
    else:  # 900 × 4 MB: add each as it is made, timed once
        ours_recv_once = [0.0, 0.0]
        for u in surv:
            y = clients[u].masked_input(np.zeros(d, np.uint32), inbox.get(u, {}))
            w, c, _ = _clock(lambda u=u, y=y: server.receive_masked(u, y))
            ours_recv_once[0] += w
            ours_recv_once[1] += c

    def ours_receive():
        s = SecAggServer(cfg)
        s.adverts, s.shared = server.adverts, server.shared
        for u in surv:
            s.receive_masked(u, ys[u])  # noqa: F821  (called before the `del ys` below, which frees them)
        return s

    recv_srv = ours_receive() if flwr_real else server
    sv, dr = recv_srv.unmask_request()
    ours_reveals = honest_unmask(clients, sv, dr)
    # Flower: its stage functions; zero updates quantize to exactly target_range / 2 each
    t0 = time.perf_counter()
    frnd = FlowerRound(n, d, 21, 11, rng, dropped)
    flwr_setup_s = time.perf_counter() - t0
    if flwr_real:
        fmasked = [frnd.masked(u, [zero32]) for u in surv]
        fagg = flwr_sum(fmasked)
    else:  # the clients still decrypt and keep their neighbours' shares (a 1-word vector: shares do not depend on d)
        for u in surv:
            frnd.masked(u, [np.zeros(1, np.float32)])
        fmasked, fagg = [], [np.zeros(1, np.int64), np.zeros(d, np.int64)]
    freveals = {u: frnd.reveal(u) for u in surv}

    if flwr_real:
        recv = _side_by_side(ours_receive, lambda: flwr_sum(fmasked), repeats)  # noqa: F821  (before the del)
        recv["note"] = "the inputs are held in memory (ours uint32 arrays, Flower's .npy bytes)"
    else:
        recv = {"ours_wall": ours_recv_once[0], "ours_cpu": ours_recv_once[1], "repeats": 1}
    del ys, fmasked
    unmask = _side_by_side(
        lambda: recv_srv.finish(ours_reveals),
        lambda: flwr_unmask(frnd, fagg, freveals),
        repeats,
        1 if n >= 1000 else None,
    )  # Flower's unmasking of 1,000 clients takes minutes
    ours_total = recv_srv.finish(ours_reveals)
    f_total = flwr_unmask(frnd, fagg, freveals)
    ours_ok = not ours_total.any()
    flwr_ok = None
    if flwr_real:
        k = len(surv)
        flwr_ok = bool(
            int(f_total[0][0]) == k * round(TARGET_RANGE / MAX_WEIGHT)
            and np.all(f_total[1] == (k * TARGET_RANGE // 2) % MOD)
        )
    if not ours_ok or flwr_ok is False:
        raise SystemExit(f"unmasked sum wrong: ours ok {ours_ok}, flwr ok {flwr_ok}")
    return {
        "clients": n,
        "d": d,
        "dropped": len(dropped),
        "flwr_real_clients": flwr_real,
        "receive": recv,
        "unmask": unmask,
        "flwr_setup_and_share_keys_s": flwr_setup_s,
        "flwr_share_keys_ms_per_client": frnd.share_keys_s * 1e3,
        "ours_sum_checked": ours_ok,
        "flwr_sum_checked": flwr_ok,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--server-repeats", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="also the server at 1,000 clients × 10^6")
    ap.add_argument("--quick", action="store_true", help="small sizes only (a check that it runs)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=pathlib.Path(__file__).parent
    ).stdout.strip()
    out: dict[str, Any] = {
        "started": started,
        "commit": commit,
        "flwr": flwr.__version__,
        "numpy": np.__version__,
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load_start": _load(),
        "argv": vars(args),
    }
    sizes = (10**4, 10**5) if args.quick else (10**5, 10**6)
    out["prg"] = [bench_prg(d, args.repeats) for d in sizes]
    out["client"] = [bench_client(d, rng, args.repeats) for d in sizes]
    print(f"PRG and client done (load {_load()})", flush=True)
    server_sizes = [(50, 10**4, True)] if args.quick else [(200, 10**5, True), (1000, 10**5, True)]
    if args.full:
        server_sizes.append((1000, 10**6, False))
    out["server"] = []
    RESULTS.parent.mkdir(exist_ok=True)
    for n, d, real in server_sizes:
        out["server"].append(bench_server(n, d, rng, args.server_repeats, real))
        out["load_end"] = _load()
        print(f"server {n} × {d} done (load {_load()})", flush=True)
        if not args.quick:  # saved after every size: the large ones take minutes
            RESULTS.write_text(json.dumps(out, indent=2))
    _print(out)


def _print(o: dict) -> None:
    ms = 1e3
    print(
        f"\nflwr {o['flwr']}, numpy {o['numpy']}, commit {o['commit']}, {o['started']}; "
        f"load {o['load_start']} → {o['load_end']}\n"
    )
    print("| measurement | ours wall | ours CPU | Flower wall | Flower CPU | ours/Flower (CPU) |")
    print("|---|---|---|---|---|---|")
    for r in o["prg"]:
        print(
            f"| mask PRG, d = {r['d']:,} | {r['ours_wall'] * ms:.2f} ms | {r['ours_cpu'] * ms:.2f} ms | "
            f"{r['flwr_wall'] * ms:.2f} ms | {r['flwr_cpu'] * ms:.2f} ms | {r['ratio_cpu']:.3f} |"
        )
    for r in o["client"]:
        for key, label in (("mask_arithmetic", "21 masks added"), ("client_step", "client masking step")):
            m = r[key]
            print(
                f"| {label}, d = {r['d']:,} | {m['ours_wall'] * ms:.1f} ms | {m['ours_cpu'] * ms:.1f} ms | "
                f"{m['flwr_wall'] * ms:.1f} ms | {m['flwr_cpu'] * ms:.1f} ms | {m['ratio_cpu']:.3f} |"
            )
    for s in o["server"]:
        tag = "" if s["flwr_real_clients"] else " (Flower: zero aggregate)"
        for key in ("receive", "unmask"):
            m = s[key]
            if "flwr_wall" not in m:
                print(
                    f"| server {key}, {s['clients']:,} × {s['d']:,}, {s['dropped']} dropped (ours only) "
                    f"| {m['ours_wall']:.2f} s | {m['ours_cpu']:.2f} s | — | — | — |"
                )
                continue
            print(
                f"| server {key}, {s['clients']:,} × {s['d']:,}, {s['dropped']} dropped{tag} "
                f"| {m['ours_wall']:.2f} s | {m['ours_cpu']:.2f} s "
                f"| {m['flwr_wall']:.2f} s | {m['flwr_cpu']:.2f} s | {m['ratio_cpu']:.3f} |"
            )
    print("\n| d | ours upload | Flower upload | plaintext float32 | ours / plaintext | Flower / plaintext |")
    print("|---|---|---|---|---|---|")
    for r in o["client"]:
        c = r["communication"]
        print(
            f"| {r['d']:,} | {c['ours_upload_bytes']:,} | {c['flwr_upload_bytes']:,} "
            f"| {c['plaintext_float32_bytes']:,} | {c['ours_ratio']:.4f} | {c['flwr_ratio']:.4f} |"
        )


if __name__ == "__main__":
    main()
