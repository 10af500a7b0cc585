"""The stall and outage settings: range-checked, from the environment, and flags of ``ldp collector``."""

from __future__ import annotations

import argparse

import pytest

from collector.errors import ConfigError
from collector.settings import CollectorSettings
from ldp_cli.commands import collector as command

NEW = {
    "max_reading": (0, 1.5),
    "body_timeout": (0.0, "10"),
    "offload_json_bytes": (-1, 2.0),
    "offload_frame_bytes": (-1, True),
    "decode_workers": (0, 65),
    "probe_after": (0.0, -1.0),
    "probe_interval": (0.0, 1e9),
}


@pytest.mark.parametrize("field", sorted(NEW))
def test_out_of_range_values_are_refused_by_name(field: str) -> None:
    for bad in NEW[field]:
        with pytest.raises(ConfigError, match=field):
            CollectorSettings(metrics_path="m.json", **{field: bad})  # type: ignore[arg-type]


def test_from_the_environment_and_the_command_line() -> None:
    env = {"LDP_METRICS": "m.json", "LDP_COLLECTOR_BODY_TIMEOUT": "2.5", "LDP_COLLECTOR_MAX_READING": "64"}
    s = CollectorSettings.from_env(env, probe_after=0.2)
    assert (s.body_timeout, s.max_reading, s.probe_after) == (2.5, 64, 0.2)
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(
        ["collector", "--metrics", "m.json", "--body-timeout", "3", "--decode-workers", "2", "--probe-interval", "0.5"]
    )
    overrides = {dest: getattr(args, dest) for _, dest, _, _ in command._FLAGS}
    s = CollectorSettings.from_env({}, metrics_path="m.json", **overrides)
    assert (s.body_timeout, s.decode_workers, s.probe_interval) == (3.0, 2, 0.5)
    assert set(NEW) <= {dest for _, dest, _, _ in command._FLAGS}
