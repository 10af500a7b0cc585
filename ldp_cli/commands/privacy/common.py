"""What ``ldp privacy``'s sub-commands share: the ``--delta``/``--json`` (and PLD) options and the output,
one JSON object or the lines of text with what the figures protect."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import probability as _prob

__all__ = ["add_common", "emit", "fmt"]


def add_common(q: argparse.ArgumentParser, neighbors: bool) -> None:
    """``--delta`` and ``--json`` everywhere; ``--neighbors`` and ``--discretization`` for the PLD commands."""
    q.add_argument("--delta", type=_prob, required=True, help="target δ (below 1/population is customary)")
    if neighbors:
        q.add_argument(
            "--neighbors",
            choices=["add_or_remove", "replace"],
            default="add_or_remove",
            help="neighbouring datasets: add/remove one person (default) or replace one person's data",
        )
    q.add_argument("--json", action="store_true", help="print one JSON object")
    if neighbors:
        q.add_argument(
            "--discretization",
            type=_positive,
            default=1e-4,
            help="PLD grid step (default 1e-4): ε is an upper bound within about this of the exact value; "
            "1e-3 is about 10x faster",
        )


def emit(args: argparse.Namespace, obj: dict[str, Any], lines: list[str]) -> int:
    """Print ``obj`` as JSON with ``--json``, else ``lines`` and the ``protects`` line."""
    if args.json:
        print(json.dumps(obj))
    else:
        print("\n".join([*lines, f"  protects: {obj['protects']}"]))
    return 0


def fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"
