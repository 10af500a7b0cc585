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

#: each command: the module that registers it (``register(subparsers)``) and the one line
#: ``ldp --help`` shows for it. The line is repeated here so that ``ldp --help`` (and a
#: mistyped command) imports no command module; tests/cli/test_startup.py checks that each
#: line is the one the module registers.
COMMAND_TABLE: dict[str, tuple[str, str]] = {
    "simulate": (
        "ldp_cli.commands.simulate",
        "privatize a simulated population with a real encoder and estimate its counts, mean or distribution",
    ),
    "demo": (
        "ldp_cli.commands.demo",
        "run the whole pipeline on simulated devices and compare the estimates with the truth (--offline: every oracle in memory)",
    ),
    "kafka": (
        "ldp_cli.commands.kafka",
        "run the project's own single-node Apache Kafka broker (downloaded from Maven Central)",
    ),
    "estimator": (
        "ldp_cli.commands.estimator",
        "service: run the streaming estimator and serve live estimates over HTTP",
    ),
    "estimate": (
        "ldp_cli.commands.estimate",
        "batch job: estimate a metric (any kind) over days of the Parquet dataset",
    ),
    "heavy-hitters": (
        "ldp_cli.commands.heavy_hitters",
        "batch job: discover a string metric's most frequent values (pem, sfp) over days of the dataset",
    ),
    "sink": ("ldp_cli.commands.sink", "write the shuffled reports to a Parquet dataset partitioned by metric and day"),
    "collector": ("ldp_cli.commands.collector", "run the HTTP collector that accepts report batches"),
    "shuffler": ("ldp_cli.commands.shuffler", "run the shuffler: batch, permute and release crowds of reports"),
    "privacy": (
        "ldp_cli.commands.privacy",
        "privacy accounting: ε of a setting, noise for a target ε, shuffle amplification",
    ),
    "fl": ("ldp_cli.commands.fl", "federated-learning scenarios with client-level DP"),
    "study": (
        "ldp_cli.commands.study",
        "research scenarios: federated learning with client-level DP on seeded synthetic data",
    ),
    "budget": (
        "ldp_cli.commands.budget",
        "a privacy budget shared among partners: sessions, shares, approvals, debits, report",
    ),
    "dpsgd": ("ldp_cli.commands.dpsgd", "train a numpy model with DP-SGD on a .npz dataset and print the ε spent"),
    "attack": (
        "ldp_cli.commands.attack",
        "attacks on trained models: membership inference (shadow, LiRA) with ε lower bounds, inversion, DLG, groups",
    ),
    "pate": ("ldp_cli.commands.pate", "PATE on load_digits: teachers, noisy labels, the student, accuracy against ε"),
    "synth": (
        "ldp_cli.commands.synth",
        "differentially private synthetic data: MST, AIM, DP-GAN, and synthetic telemetry from LDP marginals",
    ),
    "keys": ("ldp_cli.commands.keys", "create and list analyzer key pairs for sealed metrics"),
    "issuer": ("ldp_cli.commands.issuer", "the anonymous upload-token issuer"),
    "aggregator": (
        "ldp_cli.commands.aggregator",
        "run a Prio3 aggregator (leader or helper) over HTTP, set one up, or collect a batch",
    ),
    "graph": (
        "ldp_cli.commands.graph",
        "train a graph network with node- or edge-level DP and compare the two at equal ε",
    ),
    "split": (
        "ldp_cli.commands.split",
        "split learning over HTTP with DP on the cut-layer activations, an inversion attack and FL beside it",
    ),
    "he": (
        "ldp_cli.commands.he",
        "homomorphic encryption: FL aggregation under threshold CKKS, private inference",
    ),
    "psi": ("ldp_cli.commands.psi", "private set intersection between two organisations over HTTP"),
}

#: the command modules, in the order of ``ldp --help``
COMMANDS = [module for module, _ in COMMAND_TABLE.values()]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``ldp`` parser with every command registered, or with only ``command``'s module
    imported and registered (the others listed by name and summary only, so that a job
    loads what it runs and nothing else)."""
    parser = argparse.ArgumentParser(prog="ldp", description="Local-differential-privacy telemetry pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_line) in COMMAND_TABLE.items():
        if command is None or name == command:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=help_line, add_help=False)
    return parser


def _command_word(argv: list[str]) -> str:
    """The command ``argv`` names, or ``""`` when none (``ldp --help``, ``ldp``, a typo): the top-level
    parser has no option that takes a value, so the first word not starting with ``-`` is the command."""
    for word in argv:
        if not word.startswith("-"):
            return word
        if word == "--":
            break
    return ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_word(argv))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as exc:
        print(f"ldp {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
