"""``ldp attack mia|lira --target pate|synth``: the flags and the study of the membership game against a PATE
student or a classifier trained on DP synthetic data (:mod:`estimator.attacks.targets`, docs/ATTACKS.md)."""

from __future__ import annotations

import argparse
from typing import Any

from ldp_cli.commands.argtypes import positive_int as _positive_int

__all__ = ["target_flags", "target_study"]


def _floats(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not out or any(not (0 <= v < float("inf")) for v in out):
        raise argparse.ArgumentTypeError(f"expected finite numbers >= 0, got {text!r}")
    return out


def _overrides(args: argparse.Namespace, **names: str) -> dict[str, Any]:
    return {field: getattr(args, arg) for field, arg in names.items() if getattr(args, arg, None) is not None}


def target_flags(q: argparse.ArgumentParser) -> None:
    g = q.add_argument_group("other targets (--target pate|synth; docs/ATTACKS.md)")
    g.add_argument("--target", choices=["dpsgd", "pate", "synth"], default="dpsgd", help="the attacked learner")
    g.add_argument("--sigmas", type=_floats, default=None, help="pate: GNMax σ per row (0: argmax; default 0,2,8)")
    g.add_argument("--teachers", type=_positive_int, default=None, help="pate: teachers (default 10)")
    g.add_argument("--synth-method", choices=["mst", "aim", "dpgan"], default=None, help="synth: generator (mst)")
    g.add_argument("--epsilons", type=_floats, default=None, help="synth: the generator's ε per row (default 1,4)")
    g.add_argument("--gan-steps", type=_positive_int, default=None, help="synth dpgan: steps (default 300)")


def target_study(args: argparse.Namespace, common: dict[str, Any]) -> tuple[Any, Any]:
    from estimator.attacks import targets

    if args.plot:
        raise ValueError("--plot draws the DP-SGD rows' figure; it is not available with --target pate|synth")
    given = _overrides(args, pool="pool", shadows="shadows", confidence="confidence")
    if args.target == "pate":
        pate = targets.PateTargetStudy(**given, **_overrides(args, sigmas="sigmas", teachers="teachers"), **common)
        return pate, lambda note: targets.run_pate_target(pate, note)
    names = {"method": "synth_method", "epsilons": "epsilons", "gan_steps": "gan_steps"}
    synth = targets.SynthTargetStudy(**given, **_overrides(args, **names), **common)
    return synth, lambda note: targets.run_synth_target(synth, note)
