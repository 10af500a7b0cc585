"""Every ``ldp ... --help`` page is plain text: no reST roles or double backticks from the docstrings."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from ldp_cli.main import build_parser
from ldp_cli.options import plain, summary

MARKUP = re.compile(r"``|:(?:mod|class|func|meth|data|attr):")


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_help_page_is_plain_text() -> None:
    pages = dict(_parsers(build_parser(), ("ldp",)))
    # every command and sub-command is walked, the nested groups included
    for name in ("ldp demo", "ldp study drift", "ldp fl job", "ldp privacy shuffle", "ldp kafka up", "ldp keys new"):
        assert name in pages
    assert {"ldp issuer serve", "ldp issuer keys", "ldp issuer enroll"} <= set(pages)
    marked = {
        name: [line for line in p.format_help().splitlines() if MARKUP.search(line)]
        for name, p in pages.items()
        if MARKUP.search(p.format_help())
    }
    assert marked == {}


def test_plain_renders_roles_and_literals() -> None:
    assert plain("``ldp demo``: see :mod:`estimator.service`") == "ldp demo: see estimator.service"
    assert plain("a :class:`~client_sdk.client.TelemetryClient` b") == "a TelemetryClient b"
    assert plain(":func:`metrics_files` and :attr:`DemoConfig.sealed`") == "metrics_files and DemoConfig.sealed"
    assert summary("``ldp x``: one\nline.\n\nNot this.") == "ldp x: one line."
    assert summary(None) is None
