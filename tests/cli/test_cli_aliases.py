"""One name per concept across ``ldp``: each documented flag and the older spelling kept as its alias parse to the
same value (docs/CLI.md, "Flags"), and the help shows the documented name first."""

from __future__ import annotations

import argparse

import pytest

from ldp_cli.main import build_parser

# (command, other required arguments, documented flag, older alias, value given, dest, value parsed); the values
# differ from the defaults, so equal results come from the flags
ALIASES = [
    (["demo"], [], "--transport", "--kafka", "kafka://127.0.0.1:9092", "kafka", "127.0.0.1:9092"),
    (["privacy", "shuffle"], ["--users", "1000", "--delta", "1e-6"], "--epsilon", "--epsilon0", "1.5", "epsilon0", 1.5),
    (["privacy", "central"], ["--mechanism", "laplace"], "--target-epsilon", "--epsilon", "0.5", "epsilon", 0.5),
]
for group in ("fl", "study"):
    for scenario in ("drift", "compress"):
        ALIASES += [
            ([group, scenario], [], "--client-clip-norm", "--clip-norm", "0.75", "clip_norm", 0.75),
            (
                [group, scenario],
                [],
                "--client-noise-multiplier",
                "--noise-multiplier",
                "1.25",
                "noise_multiplier",
                1.25,
            ),
        ]


def _sub(parser: argparse.ArgumentParser, path: list[str]) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize(("command", "rest", "new", "old", "given", "dest", "parsed"), ALIASES)
def test_documented_flag_and_alias_parse_alike(
    command: list[str], rest: list[str], new: str, old: str, given: str, dest: str, parsed: object
) -> None:
    parser = build_parser()
    by_new = parser.parse_args([*command, *rest, new, given])
    by_old = parser.parse_args([*command, *rest, old, given])
    assert getattr(by_new, dest) == getattr(by_old, dest) == parsed
    usage = _sub(parser, command).format_help()
    assert f"{new} " in usage and usage.index(f"{new} ") < usage.index(f"{old} ")


def test_demo_kafka_keeps_the_host_port_form_and_refuses_other_transports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    assert parser.parse_args(["demo", "--kafka", "127.0.0.2:9093"]).kafka == "127.0.0.2:9093"
    assert parser.parse_args(["demo"]).kafka is None
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["demo", "--transport", "sqlite:///tmp/log.sqlite3"])
    assert exc.value.code == 2
    assert "expected kafka://HOST:PORT" in capsys.readouterr().err
