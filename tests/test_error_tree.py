"""The project's errors form one tree under LDPError; ValueErrors stay ValueErrors.

``ldp`` exits 2 with ``ldp <command>: error: <message>`` on a ValueError or
OSError (ldp_cli/main.py), so an error that moves in the tree must keep the
base classes callers and the command line catch.
"""

from __future__ import annotations

import pytest

from ldp_cli.broker import BrokerError as BrokerErrorFromBroker
from ldp_cli.errors import BrokerError, CLIError
from ldp_cli.main import main
from ldp_core.errors import FrameError, LDPError
from ldp_core.fl.errors import UpdateRejected
from ldp_core.fl.protocol import BINARY_MAGIC, parse_upload
from ldp_core.wire.framing import FramingError, pack_headed
from pipeline.errors import ChunkError, PipelineError
from pipeline.fl_records import ChunkError as ChunkErrorFromRecords
from pipeline.fl_records import decode_chunk


def test_bases() -> None:
    assert issubclass(FramingError, FrameError) and issubclass(FramingError, ValueError)
    assert issubclass(ChunkError, PipelineError) and issubclass(ChunkError, ValueError)
    assert ChunkErrorFromRecords is ChunkError
    assert BrokerErrorFromBroker is BrokerError
    assert issubclass(BrokerError, CLIError) and issubclass(CLIError, LDPError)
    assert issubclass(BrokerError, RuntimeError) and not issubclass(BrokerError, ValueError)  # ldp kafka exits 1


def test_a_bad_binary_upload_is_rejected_as_malformed_once() -> None:
    for body in (BINARY_MAGIC + b"\x01", pack_headed(BINARY_MAGIC, b"{}", version=2)):
        with pytest.raises(UpdateRejected) as info:
            parse_upload(body)
        assert info.value.reason == "malformed" and "binary FL upload" in str(info.value)
        assert info.value.__context__ is None


def test_a_bad_chunk_is_a_chunk_error() -> None:
    with pytest.raises(ChunkError, match="truncated"):
        decode_chunk(b"LDPF")


def test_the_command_line_reports_value_errors_with_exit_2(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ldp_cli.commands.privacy as privacy

    def boom(args):  # type: ignore[no-untyped-def]
        raise ChunkError("a chunk is broken")

    monkeypatch.setattr(privacy, "run_local", boom)
    assert main(["privacy", "local", "--epsilon", "1", "--reports", "2", "--delta", "1e-6"]) == 2
    assert capsys.readouterr().err.strip() == "ldp privacy: error: a chunk is broken"
