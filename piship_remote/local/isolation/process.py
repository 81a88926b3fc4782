"""One command running in a sandbox: start it through the agent, follow its output, kill it.

A :class:`LocalProcess` is a command the sandbox's agent started (see
:mod:`piship_remote.local.isolation.agent`) through its :class:`AgentLink` (the control
socket and start handshake, :mod:`piship_remote.local.isolation.agent_link`; ``AgentLink``
and ``StartFailed`` are importable from here too). The service holds the read
ends of its stdout, stderr and status pipes. The command ends when its main process exits;
whatever it left in the background keeps running in the sandbox (its output,
if it still writes to the command's pipes, is read and dropped by the agent)::

    process = LocalProcess.start(link, spec, tag="t")
    for event in process.events(deadline=None, keepalive=90.0):
        ...                       # Output(...), KEEPALIVE, then one Exited(...)
    process.kill("signal")        # from any thread: the command's process group

Started with ``size`` the command runs on a pseudo-terminal of the sandbox: its
output arrives as ``Output("pty", ...)``, :meth:`LocalProcess.send_input` types
into it and :meth:`LocalProcess.resize` changes its window size.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import selectors
import signal
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import IO, Literal

import attrs

from piship_remote.local.isolation.agent_link import (
    AgentLink,
    StartFailed,
    parse_status,
    received_fd,
    send_start,
    started_pid,
)

__all__ = [
    "CHUNK_BYTES",
    "KEEPALIVE",
    "AgentLink",
    "Exited",
    "InputFailed",
    "Keepalive",
    "LocalProcess",
    "Output",
    "StartFailed",
    "WindowSize",
]

CHUNK_BYTES = 32 * 1024
REAP_TIMEOUT = 5.0
INPUT_TIMEOUT = 10.0

Stream = Literal["stdout", "stderr", "pty"]


@attrs.frozen
class WindowSize:
    """A terminal's size in character cells."""

    cols: int
    rows: int


@attrs.frozen
class Output:
    """Bytes the command wrote to ``stream``."""

    stream: Stream
    data: bytes


@attrs.frozen
class Keepalive:
    """Nothing was written for a keepalive interval."""


KEEPALIVE = Keepalive()


@attrs.frozen
class Exited:
    """The command and everything it started are gone.

    ``killed`` is the reason given to :meth:`LocalProcess.kill` (``None`` when the
    command ended by itself) and ``signal`` the signal sent then.
    """

    exit_code: int
    killed: str | None = None
    signal: int | None = None


Event = Output | Keepalive | Exited


class InputFailed(Exception):
    """Input could not be delivered (no stdin pipe or terminal, or it is closed or full)."""


