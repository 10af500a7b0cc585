"""A wrong field name in a task file is refused by name, with the accepted ones (not a Python TypeError);
the example task file of the quickstart loads as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.fl.task import EXAMPLE_ENROLLMENT_KEY, FLTaskSpec
from ldp_core.fl.errors import FLError
from ldp_core.tokens.enrollment import EnrollmentAuthority

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fl" / "task.json"


def _example() -> dict:
    return json.loads(EXAMPLE.read_text())


def test_the_example_task_loads_and_trusts_the_example_authority() -> None:
    spec = FLTaskSpec.from_file(str(EXAMPLE))
    assert spec.task == "quickstart" and spec.enrollment_key == EXAMPLE_ENROLLMENT_KEY
    import base64

    auth = EnrollmentAuthority.load(ROOT / "examples" / "fl" / "example-authority.json")
    assert base64.b64encode(auth.public_key).decode() == EXAMPLE_ENROLLMENT_KEY


@pytest.mark.parametrize(
    "change, named, accepted",
    [
        ({"training": {"epochs": 1, "learning_rat": 0.5}}, "training: unknown field 'learning_rat'", "learning_rate"),
        ({"model": {"kind": "logistic", "n_feature": 4}}, "model 'logistic': unknown field 'n_feature'", "n_features"),
        ({"model": {"kind": "softmax", "n_features": 4}}, "model 'softmax': missing field 'n_classes'", "l2"),
        ({"sampling": {"kind": "fixed", "cout": 3}}, "sampling 'fixed' has no options ['cout']", "count"),
        ({"round": 3}, "unknown task fields ['round']", "rounds"),
    ],
)
def test_a_wrong_field_is_named_with_the_accepted_ones(change: dict, named: str, accepted: str) -> None:
    with pytest.raises(FLError) as info:
        FLTaskSpec.from_dict({**_example(), **change})
    assert named in str(info.value) and accepted in str(info.value)
    assert not isinstance(info.value, TypeError)


def test_a_missing_required_field_is_named() -> None:
    d = _example()
    del d["sampling"]
    with pytest.raises(FLError, match=r"task: missing field 'sampling'; accepted fields: task, model, clients"):
        FLTaskSpec.from_dict(d)


def test_the_job_command_exits_with_the_message_not_a_traceback(tmp_path: Path) -> None:
    """`ldp fl job` (and `ldp fl device`) exit with the message alone: SystemExit(text) prints only the text."""
    from ldp_cli.main import main

    bad = tmp_path / "task.json"
    bad.write_text(json.dumps({**_example(), "training": {"epoch": 1}}))
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    for argv, prog in (
        (["fl", "job", "--task", str(bad), "--transport", url], "ldp fl job"),
        (["fl", "device", "--task", str(bad), "--authority", "a.json", "--make-data"], "ldp fl device"),
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == f"{prog}: training: unknown field 'epoch'; accepted fields: epochs, batch_size, " + (
            "learning_rate, max_steps"
        )
