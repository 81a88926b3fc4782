"""``Sandbox.start`` on the local service: a real envd over real processes, pipes and ptys."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from piship_remote import CommandTimeout, Sandbox, activate_sandbox
from piship_remote.local import LocalE2bService
from tests.support.cli import NEEDS_BWRAP

POLICY = {"required": True, "network": {"mode": "deny"}, "environment": {"allow": ["LANG"]}}
WITHIN = 20.0
pytestmark = [NEEDS_BWRAP, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def module_service() -> Iterator[LocalE2bService]:
    with LocalE2bService() as running:
        yield running


@pytest.fixture
def sandbox(module_service: LocalE2bService, tmp_path: Path) -> Iterator[Sandbox]:
    with activate_sandbox(
        POLICY, backend=module_service.backend(), workspace=tmp_path, env={}
    ) as active:
        yield active


def test_input_sent_to_a_started_command_reaches_it(sandbox: Sandbox) -> None:
    handle = sandbox.start("tr a-z A-Z", stdin=True)

    handle.send_stdin("hello ")
    handle.send_stdin(b"world\n")
    handle.close_stdin()

    assert handle.wait(timeout=WITHIN).stdout == "HELLO WORLD\n"


def test_output_arrives_while_the_command_waits_for_input(sandbox: Sandbox) -> None:
    handle = sandbox.start("echo first; read line; echo got $line", stdin=True)
    chunks = iter(handle)

    assert next(chunks) == ("stdout", b"first\n")
    handle.send_stdin("it\n")
    assert b"".join(chunk for _, chunk in chunks) == b"got it\n"


def test_pid_is_the_process_id_the_command_sees(sandbox: Sandbox) -> None:
    handle = sandbox.start("echo $$")

    said = handle.wait(timeout=WITHIN).stdout

    assert handle.pid == int(said)


def test_kill_ends_a_running_command(sandbox: Sandbox) -> None:
    handle = sandbox.start("echo up; sleep 600")
    assert next(iter(handle)) == ("stdout", b"up\n")

    assert handle.kill() is True

    killed = handle.wait(timeout=WITHIN)
    assert (killed.exit_code, killed.stdout) == (137, "up\n")
    assert not handle.running


def test_kill_of_a_command_that_ended_returns_false(sandbox: Sandbox) -> None:
    handle = sandbox.start("echo done")
    handle.wait(timeout=WITHIN)

    assert handle.kill() is False


def test_wait_with_a_timeout_leaves_the_command_running(sandbox: Sandbox) -> None:
    handle = sandbox.start("read x", stdin=True)

    with pytest.raises(TimeoutError, match="still running"):
        handle.wait(timeout=0.1)

    assert handle.running
    handle.close_stdin()
    assert handle.wait(timeout=WITHIN).exit_code == 1


def test_the_commands_own_timeout_raises_command_timeout(sandbox: Sandbox) -> None:
    handle = sandbox.start("sleep 600", timeout=0.3)

    with pytest.raises(CommandTimeout):
        handle.wait(timeout=WITHIN)


def test_a_terminal_command_runs_on_a_tty(sandbox: Sandbox) -> None:
    result = sandbox.start("test -t 0 && test -t 1 && echo on a tty", pty=True).wait(WITHIN)

    assert result.exit_code == 0
    assert "on a tty" in result.stdout


def test_resize_changes_the_terminals_size(sandbox: Sandbox) -> None:
    handle = sandbox.start("read go; stty size", pty=True)

    handle.resize(123, 45)
    handle.send_stdin("go\r")

    assert "45 123" in handle.wait(timeout=WITHIN).stdout


def test_close_stdin_on_a_terminal_ends_its_input(sandbox: Sandbox) -> None:
    handle = sandbox.start("cat; echo ended", pty=True)

    handle.send_stdin("typed\r")
    handle.close_stdin()

    result = handle.wait(timeout=WITHIN)
    assert result.exit_code == 0
    assert "typed" in result.stdout and "ended" in result.stdout
