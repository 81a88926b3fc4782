"""The envd side of the local service: the ``process.Process`` and ``filesystem.Filesystem``
Connect RPCs, and the ``/files`` endpoints.

Requests pick their sandbox with the ``E2b-Sandbox-Id`` header (what E2B's edge
routes on), or a ``Host`` of ``49983-<id>.<domain>``, and must carry that sandbox's
``X-Access-Token`` (``/files`` may carry a URL signature instead). A refusal on a
streaming call (``Start``) is a Connect end-of-stream error, as Connect clients expect.
``Start`` streams Connect frames as the command writes; ``SendSignal`` kills a command's whole
process tree by ``tag`` or ``pid``; ``List`` shows the running commands::

    envd = Envd(registry, user="user")
    reply = envd.handle(request)     # a server.Reply; Start's carries a stream

What differs from envd, deliberately: a kill takes the whole tree (envd kills the
leader only), processes never outlive the command that started them, and
``stdin`` is always ``/dev/null``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import signal
import time
from collections.abc import Callable, Iterator, Mapping

from piship_remote.local.envd_http import ENVD_HTTP_PATHS, envd_http
from piship_remote.local.files_http import FILES_PATH, FileEndpoints
from piship_remote.local.filesystem_rpc import FILESYSTEM_PREFIX, FilesystemRpc
from piship_remote.local.http_model import Head, Reply, Request
from piship_remote.local.process import Exited, LocalProcess, Output
from piship_remote.local.sandbox_fs import TAG_PREFIX
from piship_remote.local.sandboxes import Registry, Sandbox, SandboxGone, StartRefused
from piship_remote.local.wire import (
    ConnectError,
    DataEvent,
    EndEvent,
    ProcessInfo,
    ProcessList,
    SignalRequest,
    StartEvent,
    StartRequest,
    WireError,
    end_stream_frame,
    event_frame,
    parse,
    start_message,
    structure,
    to_json,
)

__all__ = ["CONNECT_JSON", "DEFAULT_KEEPALIVE", "ENVD_PORT", "PREFIX", "Envd", "is_envd"]

PREFIX = "/process.Process/"
ENVD_PORT = 49983
CONNECT_JSON = "application/connect+json"
DEFAULT_KEEPALIVE = 90.0
MAX_TIMEOUT_DIGITS = 10
UNAUTHORIZED = (
    "unauthorized access, please provide a valid access token or method signing if supported"
)
_SIGNALS: dict[object, int] = {
    "SIGNAL_SIGKILL": signal.SIGKILL,
    "SIGNAL_SIGTERM": signal.SIGTERM,
    9: signal.SIGKILL,
    15: signal.SIGTERM,
}
_SIGNAL_STATUS: dict[int, str] = {
    signal.SIGKILL: "signal: killed",
    signal.SIGTERM: "signal: terminated",
}
_GONE = {
    "deleted": "the sandbox was deleted",
    "expired": "the sandbox's lifetime ended",
    "stopped": "the local sandbox service stopped",
}


def is_envd(head: Head) -> bool:
    """Whether a request is for envd (by its path, or a ``Host`` naming envd's port)."""
    if head.path.startswith((PREFIX, FILESYSTEM_PREFIX)) or head.path == FILES_PATH:
        return True
    if head.path in ENVD_HTTP_PATHS and "e2b-sandbox-id" in head.headers:
        return True
    return _host_sandbox(head.headers) is not None


def _host_sandbox(headers: Mapping[str, str]) -> str | None:
    label = headers.get("host", "").partition(".")[0]
    port, _, sandbox_id = label.partition("-")
    return sandbox_id if port == str(ENVD_PORT) and sandbox_id else None


class Envd:
    """Routes envd requests to the sandboxes of a :class:`Registry`."""

    def __init__(self, registry: Registry, *, user: str, home: str) -> None:
        self._registry = registry
        self._user = user
        self._files = FileEndpoints(user=user, home=home)
        self._filesystem = FilesystemRpc(home=home)

    def screen(self, head: Head) -> Reply | None:
        """The refusal of a request for no sandbox or without its token, before its body."""
        sandbox = self._sandbox(head)
        return sandbox if isinstance(sandbox, Reply) else None

    def streams_body(self, head: Head) -> bool:
        """Whether the request's body is read as it arrives (uploads), not whole."""
        return head.path == FILES_PATH and head.method == "POST"

    def handle(self, request: Request) -> Reply:
        """Answer one envd request (see :func:`is_envd`)."""
        head = Head(request.method, request.target, request.path, request.headers)
        sandbox = self._sandbox(head)
        if isinstance(sandbox, Reply):
            return sandbox
        if request.path == FILES_PATH:
            return self._files.handle(sandbox, request)
        if request.path in ENVD_HTTP_PATHS:
            return envd_http(sandbox, request)
        if request.method != "POST":
            return Reply(405, headers=(("Allow", "POST"),))
        if request.path.startswith(FILESYSTEM_PREFIX):
            refusal = self._user_refusal(request.headers.get("authorization"))
            return self._filesystem.handle(sandbox, request, refusal)
        method = request.path[len(PREFIX) :]
        if method == "Start":
            return self._start(sandbox, request)
        if method == "SendSignal":
            return _unary(request, lambda body: _signal(sandbox, body))
        if method == "List":
            return _unary(request, lambda _: _list(sandbox))
        return _connect_error(
            501, "unimplemented", f"process.Process/{method[:60]} is not supported"
        )

    def _sandbox(self, head: Head) -> Sandbox | Reply:
        """The sandbox the request names and holds the token of, or the refusal."""
        headers = head.headers
        sandbox_id = headers.get("e2b-sandbox-id") or _host_sandbox(headers) or ""
        if not sandbox_id and head.path == FILES_PATH:
            sandbox_id = self._signed_by(head)
        sandbox = self._registry.get(sandbox_id)
        if sandbox is None:
            gone = {"sandboxId": sandbox_id[:128], "message": "The sandbox was not found"}
            return _json(502, {**gone, "code": 502})
        if head.path == FILES_PATH:
            return sandbox  # a token or a URL signature, checked by the file endpoints
        token = headers.get("x-access-token", "")
        if not hmac.compare_digest(token.encode(), sandbox.access_token.encode()):
            if head.path == PREFIX + "Start":
                return _stream_error("unauthenticated", UNAUTHORIZED)
            return _json(401, {"code": 401, "message": UNAUTHORIZED})
        return sandbox

    def _signed_by(self, head: Head) -> str:
        """The sandbox whose token signs a ``/files`` URL that names no sandbox (else ``""``).

        An SDK given one URL for every sandbox makes ``download_url``/``upload_url``
        without the sandbox's id; the signature is what tells them apart.
        """
        for sandbox_id in self._registry.ids():
            sandbox = self._registry.get(sandbox_id)
            if sandbox is not None and self._files.signed_for(sandbox, head):
                return sandbox_id
        return ""

    def _start(self, sandbox: Sandbox, request: Request) -> Reply:
        refusal = self._user_refusal(request.headers.get("authorization"))
        if refusal is not None:
            return _stream_error("unauthenticated", refusal)
        if _media_type(request) != CONNECT_JSON:
            return Reply(415, headers=(("Accept-Post", CONNECT_JSON),))
        encoding = request.headers.get("connect-content-encoding", "identity")
        if encoding.lower() != "identity":
            return _stream_error("unimplemented", f"unsupported compression {encoding[:40]!r}")
        try:
            start = _start_request(request.body)
        except WireError as e:
            return _stream_error("invalid_argument", str(e))
        if start.pty is not None:
            return _stream_error("unimplemented", "the local service does not provide a pty")
        try:
            process = sandbox.start(start.process, tag=start.tag)
        except StartRefused as e:
            return _stream_error("invalid_argument", str(e))
        except SandboxGone:
            return _stream_error("unavailable", "the sandbox was deleted")
        except OSError as e:
            return _stream_error("internal", f"starting the process failed: {e.strerror}")
        headers = request.headers
        stream = _frames(
            sandbox, process, deadline=_deadline(headers), keepalive=_keepalive(headers)
        )
        return Reply(200, content_type=CONNECT_JSON, headers=_STREAM_HEADERS, stream=stream)

    def _user_refusal(self, authorization: str | None) -> str | None:
        """Why the Basic user is refused; a missing header means the default user."""
        if authorization is None:
            return None
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "basic":
            return "invalid authorization scheme"
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return "invalid authorization header"
        name = decoded.partition(":")[0]
        if name != self._user:
            return f"invalid username: '{name[:64]}'"
        return None


_STREAM_HEADERS = (("Connect-Content-Encoding", "identity"),)


def _frames(
    sandbox: Sandbox, process: LocalProcess, *, deadline: float | None, keepalive: float
) -> Iterator[bytes]:
    """The Start stream: start, data and keepalive events, then end and end-of-stream."""
    try:
        yield event_frame("start", StartEvent(process.pid))
        for event in process.events(deadline=deadline, keepalive=keepalive):
            if isinstance(event, Output):
                data = base64.b64encode(event.data).decode()
                out = DataEvent(stdout=data) if event.stream == "stdout" else DataEvent(stderr=data)
                yield event_frame("data", out)
            elif isinstance(event, Exited):
                yield from _ending(event)
            else:
                yield event_frame("keepalive", {})
    finally:
        sandbox.forget(process)


def _ending(exited: Exited) -> Iterator[bytes]:
    if exited.killed == "deadline":
        yield end_stream_frame(ConnectError("deadline_exceeded", "context deadline exceeded"))
        return
    if exited.killed in _GONE:
        yield end_stream_frame(ConnectError("unavailable", _GONE[exited.killed]))
        return
    if exited.killed is not None:
        status = _SIGNAL_STATUS.get(exited.signal or signal.SIGKILL, "signal: killed")
        yield event_frame("end", EndEvent(exit_code=-1, exited=False, status=status, error=status))
    else:
        code = exited.exit_code
        status = f"exit status {code}"
        yield event_frame("end", EndEvent(code, True, status, status if code else ""))
    yield end_stream_frame()


def _stream_error(code: str, message: str) -> Reply:
    """A Connect stream that fails before it starts: HTTP 200 and one error frame."""
    body = end_stream_frame(ConnectError(code, message))
    return Reply(200, body, CONNECT_JSON, _STREAM_HEADERS)


def _start_request(body: bytes) -> StartRequest:
    return structure(start_message(body), StartRequest)


def _deadline(headers: Mapping[str, str]) -> float | None:
    value = headers.get("connect-timeout-ms", "").strip()
    if not value.isdigit() or len(value) > MAX_TIMEOUT_DIGITS or int(value) <= 0:
        return None
    return time.monotonic() + int(value) / 1000


def _keepalive(headers: Mapping[str, str]) -> float:
    for name in ("keepalive-ping-interval", "x-keepalive-interval"):
        value = headers.get(name, "").strip()
        if value.isdigit() and 0 < int(value) <= 3600:
            return float(value)
    return DEFAULT_KEEPALIVE


def _signal(sandbox: Sandbox, body: bytes) -> Reply:
    request = parse(body, SignalRequest)
    sig = _SIGNALS.get(request.signal) if isinstance(request.signal, (str, int)) else None
    if sig is None:
        return _connect_error(400, "invalid_argument", f"unsupported signal {request.signal!r}")
    selector = request.process
    if selector.pid is None and not selector.tag:
        return _connect_error(400, "invalid_argument", "a process pid or tag is required")
    process = sandbox.find(pid=selector.pid, tag=selector.tag)
    if process is None:
        which = f"tag '{selector.tag}'" if selector.tag else f"pid {selector.pid}"
        return _connect_error(404, "not_found", f"process with {which} not found")
    process.kill("signal", sig)
    return _json(200, {})


def _list(sandbox: Sandbox) -> Reply:
    infos = [
        ProcessInfo(config, process.pid, process.tag)
        for process, config in sandbox.listing()
        if not process.tag.startswith(TAG_PREFIX)
    ]
    return Reply(200, to_json(ProcessList(infos)), "application/json")


def _unary(request: Request, answer: Callable[[bytes], Reply]) -> Reply:
    if _media_type(request) != "application/json":
        return Reply(415, headers=(("Accept-Post", "application/json"),))
    try:
        return answer(request.body)
    except WireError as e:
        return _connect_error(400, "invalid_argument", str(e))


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


def _connect_error(status: int, code: str, message: str) -> Reply:
    return Reply(status, to_json(ConnectError(code, message)), "application/json")


def _json(status: int, value: Mapping[str, object]) -> Reply:
    return Reply(status, json.dumps(value, separators=(",", ":")).encode(), "application/json")
