"""``ldp he aggregate`` and ``ldp he infer``: --json objects with the promised keys, and the plots."""

from __future__ import annotations

import json

from ldp_cli.main import main


def test_aggregate_json_and_plot(tmp_path, capsys):
    plot = tmp_path / "agg.png"
    assert main(["he", "aggregate", "--clients", "4", "--rounds", "1", "--json", "--plot", str(plot)]) == 0
    r = json.loads(capsys.readouterr().out)
    row = r["per_round"][0]
    assert row["he"]["max_abs_error"] <= r["he_precision_bound"]
    # the same updates aggregated three ways give the same model to within CKKS / quantization error
    assert abs(row["accuracy_he"] - row["accuracy_plain"]) <= 0.01
    assert row["he"]["upload_bytes_per_client"] > row["secagg"]["upload_bytes_per_client"]
    assert plot.stat().st_size > 0 and r["plot"] == str(plot)


def test_infer_json(tmp_path, capsys):
    assert main(["he", "infer", "--samples", "1", "--hidden", "4", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["he_agrees_with_plaintext"] == 1.0
    assert r["input_ciphertext_bytes"] > 100 * r["input_plaintext_bytes_float32"]
    assert r["slowdown"] > 1


def test_too_few_key_parties_is_a_usage_error(capsys):
    try:
        main(["he", "aggregate", "--key-parties", "1"])
    except SystemExit as e:
        assert e.code == 2
    assert "at least 2 key parties" in capsys.readouterr().err


def test_aggregate_t_of_n_with_a_key_party_absent(capsys):
    """3 key parties, any 2 decrypt, one never answers: the round still aggregates within the bound of the
    2 answering parties' flooding noise."""
    argv = ["he", "aggregate", "--clients", "3", "--rounds", "1", "--key-parties", "3", "--threshold", "2"]
    assert main([*argv, "--key-dropouts", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["threshold"] == 2 and r["key_dropouts"] == 1
    assert r["per_round"][0]["he"]["max_abs_error"] <= r["he_precision_bound"]
    assert r["he_sharing_bytes_per_party"] == 2 * 4 * 8 * 8192  # one key-level polynomial to each other party


def test_n_of_n_cannot_lose_a_key_party(capsys):
    assert main(["he", "aggregate", "--clients", "3", "--rounds", "1", "--key-dropouts", "1"]) == 2
    assert "n-of-n decryption cannot go without a key party" in capsys.readouterr().err
    argv = ["he", "aggregate", "--clients", "3", "--rounds", "1", "--threshold", "2", "--key-dropouts", "2"]
    assert main(argv) == 2
    assert "fewer than t = 2" in capsys.readouterr().err
    assert main(["he", "aggregate", "--threshold", "4"]) == 2
    assert "between 2 and the 3 key parties" in capsys.readouterr().err


def test_aggregate_variance_json_and_plot(tmp_path, capsys):
    """--stat variance: the per-coordinate variance by CKKS (server-side squares, collective
    relinearisation key) within its derived bound, next to SecAgg+ (squares uploaded)."""
    from estimator.he.aggregate import STATS
    from ldp_cli.commands.he import STATS as CLI_STATS

    assert CLI_STATS == STATS
    plot = tmp_path / "var.png"
    argv = ["he", "aggregate", "--clients", "3", "--rounds", "1", "--stat", "variance", "--plot", str(plot)]
    assert main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    he, sa = r["per_round"][0]["he"], r["per_round"][0]["secagg"]
    assert r["stat"] == "variance" and r["he_relin_key_bytes"] > 0 and r["he_rkg_bytes_per_party"] > 0
    assert he["square_max_abs_error"] <= he["square_bound"]
    assert he["variance_max_abs_error"] <= he["variance_bound"]
    assert sa["square_upload_bytes_per_client"] > 0 and sa["variance_max_abs_error"] < 1e-6
    assert plot.stat().st_size > 0
