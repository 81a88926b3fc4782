"""A command running in a sandbox: :class:`CommandHandle`, what ``Sandbox.start`` returns.

    handle = sandbox.start("cat", stdin=True)
    handle.send_stdin("hello\\n")
    handle.close_stdin()
    for stream, chunk in handle:          # ("stdout" | "stderr", bytes) as they arrive
        ...
    result = handle.wait()                # a CommandResult, as Sandbox.run gives

``Sandbox.exec`` and ``Sandbox.run`` build no handle: they hand the same request to the
engine and wait at once on the calling thread (output to ``on_data`` on that thread,
Ctrl-C, the deadline). ``Sandbox.start`` makes the backend call on a ``piship-exec-N``
worker and returns at once.

One result per level: a backend instance returns a :class:`~piship_remote.BackendResult`
(an exit code, or the signal that stopped the command), ``Sandbox.exec`` an
:class:`~piship_remote.ExecResult` (the exit code, ``128 + n`` for signal ``n``; the output
went to ``on_data``), ``Sandbox.run`` and :meth:`CommandHandle.wait` a
:class:`~piship_remote.CommandResult` (the exit code and the captured output).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator

from piship_remote.backends._common import exit_status
from piship_remote.backends.base import ExecRequest
from piship_remote.backends.control import CommandInput, TerminalSize
from piship_remote.model.errors import (
    CommandFailed,
    ConfigInvalid,
)
from piship_remote.model.result import CommandResult
from piship_remote.sandbox._exec_engine import (
    CHANNEL_BYTES,
    COMMAND_KILLED,
    INTERRUPT_POLL,
    ExecEngine,
)
from piship_remote.sandbox._exec_workers import KILLED, BackgroundCall, Stream
from piship_remote.sandbox._output import OutputCapture
from piship_remote.transport.deadline import Deadline

__all__ = ["UNREAD_LIMIT", "CommandHandle"]

UNREAD_LIMIT = CHANNEL_BYTES
"""The output bytes a handle holds for its iteration: beyond it the oldest go while nobody
iterates, and the command is held back while someone does."""


class CommandHandle:
    """A command started with :meth:`Sandbox.start <piship_remote.Sandbox.start>`.

    - ``pid``: the command's process id in the sandbox (waits until the service said
      it); ``None`` where the service gives none (the agent-sandbox router).
    - ``wait(timeout=None)``: its :class:`~piship_remote.CommandResult` once it ended.
      Raises :class:`~piship_remote.CommandTimeout` when the command's own ``timeout``
      (given to ``start``) expired. After :meth:`kill` the result's ``exit_code`` is 137
      (``128 + 9``, SIGKILL, as a shell reports it) on every service, with the output
      that arrived before the kill. ``wait``'s ``timeout`` is how long to wait: when it
      runs out, ``TimeoutError`` is raised and the command keeps running.
    - ``for stream, chunk in handle``: ``("stdout" | "stderr", bytes)`` as the output
      arrives, until the command ends. Up to 1 MiB waits for the reader; while nobody
      iterates, older output beyond that leaves the iteration, and while someone does,
      the command is held back until they catch up. ``wait``'s result has all of it
      either way (each stream's last ``output_limit`` bytes, as ``Sandbox.run`` keeps).
    - ``kill()``: end the command (E2B, the local service and Kubernetes on sandboxd:
      SIGKILL; Kubernetes on the router: its process group in detached mode, else the
      claim is retired, as a cancel does);
      ``False`` when it had already ended.
    - ``send_stdin(data)``, ``close_stdin()``: write to its input (started with
      ``stdin=True`` or ``pty=True``) from the calling thread; on a terminal
      ``close_stdin`` types Ctrl-D. ``resize(cols, rows)``: its terminal's size.

    Ctrl-C while waiting on or iterating a handle kills the command and re-raises, as
    ``Sandbox.exec`` does. ``dispose()`` ends it with an error that mentions "disposed".
    """

    def __init__(
        self,
        engine: ExecEngine,
        request: ExecRequest,
        deadline: Deadline,
        *,
        output_limit: int | None,
    ) -> None:
        self._engine = engine
        self._request = request
        self._deadline = deadline
        self._capture = OutputCapture(limit=output_limit)
        self._cond = threading.Condition()
        self._unread: collections.deque[tuple[Stream, bytes]] = collections.deque()
        self._unread_bytes = 0
        self._readers = 0
        self._started: BackgroundCall | None = None

    def __repr__(self) -> str:
        state = "running" if self.running else "ended"
        return f"<CommandHandle {self._request.command!r} {state}>"

    # -- how it runs -------------------------------------------------------------------

    def _begin(self, on_end: Callable[[], None] | None = None) -> CommandHandle:
        """Start the command on a worker (``Sandbox.start``); ``on_end`` is called once it
        ended and ``_started`` is set (its span's end), by whichever of the two comes last."""
        arrivals = [0]

        def arrive() -> None:
            with self._cond:
                arrivals[0] += 1
                last = arrivals[0] == 2
            if last and on_end is not None:
                on_end()

        def done() -> None:
            self._wake()
            arrive()

        self._started = self._engine.begin(self._request, self._received, self._deadline, done)
        arrive()
        return self

    def _received(self, stream: Stream, chunk: bytes) -> None:
        """Output, on the worker: kept for the result and queued for the iteration."""
        with self._cond:
            self._capture.write(stream, chunk)
            self._unread.append((stream, chunk))
            self._unread_bytes += len(chunk)
            self._cond.notify_all()
            while self._unread_bytes > UNREAD_LIMIT and len(self._unread) > 1:
                if not self._readers:
                    _, dropped = self._unread.popleft()
                    self._unread_bytes -= len(dropped)
                    continue
                if self._stopping():
                    return
                self._cond.wait(INTERRUPT_POLL)  # the reader catches up, or a kill lands

    def _stopping(self) -> bool:
        started = self._started
        return started is not None and started.call.stopped

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the public handle -------------------------------------------------------------

    @property
    def running(self) -> bool:
        """``True`` until the command's call returned (it ended, or was killed)."""
        return self._started is not None and not self._started.done.is_set()

    @property
    def pid(self) -> int | None:
        """The command's process id in the sandbox; ``None`` where the service gives none."""
        control = self._request.control
        if control is None or not self._engine.controls_commands:
            return None
        return control.pid()

    def wait(self, timeout: float | None = None) -> CommandResult:
        """The command's result once it ended (see the class); ``timeout``: how long to wait.

        Raises:
            CommandTimeout: the command's own ``timeout`` expired (it was killed).
            TimeoutError: this call's ``timeout`` passed; the command still runs.
            SandboxUnavailable: the sandbox failed under the command, or was disposed.
            PiShipError: any other failure the service reports, with its code.
        """
        started = self._begun()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not started.done.wait(_slice(deadline)):
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"the command is still running after {timeout} s (it was not killed)"
                    )
        except KeyboardInterrupt:
            self.kill()
            raise KeyboardInterrupt(COMMAND_KILLED) from None
        result = self._engine.result_of(started, self._deadline)
        with self._cond:
            return self._capture.result(exit_status(result))

    def __iter__(self) -> Iterator[tuple[Stream, bytes]]:
        started = self._begun()
        with self._cond:
            self._readers += 1
        try:
            while True:
                with self._cond:
                    while not self._unread and not started.done.is_set():
                        self._cond.wait(INTERRUPT_POLL)
                    if not self._unread:
                        return
                    item = self._unread.popleft()
                    self._unread_bytes -= len(item[1])
                    self._cond.notify_all()
                yield item
        except KeyboardInterrupt:
            self.kill()
            raise KeyboardInterrupt(COMMAND_KILLED) from None
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    def kill(self) -> bool:
        """End the command; ``False`` when it had already ended (or was killed before)."""
        started = self._begun()
        if started.done.is_set() or started.call.aborted is not None:
            return False
        started.call.abort(KILLED)
        self._wake()
        return True

    def send_stdin(self, data: bytes | str) -> None:
        """Write ``data`` (a ``str`` as UTF-8) to the command's input.

        Raises:
            ConfigInvalid: the command was not started with ``stdin=True``.
            CommandFailed: the command has ended.
        """
        if isinstance(data, str):
            data = data.encode()
        self._input("write to").send(bytes(data))

    def close_stdin(self) -> None:
        """End the command's input; nothing to do once the command ended."""
        command_input = self._bound_input("close")
        if command_input is not None:
            command_input.close()

    def resize(self, cols: int, rows: int) -> None:
        """Resize the command's terminal (started with ``pty=True``).

        Raises:
            ConfigInvalid: the command was not started with ``pty=True``.
            CommandFailed: the command has ended.
        """
        if self._request.pty is None:
            raise ConfigInvalid("the command has no terminal to resize; start it with pty=True")
        self._input("resize the terminal of").resize(TerminalSize(cols, rows))

    def _input(self, what: str) -> CommandInput:
        command_input = self._bound_input(what)
        if command_input is None:
            raise CommandFailed(f"cannot {what} the command: it has ended", component=None)
        return command_input

    def _bound_input(self, what: str) -> CommandInput | None:
        """The command's input once it started; ``None`` once it ended."""
        self._begun()
        control = self._request.control
        if control is None or not (control.stdin or self._request.pty is not None):
            raise ConfigInvalid(
                f"cannot {what} the command's input: start it with stdin=True (or pty=True)",
            )
        return control.input()

    def _begun(self) -> BackgroundCall:
        if self._started is None:
            raise RuntimeError("the command was not started")
        return self._started


def _slice(deadline: float | None) -> float | None:
    """How long to block at once: short on the main thread, where Ctrl-C must get through."""
    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
    if threading.current_thread() is threading.main_thread():
        return INTERRUPT_POLL if remaining is None else min(INTERRUPT_POLL, remaining)
    return remaining
