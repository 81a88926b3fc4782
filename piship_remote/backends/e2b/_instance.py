"""One prepared E2B-compatible sandbox: its commands (Start streams, stdin, a terminal, a
handle's controls, SendSignal) and its disposal.
:class:`~piship_remote.backends.e2b.backend.E2bCompatibleBackend` makes it."""

from __future__ import annotations

import itertools
import math
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from piship_remote.backends._common import SandboxErrors, remote_directory
from piship_remote.backends._file_protocol import RemoteFiles
from piship_remote.backends.base import BackendResult, ExecRequest, OutputCallback
from piship_remote.backends.e2b._control import ControlPlane
from piship_remote.backends.e2b._envd import (
    SERVER_DEADLINE_SLACK,
    Envd,
    StartRequest,
    start_envelope,
    start_request,
)
from piship_remote.backends.e2b._input import EnvdInput
from piship_remote.backends.e2b._lease import SandboxLease
from piship_remote.backends.e2b._stream import read_stream
from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.transport import HttpReply, TransportError
from piship_remote.transport._cancel import CancelToken, EventWatcher, when_cancelled
from piship_remote.transport.deadline import Deadline
from piship_remote.transport.endpoint import is_loopback

__all__ = ["E2bInstance"]


class E2bInstance:
    """One prepared sandbox: run commands in it, then dispose of it.

    Commands may run concurrently; each has its own tag (for SendSignal), its
    own renewal and its own stream. :meth:`dispose` ends running commands with an
    error mentioning "disposed", deletes the sandbox, and waits for the
    background kill requests it started.
    """

    cancels_promptly = True
    controls_commands = True

    def __init__(
        self,
        sandbox_id: str,
        workdir: str,
        control: ControlPlane,
        lease: SandboxLease,
        envd: Envd,
        errors: SandboxErrors,
        on_disposed: Callable[[E2bInstance], None],
    ) -> None:
        self.sandbox_id = sandbox_id
        self._workdir = workdir
        self._control = control
        self._lease = lease
        self._envd = envd
        self._errors = errors
        self._on_disposed = on_disposed
        self._lock = threading.Lock()
        self._disposed = False
        self._closing = CancelToken()
        self._running: dict[CancelToken, Callable[[], None]] = {}
        self._signallers: set[threading.Thread] = set()
        self._watcher = EventWatcher()  # a plain Event's cancel, polled on first use
        self._files: RemoteFiles | None = None
        self._ports: tuple[str, str] | None = None  # (scheme, domain) of the sandbox's hosts
        self._port_urls: dict[int, str] = {}  # the service's loopback listeners, by port
        # Tags only need to be unique in this sandbox: a random prefix and a counter.
        self._tag_prefix = f"piship-{secrets.token_hex(4)}"
        self._tag_numbers = itertools.count()

    def __repr__(self) -> str:
        return f"<E2bInstance {self.sandbox_id}>"

    def epoch(self) -> str | None:
        """The sandbox ID: it never changes for an instance."""
        return self.sandbox_id

    def attach_files(self, files: RemoteFiles) -> None:
        """Set the sandbox's file operations (envd's ``/files`` and Filesystem service)."""
        self._files = files

    def attach_ports(self, scheme: str, domain: str) -> None:
        """Where the sandbox's ports are: ``<scheme>://<port>-<id>.<domain>``."""
        self._ports = (scheme, domain)

    def url(self, port: int) -> str:
        """The address of ``port`` in the sandbox, through the service's edge.

        A service on this machine (a ``*.localhost`` or loopback domain, which most
        resolvers cannot look up as a port host) is asked for a loopback listener of
        the port (the local service opens one); elsewhere, or when it has none, the
        E2B form ``<scheme>://<port>-<id>.<domain>``."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"a port is a number from 1 to 65535, not {port!r}")
        if self._ports is None:
            raise self._errors("the service named no domain for the sandbox's ports")
        scheme, domain = self._ports
        if is_loopback(urllib.parse.urlsplit(f"//{domain}").hostname or ""):
            with self._lock:
                known = self._port_urls.get(port)
            listener = known or self._control.port_listener(self.sandbox_id, port)
            if listener is not None:
                with self._lock:
                    self._port_urls[port] = listener
                return listener
        return f"{scheme}://{port}-{self.sandbox_id}.{domain}"

    def files(self) -> RemoteFiles:
        """The sandbox's files; a call after dispose fails like a command."""
        if self._files is None or self._closing.is_set():
            raise self._errors("the sandbox was disposed")
        return self._files

    def exec(
        self,
        request: ExecRequest,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> BackendResult:
        """Renew the sandbox, run ``request.command`` with ``/bin/bash -l -c``, stream its output.

        Setting ``cancel`` sends SendSignal SIGKILL for the command (in the
        background), closes the stream and raises :class:`CommandCancelled`. envd
        is told what is left of ``deadline`` (default: ``request.timeout``).
        """
        if cancel is not None and cancel.is_set():
            raise CommandCancelled()
        cwd = remote_directory(self._workdir, request.workspace_path)
        token = self._begin(cancel)
        try:
            limit = deadline if deadline is not None else request.timeout
            result = self._run(request, cwd, token, limit, on_stdout, on_stderr)
            if token.is_set():
                # Cancelled as it ended: the kill is on its way, so the caller is told so.
                raise CommandCancelled()
            return result
        except (PiShipError, CommandCancelled) as e:
            if not token.is_set():
                raise
            # The token ended the call: say why, whatever the interrupted read raised.
            if self._closing.is_set() and not (cancel is not None and cancel.is_set()):
                raise self._errors("the sandbox was disposed while the command ran") from None
            if isinstance(e, CommandCancelled):
                raise
            raise CommandCancelled() from None
        finally:
            self._end(token)

    def dispose(self) -> None:
        """Delete the sandbox. Idempotent and thread-safe; running commands end at once."""
        self._shut(delete=True)

    def detach(self) -> str:
        """Let go of the sandbox without deleting it; its id, to attach to later."""
        self._shut(delete=False)
        return self.sandbox_id

    def _shut(self, *, delete: bool) -> None:
        with self._lock:
            if self._disposed:
                return
            self._disposed = True
            running = list(self._running)
        self._closing.set()
        for token in running:
            token.set()
        self._lease.dispose()
        if delete:
            self._control.delete(self.sandbox_id)
        with self._lock:
            signallers = list(self._signallers)
        for thread in signallers:
            thread.join()
        self._watcher.close()
        self._on_disposed(self)

    # -- one command ------------------------------------------------------------------------

    def _begin(self, cancel: threading.Event | None) -> CancelToken:
        """A token for this command, set by ``cancel`` or by dispose."""
        token = CancelToken()
        forget = when_cancelled(cancel, self._watcher, token.set)
        with self._lock:
            if not self._disposed:
                self._running[token] = forget
                return token
        forget()
        raise self._errors("the sandbox was disposed")

    def _end(self, token: CancelToken) -> None:
        with self._lock:
            forget = self._running.pop(token, _nothing)
        forget()

    def _run(
        self,
        request: ExecRequest,
        cwd: str,
        token: CancelToken,
        limit: Deadline | float | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> BackendResult:
        tag = f"{self._tag_prefix}{next(self._tag_numbers) & 0xFFFFFFFF:08x}"
        forget_kill = token.on_cancel(lambda: self._signal(tag))
        control = request.control
        try:
            start = start_request(
                request.command,
                request.env,
                cwd,
                tag,
                login=request.login,
                stdin=request.takes_input and request.pty is None,
                pty=request.pty,
            )
            # Start follows the renewal onto the wire; it is read once the renewal answered.
            response = self._lease.cover(
                lambda: self._start(start, token, limit),
                token,
                refused=lambda: self._signal(tag),
            )
            if request.stdin is not None:
                self._feed(tag, request.stdin, token)
            on_pid = None
            if control is not None:
                terminal = request.pty is not None
                control.bind(EnvdInput(self._envd, tag, token, self._errors, terminal=terminal))
                on_pid = control.started
            with response:
                try:
                    return read_stream(response, on_stdout, on_stderr, self._errors, on_pid)
                except PiShipError:
                    if not token.is_set():
                        # The stream broke (idle, dropped): envd keeps a command running
                        # after a disconnect, so kill what can no longer be watched.
                        self._signal(tag)
                    raise
        finally:
            forget_kill()

    def _start(
        self, start: StartRequest, cancel: CancelToken, deadline: Deadline | float | None
    ) -> HttpReply:
        """Send Start, made here where the deadline is: envd is told what is left of it
        (``Connect-Timeout-Ms``), a little later than ours, so it ends the command even if
        this client is gone; the answer's head may take ``idle_timeout``, cut to a little
        after the deadline (the run engine fires that one first)."""
        envd = self._envd
        left = deadline.remaining() if isinstance(deadline, Deadline) else deadline
        headers = envd.start_headers
        if left is not None:
            deadline_ms = max(1, math.ceil((left + SERVER_DEADLINE_SLACK) * 1000))
            headers = headers.plus({"Connect-Timeout-Ms": str(deadline_ms)})
        bound: dict[str, Any] = {"timeout": envd.idle_timeout}
        if isinstance(deadline, Deadline) and deadline.bounded and envd.takes_deadline:
            idle = Deadline.after(envd.idle_timeout, clock=deadline.clock)
            bound = {"deadline": idle.earliest(deadline.later(SERVER_DEADLINE_SLACK))}
        try:
            response = envd.transport.request(
                "POST",
                envd.start_url,
                headers=headers,
                data=start_envelope(start),
                idle_timeout=envd.idle_timeout,
                cancel=cancel,
                stream=True,
                **bound,
            )
        except TransportError as e:
            raise envd.start_failed(e) from None
        return envd.started(response)

    def _feed(self, tag: str, chunks: Iterable[bytes], token: CancelToken) -> None:
        """Start a ``piship-e2b-stdin`` thread: SendInput each chunk, then CloseStdin.

        It is not joined: reading the input may block (a terminal, an open pipe) for
        longer than the command runs. It stops at the first refusal (the command
        ended, or closed its input) and when the command's token is set.
        """

        def feed() -> None:
            try:
                for chunk in chunks:
                    if token.is_set():
                        return
                    if chunk and not self._envd.send_input(tag, chunk, token):
                        return
                if not token.is_set():
                    self._envd.close_stdin(tag, token)
            except Exception:
                pass  # the input's end is the command's business: its exit status says it

        threading.Thread(target=feed, name="piship-e2b-stdin", daemon=True).start()

    # -- SendSignal, in the background ------------------------------------------------------

    def _signal(self, tag: str) -> None:
        """Start a ``piship-e2b-signal`` thread that kills the command ``tag``; never blocks."""
        if self._closing.is_set():
            return  # dispose deletes the whole sandbox instead
        thread = threading.Thread(
            target=self._kill, args=(tag,), name="piship-e2b-signal", daemon=True
        )
        with self._lock:
            if self._disposed:
                return
            self._signallers.add(thread)
            thread.start()

    def _kill(self, tag: str) -> None:
        try:
            # Not cancelled by dispose: a kill on its way must arrive (it has a short deadline).
            self._envd.kill(tag, None)
        except Exception:
            pass  # best effort: the stream is closed anyway
        finally:
            with self._lock:
                self._signallers.discard(threading.current_thread())


def _nothing() -> None:
    return None
