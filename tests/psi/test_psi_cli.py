"""``ldp psi client`` against a real server over HTTP; bad input exits 2."""

from __future__ import annotations

import json

from estimator.psi.http import create_app
from estimator.psi.protocol import PsiServer, load_items
from ldp_cli.main import main
from tests.support.collector_support import ServerThread


def test_client_json_and_out(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("a\nb\n\nc\nb\n d \n")
    out, plot = tmp_path / "common.txt", tmp_path / "psi.png"
    with ServerThread(create_app(PsiServer(["b", "d", "x"]))) as srv:
        mine = str(tmp_path / "mine.txt")
        rc = main(
            ["psi", "client", "--server", srv.url, "--items", mine, "--json", "--out", str(out), "--plot", str(plot)]
        )
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["client_items"] == 4 and r["intersection_size"] == 2
    assert sorted(r["intersection"]) == ["b", "d"]
    assert sorted(load_items(out)) == ["b", "d"]
    assert plot.stat().st_size > 0 and r["plot"] == str(plot)


def test_missing_items_file_and_unreachable_server(tmp_path, capsys):
    assert main(["psi", "client", "--server", "http://127.0.0.1:9", "--items", str(tmp_path / "none.txt")]) == 2
    assert "no items file" in capsys.readouterr().err
    (tmp_path / "mine.txt").write_text("a\n")
    assert main(["psi", "client", "--server", "http://127.0.0.1:9", "--items", str(tmp_path / "mine.txt")]) == 2
    assert "could not reach" in capsys.readouterr().err
