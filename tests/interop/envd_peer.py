"""An independent envd peer on loopback, and a minimal E2B control plane in front of it.

The Connect side is not ours: it is the ``Process`` service stub that ships in the
official ``e2b`` wheel (generated from envd's real ``process.proto``), served by the
official ``connectrpc`` runtime (``ProcessWSGIApplication``) on a werkzeug thread.
Only the process semantics are written here, after envd (reference
``e2b-real-protocol.md`` §3): real ``/bin/bash`` processes, output streamed in
32 KiB reads as it comes, ``exitCode`` omitted when 0, ``-1`` / ``exited: false`` /
``status: "signal: killed"`` after a SIGKILL, keepalive events after silence, a
server-side kill when ``Connect-Timeout-Ms`` expires, ``invalid_argument`` for a
missing cwd, ``unauthenticated`` for an unknown user, and a plain-JSON 401 for a
wrong ``X-Access-Token``::

    with EnvdPeer(home=tmp_path, access_token="envd-token-1") as envd:
        with ControlPlane(envd) as control:
            backend = E2bCompatibleBackend(endpoint=control.url, envd_url=envd.url,
                                           workdir=str(tmp_path))
            ...
            process = envd.wait_for_process(lambda p: p.tag is not None)

Every thread here is a daemon named ``piship-peer-…``; ``close()`` kills every process
group still running, force-closes open connections and joins the threads.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.process import process_pb as pb
from e2b.envd.process.process_connect import ProcessSync, ProcessWSGIApplication
from protobuf import Oneof
from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

from piship_remote.testing import Recorded

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["ENVD_PATH", "ControlPlane", "EnvdPeer", "PeerProcess"]

CHUNK_SIZE = 32 << 10
"""envd reads stdout and stderr in 32 KiB pieces (``stdChunkSize``)."""
OUTPUT_BUFFER = 64
"""envd's ``outputBufferSize``: a slow reader back-pressures the process."""
DEFAULT_KEEPALIVE = 90.0
"""envd's keepalive interval when ``Keepalive-Ping-Interval`` is missing or invalid."""
ENVD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The ``PATH`` envd gives processes (its own, never the client's)."""
UNAUTHORIZED = {
    "code": 401,
    "message": "unauthorized access, please provide a valid access token or method signing "
    "if supported",
}
ENVD_VERSION = "0.4.0"
JOIN_TIMEOUT = 5.0
_POLL = 0.05

# Go's ``syscall.Signal.String()`` for the signals a test can send.
_GO_SIGNAL_NAMES = {
    signal.SIGHUP: "hangup",
    signal.SIGINT: "interrupt",
    signal.SIGQUIT: "quit",
    signal.SIGABRT: "aborted",
    signal.SIGKILL: "killed",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGPIPE: "broken pipe",
    signal.SIGTERM: "terminated",
}
Stream = Literal["stdout", "stderr"]
# Typed oneof constructors: ``_Start("start", …)`` (a bare ``Oneof`` infers ``str`` fields).
_Start = Oneof[Literal["start"], pb.ProcessEvent.StartEvent]
_Data = Oneof[Literal["data"], pb.ProcessEvent.DataEvent]
_End = Oneof[Literal["end"], pb.ProcessEvent.EndEvent]
_KeepAlive = Oneof[Literal["keepalive"], pb.ProcessEvent.KeepAlive]
_Stdout = Oneof[Literal["stdout"], bytes]
_Stderr = Oneof[Literal["stderr"], bytes]


class _Eof:
    """A reader's end-of-file marker on a process's output queue."""


_EOF = _Eof()


# -- loopback HTTP plumbing -------------------------------------------------------------


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return None


class _LoopbackServer(ThreadedWSGIServer):
    """werkzeug's threaded server with named connection threads that ``stop()`` can end."""

    block_on_close = False

    def __init__(self, app: WSGIApplication, prefix: str) -> None:
        super().__init__("127.0.0.1", 0, app, handler=_QuietHandler)
        self._prefix = prefix
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._thread = threading.Thread(
            target=self.serve_forever, args=(_POLL,), name=f"{prefix}-serve", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def start(self) -> None:
        self._thread.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"{self._prefix}-conn",
            daemon=True,
        )
        with self._lock:
            self._connections[request] = thread
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._connections.pop(request, None)
        super().shutdown_request(request)

    def stop(self) -> None:
        """Stop accepting, cut every open connection, join every thread."""
        self.shutdown()
        with self._lock:
            connections = dict(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in connections.values():
            thread.join(JOIN_TIMEOUT)
        self._thread.join(JOIN_TIMEOUT)


def _read_body(environ: WSGIEnvironment) -> bytes:
    stream = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH")
    if length:
        return bytes(stream.read(int(length)))
    if environ.get("wsgi.input_terminated"):  # chunked: werkzeug de-chunks to EOF
        return b"".join(iter(lambda: stream.read(1 << 16), b""))
    return b""


def _recording(app: WSGIApplication, record: Callable[[Recorded], None]) -> WSGIApplication:
    """Record each request whole, then hand the app a replayable body."""

    def recorded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        body = _read_body(environ)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        environ["wsgi.input_terminated"] = False
        headers = {
            key[5:].replace("_", "-").lower(): str(value)
            for key, value in environ.items()
            if key.startswith("HTTP_")
        }
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        query = environ.get("QUERY_STRING")
        path = environ.get("PATH_INFO", "/") + (f"?{query}" if query else "")
        record(Recorded(environ["REQUEST_METHOD"], path, headers, body))
        return app(environ, start_response)

    return recorded


def _json(start_response: StartResponse, status: str, body: Any) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        status,
        [("Content-Type", "application/json; charset=utf-8"), ("Content-Length", str(len(data)))],
    )
    return [data]


def _empty(start_response: StartResponse, status: str) -> list[bytes]:
    start_response(status, [("Content-Length", "0")])
    return []


class _Recorder:
    """Requests in arrival order, with a wait for one that has not come yet."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._requests: list[Recorded] = []

    @property
    def requests(self) -> list[Recorded]:
        with self._changed:
            return list(self._requests)

    def record(self, request: Recorded) -> None:
        with self._changed:
            self._requests.append(request)
            self._changed.notify_all()

    def wait_for(self, path: str, timeout: float = 5.0) -> Recorded:
        """The first request for ``path`` (query included), waiting up to ``timeout``."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: next((r for r in self._requests if r.path == path), None), timeout
            )
        if found is None:
            raise AssertionError(f"no request for {path} within {timeout} s")
        return found


