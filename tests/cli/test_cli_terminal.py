"""``run -t``: the command on a terminal when the CLI's stdin is one (a pty the test holds)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import NEEDS_BWRAP, cli_process

CHILD_WITHIN = 60.0  # seconds a child CLI may take (the local service starts in about one)
pytestmark = [NEEDS_BWRAP, pytest.mark.timeout(120)]


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A pty: (the test's end, the end the CLI reads as its stdin)."""
    main, replica = pty.openpty()
    yield main, replica
    os.close(main)
    os.close(replica)


def run_on(replica: int, *args: str, cwd: Path) -> subprocess.Popen[bytes]:
    return cli_process("run", "-t", "--backend", "local", "--", *args, cwd=cwd, stdin=replica)


def read_until(process: subprocess.Popen[bytes], expected: bytes) -> bytes:
    """The child's output up to and including ``expected`` (``b""`` if it never came)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + CHILD_WITHIN
    while expected not in seen and time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], deadline - time.monotonic())
        chunk = os.read(fd, 4096) if readable else b""
        if not chunk:
            break
        seen += chunk
    return seen if expected in seen else b""


def finish(process: subprocess.Popen[bytes]) -> tuple[int, bytes, str]:
    try:
        out, err = process.communicate(timeout=CHILD_WITHIN)
    finally:
        process.kill()
        process.wait()
    return process.returncode, out, err.decode()


def test_run_t_gives_the_command_a_terminal(terminal: tuple[int, int], tmp_path: Path) -> None:
    _, replica = terminal

    process = run_on(replica, "test -t 0 && test -t 1 && echo on a tty", cwd=tmp_path)

    status, out, err = finish(process)

    assert status == 0, err
    assert out == b"on a tty\r\n"


def test_what_is_typed_reaches_the_command_on_its_terminal(
    terminal: tuple[int, int], tmp_path: Path
) -> None:
    main, replica = terminal
    process = run_on(replica, "echo ready; read line; echo got $line", cwd=tmp_path)
    assert read_until(process, b"ready\r\n")

    os.write(main, b"typed\r")

    status, out, err = finish(process)
    assert status == 0, err
    assert out.endswith(b"got typed\r\n")


def test_run_t_takes_the_local_terminals_size(terminal: tuple[int, int], tmp_path: Path) -> None:
    _, replica = terminal
    termios.tcsetwinsize(replica, (33, 111))

    status, out, err = finish(run_on(replica, "stty size", cwd=tmp_path))

    assert status == 0, err
    assert out == b"33 111\r\n"


def test_run_t_restores_the_local_terminals_settings(
    terminal: tuple[int, int], tmp_path: Path
) -> None:
    _, replica = terminal
    before = termios.tcgetattr(replica)

    status, _, err = finish(run_on(replica, "true", cwd=tmp_path))

    assert status == 0, err
    assert termios.tcgetattr(replica) == before


def test_run_t_without_a_terminal_runs_the_command_without_one(tmp_path: Path) -> None:
    process = cli_process(
        "run", "-t", "--backend", "local", "--", "test -t 0 || echo no tty", cwd=tmp_path
    )

    status, out, err = finish(process)

    assert status == 0, err
    assert out == b"no tty\n"
    assert "not a terminal" in err
