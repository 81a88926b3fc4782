"""One command running under bubblewrap: spawn it, follow its output, kill its tree.

A :class:`LocalProcess` owns the ``bwrap`` child. Because bwrap gives the command a
pid namespace of its own, killing bwrap (and the namespace's init) takes every
process the command started with it, and when the command's main process ends,
whatever it left in the background ends too::

    process = LocalProcess.spawn(bwrap, options, ["/bin/bash", "-c", "echo hi"], tag="t")
    for event in process.events(deadline=None, keepalive=90.0):
        ...                       # Output(...), KEEPALIVE, then one Exited(...)
    process.kill("signal")        # from any thread: SIGKILL to the whole tree

The thread that spawns a process must outlive it: bwrap's ``--die-with-parent``
fires when the *thread* that forked it ends. The service spawns on the request
thread, which follows :meth:`LocalProcess.events` to the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO, Literal

import attrs

from piship_remote.local.isolation import options_fd

__all__ = ["CHUNK_BYTES", "KEEPALIVE", "Exited", "Keepalive", "LocalProcess", "Output"]

CHUNK_BYTES = 32 * 1024
REAP_TIMEOUT = 5.0

Stream = Literal["stdout", "stderr"]


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


class LocalProcess:
    """A running ``bwrap`` child and what the service knows about it."""

    def __init__(self, popen: subprocess.Popen[bytes], status: int, tag: str) -> None:
        self.pid = popen.pid
        self.tag = tag
        self._popen = popen
        self._status = status
        self._lock = threading.Lock()
        self._init_pidfd: int | None = None
        self._inner_exit: int | None = None
        self._killed: str | None = None
        self._signal: int | None = None
        self._done = threading.Event()

    @classmethod
    def spawn(
        cls,
        bwrap: str,
        options: Sequence[str],
        command: Sequence[str],
        *,
        tag: str = "",
        stdin: bool = False,
    ) -> LocalProcess:
        """Start ``command`` under ``bwrap`` with ``options``; ``stdin`` True gives it a pipe."""
        status_read, status_write = os.pipe()
        try:
            args = options_fd([*options, "--json-status-fd", str(status_write)])
            try:
                popen = subprocess.Popen(
                    [bwrap, "--args", str(args), "--", *command],
                    env={},
                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(args, status_write),
                    start_new_session=True,
                )
            finally:
                os.close(args)
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        return cls(popen, status_read, tag)

    @property
    def stdin(self) -> IO[bytes] | None:
        """The pipe to the command's stdin (spawned with ``stdin=True``), else ``None``."""
        return self._popen.stdin

    @property
    def finished(self) -> bool:
        """Whether :meth:`events` has seen the end (and reaped the process)."""
        return self._done.is_set()

    def kill(self, reason: str, sig: int = signal.SIGKILL) -> None:
        """Signal the whole tree with ``sig``; the first ``reason`` given is the one reported."""
        with self._lock:
            if self._done.is_set():
                return
            if self._killed is None:
                self._killed, self._signal = reason, sig
            if self._init_pidfd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self._init_pidfd, signal.SIGKILL)
            # bwrap dies of it; its --die-with-parent then kills the namespace's init.
            with contextlib.suppress(OSError):
                self._popen.send_signal(sig)

    def wait(self, timeout: float) -> bool:
        """Wait until :meth:`events` has reaped the process; ``False`` on timeout."""
        return self._done.wait(timeout)

    def events(self, *, deadline: float | None, keepalive: float) -> Iterator[Event]:
        """Output as it is written, keepalives while quiet, and finally one :class:`Exited`.

        ``deadline`` (``time.monotonic`` seconds) kills the tree with reason
        ``"deadline"``. Closing the iterator early kills the tree too.
        """
        ended = False
        try:
            yield from self._follow(deadline, keepalive)
            yield self._exited()
            ended = True
        finally:
            if not ended:
                self.kill("abandoned")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._popen.wait(REAP_TIMEOUT)
            self._close()

    def _follow(self, deadline: float | None, keepalive: float) -> Iterator[Output | Keepalive]:
        assert self._popen.stdout is not None and self._popen.stderr is not None
        pipes: dict[int, Stream | None] = {
            self._popen.stdout.fileno(): "stdout",
            self._popen.stderr.fileno(): "stderr",
            self._status: None,
        }
        with selectors.DefaultSelector() as selector:
            for fd, stream in pipes.items():
                selector.register(fd, selectors.EVENT_READ, stream)
            quiet_since = time.monotonic()
            # All three close only when bwrap has exited, and with it every process
            # of the namespace, so their end is the end of the command.
            while selector.get_map():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self.kill("deadline")
                    deadline = None
                wait = quiet_since + keepalive - now
                if deadline is not None:
                    wait = min(wait, deadline - now)
                for key, _ in selector.select(max(wait, 0.0)):
                    chunk = os.read(key.fd, CHUNK_BYTES)
                    if not chunk:
                        selector.unregister(key.fd)
                    elif key.data is None:
                        self._note_status(chunk)
                    else:
                        quiet_since = time.monotonic()
                        yield Output(key.data, chunk)
                if time.monotonic() - quiet_since >= keepalive:
                    quiet_since = time.monotonic()
                    yield KEEPALIVE

    def _note_status(self, chunk: bytes) -> None:
        for line in chunk.splitlines():
            try:
                status = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if not isinstance(status, dict):
                continue
            if isinstance(status.get("child-pid"), int):
                self._open_init(status["child-pid"])
            if isinstance(status.get("exit-code"), int):
                self._inner_exit = status["exit-code"]

    def _open_init(self, pid: int) -> None:
        with self._lock:
            if self._init_pidfd is None:
                with contextlib.suppress(OSError, AttributeError):
                    self._init_pidfd = os.pidfd_open(pid)
            if self._killed is not None and self._init_pidfd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self._init_pidfd, signal.SIGKILL)

    def _exited(self) -> Exited:
        code = self._popen.wait()
        with self._lock:
            self._done.set()
            if self._inner_exit is not None:
                code = self._inner_exit
            return Exited(code, self._killed, self._signal)

    def _close(self) -> None:
        with self._lock:
            self._done.set()
            if self._init_pidfd is not None:
                os.close(self._init_pidfd)
                self._init_pidfd = None
        pipes: list[IO[bytes] | None] = [self._popen.stdout, self._popen.stderr]
        for pipe in pipes:
            if pipe is not None:
                pipe.close()
        with contextlib.suppress(OSError):
            os.close(self._status)
