"""``run -t``: the remote command on a terminal, this process's terminal in raw mode before it.

What is typed goes to the command as it is typed (Ctrl-C and Ctrl-D included: the remote
terminal turns them into a signal and an end of input), the command's output comes back as
it arrives, and the local terminal's size follows into the sandbox (at the start and on
``SIGWINCH``). The local terminal's settings are restored however the command ends.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from types import FrameType

from piship_remote.model.errors import PiShipError
from piship_remote.sandbox.command_handle import CommandHandle
from piship_remote.sandbox.sandbox import Sandbox

__all__ = ["run_on_terminal", "terminal_input"]

INPUT_POLL = 0.05  # how often the input thread looks whether the command ended
INPUT_CHUNK = 4096


def terminal_input() -> int | None:
    """The descriptor of this process's stdin when it is a terminal, else ``None``."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd if os.isatty(fd) else None


def run_on_terminal(sandbox: Sandbox, command: str, fd: int, timeout: float | None) -> int:
    """Run ``command`` on a terminal in ``sandbox``, typed into from the terminal ``fd``;
    its exit code."""
    handle = sandbox.start(command, pty=_size(fd), timeout=timeout)
    out = sys.stdout.buffer
    with _raw(fd), _resizing(handle, fd), _typing(handle, fd):
        for _, chunk in handle:
            out.write(chunk)
            out.flush()
        return handle.wait().exit_code


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSADRAIN)  # what was typed ahead is kept for the command
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _typing(handle: CommandHandle, fd: int) -> Iterator[None]:
    """A ``piship-cli-input`` thread sends what is typed until the command ends."""
    stop = threading.Event()
    thread = threading.Thread(
        target=_forward, args=(handle, fd, stop), name="piship-cli-input", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _forward(handle: CommandHandle, fd: int, stop: threading.Event) -> None:
    try:
        while not stop.is_set() and handle.running:
            readable, _, _ = select.select([fd], [], [], INPUT_POLL)
            if not readable:
                continue
            data = os.read(fd, INPUT_CHUNK)
            if not data:
                handle.close_stdin()
                return
            handle.send_stdin(data)
    except (OSError, PiShipError):
        pass  # the command ended, or the terminal went away: its exit status tells the rest


@contextlib.contextmanager
def _resizing(handle: CommandHandle, fd: int) -> Iterator[None]:
    """The remote terminal follows the local one's size on ``SIGWINCH`` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def resized(_signum: int, _frame: FrameType | None) -> None:
        _follow_size(handle, fd)

    previous = signal.signal(signal.SIGWINCH, resized)
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)


def _follow_size(handle: CommandHandle, fd: int) -> None:
    size = _size(fd)
    if not isinstance(size, tuple):
        return
    try:
        handle.resize(*size)
    except PiShipError:
        pass  # the command ended


def _size(fd: int) -> tuple[int, int] | bool:
    """The terminal's ``(cols, rows)``; ``True`` (the default size) when it has none."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return True
    return (size.columns, size.lines) if size.columns > 0 and size.lines > 0 else True
