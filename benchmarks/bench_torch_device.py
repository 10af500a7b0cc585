"""One FL device's DP-SGD round (task option ``local_dp_sgd``): numpy model against a PyTorch module.

Runs in the torch venv (``scripts/test-torch`` makes it; ``$LDP_TORCH_VENV/bin/python``). For
each task model (softmax regression and an MLP, ReLU), the same device data (a seeded
10-class Gaussian mixture), the same round parameters and the same spec (σ, c, q, T), one
round is timed through :func:`ldp_core.fl.local_dpsgd.train_local_dpsgd` (the numpy
device) and :func:`client_sdk.fl.torch_device.train_torch_local_dpsgd` with ghost clipping
and with ``torch.func`` per-sample gradients (vmap). One warm-up round each, then
``--repeats`` rounds per configuration, alternating configurations; the figure is the
median seconds per round (T steps, the Poisson draws, the noise and the layout mapping
included). numpy's BLAS and torch run on one thread (the machine is shared); the load
average is recorded. The largest difference between the numpy and torch updates of the
same round (same generators) is printed beside the timings.

Usage (from the repository root)::

    $LDP_TORCH_VENV/bin/python benchmarks/bench_torch_device.py        # about 10 s

Results print as Markdown and go to ``benchmarks/results/torch_device.json``.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    import torch

    from client_sdk.fl.torch_device import TorchDeviceModel, train_torch_local_dpsgd
    from ldp_core.fl.local_dpsgd import LocalDPSGDSpec, train_local_dpsgd
    from ldp_core.fl.protocol import model_from_dict
    from ldp_core.fl.training import LocalTraining, RoundConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=512, help="N, the device's examples")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "torch_device.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    d, k, n = args.features, 10, args.examples
    spec = LocalDPSGDSpec(noise_multiplier=1.0, clip=1.0, sample_rate=1 / 16, steps=20)
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=1.0, size=(k, d))
    y = rng.integers(0, k, n)
    X = (centers[y] + rng.normal(size=(n, d))).astype(np.float32)
    models = {
        "softmax": {"kind": "softmax", "n_features": d, "n_classes": k, "l2": 0.0},
        "mlp": {"kind": "mlp", "n_features": d, "hidden": args.hidden, "n_classes": k, "activation": "relu", "l2": 0.0},
    }
    load0 = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for name, md in models.items():
        ref = model_from_dict(md)
        params = ref.init_params(np.random.default_rng(1))
        cfg = RoundConfig(0, params, "fedavg", LocalTraining(learning_rate=0.5))
        runs: dict[str, Any] = {
            "numpy": lambda g1, g2, ref=ref, cfg=cfg: train_local_dpsgd(ref, cfg, X, y, spec, g1, g2, "c"),
        }
        for method in ("ghost", "vmap"):
            tdm = TorchDeviceModel.for_task_model(md, method=method)  # type: ignore[arg-type]
            runs[method] = lambda g1, g2, tdm=tdm, cfg=cfg: train_torch_local_dpsgd(tdm, cfg, X, y, spec, g1, g2, "c")
        deltas = {m: f(np.random.default_rng(5), np.random.default_rng(6)).delta for m, f in runs.items()}  # warm-up
        times: dict[str, list[float]] = {m: [] for m in runs}
        for rep in range(args.repeats):
            for m, f in runs.items():
                t0 = time.perf_counter()
                f(np.random.default_rng([rep, 1]), np.random.default_rng([rep, 2]))
                times[m].append(time.perf_counter() - t0)
        for m in runs:
            rows.append(
                {
                    "model": name,
                    "params": ref.num_params,
                    "path": m,
                    "median_seconds_per_round": statistics.median(times[m]),
                    "seconds": times[m],
                    "max_abs_diff_to_numpy": float(np.max(np.abs(deltas[m] - deltas["numpy"]))),
                }
            )
    load1 = os.getloadavg()
    out = {
        "examples": n,
        "features": d,
        "hidden": args.hidden,
        "spec": spec.to_dict(),
        "repeats": args.repeats,
        "torch": torch.__version__,
        "loadavg_before": load0,
        "loadavg_after": load1,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"N = {n}, d = {d}, spec {spec.to_dict()}, load {load0[0]:.2f} -> {load1[0]:.2f}\n")
    print("| model | parameters | path | median s / round | max abs diff to numpy |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['params']:,} | {r['path']} | {r['median_seconds_per_round']:.4f} | "
            f"{r['max_abs_diff_to_numpy']:.2e} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
