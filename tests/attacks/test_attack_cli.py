"""``ldp attack`` through the real command line: the JSON keys, the plot, and bad input refused with exit
code 2 and a message (small, seeded settings so that it runs in seconds)."""

from __future__ import annotations

import json

import pytest

from ldp_cli.main import main


def _run(capsys, *argv: str) -> dict:
    assert main(["attack", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_lira_prints_the_lower_bound_beside_the_printed_epsilon(capsys, tmp_path) -> None:
    plot = tmp_path / "lira.png"
    r = _run(
        capsys,
        "lira",
        "--noise-multipliers",
        "0,2",
        "--shadows",
        "3",
        "--pool",
        "100",
        "--steps",
        "30",
        "--plot",
        str(plot),
    )
    assert [row["noise_multiplier"] for row in r["rows"]] == [0.0, 2.0]
    assert r["rows"][0]["printed_epsilon"] is None and r["rows"][1]["printed_epsilon"] > 0
    for row in r["rows"]:
        assert set(row["attacks"]) == {"lira_online", "lira_offline"}
        assert row["epsilon_lower_bound"] == max(a["epsilon_lower_bound"] for a in row["attacks"].values())
    assert plot.stat().st_size > 0 and r["plot"] == str(plot)


def test_mia_text_output_and_progress(capsys) -> None:
    assert (
        main(
            [
                "attack",
                "mia",
                "--noise-multipliers",
                "1",
                "--shadows",
                "2",
                "--pool",
                "60",
                "--steps",
                "10",
                "--progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "ε lower bound" in out.out and "shadow AUC" in out.out
    assert "attack mia: σ = 1: shadow 2/2 model trained" in out.err


def test_inversion_dlg_and_groups_json(capsys) -> None:
    inv = _run(capsys, "inversion", "--noise-multipliers", "0,4", "--steps", "30")
    assert [r["noise_multiplier"] for r in inv["rows"]] == [0.0, 4.0]
    assert {"mean_cosine_to_class_mean", "identified_fraction", "printed_epsilon"} <= set(inv["rows"][0])
    dlg = _run(capsys, "dlg", "--no-dlg", "--trials", "1", "--noise-multipliers", "0.1", "--clients", "2")
    assert [(r["defence"], r["clients"]) for r in dlg["rows"]] == [
        ("none", 1),
        ("clip", 1),
        ("noise", 1),
        ("secagg", 2),
    ]
    assert dlg["rows"][0]["analytic_error"] < 1e-9 and dlg["rows"][0]["dlg_error"] is None
    grp = _run(capsys, "groups", "--noise-multipliers", "1", "--steps", "20")
    assert {"no_dp", "clip_only", "dp", "drop", "drop_clip_only", "epsilon"} <= set(grp["rows"][0])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["attack", "groups", "--noise-multipliers", "0"], "give σ > 0"),
        (["attack", "lira", "--noise-multipliers", "-1"], "finite numbers >= 0"),
        (["attack", "dlg", "--clients", "1"], "integers >= 2"),
    ],
)
def test_bad_input_exits_2_with_a_message(capsys, argv, message) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_cnn_attack_without_pytorch_says_what_to_install(capsys, monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch raises ImportError
    assert main(["attack", "dlg", "--model", "cnn", "--trials", "1"]) == 2
    assert "needs PyTorch" in capsys.readouterr().err
