"""PTYs in local sandboxes: a pseudo-terminal opened inside the sandbox, its output as
``pty`` data events, input through SendInput, resize through Update, kill through
SendSignal, as the SDKs' ``pty.create``/``send_stdin``/``resize``/``kill`` use them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from tests.support.local_service import Client, gone, marked, marker, needs_bwrap
from tests.support.process_rpc import pid_of, pty_shows, pty_text, send_input, start_pty, unary

pytestmark = [needs_bwrap, pytest.mark.timeout(30)]


@pytest.fixture(scope="module")
def service() -> Iterator[LocalE2bService]:
    with LocalE2bService() as running:
        yield running


def type_line(client: Client, sandbox: dict[str, Any], pid: int, line: str) -> None:
    response = send_input(client, sandbox, {"pid": pid}, line.encode() + b"\n", kind="pty")
    assert response.status_code == 200, response.text


def test_output_comes_as_pty_data_from_a_terminal_inside_the_sandbox(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start_pty(client, sandbox, 80, 24)
    pid = pid_of(stream)
    type_line(client, sandbox, pid, "tty; echo done-$((1+1))")
    stream.until(pty_shows("done-2"))
    assert "/dev/pts/0" in pty_text(stream)
    assert stream.stdout == stream.stderr == ""


def test_the_terminal_has_the_size_asked_for(client: Client, sandbox: dict[str, Any]) -> None:
    stream = start_pty(client, sandbox, 91, 17)
    type_line(client, sandbox, pid_of(stream), "stty size")
    assert "17 91" in pty_text(stream.until(pty_shows("17 91")))


def test_update_resizes_the_terminal_and_the_shell_gets_sigwinch(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start_pty(client, sandbox, 80, 24)
    pid = pid_of(stream)
    trap = "trap 'echo winch-$(stty size | tr \" \" x)' WINCH"
    type_line(client, sandbox, pid, f"{trap}; echo ar''med")
    stream.until(pty_shows("armed\r\n"))
    size = {"size": {"cols": 132, "rows": 43}}
    response = unary(client, sandbox, "Update", {"process": {"pid": pid}, "pty": size})
    assert (response.status_code, response.json()) == (200, {})
    type_line(client, sandbox, pid, "true")
    assert "winch-43x132" in pty_text(stream.until(pty_shows("winch-43x132")))


def test_exit_in_the_terminal_ends_the_stream_with_its_status(
    client: Client, sandbox: dict[str, Any]
) -> None:
    stream = start_pty(client, sandbox, 80, 24)
    type_line(client, sandbox, pid_of(stream), "exit 5")
    stream.finish()
    assert stream.end == {
        "exitCode": 5,
        "exited": True,
        "status": "exit status 5",
        "error": "exit status 5",
    }
    assert stream.trailer == {}


def test_send_signal_kills_the_terminal_and_what_runs_in_it(
    client: Client, sandbox: dict[str, Any]
) -> None:
    mark = marker()
    stream = start_pty(client, sandbox, 80, 24)
    pid = pid_of(stream)
    type_line(client, sandbox, pid, f"sleep {mark} & echo bg-''started")
    stream.until(pty_shows("bg-started\r\n"))
    assert gone(lambda: bool(marked(mark)))  # the job has exec'd sleep
    response = unary(
        client, sandbox, "SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
    )
    assert response.status_code == 200
    stream.finish()
    assert stream.end == {"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}
    assert gone(lambda: not marked(mark))


def test_stdin_input_to_a_pty_is_refused_like_envd(client: Client, sandbox: dict[str, Any]) -> None:
    stream = start_pty(client, sandbox, 80, 24)
    pid = pid_of(stream)
    response = send_input(client, sandbox, {"pid": pid}, b"x", kind="stdin")
    type_line(client, sandbox, pid, "exit")
    stream.finish()
    assert response.status_code == 500
    assert response.json()["code"] == "internal"


def test_a_pty_in_a_missing_cwd_fails_like_envd(client: Client, sandbox: dict[str, Any]) -> None:
    stream = start_pty(client, sandbox, 80, 24, cwd="/nowhere").finish()
    assert stream.trailer == {
        "error": {"code": "invalid_argument", "message": "cwd '/nowhere' does not exist"}
    }


def test_a_pty_starts_in_a_cwd_outside_the_home(client: Client, sandbox: dict[str, Any]) -> None:
    stream = start_pty(client, sandbox, 80, 24, cwd="/tmp")
    type_line(client, sandbox, pid_of(stream), "echo at:$PWD")
    assert "at:/tmp" in pty_text(stream.until(pty_shows("at:/tmp")))
