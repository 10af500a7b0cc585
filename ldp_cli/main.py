"""The ``ldp`` command line.

Exit codes: what the sub-command returns (0 on success); 2 for a usage error
(argparse) and for any :class:`ValueError` or :class:`OSError` it lets
through, printed as ``ldp <command>: error: <message>``. The project's
argument and setting errors (:class:`~pipeline.errors.ConfigError`,
:class:`~ldp_core.errors.SpecError`, :class:`~ldp_core.errors.FrameError`,
:class:`~pipeline.errors.ChunkError`, :class:`~estimator.errors.BatchError`,
:class:`~estimator.errors.AccountingError`, ...) are ``ValueError`` subclasses
for that reason; see :mod:`ldp_cli.errors` for the command line's own.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main", "build_parser"]

#: sub-command modules, each exposing ``register(subparsers)``
COMMANDS = [
    "ldp_cli.commands.simulate",
    "ldp_cli.commands.demo",
    "ldp_cli.commands.kafka",
    "ldp_cli.commands.estimator",
    "ldp_cli.commands.estimate",
    "ldp_cli.commands.heavy_hitters",
    "ldp_cli.commands.sink",
    "ldp_cli.commands.collector",
    "ldp_cli.commands.shuffler",
    "ldp_cli.commands.privacy",
    "ldp_cli.commands.fl",
    "ldp_cli.commands.study",
    "ldp_cli.commands.dpsgd",
    "ldp_cli.commands.keys",
    "ldp_cli.commands.issuer",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ldp", description="Local-differential-privacy telemetry pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as exc:
        print(f"ldp {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
