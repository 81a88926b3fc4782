"""The controls of one running command, shared by its handle and the backend running it.

``Sandbox.start`` puts a :class:`CommandControl` on the :class:`ExecRequest`; a backend that
can do more than run and cancel (an E2B-compatible envd: a pid, stdin, a terminal) binds its
:class:`CommandInput` once the command started, and says its pid::

    control = CommandControl(stdin=True)                     # the handle's side
    control.bind(envd_input); control.started(pid)           # the backend's side
    control.input().send(b"hello\\n")                         # on the handle's caller's thread

A request for the caller's thread never waits on a thread of the library.
"""

from __future__ import annotations

import threading
from typing import Protocol

import attrs

__all__ = ["CommandControl", "CommandInput", "TerminalSize"]


@attrs.frozen
class TerminalSize:
    """A terminal's size in character cells."""

    cols: int = 80
    rows: int = 24

    def __attrs_post_init__(self) -> None:
        for name, value in (("cols", self.cols), ("rows", self.rows)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
                raise ValueError(
                    f"a terminal's {name} must be an int from 1 to 65535, not {value!r}"
                )


class CommandInput(Protocol):
    """What a backend does with the caller's input to one running command."""

    def send(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin (or its terminal); raise if refused."""
        ...

    def close(self) -> None:
        """End the command's input (on a terminal: type end-of-file, Ctrl-D)."""
        ...

    def resize(self, size: TerminalSize) -> None:
        """Resize the command's terminal."""
        ...


class CommandControl:
    """The link between a running command's handle and the backend call running it.

    ``stdin``: the command's input is a pipe the caller writes through :meth:`input`.
    The backend calls :meth:`bind` once the command started (its input can be written)
    and :meth:`started` with its pid; the engine calls :meth:`end` when the call returned.
    :meth:`input` and :meth:`pid` wait for those, so a caller never races the start.
    """

    def __init__(self, *, stdin: bool = False) -> None:
        self.stdin = stdin
        self._lock = threading.Lock()
        self._bound = threading.Event()
        self._pid_said = threading.Event()
        self._input: CommandInput | None = None
        self._pid: int | None = None
        self._ended = False

    def bind(self, command_input: CommandInput) -> None:
        with self._lock:
            if not self._ended:
                self._input = command_input
        self._bound.set()

    def started(self, pid: int | None) -> None:
        with self._lock:
            if self._pid is None:
                self._pid = pid
        self._pid_said.set()

    def end(self) -> None:
        """The backend call returned: input is refused from now on, waiters are released."""
        with self._lock:
            self._ended = True
            self._input = None
        self._bound.set()
        self._pid_said.set()

    def input(self) -> CommandInput | None:
        """The bound input once the command started; ``None`` once the call ended."""
        self._bound.wait()
        with self._lock:
            return self._input

    def pid(self) -> int | None:
        """The command's pid once the backend said it; ``None`` if the call ended first."""
        self._pid_said.wait()
        return self._pid
