"""``Sandbox.start`` and its :class:`CommandHandle` on the E2B double: each method, the order
of the output, waiting with and without a deadline, killing, input and a terminal."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import (
    CommandHandle,
    CommandResult,
    CommandTimeout,
    E2bCompatibleBackend,
    PiShipError,
    Sandbox,
    activate_sandbox,
)
from piship_remote.testing import E2bServer, Recorded
from piship_remote.testing.e2b_commands import PID
from tests.support.interrupts import interrupt_main_inside
from tests.support.seed import assert_no_library_thread_left

POLICY = {"required": True, "network": {"mode": "deny"}, "environment": {"allow": ["LANG"]}}
WITHIN = 10.0  # seconds anything here may take
Answer = Callable[[dict[str, Any]], dict[str, Any]]
pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def served(
    e2b_server: Callable[..., E2bServer], workspace: Path
) -> Iterator[Callable[[Answer], tuple[E2bServer, Sandbox]]]:
    sandboxes: list[Sandbox] = []

    def make(command: Answer) -> tuple[E2bServer, Sandbox]:
        mock = e2b_server(command=command)
        backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url)
        sandbox = activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
        sandboxes.append(sandbox)
        return mock, sandbox

    yield make
    for sandbox in sandboxes:
        sandbox.dispose()


@pytest.fixture
def sandbox_for(
    served: Callable[[Answer], tuple[E2bServer, Sandbox]],
) -> Callable[[Answer], Sandbox]:
    return lambda command: served(command)[1]


def bodies(mock: E2bServer, method: str) -> list[dict[str, Any]]:
    """The JSON bodies of the envd ``method`` requests (a Start's after its envelope head)."""
    found = [r for r in mock.requests if r.path == f"/process.Process/{method}"]
    return [_body(r, method) for r in found]


def _body(request: Recorded, method: str) -> dict[str, Any]:
    raw = request.body[5:] if method == "Start" else request.body
    value: dict[str, Any] = json.loads(raw)
    return value


def typed(body: dict[str, Any]) -> bytes:
    return base64.b64decode(body["input"]["pty"])


def test_start_returns_while_the_command_runs_and_wait_gives_its_result(
    sandbox_for: Callable[[Answer], Sandbox],
) -> None:
    gate = threading.Event()
    sandbox = sandbox_for(lambda start: {"stdout": "hi\n", "after": gate, "exit_code": 3})

    handle = sandbox.start("make")
    assert handle.running
    gate.set()

    assert handle.wait(timeout=WITHIN) == CommandResult(exit_code=3, stdout="hi\n", stderr="")
    assert not handle.running


def test_iteration_gives_each_chunk_with_its_stream_in_the_order_it_came(
    sandbox_for: Callable[[Answer], Sandbox],
) -> None:
    sandbox = sandbox_for(lambda start: {"stdout": "a", "chunks": ["b", "c"], "stderr": "e"})

    handle = sandbox.start("x")

    assert list(handle) == [("stdout", b"a"), ("stdout", b"b"), ("stdout", b"c"), ("stderr", b"e")]


def test_iteration_gives_output_before_the_command_ends(
    sandbox_for: Callable[[Answer], Sandbox],
) -> None:
    gate = threading.Event()
    sandbox = sandbox_for(lambda start: {"stdout": "first\n", "after": gate})
    handle = sandbox.start("x")
    chunks = iter(handle)

    assert next(chunks) == ("stdout", b"first\n")
    assert handle.running
    gate.set()
    assert list(chunks) == []


def test_pid_is_the_one_the_start_event_gave(sandbox_for: Callable[[Answer], Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {})

    assert sandbox.start("x").pid == PID


def test_wait_with_a_timeout_raises_timeout_error_and_leaves_the_command_running(
    sandbox_for: Callable[[Answer], Sandbox],
) -> None:
    gate = threading.Event()
    sandbox = sandbox_for(lambda start: {"after": gate})
    handle = sandbox.start("x")

    with pytest.raises(TimeoutError, match="still running") as caught:
        handle.wait(timeout=0.05)

    assert not isinstance(caught.value, CommandTimeout)
    assert handle.running
    gate.set()
    assert handle.wait(timeout=WITHIN).exit_code == 0


def test_the_commands_own_timeout_kills_it_and_wait_raises_command_timeout(
    served: Callable[[Answer], tuple[E2bServer, Sandbox]],
) -> None:
    mock, sandbox = served(lambda start: {"hang": True})
    handle = sandbox.start("sleep 600", timeout=0.2)

    with pytest.raises(CommandTimeout, match=r"^timeout:0\.2$"):
        handle.wait(timeout=WITHIN)

    signal = mock.wait_for("POST", "/process.Process/SendSignal", timeout=WITHIN)
    assert signal.json()["process"]["tag"] == bodies(mock, "Start")[-1]["tag"]


def test_kill_sends_sigkill_and_wait_returns_the_signals_exit_code(
    served: Callable[[Answer], tuple[E2bServer, Sandbox]],
) -> None:
    mock, sandbox = served(lambda start: {"hang": True})
    handle = sandbox.start("sleep 600")
    assert handle.pid == PID  # it started

    assert handle.kill() is True

    assert handle.wait(timeout=WITHIN).exit_code == 137
    signal = mock.wait_for("POST", "/process.Process/SendSignal", timeout=WITHIN)
    tag = bodies(mock, "Start")[-1]["tag"]
    assert signal.json() == {"process": {"tag": tag}, "signal": "SIGNAL_SIGKILL"}


def test_kill_of_a_finished_command_returns_false(sandbox_for: Callable[[Answer], Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {"stdout": "done\n"})
    handle = sandbox.start("x")
    handle.wait(timeout=WITHIN)

    assert handle.kill() is False
    assert handle.wait(timeout=WITHIN).stdout == "done\n"


def test_send_stdin_and_close_stdin_reach_the_command(
    served: Callable[[Answer], tuple[E2bServer, Sandbox]],
) -> None:
    mock, sandbox = served(lambda start: {"cat": True})
    handle = sandbox.start("cat", stdin=True)

    handle.send_stdin("hi ")
    handle.send_stdin(b"there")
    handle.close_stdin()

    assert handle.wait(timeout=WITHIN).stdout == "hi there"
    assert bodies(mock, "Start")[-1]["stdin"] is True


def test_a_command_started_without_stdin_refuses_input(
    sandbox_for: Callable[[Answer], Sandbox],
) -> None:
    sandbox = sandbox_for(lambda start: {})
    handle = sandbox.start("x")

    with pytest.raises(PiShipError, match="stdin=True") as caught:
        handle.send_stdin("hi")
    assert caught.value.code == "CONFIG_INVALID"


def test_input_to_a_command_that_ended_is_refused(
    sandbox_for: Callable[[Answer], Sandbox],
) -> None:
    sandbox = sandbox_for(lambda start: {})
    handle = sandbox.start("x", stdin=True)
    handle.wait(timeout=WITHIN)

    with pytest.raises(PiShipError, match="ended") as caught:
        handle.send_stdin("late")
    assert caught.value.code == "COMMAND_FAILED"


def test_a_terminal_command_starts_with_a_pty_of_80_by_24(
    served: Callable[[Answer], tuple[E2bServer, Sandbox]],
) -> None:
    mock, sandbox = served(lambda start: {})

    sandbox.start("bash", pty=True).wait(timeout=WITHIN)

    start = bodies(mock, "Start")[-1]
    assert start["pty"] == {"size": {"cols": 80, "rows": 24}}
    assert start["stdin"] is False


def test_a_terminal_of_a_given_size_starts_with_it(
    served: Callable[[Answer], tuple[E2bServer, Sandbox]],
) -> None:
    mock, sandbox = served(lambda start: {})

    sandbox.start("bash", pty=(132, 50)).wait(timeout=WITHIN)

    assert bodies(mock, "Start")[-1]["pty"] == {"size": {"cols": 132, "rows": 50}}


def test_input_to_a_terminal_is_typed_and_its_close_is_ctrl_d(
    served: Callable[[Answer], tuple[E2bServer, Sandbox]],
) -> None:
    gate = threading.Event()
    mock, sandbox = served(lambda start: {"after": gate})
    handle = sandbox.start("bash", pty=True)

    handle.send_stdin("ls\n")
    handle.close_stdin()
    gate.set()
    handle.wait(timeout=WITHIN)

    assert [typed(body) for body in bodies(mock, "SendInput")] == [b"ls\n", b"\x04"]
    assert bodies(mock, "CloseStdin") == []


def test_resize_updates_the_terminal_size(
    served: Callable[[Answer], tuple[E2bServer, Sandbox]],
) -> None:
    gate = threading.Event()
    mock, sandbox = served(lambda start: {"after": gate})
    handle = sandbox.start("bash", pty=True)

    handle.resize(120, 40)
    gate.set()
    handle.wait(timeout=WITHIN)

    start = bodies(mock, "Start")[-1]
    assert bodies(mock, "Update") == [
        {"process": {"tag": start["tag"]}, "pty": {"size": {"cols": 120, "rows": 40}}}
    ]


def test_resize_without_a_terminal_is_refused(sandbox_for: Callable[[Answer], Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {})
    handle = sandbox.start("x")

    with pytest.raises(PiShipError, match="pty=True") as caught:
        handle.resize(100, 30)
    assert caught.value.code == "CONFIG_INVALID"


def test_a_terminal_size_out_of_range_is_refused(sandbox_for: Callable[[Answer], Sandbox]) -> None:
    gate = threading.Event()
    sandbox = sandbox_for(lambda start: {"after": gate})
    handle = sandbox.start("bash", pty=True)

    with pytest.raises(ValueError, match="cols"):
        handle.resize(0, 30)
    gate.set()


@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_while_waiting_kills_the_command_and_reraises(
    served: Callable[[Answer], tuple[E2bServer, Sandbox]],
) -> None:
    mock, sandbox = served(lambda start: {"hang": True})
    handle = sandbox.start("sleep 600")
    threading.Thread(target=interrupt_main_inside, args=("wait",), daemon=True).start()

    with pytest.raises(KeyboardInterrupt):
        handle.wait()

    signal_request = mock.wait_for("POST", "/process.Process/SendSignal", timeout=WITHIN)
    assert signal_request.json()["process"]["tag"] == bodies(mock, "Start")[-1]["tag"]


def test_dispose_ends_a_started_command_and_leaves_no_library_thread(
    e2b_server: Callable[..., E2bServer], workspace: Path
) -> None:
    mock = e2b_server(command=lambda start: {"hang": True})
    backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url)
    sandbox = activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
    handle = sandbox.start("sleep 600", stdin=True)
    assert handle.pid == PID

    sandbox.dispose()

    with pytest.raises(PiShipError, match="disposed"):
        handle.wait(timeout=WITHIN)
    assert_no_library_thread_left()


def test_exec_and_start_share_one_handle_type(sandbox_for: Callable[[Answer], Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {"stdout": "x\n"})

    assert isinstance(sandbox.start("x"), CommandHandle)
