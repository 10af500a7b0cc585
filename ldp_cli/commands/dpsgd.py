"""``ldp dpsgd``: central DP-SGD over a ``.npz`` dataset (:mod:`estimator.jobs.dpsgd`).

Prints the ε spent after each epoch on stderr as it trains, then a summary;
with ``--json``, one object with ``epsilon`` (at ``--delta``, per the
accountant: PLD, with RDP as ``epsilon_rdp``), ``accuracy`` (on the test
data), ``steps``, ``seconds`` and the details of the run (``per_epoch`` among
them), and where the batches and noise came from (``randomness``:
``os_csprng`` without ``--seed``, ``seeded`` with one, then ``seed_warning``
says the ε does not hold against anyone who knows the seed; the text output
prints it as a warning). ``--plot FILE.png`` draws test accuracy against ε. Bad input (a
missing file or array, wrong shapes, labels out of range, q outside (0, 1])
exits 2 with a message saying what is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ldp_cli.commands.argtypes import open_unit as _open_unit
from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import probability as _prob
from ldp_cli.commands.argtypes import seed as _seed
from ldp_cli.commands.budget import add_budget_flags, charge
from ldp_cli.commands.dpsgd_select import add_selection_flags, run_selection
from ldp_cli.progress import add_progress_flags

__all__ = ["register", "run_dpsgd_cmd"]


def _nonnegative(text: str) -> float:
    v = float(text)
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dpsgd",
        help="train a numpy model with DP-SGD on a .npz dataset and print the ε spent",
        description="DP-SGD (Abadi et al. 2016): Poisson-sampled batches at rate q, per-example clipping to C, "
        "Gaussian noise with multiplier σ, over FILE.npz (arrays x and y, optionally x_test and y_test; "
        "without them a seeded fraction is held out). ε per example (add/remove), by dp_accounting's PLD "
        "accountant with RDP as a second opinion. One epoch is round(1/q) steps.",
    )
    p.add_argument("--data", required=True, help="the .npz file (x: rows × features, y: integer labels)")
    p.add_argument("--model", required=True, choices=["logistic", "softmax", "mlp"])
    p.add_argument("--noise-multiplier", type=_nonnegative, required=True, help="σ (0: clipped SGD, no privacy)")
    p.add_argument("--clip", type=_positive, required=True, help="per-example clipping norm C")
    p.add_argument("--sample-rate", type=_prob, required=True, help="Poisson sampling rate q in (0, 1]")
    p.add_argument("--epochs", type=_positive_int, required=True)
    p.add_argument("--delta", type=_open_unit, required=True, help="δ of the reported (ε, δ)")
    p.add_argument("--lr", type=_positive, default=0.5, help="learning rate (default 0.5)")
    p.add_argument("--hidden", type=_positive_int, default=32, help="hidden width of the mlp (default 32)")
    p.add_argument("--l2", type=_nonnegative, default=0.0, help="L2 penalty on the weights (default 0)")
    p.add_argument("--classes", type=_positive_int, default=None, help="number of classes (default: largest label + 1)")
    p.add_argument(
        "--test-fraction",
        type=_open_unit,
        default=0.2,
        help="fraction held out for testing when the file has no x_test/y_test (default 0.2)",
    )
    p.add_argument(
        "--seed",
        type=_seed,
        default=None,
        help="seed of the split, initialization, batches and noise, for a reproducible study (default: none; "
        "batches and noise from the OS CSPRNG). A seeded run's ε does not hold against anyone who knows the seed",
    )
    p.add_argument("--plot", default=None, help="write test accuracy against ε to this PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_selection_flags(p)
    add_budget_flags(p)
    add_progress_flags(p)  # the per-epoch lines on stderr: shown unless --json or --no-progress (--progress forces)
    p.set_defaults(func=run_dpsgd_cmd)


def _fmt(e: float | None) -> str:
    return "∞ (no noise)" if e is None else f"{e:.4g}"


def run_dpsgd_cmd(args: argparse.Namespace) -> int:
    from estimator.jobs.dpsgd import DPSGDJob, load_dataset, plot_accuracy_vs_epsilon, run_dpsgd
    from ldp_core.fl.dpsgd import DPSGDConfig

    job = DPSGDJob(
        model=args.model,
        config=DPSGDConfig(args.noise_multiplier, args.clip, args.sample_rate, args.lr),
        epochs=args.epochs,
        delta=args.delta,
        seed=args.seed,
        hidden=args.hidden,
        l2=args.l2,
    )
    split_rng, init_rng, sample_rng, noise_rng = job.generators()
    data = load_dataset(args.data, args.model, split_rng, args.test_fraction, args.classes)
    if args.select:
        if args.plot:
            raise ValueError("--plot draws one run's accuracy against its ε; it is not available with --select")
        selected, lines = run_selection(args, job, data)
        if "refused" in selected:
            return int(selected["refused"])
        if args.json:
            print(json.dumps(selected))
        else:
            print("\n".join(lines))
        return 0 if selected["selection"]["chosen"] is not None else 1

    if args.budget_session:
        event = job.config.event(args.epochs * job.config.steps_per_epoch())
        if event is None:
            raise ValueError("a run without noise has no finite ε: it cannot be debited to a budget session")
        refused = charge(args, "dpsgd", event, f"dpsgd {args.model} on {args.data}")
        if refused is not None:
            return refused

    def progress(row: dict[str, Any]) -> None:
        # the epochs' ε and accuracy are results too: printed piped as well (docs/DPSGD.md), unlike other progress
        if not args.no_progress and (args.progress or not args.json):
            print(
                f"epoch {row['epoch']}/{args.epochs}: {row['steps']} steps, ε = {_fmt(row['epsilon'])} "
                f"(δ = {args.delta:g}), test accuracy {row['accuracy']:.4f}",
                file=sys.stderr,
                flush=True,
            )

    result = run_dpsgd(job, data, init_rng, sample_rng, noise_rng, progress)
    if args.plot:
        plot_accuracy_vs_epsilon(result, args.plot)
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"dpsgd {args.model}: {result['train_examples']} training rows, {result['test_examples']} test rows "
        f"({result['test_split']}), σ = {args.noise_multiplier:g}, C = {args.clip:g}, q = {args.sample_rate:g} "
        f"(expected batch {result['expected_batch_size']:.1f}), {result['steps']} steps in {result['seconds']:.1f} s"
    )
    rdp = "" if result["epsilon_rdp"] is None else f" (RDP: {result['epsilon_rdp']:.4g})"
    print(f"ε = {_fmt(result['epsilon'])}{rdp} at δ = {args.delta:g}; test accuracy {result['accuracy']:.4f}")
    print(f"ε protects {result['protects']}.")
    if result["seed_warning"]:
        print(f"warning: {result['seed_warning']}.")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
