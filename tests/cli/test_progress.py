"""The shared progress rule (ldp_cli/progress.py): on a terminal, or forced with --progress; never with
--no-progress, --json (unless forced) or on a pipe; always on the stream given (stderr), never stdout."""

from __future__ import annotations

import argparse
import io
import os
import pty

from ldp_cli.progress import bar, lines, progress_enabled


def _args(**kw: bool) -> argparse.Namespace:
    return argparse.Namespace(**{"no_progress": False, "progress": False, "json": False, **kw})


def _drawn_on_a_tty(args: argparse.Namespace) -> bytes:
    master, slave = pty.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            lines(args, "ldp test", tty)("round 1/1 closed")
            tty.flush()
        os.set_blocking(master, False)
        try:
            return os.read(master, 65536)
        except BlockingIOError:
            return b""
    finally:
        os.close(master)
        os.close(slave)


def test_the_rule() -> None:
    master, slave = pty.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            assert progress_enabled(_args(), tty)
            assert not progress_enabled(_args(no_progress=True), tty)
            assert not progress_enabled(_args(json=True), tty)
            assert progress_enabled(_args(json=True, progress=True), tty)
    finally:
        os.close(master)
        os.close(slave)
    pipe = io.StringIO()
    assert not progress_enabled(_args(), pipe)
    assert progress_enabled(_args(progress=True), pipe)


def test_lines_on_a_tty_and_nothing_when_off() -> None:
    assert b"ldp test: round 1/1 closed" in _drawn_on_a_tty(_args())
    assert _drawn_on_a_tty(_args(no_progress=True)) == b""
    assert _drawn_on_a_tty(_args(json=True)) == b""


def test_bar_on_a_tty_only() -> None:
    for args, shown in ((_args(), True), (_args(no_progress=True), False), (_args(json=True), False)):
        master, slave = pty.openpty()
        try:
            with open(slave, "w", closefd=False) as tty:
                with bar(args, "ldp test", "round", stream=tty) as b:
                    b.update()
                tty.flush()
            os.set_blocking(master, False)
            try:
                drawn = os.read(master, 65536)
            except BlockingIOError:
                drawn = b""
            assert (b"round" in drawn) is shown, drawn
        finally:
            os.close(master)
            os.close(slave)


def test_forced_on_a_pipe_and_silent_otherwise() -> None:
    out = io.StringIO()
    lines(_args(progress=True), "ldp test", out)("phase 1")
    with bar(_args(progress=True), "ldp test", "round", stream=out) as b:
        b.update()
    assert out.getvalue().startswith("ldp test: phase 1 (") and "round" in out.getvalue()
    quiet = io.StringIO()
    lines(_args(), "ldp test", quiet)("phase 1")
    with bar(_args(), "ldp test", "round", stream=quiet) as b:
        b.update()
    assert quiet.getvalue() == ""


def test_simulate_and_the_offline_demo_draw_only_when_asked(tmp_path, capsys) -> None:
    """Before, ldp simulate drew its bar on a pipe for 2M users or more, and ldp demo --offline always."""
    import json

    from ldp_cli.main import main

    sim = ["simulate", "--mechanism", "grr", "--epsilon", "1", "--domain", "5", "--users", "3000", "--seed", "3"]
    assert main([*sim, "--json"]) == 0
    plain = capsys.readouterr()
    assert plain.err == "" and json.loads(plain.out)
    assert main([*sim, "--json", "--progress"]) == 0
    forced = capsys.readouterr()
    assert "ldp simulate grr" in forced.err and json.loads(forced.out)["true"] == json.loads(plain.out)["true"]
    demo = ["demo", "--offline", "--mechanisms", "grr", "--users", "3000", "--no-plot", "--out", str(tmp_path)]
    assert main(demo) == 0
    assert capsys.readouterr().err == ""
    assert main([*demo, "--progress"]) == 0
    assert "report" in capsys.readouterr().err
