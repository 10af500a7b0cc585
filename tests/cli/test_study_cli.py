"""``ldp study <scenario>`` and its older spelling ``ldp fl <scenario>``: one parser, one result."""

from __future__ import annotations

import json

import pytest

from ldp_cli.commands.study import SCENARIOS
from ldp_cli.main import build_parser, main


@pytest.mark.parametrize("argv", [["clinics", "--rounds", "2", "--no-noise-search", "--json"], ["drift", "--dp"]])
def test_both_spellings_parse_alike(argv: list[str]) -> None:
    study = vars(build_parser().parse_args(["study", *argv]))
    fl = vars(build_parser().parse_args(["fl", *argv]))
    assert study.pop("command") == "study" and fl.pop("command") == "fl"
    assert study == fl  # the same options, defaults and runner


def test_every_scenario_keeps_its_fl_spelling() -> None:
    parser = build_parser()
    for name in SCENARIOS:
        assert parser.parse_args(["fl", name]).func is parser.parse_args(["study", name]).func, name


def test_both_spellings_give_the_same_result(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["clinics", "--rounds", "2", "--sample-rate", "1", "--no-noise-search", "--json"]
    assert main(["study", *argv]) == 0
    study = json.loads(capsys.readouterr().out)
    assert main(["fl", *argv]) == 0
    assert json.loads(capsys.readouterr().out) == study
    assert [s["name"] for s in study["settings"]]


def test_errors_name_the_spelling_used() -> None:
    with pytest.raises(SystemExit, match="^ldp study drift: --ddg needs --dp"):
        main(["study", "drift", "--ddg"])
    with pytest.raises(SystemExit, match="^ldp fl drift: --ddg needs --dp"):
        main(["fl", "drift", "--ddg"])
