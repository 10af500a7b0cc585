"""What ``ldp study``'s scenarios share: the ``--plot``/``--json`` flags, the output (JSON or the
scenario's table), and the command's name as the user spelled it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ldp_cli.progress import add_progress_flags, bar

__all__ = ["prog", "add_plot_and_json", "add_no_progress", "round_bar", "finish"]


def prog(args: argparse.Namespace) -> str:
    """``ldp study <scenario>`` or ``ldp fl <scenario>``, as the user spelled it (for error messages)."""
    return f"ldp {args.command} {args.scenario}"


def add_plot_and_json(p: argparse.ArgumentParser, plot_help: str) -> None:
    """The scenarios' ``--plot PNG`` and ``--json`` flags (read by :func:`finish`)."""
    p.add_argument("--plot", default=None, help=plot_help)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_no_progress(p: argparse.ArgumentParser) -> None:
    """``--no-progress`` and ``--progress`` (:func:`ldp_cli.progress.add_progress_flags`, read by :func:`round_bar`)."""
    add_progress_flags(p)


def round_bar(args: argparse.Namespace, stream: Any = None, total: int | None = None) -> Any:
    """A bar counting federated rounds on ``stream`` (stderr by default), shown by the rule of
    :mod:`ldp_cli.progress` (a terminal, not ``--json`` nor ``--no-progress``; or ``--progress``); otherwise
    disabled and silent, so piped output stays as it was. Use ``bar.update`` (via ``lambda *_: bar.update()``)
    as the scenario's ``on_round``; ``total``, if known, is the number of rounds over every run."""
    return bar(args, prog(args), "round", total=total, stream=stream)


def finish(
    args: argparse.Namespace,
    result: dict[str, Any],
    plot: Callable[[dict[str, Any], str], None],
    lines: Callable[[dict[str, Any]], list[str]],
) -> int:
    """Write ``--plot`` (and name it in the result); print the result as JSON with ``--json``, else its table."""
    if args.plot:
        plot(result, args.plot)
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result))
        return 0
    print("\n".join(lines(result)))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