# -- the process implementation ---------------------------------------------------------


class PeerProcess:
    """One process the peer started: the leader's ``popen``, its tag, what it sent."""

    def __init__(self, popen: subprocess.Popen[bytes], config: pb.ProcessConfig, tag: str | None):
        self.popen = popen
        self.pid = popen.pid
        self.config = config
        self.tag = tag
        self.output: list[tuple[Stream, bytes]] = []
        """The data events sent, in order (``("stdout" | "stderr", bytes)``)."""
        self.signals: list[pb.Signal] = []
        self.events: queue.Queue[tuple[Stream, bytes] | _Eof] = queue.Queue(OUTPUT_BUFFER)
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.detached = threading.Event()
        self.pumps: list[threading.Thread] = []

    def wait(self, timeout: float = 5.0) -> int:
        """The leader's return code (negative: killed by that signal), after it exits."""
        return self.popen.wait(timeout)


class _ProcessService(ProcessSync):
    """envd's ``process.Process`` semantics on the generated ``ProcessSync`` service.

    Start, SendSignal and List are modelled; the other RPCs keep the generated
    ``unimplemented`` answers.
    """

    def __init__(self, peer: EnvdPeer) -> None:
        self._peer = peer

    # -- Start ---------------------------------------------------------------------

    def start(
        self, request: pb.StartRequest, ctx: RequestContext[pb.StartRequest, pb.StartResponse], /
    ) -> Iterator[pb.StartResponse]:
        peer = self._peer
        user = peer.user_of(ctx.request_headers.get("authorization"))
        config = request.process or pb.ProcessConfig()
        cwd = peer.directory(config.cwd if config.has_field("cwd") else "")
        env = {**peer.base_env(user), **dict(config.envs)}
        # Absent ``stdin`` means envd keeps a stdin pipe open (its compatibility default).
        keep_stdin = not request.has_field("stdin") or request.stdin
        remaining = ctx.timeout_ms
        deadline = None if remaining is None else time.monotonic() + max(0.0, remaining) / 1000
        try:
            popen = subprocess.Popen(
                [config.cmd, *config.args],
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE if keep_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # only so close() can reap whole trees
            )
        except OSError as e:
            raise ConnectError(
                Code.INVALID_ARGUMENT, f"error starting process '{config.cmd}': {e.strerror}"
            ) from None
        process = PeerProcess(popen, config, request.tag if request.has_field("tag") else None)
        peer.register(process)
        pipes: tuple[tuple[Stream, IO[bytes] | None], ...] = (
            ("stdout", popen.stdout),
            ("stderr", popen.stderr),
        )
        for name, pipe in pipes:
            assert pipe is not None
            pump = threading.Thread(
                target=_pump,
                args=(process, name, pipe.fileno(), peer.chunk_size),
                name=f"piship-peer-{name}-{process.pid}",
                daemon=True,
            )
            process.pumps.append(pump)
            pump.start()
        interval = peer.keepalive_for(ctx.request_headers.get("keepalive-ping-interval"))
        return self._events(process, deadline, interval)

    def _events(
        self, process: PeerProcess, deadline: float | None, interval: float
    ) -> Iterator[pb.StartResponse]:
        yield _event(_Start("start", pb.ProcessEvent.StartEvent(pid=process.pid)))
        open_pipes = 2
        last_sent = time.monotonic()
        try:
            while open_pipes:
                now = time.monotonic()
                wait = max(0.0, last_sent + interval - now)
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - now))
                try:
                    item = process.events.get(timeout=wait)
                except queue.Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        # envd runs the command under the request's deadline: SIGKILL.
                        _kill(process, signal.SIGKILL)
                        raise ConnectError(
                            Code.DEADLINE_EXCEEDED, "context deadline exceeded"
                        ) from None
                    yield _event(_KeepAlive("keepalive", pb.ProcessEvent.KeepAlive()))
                    last_sent = time.monotonic()
                    continue
                if isinstance(item, _Eof):
                    open_pipes -= 1
                    continue
                if not process.forwarding.is_set():
                    continue  # envd stops forwarding output once a signal was sent
                process.output.append(item)
                yield _event(_Data("data", _data(*item)))
                last_sent = time.monotonic()
            yield _event(_End("end", _end_event(process.popen.wait())))
        finally:
            # A client that goes away does not kill the process (envd semantics).
            process.detached.set()

    # -- unary RPCs ----------------------------------------------------------------

    def send_signal(
        self,
        request: pb.SendSignalRequest,
        ctx: RequestContext[pb.SendSignalRequest, pb.SendSignalResponse],
        /,
    ) -> pb.SendSignalResponse:
        process = self._peer.select(request.process)
        if request.signal not in (pb.Signal.SIGKILL, pb.Signal.SIGTERM):
            raise ConnectError(Code.INVALID_ARGUMENT, f"invalid signal: {request.signal}")
        process.signals.append(request.signal)
        process.forwarding.clear()
        _kill(process, signal.Signals(request.signal.value))
        return pb.SendSignalResponse()

    def list(
        self, request: pb.ListRequest, ctx: RequestContext[pb.ListRequest, pb.ListResponse], /
    ) -> pb.ListResponse:
        return pb.ListResponse(
            processes=[
                pb.ProcessInfo(config=p.config, pid=p.pid, tag=p.tag)
                for p in self._peer.processes()
                if p.popen.poll() is None
            ]
        )


