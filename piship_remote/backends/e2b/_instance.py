"""One prepared E2B-compatible sandbox: its commands on envd, and its disposal.

envd's Process service runs in the sandbox on port 49983; the service's edge routes to it
by the ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers. :class:`Envd` is that client:
Start a command as a Connect stream (its envelope written by hand on the fast path,
``start_envelope``), SendSignal to kill it. :class:`EnvdInput` is a running command's
input (SendInput, CloseStdin, Update for its terminal), bound to a request's
:class:`~piship_remote.backends.control.CommandControl` once the command started.
:class:`E2bInstance` runs each command: the lease renewed, Start sent with what is left of
the deadline, the stream decoded, a cancel turned into SIGKILL.
:class:`~piship_remote.backends.e2b.backend.E2bCompatibleBackend` makes it.
"""

from __future__ import annotations

import base64
import itertools
import math
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from json.encoder import encode_basestring
from typing import Any

import attrs
import cattrs

from piship_remote.backends._common import (
    SandboxErrors,
    is_success,
    remote_directory,
    retry_after_seconds,
)
from piship_remote.backends._sandbox_commands import HELPER_SHELL
from piship_remote.backends.base import BackendResult, ExecRequest, OutputCallback, RemoteFiles
from piship_remote.backends.control import TerminalSize
from piship_remote.backends.e2b._control import ControlPlane
from piship_remote.backends.e2b._lease import SandboxLease
from piship_remote.backends.e2b._stream import UNKNOWN_OUTCOME, read_stream
from piship_remote.model.errors import COMMAND_FAILED, CommandCancelled, PiShipError
from piship_remote.transport import HeaderSet, HttpClient, HttpReply, TransportError
from piship_remote.transport._cancel import CancelToken, EventWatcher, when_cancelled
from piship_remote.transport.deadline import Deadline
from piship_remote.transport.endpoint import is_loopback
from piship_remote.wire.connect import connect_envelope, encoded_envelope

__all__ = [
    "CONNECT_CONTENT_TYPE",
    "END_OF_TRANSMISSION",
    "ENVD_PORT",
    "KEEPALIVE_INTERVAL",
    "SERVER_DEADLINE_SLACK",
    "SIGNAL_TIMEOUT",
    "E2bInstance",
    "Envd",
    "EnvdInput",
    "StartRequest",
    "start_envelope",
    "start_request",
]


ENVD_PORT = 49983
SIGNAL_TIMEOUT = 5.0
KEEPALIVE_INTERVAL = 50
# envd is told a deadline this much later than ours, as a backstop if this client is gone.
SERVER_DEADLINE_SLACK = 1.0
CONNECT_CONTENT_TYPE = "application/connect+json"


@attrs.frozen
class _ProcessConfig:
    cmd: str
    args: tuple[str, ...]
    envs: Mapping[str, str]
    cwd: str


@attrs.frozen
class _PtySize:
    cols: int
    rows: int


@attrs.frozen
class _Pty:
    size: _PtySize


@attrs.frozen
class StartRequest:
    """The body of ``/process.Process/Start``."""

    process: _ProcessConfig
    stdin: bool
    tag: str
    pty: _Pty | None = None


@attrs.frozen
class _ProcessSelector:
    tag: str


@attrs.frozen
class _SignalRequest:
    process: _ProcessSelector
    signal: str


@attrs.frozen
class _Input:
    stdin: str | None = None  # base64, one of the two
    pty: str | None = None


@attrs.frozen
class _UpdateRequest:
    process: _ProcessSelector
    pty: _Pty


@attrs.frozen
class _InputRequest:
    process: _ProcessSelector
    input: _Input


@attrs.frozen
class _CloseStdinRequest:
    process: _ProcessSelector


def _wire_converter() -> cattrs.Converter:
    converter = cattrs.Converter(omit_if_default=True)
    converter.register_unstructure_hook(Mapping, dict)
    return converter


_WIRE = _wire_converter()


def start_request(
    command: str,
    env: Mapping[str, str],
    cwd: str,
    tag: str,
    *,
    login: bool = True,
    stdin: bool = False,
    pty: TerminalSize | None = None,
) -> StartRequest:
    """Start ``command`` with ``/bin/bash -l -c`` in ``cwd``, tagged for SendSignal; with
    ``login=False`` with :data:`HELPER_SHELL` (``/bin/sh -c``), which reads no startup file.
    ``stdin``: its standard input is a pipe that SendInput writes to; ``pty``: it runs
    on a terminal of that size instead (its output then comes as ``pty`` data)."""
    cmd, *args = ("/bin/bash", "-l", "-c") if login else HELPER_SHELL
    return StartRequest(
        process=_ProcessConfig(cmd=cmd, args=(*args, command), envs=env, cwd=cwd),
        stdin=stdin,
        tag=tag,
        pty=None if pty is None else _Pty(_PtySize(pty.cols, pty.rows)),
    )


