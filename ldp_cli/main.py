"""The ``ldp`` command line."""

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
    "ldp_cli.commands.estimator", "ldp_cli.commands.estimate", "ldp_cli.commands.sink",
    "ldp_cli.commands.collector",
    "ldp_cli.commands.shuffler",
    "ldp_cli.commands.privacy",
    "ldp_cli.commands.fl",
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
