"""The pure-ldp half of ``bench_oracles.py``; runs inside ``.bench-venv``.

It imports nothing from this project (the two sides live in different
virtual environments with different numpy versions). It reads a JSON job
written by ``bench_oracles.py``::

    {"data": "/tmp/.../values.npy", "d": 1024, "epsilon": 2.0, "repeats": 3,
     "seed": 12345, "out": "/tmp/.../pureldp.json",
     "mechanisms": [{"name": "olh", "kind": "olh", "n": 2000, "params": {"g": 8}}, ...]}

(``kind`` picks the pure-ldp classes; ``name`` labels the result.)

and, for each mechanism, privatises the first ``n`` values of the data file
one at a time with pure-ldp's client class (its API has no batch encoder),
then times the server's ``aggregate`` over every report plus
``estimate_all`` over the whole domain. pure-ldp draws its randomness from
the ``random`` and ``numpy.random`` module state, so the only way to make
its runs reproducible is to seed that state here, once per repeat.

Usage: ``.bench-venv/bin/python benchmarks/pureldp_side.py JOB.json``.
Progress goes to stderr; results go to the job's ``out`` file.
"""

from __future__ import annotations

import json
import random
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["main", "FACTORIES"]


def _log(msg: str) -> None:
    print(f"[pure-ldp] {msg}", file=sys.stderr, flush=True)


# Each factory returns (client, server, items): ``items`` turns our 0-based
# domain indices into the values pure-ldp's classes expect (their default
# index mapper is ``x - 1``), and the server is what estimate_all is asked for.
Factory = Callable[[float, int, dict[str, Any]], tuple[Any, Any, Callable[[np.ndarray], list]]]


def _one_based(v: np.ndarray) -> list:
    return (v.astype(np.int64) + 1).tolist()


def _raw(v: np.ndarray) -> list:
    return v.astype(np.int64).tolist()


def _grr(eps: float, d: int, params: dict[str, Any]):
    from pure_ldp.frequency_oracles.direct_encoding import DEClient, DEServer

    return DEClient(eps, d), DEServer(eps, d), _one_based


def _oue(eps: float, d: int, params: dict[str, Any]):
    from pure_ldp.frequency_oracles.unary_encoding import UEClient, UEServer

    return UEClient(eps, d, use_oue=True), UEServer(eps, d, use_oue=True), _one_based


def _olh(eps: float, d: int, params: dict[str, Any]):
    from pure_ldp.frequency_oracles.local_hashing import LHClient, LHServer

    g = int(params["g"])
    return LHClient(eps, d, g=g, use_olh=False), LHServer(eps, d, g=g, use_olh=False), _one_based


def _hr(eps: float, d: int, params: dict[str, Any]):
    from pure_ldp.frequency_oracles.hadamard_response import HadamardResponseClient, HadamardResponseServer

    server = HadamardResponseServer(eps, d)
    return HadamardResponseClient(eps, d, server.get_hash_funcs()), server, _one_based


def _cms_like(hadamard: bool):
    def factory(eps: float, d: int, params: dict[str, Any]):
        from pure_ldp.frequency_oracles.apple_cms import CMSClient, CMSServer

        k, m = int(params["k"]), int(params["m"])
        server = CMSServer(eps, k, m, is_hadamard=hadamard)
        return CMSClient(eps, server.get_hash_funcs(), m, is_hadamard=hadamard), server, _raw

    return factory


def _rappor(eps: float, d: int, params: dict[str, Any]):
    from pure_ldp.frequency_oracles.rappor import RAPPORClient, RAPPORServer

    f, m, k, c = float(params["f"]), int(params["m"]), int(params["k"]), int(params["cohorts"])
    server = RAPPORServer(f, m, k, d, num_of_cohorts=c)
    return RAPPORClient(f, m, server.get_hash_funcs(), num_of_cohorts=c), server, _one_based


FACTORIES: dict[str, Factory] = {
    "grr": _grr,
    "oue": _oue,
    "olh": _olh,
    "hr": _hr,
    "cms": _cms_like(False),
    "hcms": _cms_like(True),
    "rappor": _rappor,
}

