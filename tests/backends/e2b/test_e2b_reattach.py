"""A command whose stream is cut is followed again with Connect by tag on the E2B double:
never started again; its output replayed where the double keeps it, read back from the
spool with ``resumable=True``, else marked as a gap; the real exit code returned."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import (
    E2bCompatibleBackend,
    ExecResult,
    OutputGap,
    Sandbox,
    activate_sandbox,
)
from piship_remote.model.output_gap import UNKNOWN_SIZE
from piship_remote.testing import E2bServer

pytestmark = pytest.mark.timeout(60)

LINES = "".join(f"{n}\n" for n in range(1, 5001))  # 23893 bytes
ANSWER = {"stdout": LINES, "stderr": "warn\n", "exit_code": 5}
MakeSandbox = Callable[..., Sandbox]


@pytest.fixture
def sandbox_on(
    e2b_server: Callable[..., E2bServer], tmp_path: Path
) -> Iterator[Callable[..., tuple[E2bServer, Sandbox]]]:
    opened: list[Sandbox] = []

    def make(**server_options: Any) -> tuple[E2bServer, Sandbox]:
        server = e2b_server(command=lambda start: ANSWER, **server_options)
        backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)
        sandbox = activate_sandbox({"required": True}, backend=backend, workspace=tmp_path, env={})
        opened.append(sandbox)
        return server, sandbox

    yield make
    for sandbox in opened:
        sandbox.dispose()


def starts(server: E2bServer) -> int:
    paths = [r.path for r in server.requests]
    return paths.count("/process.Process/Start") - 1  # the readiness probe's own


def test_a_cut_stream_is_followed_with_connect_and_the_command_started_once(
    sandbox_on: Callable[..., tuple[E2bServer, Sandbox]],
) -> None:
    server, sandbox = sandbox_on(keep_output=True)
    server.faults.cut_streams_after(3000, 9000, unheard=500)
    result = sandbox.run("numbers")
    assert (result.exit_code, result.stdout, result.stderr) == (5, LINES, "warn\n")
    assert result.missing == {"stdout": 0, "stderr": 0}
    assert starts(server) == 1
    assert [r.path for r in server.requests].count("/process.Process/Connect") == 2


def test_without_a_replay_the_result_says_output_may_be_missing(
    sandbox_on: Callable[..., tuple[E2bServer, Sandbox]],
) -> None:
    server, sandbox = sandbox_on()
    server.faults.cut_streams_after(3000, unheard=500)
    result = sandbox.run("numbers")
    assert result.exit_code == 5
    assert result.missing == {"stdout": UNKNOWN_SIZE, "stderr": UNKNOWN_SIZE}
    assert result.stdout == LINES[:3000] + LINES[3500:]
    assert starts(server) == 1


def test_on_data_gets_a_marked_gap_notice_never_silently_joined_text(
    sandbox_on: Callable[..., tuple[E2bServer, Sandbox]],
) -> None:
    server, sandbox = sandbox_on()
    server.faults.cut_streams_after(3000, unheard=500)
    chunks: list[bytes] = []
    sandbox.exec("numbers", on_data=chunks.append)
    gaps = [chunk for chunk in chunks if isinstance(chunk, OutputGap)]
    assert [(gap.stream, gap.size) for gap in gaps] == [
        ("stdout", UNKNOWN_SIZE),
        ("stderr", UNKNOWN_SIZE),
    ]
    assert b"may be missing" in gaps[0]


def test_without_a_replay_exec_says_output_may_be_missing(
    sandbox_on: Callable[..., tuple[E2bServer, Sandbox]],
) -> None:
    server, sandbox = sandbox_on()
    server.faults.cut_streams_after(3000, unheard=500)
    result = sandbox.exec("numbers")
    assert result.exit_code == 5
    assert result.missing == {"stdout": UNKNOWN_SIZE, "stderr": UNKNOWN_SIZE}


def test_exec_whose_stream_was_replayed_says_nothing_is_missing(
    sandbox_on: Callable[..., tuple[E2bServer, Sandbox]],
) -> None:
    server, sandbox = sandbox_on(keep_output=True)
    server.faults.cut_streams_after(3000, 9000, unheard=500)
    result = sandbox.exec("numbers", on_data=lambda chunk: None)
    assert result == ExecResult(5, {"stdout": 0, "stderr": 0})


def test_resumable_reads_the_spool_back_by_offset_on_a_double_that_keeps_nothing(
    sandbox_on: Callable[..., tuple[E2bServer, Sandbox]],
) -> None:
    server, sandbox = sandbox_on()
    server.faults.cut_streams_after(3000, 4000, unheard=500)
    result = sandbox.run("numbers", resumable=True)
    assert (result.exit_code, result.stdout, result.stderr) == (5, LINES, "warn\n")
    assert result.missing == {"stdout": 0, "stderr": 0}
    assert starts(server) == 1


def test_resumable_leaves_no_spool_behind(
    sandbox_on: Callable[..., tuple[E2bServer, Sandbox]],
) -> None:
    server, sandbox = sandbox_on()
    sandbox.run("numbers", resumable=True)
    assert not [path for path in server.files() if "piship-spool" in path]


def test_a_connect_the_service_refuses_leaves_the_outcome_unknown(
    sandbox_on: Callable[..., tuple[E2bServer, Sandbox]],
) -> None:
    server, sandbox = sandbox_on()
    server.faults.drop_stream_after_output()
    with pytest.raises(Exception, match="outcome is unknown"):
        sandbox.run("numbers")
    assert starts(server) == 1