def start_envelope(start: StartRequest) -> bytes:
    """The Start request's envelope: the bytes ``connect_envelope`` makes of it, built
    from its strings (each JSON-quoted as ``json.dumps`` quotes it), without walking it
    generically; anything but strings in it goes through ``connect_envelope``."""
    process = start.process
    envs = process.envs
    strings = (process.cmd, *process.args, process.cwd, start.tag, *envs.keys(), *envs.values())
    plain = all(type(text) is str for text in strings) and type(start.stdin) is bool
    if not plain or start.pty is not None:
        return connect_envelope(_WIRE.unstructure(start))
    quote = encode_basestring
    text = "".join(
        (
            '{"process":{"cmd":',
            quote(process.cmd),
            ',"args":[',
            ",".join(map(quote, process.args)),
            '],"envs":{',
            ",".join(f"{quote(name)}:{quote(value)}" for name, value in envs.items()),
            '},"cwd":',
            quote(process.cwd),
            '},"stdin":',
            "true" if start.stdin else "false",
            ',"tag":',
            quote(start.tag),
            "}",
        )
    )
    return encoded_envelope(text.encode())


class Envd:
    """The Process service of one sandbox's envd: Start streams and SendSignal kills."""

    def __init__(
        self,
        transport: HttpClient,
        base: str,
        sandbox_id: str,
        access_token: str | None,
        user: str,
        idle_timeout: float,
        errors: SandboxErrors,
    ) -> None:
        self.transport = transport
        self._base = base
        self.start_url = f"{base}/process.Process/Start"
        self.idle_timeout = idle_timeout
        self._errors = errors
        headers = {
            "Connect-Protocol-Version": "1",
            "E2b-Sandbox-Id": sandbox_id,
            "E2b-Sandbox-Port": str(ENVD_PORT),
        }
        if access_token is not None:
            headers["X-Access-Token"] = access_token
        # Checked and encoded once for the connection, not for every request.
        self._headers = HeaderSet(headers)
        self.start_headers = HeaderSet(
            {
                "Content-Type": CONNECT_CONTENT_TYPE,
                **headers,
                "Keepalive-Ping-Interval": str(KEEPALIVE_INTERVAL),
                "Authorization": _basic(user),
                # A compressed body would hide the envelopes from the reader.
                "Accept-Encoding": "identity",
            }
        )

    def start_failed(self, error: TransportError) -> BaseException:
        """What a Start that failed in the transport raises: ``error`` itself if it
        never reached envd, else a failure saying the command may have started."""
        if not error.request_sent:
            return error
        return self._errors(
            f"starting the command failed: {error}; whether the command started is unknown, "
            f"so {UNKNOWN_OUTCOME}"
        )

    def started(self, response: HttpReply) -> HttpReply:
        """``response`` to Start, checked to be a Connect stream (closed if not), not yet read."""
        try:
            self._check_started(response)
        except BaseException:
            response.close()
            raise
        return response

    def kill(self, tag: str, cancel: threading.Event | None) -> None:
        """SendSignal SIGKILL to the command tagged ``tag`` (plain JSON, short deadline)."""
        self.transport.request(
            "POST",
            f"{self._base}/process.Process/SendSignal",
            headers=self._headers,
            json=_WIRE.unstructure(_SignalRequest(_ProcessSelector(tag), "SIGNAL_SIGKILL")),
            timeout=SIGNAL_TIMEOUT,
            cancel=cancel,
        ).close()

    def send_input(
        self, tag: str, data: bytes, cancel: threading.Event | None, *, pty: bool = False
    ) -> bool:
        """SendInput ``data`` to the stdin (``pty``: the terminal) of the command tagged
        ``tag``; False if refused."""
        encoded = base64.b64encode(data).decode("ascii")
        given = _Input(pty=encoded) if pty else _Input(stdin=encoded)
        body = _InputRequest(_ProcessSelector(tag), given)
        return self._unary("SendInput", _WIRE.unstructure(body), cancel)

    def resize(self, tag: str, size: TerminalSize, cancel: threading.Event | None) -> bool:
        """Update the terminal of the command tagged ``tag`` to ``size``; False if refused."""
        body = _UpdateRequest(_ProcessSelector(tag), _Pty(_PtySize(size.cols, size.rows)))
        return self._unary("Update", _WIRE.unstructure(body), cancel)

    def close_stdin(self, tag: str, cancel: threading.Event | None) -> bool:
        """CloseStdin of the command tagged ``tag`` (it reads end of file); False if refused."""
        body = _CloseStdinRequest(_ProcessSelector(tag))
        return self._unary("CloseStdin", _WIRE.unstructure(body), cancel)

    def _unary(self, method: str, body: object, cancel: threading.Event | None) -> bool:
        with self.transport.request(
            "POST",
            f"{self._base}/process.Process/{method}",
            headers=self._headers,
            json=body,
            timeout=self.idle_timeout,
            cancel=cancel,
        ) as response:
            return is_success(response.status)

    def _check_started(self, response: HttpReply) -> None:
        status = response.status
        if not is_success(status):
            raise _start_failure(response, self._errors)
        if status in (204, 205):
            raise self._errors(f"starting the command failed: HTTP {status}")
        content_type = response.headers.get("Content-Type", "")
        if not content_type.lower().startswith(CONNECT_CONTENT_TYPE):
            shown = content_type[:100] or "no content type"
            raise self._errors(
                f"starting the command failed: HTTP {status} with {shown}, not a Connect stream"
            )