#: the pure-ldp classes each name is measured with (for the report)
CLASSES: dict[str, str] = {
    "grr": "DEClient / DEServer",
    "oue": "UEClient / UEServer (use_oue=True)",
    "olh": "LHClient / LHServer (exact, g as ours)",
    "hr": "HadamardResponseClient / HadamardResponseServer",
    "cms": "CMSClient / CMSServer (is_hadamard=False)",
    "hcms": "CMSClient / CMSServer (is_hadamard=True)",
    "rappor": "RAPPORClient / RAPPORServer",
}


def run_one(
    name: str, kind: str, values: np.ndarray, eps: float, d: int, params: dict[str, Any], repeats: int, seed: int
) -> dict[str, Any]:
    """Time pure-ldp's client and server for one mechanism over ``values``."""
    n = int(values.size)
    truth = np.bincount(values, minlength=d).astype(np.float64)
    domain = _one_based(np.arange(d)) if kind not in ("cms", "hcms") else _raw(np.arange(d))
    runs = []
    for r in range(repeats):
        random.seed(f"pure-ldp/{seed}/{name}/{r}")
        np.random.seed((seed * 7919 + 104729 * (r + 1) + sum(map(ord, name))) % 2**32)
        client, server, to_items = FACTORIES[kind](eps, d, params)
        items = to_items(values)
        privatise = client.privatise
        t0, c0 = time.perf_counter(), time.process_time()
        reports = [privatise(x) for x in items]
        t1, c1 = time.perf_counter(), time.process_time()
        aggregate = server.aggregate
        for rep in reports:
            aggregate(rep)
        t2, c2 = time.perf_counter(), time.process_time()
        run: dict[str, Any] = {
            "encode_s": t1 - t0,
            "aggregate_s": t2 - t1,
            "encode_cpu_s": c1 - c0,
            "aggregate_cpu_s": c2 - c1,
        }
        try:
            est = np.asarray(server.estimate_all(domain, suppress_warnings=True), dtype=np.float64)
        except Exception as exc:  # e.g. RAPPOR's Lasso selecting no feature at small n
            run["estimate_error"] = f"{type(exc).__name__}: {exc}"
            _log(f"{name} repeat {r + 1}/{repeats}: estimation failed: {run['estimate_error']}")
        else:
            run["estimate_s"] = time.perf_counter() - t2
            run["estimate_cpu_s"] = time.process_time() - c2
            err = est - truth
            run.update(mse=float(np.mean(err**2)), sq_err_std=float(np.std(err**2)), bias_mean=float(np.mean(err)))
            _log(
                f"{name} repeat {r + 1}/{repeats}: n={n} encode {t1 - t0:.2f}s aggregate {t2 - t1:.2f}s "
                f"estimate {run['estimate_s']:.2f}s mse {run['mse']:.4g}"
            )
        runs.append(run)
        del reports, server, client
    return {"name": name, "kind": kind, "n": n, "classes": CLASSES[kind], "params": params, "runs": runs}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: pureldp_side.py JOB.json", file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        job = json.load(fh)
    warnings.filterwarnings("ignore")
    data = np.load(job["data"])
    import pure_ldp
    import xxhash

    out: dict[str, Any] = {
        "versions": {
            "pure_ldp": getattr(pure_ldp, "__version__", None) or _dist_version("pure-ldp"),
            "numpy": np.__version__,
            "xxhash": xxhash.VERSION,
            "python": sys.version.split()[0],
        },
        "mechanisms": {},
    }
    for mech in job["mechanisms"]:
        name, n = mech["name"], int(mech["n"])
        _log(f"{name}: n={n}, params {mech.get('params', {})}")
        try:
            out["mechanisms"][name] = run_one(
                name,
                mech.get("kind", name),
                data[:n],
                float(job["epsilon"]),
                int(job["d"]),
                mech.get("params", {}),
                int(job["repeats"]),
                int(job["seed"]),
            )
        except Exception as exc:  # report and go on with the next mechanism
            _log(f"{name} failed: {type(exc).__name__}: {exc}")
            out["mechanisms"][name] = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
        with open(job["out"], "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


def _dist_version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