def _event(event: _Start | _Data | _End | _KeepAlive) -> pb.StartResponse:
    return pb.StartResponse(event=pb.ProcessEvent(event=event))


def _data(stream: Stream, chunk: bytes) -> pb.ProcessEvent.DataEvent:
    if stream == "stdout":
        return pb.ProcessEvent.DataEvent(output=_Stdout("stdout", chunk))
    return pb.ProcessEvent.DataEvent(output=_Stderr("stderr", chunk))


def _end_event(returncode: int) -> pb.ProcessEvent.EndEvent:
    """Go's ``ProcessState``: ``ExitCode()`` (-1 when signalled), ``Exited()``, ``String()``."""
    if returncode >= 0:
        status = f"exit status {returncode}"
        error = status if returncode else None
        return pb.ProcessEvent.EndEvent(
            exit_code=returncode, exited=True, status=status, error=error
        )
    number = -returncode
    name = _GO_SIGNAL_NAMES.get(signal.Signals(number), f"signal {number}")
    status = f"signal: {name}"
    return pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=status, error=status)


def _pump(process: PeerProcess, stream: Stream, fd: int, chunk_size: int) -> None:
    """Forward one pipe in pieces as they come; drop them once the stream is gone."""
    try:
        while chunk := os.read(fd, chunk_size):
            _deliver(process, (stream, chunk))
    except OSError:
        pass
    finally:
        _deliver(process, _EOF)


