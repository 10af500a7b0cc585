"""``ldp split``: split learning over HTTP with DP on the cut-layer activations (docs/SPLIT.md).

* ``ldp split serve [--host H] [--port P] [--width W] [--record]``: the server half (FastAPI under
  uvicorn, :mod:`estimator.split.server`); ``--record`` keeps what ``predict`` receives and shares it on
  ``GET /split/v1/observed`` (a study of what the server sees; off by default).
* ``ldp split train --server URL [--noise-multiplier S --clip C --epochs E] [--attack] --json``: the
  client half (:mod:`client_sdk.split`) on scikit-learn's digits: ``accuracy``, ``epsilon_per_example``
  (δ = ``--delta``), ``bytes_up``/``bytes_down``; ``--attack`` adds the server's inversion attack on the
  test activations it received (``attack``: ``mse``, ``ssim``, and the baselines of guessing the mean).
* ``ldp split run [--noise-multipliers 0,1,4] --json [--plot FILE]``: the whole study: a fresh server on
  127.0.0.1 per noise level, training, the attack, and FedAvg on the same task (``fl``) beside it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ldp_cli.commands.argtypes import nonnegative, positive, positive_int, seed

__all__ = ["register", "run_split_cmd"]


def _sigmas(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not out or any(not (0 <= s < float("inf")) for s in out):
        raise argparse.ArgumentTypeError(f"noise multipliers must be finite numbers >= 0, got {text!r}")
    return out


def _port(text: str) -> int:
    v = int(text)
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 0..65535, got {text}")
    return v


def _training_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clip", type=positive, default=2.0, help="per-example activation norm bound C (default 2)")
    p.add_argument("--epochs", type=positive_int, default=10, help="passes over the client's data (default 10)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="examples per request (default 32)")
    p.add_argument("--lr", type=positive, default=0.3, help="learning rate of the client's layer (default 0.3)")
    p.add_argument("--delta", type=positive, default=1e-5, help="δ of the reported ε (default 1e-5)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the data split, weights and noise (default 0)")
    p.add_argument("--ridge-only", action="store_true", help="the attacker fits ridge inverses only (faster)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "split",
        help="split learning over HTTP with DP on the cut-layer activations, an inversion attack and FL beside it",
        description="Split learning (docs/SPLIT.md): the client holds the layers below the cut, the server those "
        "above and the labels; activations go up (clipped and noised), gradients come down.",
    )
    verbs = p.add_subparsers(dest="split_command", required=True)
    s = verbs.add_parser("serve", help="run the server half")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=_port, default=8750, help="port (default 8750)")
    s.add_argument("--width", type=positive_int, default=16, help="cut-layer width (default 16)")
    s.add_argument("--classes", type=positive_int, default=10, help="classes (default 10)")
    s.add_argument("--lr", type=positive, default=0.3, help="learning rate of the server's layer (default 0.3)")
    s.add_argument("--record", action="store_true", help="keep what predict receives and share it (a study)")
    t = verbs.add_parser("train", help="train the client half against a server")
    t.add_argument("--server", required=True, help="the server's base URL, e.g. http://127.0.0.1:8750")
    t.add_argument("--noise-multiplier", type=nonnegative, default=0.0, help="σ: noise σ·C on activations")
    t.add_argument("--attack", action="store_true", help="run the server's inversion attack (server needs --record)")
    _training_flags(t)
    r = verbs.add_parser("run", help="the whole study: split learning per σ, the attack, and FedAvg beside it")
    r.add_argument(
        "--noise-multipliers", type=_sigmas, default=(0.0, 0.25, 1.0, 4.0), help="σ list (default 0,0.25,1,4)"
    )
    r.add_argument("--width", type=positive_int, default=16, help="cut-layer width (default 16)")
    r.add_argument("--fl-clients", type=positive_int, default=10, help="FedAvg clients (default 10)")
    r.add_argument("--fl-rounds", type=positive_int, default=10, help="FedAvg rounds (default 10)")
    r.add_argument("--no-fl", action="store_true", help="skip the FedAvg comparison")
    r.add_argument("--plot", default=None, help="write accuracy, reconstruction error and images to this PNG")
    _training_flags(r)
    p.set_defaults(func=run_split_cmd)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from estimator.split.server import SplitServer, create_app

    if args.classes < 2:
        raise ValueError("--classes must be >= 2")
    app = create_app(SplitServer(args.width, args.classes, args.lr, record=args.record))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


def _study(args: argparse.Namespace, **extra: Any) -> Any:
    from simulator.split import SplitStudy

    if not 0 < args.delta < 1:
        raise ValueError(f"--delta must be in (0, 1), got {args.delta}")
    return SplitStudy(
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.lr,
        clip=args.clip,
        delta=args.delta,
        seed=args.seed,
        attack_mlp=not args.ridge_only,
        **extra,
    )


def _print_row(row: dict[str, Any]) -> None:
    eps = row["epsilon_per_example"]
    print(
        f"σ = {row['noise_multiplier']:g}: accuracy {row['accuracy']:.4f}, ε per example "
        f"{'∞' if eps is None else f'{eps:.4g}'}, {row['bytes_up']} B up, {row['bytes_down']} B down"
    )
    if "attack" in row:
        a = row["attack"]
        print(
            f"  inversion: MSE {a['mse']:.4f} (guessing the mean: {a['mse_baseline']:.4f}), "
            f"SSIM {a['ssim']:.3f} (mean: {a['ssim_baseline']:.3f})"
        )


def run_split_cmd(args: argparse.Namespace) -> int:
    if args.split_command == "serve":
        return _serve(args)
    if args.split_command == "train":
        from simulator.split import train_against

        row = train_against(_study(args), args.server, args.noise_multiplier, args.attack)
        if args.json:
            print(json.dumps(row))
        else:
            _print_row(row)
        return 0
    from simulator.split import plot_study, run_study

    study = _study(args, width=args.width, fl_clients=args.fl_clients, fl_rounds=args.fl_rounds)
    result = run_study(study, args.noise_multipliers, fl=not args.no_fl)
    if args.plot:
        plot_study(result, args.plot)
        result["plot"] = args.plot
    result.pop("_examples", None)
    if args.json:
        print(json.dumps(result))
        return 0
    for row in result["split"]:
        _print_row(row)
    if "fl" in result:
        fl = result["fl"]
        print(f"FedAvg: accuracy {fl['accuracy']:.4f}, {fl['bytes_up']} B up, {fl['bytes_down']} B down")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
