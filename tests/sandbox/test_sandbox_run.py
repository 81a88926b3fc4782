"""``Sandbox.run``: the subprocess.run-like convenience for scripts and notebooks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import (
    CommandFailed,
    CommandResult,
    CommandTimeout,
    E2bCompatibleBackend,
    Sandbox,
    activate_sandbox,
)
from piship_remote.testing import E2bServer

POLICY = {"required": True, "network": {"mode": "deny"}, "environment": {"allow": ["LANG"]}}
E2bFactory = Callable[..., E2bServer]


@pytest.fixture
def sandbox_for(e2b_server: E2bFactory, workspace: Path) -> Iterator[Callable[..., Sandbox]]:
    sandboxes: list[Sandbox] = []

    def make(command: Callable[[dict[str, Any]], dict[str, Any]]) -> Sandbox:
        mock = e2b_server(command=command)
        backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url)
        sandbox = activate_sandbox(POLICY, backend=backend, workspace=workspace, env={})
        sandboxes.append(sandbox)
        return sandbox

    yield make
    for sandbox in sandboxes:
        sandbox.dispose()


def test_run_captures_stdout_and_stderr_apart(sandbox_for: Callable[..., Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {"stdout": "out ✓\n", "stderr": "err\n", "exit_code": 2})
    assert sandbox.run("x") == CommandResult(exit_code=2, stdout="out ✓\n", stderr="err\n")


def test_run_with_check_raises_command_failed_with_the_tail(
    sandbox_for: Callable[..., Sandbox],
) -> None:
    sandbox = sandbox_for(
        lambda start: {"stdout": "fine\n", "stderr": "no such file\n", "exit_code": 1}
    )
    with pytest.raises(CommandFailed) as caught:
        sandbox.run("cat missing", check=True)
    assert caught.value.code == "COMMAND_FAILED"
    assert caught.value.exit_code == 1
    assert str(caught.value) == "the command exited with status 1: no such file"
    assert caught.value.result.stdout == "fine\n"


def test_run_with_check_passes_a_zero_exit(sandbox_for: Callable[..., Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {"stdout": "ok\n"})
    assert sandbox.run("true", check=True).stdout == "ok\n"


def test_run_echo_writes_live_to_the_current_streams(
    sandbox_for: Callable[..., Sandbox], capsys: pytest.CaptureFixture[str]
) -> None:
    sandbox = sandbox_for(lambda start: {"chunks": [b"caf\xc3", b"\xa9\n"], "stderr": "warn\n"})
    result = sandbox.run("x", echo=True)
    captured = capsys.readouterr()
    assert captured.out == "café\n"
    assert captured.err == "warn\n"
    assert result.stdout == "café\n"


def test_run_failure_message_has_no_secret(sandbox_for: Callable[..., Sandbox]) -> None:
    leaked = "Authorization: Bearer abcdefgh12345678zz"
    sandbox = sandbox_for(lambda start: {"stderr": leaked, "exit_code": 9})
    with pytest.raises(CommandFailed) as caught:
        sandbox.run("x", check=True)
    assert "abcdefgh12345678zz" not in str(caught.value)


@pytest.mark.timeout(10)
def test_run_honours_the_timeout(sandbox_for: Callable[..., Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {"hang": True})
    with pytest.raises(CommandTimeout, match=r"^timeout:0\.2$"):
        sandbox.run("sleep 600", timeout=0.2)


MIB = 1024 * 1024


def mebibytes(count: int, last: bytes) -> Iterator[bytes]:
    """``count`` MiB of output in 1 MiB pieces, the last one ending with ``last``."""
    piece = b"x" * MIB
    for _ in range(count - 1):
        yield piece
    yield piece[: MIB - len(last)] + last


@pytest.mark.timeout(120)
def test_run_of_400_mib_keeps_only_the_last_16_mib(sandbox_for: Callable[..., Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {"chunks": mebibytes(400, b"the end\n"), "stderr": "e"})
    result = sandbox.run("yes | head -c 400M")
    assert len(result.stdout) == 16 * MIB
    assert result.stdout.endswith("x" * 100 + "the end\n")
    assert result.stdout_truncated
    assert (result.stderr, result.stderr_truncated) == ("e", False)


def test_run_under_the_limit_keeps_everything(sandbox_for: Callable[..., Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {"stdout": "12345", "stderr": "abc"})
    result = sandbox.run("x", output_limit=5)
    assert (result.stdout, result.stdout_truncated) == ("12345", False)
    assert (result.stderr, result.stderr_truncated) == ("abc", False)


def test_run_keeps_the_last_bytes_of_each_stream(sandbox_for: Callable[..., Sandbox]) -> None:
    sandbox = sandbox_for(
        lambda start: {"chunks": [b"first ", b"second ", b"third"], "stderr": "0123456789"}
    )
    result = sandbox.run("x", output_limit=8)
    assert (result.stdout, result.stdout_truncated) == ("nd third", True)
    assert (result.stderr, result.stderr_truncated) == ("23456789", True)


def test_run_drops_a_character_the_limit_cut_in_half(sandbox_for: Callable[..., Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {"stdout": "a✓b"})  # ✓ is three bytes
    result = sandbox.run("x", output_limit=3)
    assert (result.stdout, result.stdout_truncated) == ("b", True)


def test_run_without_a_limit_keeps_everything(sandbox_for: Callable[..., Sandbox]) -> None:
    sandbox = sandbox_for(lambda start: {"chunks": [b"a" * MIB, b"b" * MIB]})
    result = sandbox.run("x", output_limit=None)
    assert len(result.stdout) == 2 * MIB
    assert not result.stdout_truncated


def test_run_echo_shows_what_the_limit_drops(
    sandbox_for: Callable[..., Sandbox], capsys: pytest.CaptureFixture[str]
) -> None:
    sandbox = sandbox_for(lambda start: {"chunks": [b"first ", b"second"]})
    result = sandbox.run("x", echo=True, output_limit=6)
    assert capsys.readouterr().out == "first second"
    assert result.stdout == "second"


def test_exec_on_data_gets_every_byte_of_a_long_stream(
    sandbox_for: Callable[..., Sandbox],
) -> None:
    sandbox = sandbox_for(lambda start: {"chunks": mebibytes(20, b"!")})
    received: list[int] = []
    sandbox.exec("x", on_data=lambda chunk: received.append(len(chunk)))
    assert sum(received) == 20 * MIB


@pytest.mark.parametrize(("limit", "error"), [(-1, ValueError), ("16M", TypeError)])
def test_run_refuses_a_bad_output_limit(
    sandbox_for: Callable[..., Sandbox], limit: Any, error: type[Exception]
) -> None:
    sandbox = sandbox_for(lambda start: {"stdout": "never"})
    with pytest.raises(error, match="output limit"):
        sandbox.run("x", output_limit=limit)