def _deliver(process: PeerProcess, item: tuple[Stream, bytes] | _Eof) -> None:
    while not process.detached.is_set():
        try:
            process.events.put(item, timeout=_POLL)
            return
        except queue.Full:
            continue


def _kill(process: PeerProcess, signum: signal.Signals) -> None:
    """Signal the leader only, as envd does (its descendants survive)."""
    with contextlib.suppress(ProcessLookupError):
        process.popen.send_signal(signum)


# -- the peer ----------------------------------------------------------------------------


class EnvdPeer:
    """envd on loopback: the e2b wheel's ``ProcessWSGIApplication`` over real processes.

    ``home`` is the default user's home (the default cwd; relative cwds resolve
    against it). ``access_token``: every request except ``GET /health`` must carry it
    as ``X-Access-Token`` (else a plain-JSON 401, as envd answers). ``users`` are the
    names ``Authorization: Basic base64("<user>:")`` may select; no header means
    ``default_user``. ``keepalive_interval`` overrides the client's
    ``Keepalive-Ping-Interval`` (seconds) so tests need not wait 50 s.
    ``chunk_size`` is the pipe read size (envd's is 32 KiB).
    """

    def __init__(
        self,
        *,
        home: str | os.PathLike[str],
        access_token: str | None = None,
        users: Iterable[str] = ("user", "root"),
        default_user: str = "user",
        keepalive_interval: float | None = None,
        chunk_size: int = CHUNK_SIZE,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.home = os.fspath(home)
        self.access_token = access_token
        self.users = frozenset(users)
        self.default_user = default_user
        self.keepalive_interval = keepalive_interval
        self.chunk_size = chunk_size
        self.sandbox_env = dict(env or {})
        self._recorder = _Recorder()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._processes: list[PeerProcess] = []
        self._closed = False
        app = ProcessWSGIApplication(_ProcessService(self))
        self._server = _LoopbackServer(
            _recording(self._guarded(app), self._recorder.record), "piship-peer-envd"
        )
        self._server.start()
        self.url = self._server.url

    # -- what tests look at --------------------------------------------------------

    @property
    def requests(self) -> list[Recorded]:
        """Every request, in arrival order (header names lower-case)."""
        return self._recorder.requests

    def wait_for(self, path: str, timeout: float = 5.0) -> Recorded:
        """The first request for ``path``, waiting for it up to ``timeout`` seconds."""
        return self._recorder.wait_for(path, timeout)

    def processes(self) -> list[PeerProcess]:
        """Every process started so far, in order."""
        with self._lock:
            return list(self._processes)

    def wait_for_process(
        self, match: Callable[[PeerProcess], bool], timeout: float = 5.0
    ) -> PeerProcess:
        """The first started process ``match`` accepts, waiting up to ``timeout``."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: next((p for p in self._processes if match(p)), None), timeout
            )
        if found is None:
            raise AssertionError(f"no matching process started within {timeout} s")
        return found

    # -- envd's rules (used by the service) ------------------------------------------

    def user_of(self, authorization: str | None) -> str:
        """The user ``Authorization: Basic …`` names; ``unauthenticated`` when unknown."""
        if authorization is None:
            return self.default_user
        scheme, _, value = authorization.partition(" ")
        try:
            name = base64.b64decode(value, validate=True).decode().partition(":")[0]
        except (ValueError, UnicodeDecodeError):
            name = ""
        if scheme.lower() != "basic" or name not in self.users:
            raise ConnectError(Code.UNAUTHENTICATED, f"invalid username: '{name}'")
        return name

    def directory(self, cwd: str) -> str:
        """envd's cwd rule: empty → home, ``~`` and relative paths from home; must exist."""
        if not cwd:
            path = self.home
        elif cwd == "~" or cwd.startswith("~/"):
            path = self.home + cwd[1:]
        elif not cwd.startswith("/"):
            path = os.path.join(self.home, cwd)
        else:
            path = cwd
        if not os.path.isdir(path):
            raise ConnectError(Code.INVALID_ARGUMENT, f"cwd '{path}' does not exist")
        return path

    def base_env(self, user: str) -> dict[str, str]:
        """envd's own ``PATH``, ``HOME``, ``USER``, ``LOGNAME``, then the sandbox's variables."""
        return {
            "PATH": ENVD_PATH,
            "HOME": self.home,
            "USER": user,
            "LOGNAME": user,
            **self.sandbox_env,
        }

    def keepalive_for(self, header: str | None) -> float:
        if self.keepalive_interval is not None:
            return self.keepalive_interval
        try:
            seconds = int(header or "")
        except ValueError:
            return DEFAULT_KEEPALIVE
        return float(seconds) if seconds > 0 else DEFAULT_KEEPALIVE

    def register(self, process: PeerProcess) -> None:
        with self._changed:
            if self._closed:
                _kill(process, signal.SIGKILL)
                raise ConnectError(Code.UNAVAILABLE, "envd is shutting down")
            self._processes.append(process)
            self._changed.notify_all()

    def select(self, selector: pb.ProcessSelector | None) -> PeerProcess:
        """The running process a ``{pid}`` or ``{tag}`` selector names; ``not_found`` else."""
        choice = selector.selector if selector is not None else None
        if choice is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "no process selector")
        for process in reversed(self.processes()):
            named = process.pid if choice.field == "pid" else process.tag
            if named == choice.value and process.popen.poll() is None:
                return process
        raise ConnectError(Code.NOT_FOUND, f"process with {choice.field} {choice.value} not found")

    def kill_all(self) -> None:
        """SIGKILL every process group still running (a deleted sandbox takes them all).

        A group whose pipes are still being read may outlive its leader (envd kills
        only the leader), so those are killed too.
        """
        for process in self.processes():
            if process.popen.poll() is None or any(p.is_alive() for p in process.pumps):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)

    # -- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Kill every process tree, stop serving, reap every process; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.kill_all()
        self._server.stop()
        self._server.server_close()
        for process in self.processes():
            process.detached.set()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(JOIN_TIMEOUT)
            for pump in process.pumps:
                pump.join(JOIN_TIMEOUT)
            for pipe in (process.popen.stdin, process.popen.stdout, process.popen.stderr):
                if pipe is not None:
                    pipe.close()

    def __enter__(self) -> EnvdPeer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _guarded(self, app: WSGIApplication) -> WSGIApplication:
        """envd's HTTP layer in front of Connect: ``/health`` and the access-token check."""

        def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            if environ.get("PATH_INFO") == "/health":
                return _empty(start_response, "204 No Content")
            token = environ.get("HTTP_X_ACCESS_TOKEN")
            if self.access_token is not None and token != self.access_token:
                return _json(start_response, "401 Unauthorized", UNAUTHORIZED)
            return app(environ, start_response)

        return guarded