_GONE_HINT = "the sandbox is gone (it expired or was deleted); activate a new sandbox"


def _start_failure(response: HttpReply, errors: SandboxErrors) -> PiShipError:
    """A non-2xx Start: envd's own errors, or plain JSON and HTML from the edge proxy."""
    status = response.status
    if "html" in response.headers.get("Content-Type", "").lower():
        detail = f"HTTP {status} (an HTML error page from a proxy, not an answer from envd)"
        response.close()
    else:
        detail = response.failure()
    hint = _start_hint(status, detail)
    retry_after = response.headers.get("Retry-After")
    return errors(
        f"starting the command failed: {detail}" + (f"; {hint}" if hint else ""),
        retryable=status == 429,
        not_started=hint == _GONE_HINT,
        retry_after=retry_after_seconds(retry_after) if status == 429 else None,
    )


def _start_hint(status: int, detail: str) -> str | None:
    if status == 401:
        return "envd refused the access token or the user"
    if status == 429:
        return "the sandbox has too many concurrent connections; try again shortly"
    if status == 502 and "not found" in detail.lower():
        return _GONE_HINT
    if status in (502, 503, 504):
        return "the sandbox cannot be reached"
    return None


def _basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode("ascii")


END_OF_TRANSMISSION = b"\x04"  # what a terminal reads as the end of input (Ctrl-D)


class EnvdInput:
    """The input of the command tagged ``tag``; ``terminal``: it runs on a pty."""

    def __init__(
        self, envd: Envd, tag: str, token: CancelToken, errors: SandboxErrors, *, terminal: bool
    ) -> None:
        self._envd = envd
        self._tag = tag
        self._token = token
        self._errors = errors
        self._terminal = terminal

    def send(self, data: bytes) -> None:
        if data and not self._envd.send_input(self._tag, data, self._token, pty=self._terminal):
            raise self._refused("its input")

    def close(self) -> None:
        if self._terminal:
            self.send(END_OF_TRANSMISSION)
        elif not self._envd.close_stdin(self._tag, self._token):
            raise self._refused("closing its input")

    def resize(self, size: TerminalSize) -> None:
        if not self._envd.resize(self._tag, size, self._token):
            raise self._refused("resizing its terminal")

    def _refused(self, what: str) -> PiShipError:
        return self._errors(
            f"the sandbox refused {what}: the command ended or closed its input",
            code=COMMAND_FAILED,
        )


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
        is told what is left of ``deadline``.
        """
        if cancel is not None and cancel.is_set():
            raise CommandCancelled()
        cwd = remote_directory(self._workdir, request.workspace_path)
        token = self._begin(cancel)
        try:
            result = self._run(request, cwd, token, deadline, on_stdout, on_stderr)
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
        deadline: Deadline | None,
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
                lambda: self._start(start, token, deadline),
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
        self, start: StartRequest, cancel: CancelToken, deadline: Deadline | None
    ) -> HttpReply:
        """Send Start, made here where the deadline is: envd is told what is left of it
        (``Connect-Timeout-Ms``), a little later than ours, so it ends the command even if
        this client is gone; the answer's head may take ``idle_timeout``, cut to a little
        after the deadline (the run engine fires that one first)."""
        envd = self._envd
        left = None if deadline is None else deadline.remaining()
        headers = envd.start_headers
        if left is not None:
            deadline_ms = max(1, math.ceil((left + SERVER_DEADLINE_SLACK) * 1000))
            headers = headers.plus({"Connect-Timeout-Ms": str(deadline_ms)})
        bound: dict[str, Any] = {"timeout": envd.idle_timeout}
        if deadline is not None and deadline.bounded:
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