class LocalProcess:
    """A command started by a sandbox's agent, and what the service knows about it."""

    def __init__(
        self,
        link: AgentLink,
        ident: int,
        pid: int,
        pipes: tuple[int, int, int],
        tag: str,
        limit_check: Callable[[int], str | None],
        stdin: IO[bytes] | None = None,
        terminal: bool = False,
    ) -> None:
        self.pid = pid
        self.tag = tag
        self.terminal = terminal
        self._stdin = stdin
        self._input_lock = threading.Lock()
        self._input_closed = False
        self._link = link
        self._id = ident
        self._stdout, self._stderr, self._status = pipes
        self._limit_check = limit_check
        self._lock = threading.Lock()
        self._killed: str | None = None
        self._signal: int | None = None
        self._done = threading.Event()

    @classmethod
    def start(
        cls,
        link: AgentLink,
        spec: Mapping[str, object],
        *,
        tag: str = "",
        limit_check: Callable[[int], str | None] = lambda _: None,
        stdin: bool = False,
        size: WindowSize | None = None,
    ) -> LocalProcess:
        """Ask the agent to start ``spec`` (``cmd``, ``args``, ``env``, ``cwd``).

        ``limit_check(exit_code)`` names a sandbox limit the command hit, if any;
        ``stdin`` True gives the command a pipe (:attr:`stdin`), else ``/dev/null``;
        ``size`` runs it on a new pseudo-terminal of that size instead.
        :class:`StartFailed` when the program cannot be started, ``OSError`` when
        the agent is gone.
        """
        if size is not None:
            return cls._start_terminal(link, spec, tag, limit_check, size)
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        in_read, in_write = os.pipe() if stdin else (-1, -1)
        kept = [out_read, err_read] + ([in_write] if stdin else [])
        sent = [out_write, err_write]
        ident, status_read = send_start(link, spec, {}, sent, [in_read] if stdin else [], kept)
        pipe = os.fdopen(in_write, "wb") if stdin else None
        try:
            pid = started_pid(status_read)
        except BaseException:
            for fd in (out_read, err_read):
                os.close(fd)
            if pipe is not None:
                pipe.close()
            raise
        pipes = (out_read, err_read, status_read)
        return cls(link, ident, pid, pipes, tag, limit_check, pipe)

    @classmethod
    def _start_terminal(
        cls,
        link: AgentLink,
        spec: Mapping[str, object],
        tag: str,
        limit_check: Callable[[int], str | None],
        size: WindowSize,
    ) -> LocalProcess:
        """Start ``spec`` on a pty the agent opens inside the sandbox; hold its master end."""
        receiver, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with receiver:
            try:
                extra = {"size": {"cols": size.cols, "rows": size.rows}}
                ident, status_read = send_start(
                    link, {**spec, **extra}, {"pty": True}, [sender.detach()], [], []
                )
            finally:
                sender.close()
            try:
                pid = started_pid(status_read)
                master = received_fd(receiver)
            except BaseException:
                with contextlib.suppress(OSError):
                    link.send({"op": "kill", "id": ident, "signal": int(signal.SIGKILL)})
                raise
        os.set_blocking(master, False)
        return cls(link, ident, pid, (master, -1, status_read), tag, limit_check, terminal=True)

    @property
    def stdin(self) -> IO[bytes] | None:
        """The pipe to the command's stdin (started with ``stdin=True``), else ``None``."""
        return self._stdin

    def send_input(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin pipe, or type it into its terminal.

        :class:`InputFailed` when it has neither (or it was closed) or the
        command does not take the bytes within a few seconds.
        """
        with self._input_lock:
            if self._input_closed:
                raise InputFailed("stdin is closed")
            if self.terminal:
                fd = self._stdout
            elif self._stdin is not None:
                fd = self._stdin.fileno()
            else:
                raise InputFailed("the process was started without stdin")
            _write_all(fd, data)

    def close_stdin(self) -> None:
        """Close the command's stdin pipe (it reads end of file); :class:`InputFailed` if none."""
        with self._input_lock:
            if self.terminal or self._stdin is None:
                raise InputFailed("the process was started without a stdin pipe")
            if not self._input_closed:
                self._input_closed = True
                self._stdin.close()

    def resize(self, size: WindowSize) -> None:
        """Set the terminal's window size (the command gets ``SIGWINCH``)."""
        with self._input_lock:
            if not self.terminal or self._input_closed:
                raise InputFailed("the process has no terminal")
            winsize = struct.pack("HHHH", size.rows, size.cols, 0, 0)
            try:
                fcntl.ioctl(self._stdout, termios.TIOCSWINSZ, winsize)
            except OSError as e:
                raise InputFailed(e.strerror or str(e)) from None

    @property
    def killed(self) -> str | None:
        """Why the command was killed (the first reason asked), or ``None``."""
        return self._killed

    @property
    def finished(self) -> bool:
        """Whether :meth:`events` has seen the end (and reaped the process)."""
        return self._done.is_set()

    def kill(self, reason: str, sig: int = signal.SIGKILL) -> None:
        """Signal the command's process group with ``sig``; the first ``reason`` is reported."""
        with self._lock:
            if self._done.is_set():
                return
            if self._killed is None:
                self._killed, self._signal = reason, sig
        with contextlib.suppress(OSError):
            self._link.send({"op": "kill", "id": self._id, "signal": int(sig)})

    def wait(self, timeout: float) -> bool:
        """Wait until :meth:`events` has seen the end; ``False`` on timeout."""
        return self._done.wait(timeout)

    def events(self, *, deadline: float | None, keepalive: float) -> Iterator[Event]:
        """Output as it is written, keepalives while quiet, and finally one :class:`Exited`.

        ``deadline`` (``time.monotonic`` seconds) kills the command with reason
        ``"deadline"``. Closing the iterator early kills it too.
        """
        ended = False
        try:
            status = yield from self._follow(deadline, keepalive)
            limit = self._limit_check(_exit_code(status))
            if limit is not None and self._killed is None:
                yield Output("stderr", f"piship: {limit}\n".encode())
            yield self._exited(status)
            ended = True
        finally:
            if not ended:
                self.kill("abandoned")
            self._close()

    def _follow(
        self, deadline: float | None, keepalive: float
    ) -> Generator[Output | Keepalive, None, dict[str, object]]:
        """Yield output until the agent reports the main process's end; return that report."""
        streams: dict[int, Stream] = {self._stdout: "stdout", self._stderr: "stderr"}
        if self.terminal:
            streams = {self._stdout: "pty"}
        for fd in streams:
            os.set_blocking(fd, False)
        status: dict[str, object] = {}
        with selectors.DefaultSelector() as selector:
            for fd, stream in streams.items():
                selector.register(fd, selectors.EVENT_READ, stream)
            selector.register(self._status, selectors.EVENT_READ, None)
            quiet_since = time.monotonic()
            while self._status in selector.get_map():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self.kill("deadline")
                    deadline = None
                wait = quiet_since + keepalive - now
                if deadline is not None:
                    wait = min(wait, deadline - now)
                for key, _ in selector.select(max(wait, 0.0)):
                    if key.data is None:
                        chunk = os.read(key.fd, CHUNK_BYTES)
                        status.update(parse_status(chunk))
                        if not chunk or "exit" in status or "signal" in status:
                            selector.unregister(key.fd)
                        continue
                    chunk = _read(key.fd)
                    if not chunk:
                        selector.unregister(key.fd)
                        streams.pop(key.fd)
                    else:
                        quiet_since = time.monotonic()
                        yield Output(key.data, chunk)
                if time.monotonic() - quiet_since >= keepalive:
                    quiet_since = time.monotonic()
                    yield KEEPALIVE
        # What the command wrote before it ended is in the pipes now; read it all.
        for fd, stream in list(streams.items()):
            while chunk := _read(fd):
                yield Output(stream, chunk)
        return status

    def _exited(self, status: Mapping[str, object]) -> Exited:
        with self._lock:
            self._done.set()
            killed, sig = self._killed, self._signal
        if "exit" not in status and "signal" not in status:
            # The agent went away: the sandbox was deleted, expired or stopped (each says
            # so as the kill's reason), or the sandbox itself failed.
            return Exited(-1, killed or "lost", sig or signal.SIGKILL)
        return Exited(_exit_code(status), killed, sig)

    def _close(self) -> None:
        with self._lock:
            self._done.set()
        with contextlib.suppress(OSError):
            os.close(self._status)
        with self._input_lock:
            self._input_closed = True
            if self._stdin is not None:
                with contextlib.suppress(OSError):
                    self._stdin.close()
            if self.terminal:
                os.close(self._stdout)  # the terminal hangs up
                return
        # Background processes may still hold the pipes: the agent reads them to the end.
        try:
            self._link.send({"op": "drain"}, [self._stdout, self._stderr])
        except OSError:
            pass
        finally:
            os.close(self._stdout)
            os.close(self._stderr)


def _read(fd: int) -> bytes:
    """What the pipe (or pty master) holds now (``b""`` at its end or when it is empty)."""
    try:
        return os.read(fd, CHUNK_BYTES)
    except BlockingIOError:
        return b""
    except OSError as e:
        if e.errno == errno.EIO:  # a pty master once every slave end is closed
            return b""
        raise


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, waiting at most :data:`INPUT_TIMEOUT` for room."""
    view = memoryview(data)
    deadline = time.monotonic() + INPUT_TIMEOUT
    while view:
        _, writable, _ = select.select([], [fd], [], max(deadline - time.monotonic(), 0.0))
        if not writable:
            raise InputFailed("the process does not read its input")
        try:
            view = view[os.write(fd, view[:CHUNK_BYTES]) :]
        except BlockingIOError:
            continue
        except OSError as e:
            raise InputFailed(e.strerror or str(e)) from None


def _exit_code(status: Mapping[str, object]) -> int:
    """The shell-style exit status: the code, or 128 plus the signal number."""
    code, sig = status.get("exit"), status.get("signal")
    if isinstance(sig, int):
        return 128 + sig
    return code if isinstance(code, int) else -1
