"""DP-SGD on torch: ours (client_sdk.fl.torch_dpsgd) beside Opacus 1.6.0, and adapter-only memory.

Runs inside ``.bench-opacus-venv`` (``bash benchmarks/baseline_env.sh opacus``), where Opacus,
torch and this project are installed. Two parts, each configuration in a fresh subprocess
(so that its peak memory is its own), alternating configurations repeat by repeat:

1. **Opacus side by side.** The same MLP (d → h → K, ReLU), the same initial parameters
   (drawn from a numpy generator), the same data (a seeded Gaussian mixture), clipping
   norm C, noise multiplier σ, Poisson sampling at q = 1/32 of N = 8192 (expected batch
   256, Opacus's ``poisson_sampling=True`` with ``batch_size=256``), SGD with the same
   learning rate, the gradient divided by the expected batch size on both sides. Ours
   with ghost clipping and with vmap per-sample gradients; Opacus with its per-sample
   hooks and with its ghost clipping (``grad_sample_mode="ghost"``). ε at δ from our
   accountants (dp_accounting PLD and RDP) and Opacus's (RDP and PRV) for the same
   (σ, q, steps); test accuracy after E epochs over several seeds (median and range);
   seconds per step (median over the steps after the first) and peak memory.
2. **Adapter-only training.** A wider MLP backbone, all parameters trained against a
   frozen backbone with rank-r LoRA adapters on each linear layer (``add_lora``), with
   ghost clipping and vmap per-sample gradients (and Opacus hooks for reference).

Peak memory: the process's resident set high-water mark (``VmHWM``) is reset through
``/proc/self/clear_refs`` after the first training step (which loads code lazily:
torch.func's transforms alone add some 170 MB of resident memory on their first call),
and the figure is VmHWM at the end minus VmRSS at the reset: the memory the remaining
training steps added. Times are medians over the steps after the first. torch runs on one thread (the machine is shared); the load average is recorded.

Usage (from the repository root)::

    PY=$(bash benchmarks/baseline_env.sh opacus)     # once; idempotent
    $PY benchmarks/bench_opacus.py                   # a few minutes

Results print as Markdown, go to ``benchmarks/results/opacus.json`` and the plot to
``docs/img/dpsgd_opacus.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
N, D, K, HIDDEN, BATCH = 8192, 64, 10, 256, 256
Q = BATCH / N
SIGMA, CLIP, LR, DELTA = 1.0, 1.0, 0.5, 1e-5


def _rss_kb(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _reset_peak() -> int:
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    return _rss_kb("VmRSS")


def make_data(seed: int, n: int, d: int, k: int) -> tuple[np.ndarray, ...]:
    """A Gaussian mixture: K class means drawn N(0, (16/d)·I), unit noise; n train and n/4 test rows."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 4.0 / np.sqrt(d), size=(k, d))
    y = rng.integers(0, k, size=n + n // 4)
    x = (means[y] + rng.normal(size=(len(y), d))).astype(np.float32)
    return x[:n], y[:n], x[n:], y[n:]


def build(seed: int, d: int, hidden: int, layers: int, lora: int) -> Any:
    import torch
    from torch import nn

    from client_sdk.fl.torch_adapter import TorchModel
    from client_sdk.fl.torch_dpsgd import add_lora

    mods: list[Any] = []
    width = d
    for _ in range(layers):
        mods += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    mods.append(nn.Linear(width, K))
    net = nn.Sequential(*mods)
    m = TorchModel(net, "multiclass")
    m.load_into(m.init_params(np.random.default_rng(seed)))
    if lora:
        add_lora(net, lora, np.random.default_rng(seed + 1))
    torch.manual_seed(seed)  # unused by our side; Opacus draws from the generators passed below
    return net


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from client_sdk.fl.torch_adapter import TorchModel
    from client_sdk.fl.torch_dpsgd import torch_dpsgd_step
    from ldp_core.fl.dpsgd import DPSGDConfig

    seed, impl = spec["seed"], spec["impl"]
    x, y, xt, yt = make_data(100 + seed, spec["n"], spec["d"], K)
    net = build(seed, spec["d"], spec["hidden"], spec["layers"], spec["lora"])
    trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
    steps_per_epoch = round(1 / spec["q"])
    steps = spec["epochs"] * steps_per_epoch
    times: list[float] = []
    if impl.startswith("ours"):
        m = TorchModel(net, "multiclass")
        cfg = DPSGDConfig(SIGMA, CLIP, spec["q"], LR)
        srng, nrng = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2])
        base = 0
        for t in range(steps):
            t0 = time.perf_counter()
            torch_dpsgd_step(m, x, y, cfg, srng, nrng, impl.split("-")[1])
            times.append(time.perf_counter() - t0)
            if t == 0:
                base = _reset_peak()
    else:
        from opacus import PrivacyEngine
        from torch.utils.data import DataLoader, TensorDataset

        ds = TensorDataset(torch.as_tensor(x), torch.as_tensor(y))
        loader = DataLoader(ds, batch_size=round(spec["q"] * spec["n"]), generator=torch.Generator().manual_seed(seed))
        opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=LR)
        mode = impl.split("-")[1]
        net.train()  # Opacus insists; the MLP has no dropout or normalization, so it computes the same
        engine = PrivacyEngine(accountant="prv", secure_mode=False)
        crit = torch.nn.CrossEntropyLoss()
        out = engine.make_private(
            module=net,
            optimizer=opt,
            criterion=crit,
            data_loader=loader,
            noise_multiplier=SIGMA,
            max_grad_norm=CLIP,
            poisson_sampling=True,
            noise_generator=torch.Generator().manual_seed(seed + 7),
            grad_sample_mode=mode,
        )
        if mode == "ghost":
            net, opt, crit, loader = out
        else:
            net, opt, loader = out
        base = done = 0
        while done < steps:
            for xb, yb in loader:
                t0 = time.perf_counter()
                opt.zero_grad()
                loss = crit(net(xb), yb)
                loss.backward()
                opt.step()
                times.append(time.perf_counter() - t0)
                if done == 0:
                    base = _reset_peak()
                done += 1
                if done == steps:
                    break
    peak_mb = (_rss_kb("VmHWM") - base) / 1024
    with torch.no_grad():
        acc = float((net(torch.as_tensor(xt)).argmax(1).numpy() == yt).mean())
    return {
        "impl": impl,
        "seed": seed,
        "steps": steps,
        "trainable_params": trainable,
        "seconds_per_step": statistics.median(times[1:]),
        "peak_mb": peak_mb,
        "accuracy": acc,
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"{spec}: {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def epsilons(steps: int) -> dict[str, float]:
    from opacus.accountants import PRVAccountant, RDPAccountant

    from ldp_core.fl.dpsgd import DPSGDConfig
    from ldp_core.fl.dpsgd_accounting import StepAccountant

    ours = StepAccountant(DPSGDConfig(SIGMA, CLIP, Q, LR))
    res = {"ours_pld": ours.epsilon_pld(steps, DELTA), "ours_rdp": ours.epsilon_rdp(steps, DELTA)[0]}
    for name, acc in (("opacus_rdp", RDPAccountant()), ("opacus_prv", PRVAccountant())):
        acc.history = [(SIGMA, Q, steps)]
        res[name] = float(acc.get_epsilon(DELTA))
    return res


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "trainable_params": rows[0]["trainable_params"],
        "accuracy_median": statistics.median(r["accuracy"] for r in rows),
        "accuracy_min": min(r["accuracy"] for r in rows),
        "accuracy_max": max(r["accuracy"] for r in rows),
        "ms_per_step": 1000 * statistics.median(r["seconds_per_step"] for r in rows),
        "peak_mb": statistics.median(r["peak_mb"] for r in rows),
        "runs": len(rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/opacus.json"))
    ap.add_argument("--plot", default=str(ROOT / "docs/img/dpsgd_opacus.png"))
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(json.loads(a.worker))))
        return
    load_start = [round(v, 2) for v in os.getloadavg()]
    impls = ["ours-ghost", "ours-vmap", "opacus-hooks", "opacus-ghost"]
    same = {"n": N, "d": D, "hidden": HIDDEN, "layers": 1, "lora": 0, "q": Q, "epochs": a.epochs}
    part1: dict[str, list[dict[str, Any]]] = {i: [] for i in impls}
    for seed in range(a.seeds):
        for impl in impls:
            part1[impl].append(run({**same, "impl": impl, "seed": seed}))
            print(f"  {part1[impl][-1]}", file=sys.stderr)
    steps = a.epochs * round(1 / Q)
    eps = epsilons(steps)
    wide = {"n": 4096, "d": 256, "hidden": 512, "layers": 2, "q": 128 / 4096, "epochs": 1}
    part2: dict[str, list[dict[str, Any]]] = {}
    cases = [
        (f"{impl} {'LoRA r=8' if lora else 'full'}", impl, lora)
        for lora in (0, 8)
        for impl in ("ours-ghost", "ours-vmap", "opacus-hooks")
    ]
    for rep in range(2):
        for label, impl, lora in cases:
            part2.setdefault(label, []).append(run({**wide, "impl": impl, "lora": lora, "seed": rep}))
            print(f"  {label}: {part2[label][-1]}", file=sys.stderr)
    result = {
        "machine": {"cpus": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": list(os.getloadavg())},
        "setup": {"n": N, "d": D, "hidden": HIDDEN, "classes": K, "sigma": SIGMA, "clip": CLIP, "q": Q, "lr": LR},
        "steps": steps,
        "delta": DELTA,
        "epsilon": eps,
        "side_by_side": {k: _summary(v) for k, v in part1.items()},
        "adapter_only": {"setup": wide, **{k: _summary(v) for k, v in part2.items()}},
    }
    pathlib.Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"load average {load_start} → {result['machine']['loadavg_end']}; {steps} steps, δ = {DELTA}")
    print("ε: " + ", ".join(f"{k} {v:.4f}" for k, v in eps.items()))
    print("\n| implementation | accuracy median [min, max] | ms/step | peak MB |\n|---|---|---|---|")
    for k, s in result["side_by_side"].items():
        print(
            f"| {k} | {s['accuracy_median']:.4f} [{s['accuracy_min']:.4f}, {s['accuracy_max']:.4f}] "
            f"| {s['ms_per_step']:.1f} | {s['peak_mb']:.1f} |"
        )
    print("\n| adapter-only: configuration | trainable params | ms/step | peak MB |\n|---|---|---|---|")
    for k, s in result["adapter_only"].items():
        if k != "setup":
            print(f"| {k} | {s['trainable_params']:,} | {s['ms_per_step']:.1f} | {s['peak_mb']:.1f} |")
    plot(result, a.plot)


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    sbs = result["side_by_side"]
    names = list(sbs)
    axes[0].bar(names, [sbs[k]["ms_per_step"] for k in names], color="tab:blue")
    axes[0].set_ylabel("ms per step (median)")
    axes[0].set_title(f"same model, data, C, σ, q; ε (PLD) = {result['epsilon']['ours_pld']:.3f}", fontsize=9)
    for k in names:
        s = sbs[k]
        axes[1].errorbar(
            [k],
            [s["accuracy_median"]],
            yerr=[[s["accuracy_median"] - s["accuracy_min"]], [s["accuracy_max"] - s["accuracy_median"]]],
            fmt="o",
            capsize=4,
        )
    axes[1].set_ylabel("test accuracy (median, min–max over seeds)")
    ad = {k: v for k, v in result["adapter_only"].items() if k != "setup"}
    axes[2].barh(list(ad), [v["peak_mb"] for v in ad.values()], color="tab:orange")
    axes[2].set_xlabel("peak memory added by training steps (MB)")
    axes[2].set_title("full model vs LoRA adapters (frozen backbone)", fontsize=9)
    for ax in axes[:2]:
        ax.tick_params(axis="x", rotation=20, labelsize=8)
    axes[2].tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