# -- the control plane -----------------------------------------------------------------------


class ControlPlane:
    """A minimal E2B REST control plane whose sandboxes all live in one :class:`EnvdPeer`.

    ``POST /sandboxes`` (and the official SDK's ``/v2/sandboxes``) → 201 with a fresh
    ``sandboxID`` and the peer's access token; ``POST /sandboxes/<id>/timeout`` → 204;
    ``DELETE /sandboxes/<id>`` → 204 and every process in the peer is killed (deleting
    a sandbox ends everything in it); an unknown ID → 404 ``{"code":404,"message":…}``;
    ``GET /health`` → 204. With ``api_key`` set, ``/sandboxes…`` requires ``X-API-Key``.
    ``envd_token`` is the access token the create answer hands out (default: the
    peer's own; another value models a stale or wrong token).
    """

    def __init__(
        self, envd: EnvdPeer, *, api_key: str | None = None, envd_token: str | None = None
    ) -> None:
        self._envd = envd
        self._api_key = api_key
        self._envd_token = envd_token if envd_token is not None else envd.access_token
        self._stopped = False
        self._recorder = _Recorder()
        self._lock = threading.Lock()
        self._live: dict[str, dict[str, Any]] = {}
        self._server = _LoopbackServer(
            _recording(self._app, self._recorder.record), "piship-peer-control"
        )
        self._server.start()
        self.url = self._server.url

    @property
    def requests(self) -> list[Recorded]:
        """Every request, in arrival order."""
        return self._recorder.requests

    @property
    def live_sandboxes(self) -> list[str]:
        """Sandboxes created and not deleted."""
        with self._lock:
            return list(self._live)

    def close(self) -> None:
        """Stop serving; idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._server.stop()
        self._server.server_close()

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _app(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "/")
        if path == "/health":
            return _empty(start_response, "204 No Content")
        if not path.startswith(("/sandboxes", "/v2/sandboxes")):
            return _json(start_response, "404 Not Found", {"code": 404, "message": "not found"})
        presented = environ.get("HTTP_X_API_KEY", "")
        if self._api_key is not None and presented != self._api_key:
            return _json(start_response, "401 Unauthorized", {"code": 401, "message": "bad key"})
        if method == "POST" and path in ("/sandboxes", "/v2/sandboxes"):
            return self._create(environ, start_response)
        parts = path.split("/")
        sandbox_id = parts[2] if len(parts) > 2 else ""
        with self._lock:
            known = sandbox_id in self._live
        if not known:
            return _json(
                start_response,
                "404 Not Found",
                {"code": 404, "message": f'sandbox "{sandbox_id}" not found'},
            )
        if method == "DELETE" and len(parts) == 3:
            with self._lock:
                self._live.pop(sandbox_id, None)
            self._envd.kill_all()
            return _empty(start_response, "204 No Content")
        if method == "POST" and len(parts) == 4 and parts[3] in ("timeout", "refreshes"):
            return _empty(start_response, "204 No Content")
        return _json(start_response, "404 Not Found", {"code": 404, "message": "not found"})

    def _create(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        try:
            body = json.loads(environ["wsgi.input"].read() or b"{}")
        except ValueError:
            return _json(start_response, "400 Bad Request", {"code": 400, "message": "bad JSON"})
        template = body.get("templateID") if isinstance(body, dict) else None
        if not isinstance(template, str):
            return _json(
                start_response, "400 Bad Request", {"code": 400, "message": "templateID missing"}
            )
        sandbox_id = "sbx" + secrets.token_hex(6)
        with self._lock:
            self._live[sandbox_id] = body
        return _json(
            start_response,
            "201 Created",
            {
                "sandboxID": sandbox_id,
                "templateID": template,
                "clientID": "peer",
                "envdVersion": ENVD_VERSION,
                "envdAccessToken": self._envd_token,
                "domain": None,
            },
        )
