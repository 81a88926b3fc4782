"""A fake E2B-compatible service: control plane and envd on one loopback server.

    with E2bServer(command=lambda start: {"stdout": "hi\\n", "exit_code": 3}) as mock:
        backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url, template="t")
        ...
        assert mock.requests[-1].path == "/sandboxes/sbx1"      # the DELETE
        assert mock.live_sandboxes == []

Routes (the seed's mock, reference e2b-backend.md §13.4):

- ``/health`` (any method): status ``health``, empty body.
- ``/sandboxes…`` and ``/v2/sandboxes…`` are control paths. With ``api_key`` set, a
  request whose ``X-API-Key`` differs is answered 401
  ``{"code":401,"message":"invalid key <the key presented>"}`` (the echo is deliberate:
  redaction must remove it). Each path listed in ``reject_once`` is answered that way
  once more, even with the right key (the query is ignored; list a path twice to
  reject it twice).
- ``POST /sandboxes`` (or ``/v2/sandboxes``, the official SDK's): status ``create``
  with sandbox ``sbx1``, envd token ``envd-token-1`` and ``"domain": null``, or, when
  ``create >= 400``, ``{"code":<create>,"message":"no capacity"}``.
- ``/sandboxes/<id>/timeout`` and ``/sandboxes/<id>`` (any method): 204. A DELETE of
  ``/sandboxes/<id>`` ends one live sandbox with that id; a renewal (``{"timeout": s}``)
  moves its end to ``s`` seconds from now. A sandbox whose end has passed is gone
  (the create's ``timeout``, 300 s when absent, is its first lifetime).
- ``POST /sandboxes/<id>/connect`` (or ``/v2/…``): 200 with the sandbox, a fresh envd
  token ``envd-token-<n>`` and ``"domain": null``, its end moved like a renewal;
  404 ``{"code":404,"message":"sandbox <id> not found"}`` when it is not live.
- ``GET /v2/sandboxes?metadata=<k%3Dv&…>``: the live sandboxes whose metadata has
  every pair, as ``ListedSandbox`` objects (``startedAt``/``endAt`` RFC 3339).
  :meth:`E2bServer.plant` adds a sandbox with any id and metadata (an orphan).
- ``/process.Process/Start``: ``Authorization`` must be ``Basic base64("<user>:")``
  (absent is accepted as the service's default user, as the official SDK sends
  none); else 401 ``{"code":"unauthenticated","message":"invalid user"}``. The
  first envelope is the StartRequest. A script containing ``piship-sandbox-ready``
  is answered ``piship-sandbox-ready <envs.PISHIP_PROBE_UNLISTED or unset>\\n``;
  any other goes to ``command(start)`` (default: empty output, exit 0).
- ``/process.Process/SendSignal``: ends the hung streams with the request's
  ``process.tag`` (every hung stream when it names no tag) with an end-of-stream
  frame ``{}``, and remembers the tag, so a Start with that tag that arrives later
  does not hang. Answers 200 ``{}``.
- anything else: 404.

``command(start)`` gets the parsed StartRequest and returns a mapping with any of:

=================  ==================================================================
``stdout``         text or bytes, one data frame (standard base64)
``stderr``         text or bytes, one data frame after stdout
``chunks``         a list of text/bytes pieces, each its own stdout frame (after stdout)
``exit_code``      int, default 0; sent as ``exitCode`` only when non-zero, like envd
``omit_zero_exit`` default True; False sends ``"exitCode": 0`` explicitly
``keepalive``      True: a keepalive event after start and after every data frame
``after``          a ``threading.Event``: the stream waits for it before ending
``hang``           True: no end; the stream stays open until SendSignal (then ``{}``
                   end-of-stream) or until the server closes (then a drop)
``killed_end``     with ``hang``: after SendSignal, first send envd's end event for a
                   SIGKILLed process (``exitCode: -1``, ``status: "signal: killed"``,
                   ``error``), as real envd does and the official SDK expects
``stream_error``   message: end-of-stream ``{"error":{"code":"internal","message":…}}``
                   and no end event
``no_end_stream``  True: the end event, then the body ends without end-of-stream
``drop``           True: cut the connection after the output (a mid-stream reset)
``status``         answer Start with this HTTP status and ``body`` instead of a stream
``body``           the body for ``status`` (text, bytes or JSON value)
``content_type``   the Start response's content type (default ``application/connect+json``)
=================  ==================================================================
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

from piship_remote.local.wire import (
    ApiError,
    ConnectError,
    DataEvent,
    EndEvent,
    SandboxInfo,
    SignalRequest,
    StartEvent,
    WireError,
    end_stream_frame,
    event_frame,
    start_message,
    structure,
    to_json,
    unstructure,
)
from piship_remote.testing.recorder import DropConnection, RecordingServer, json_response

from werkzeug import Request, Response  # isort: skip  (after recorder, which names the extra)

__all__ = [
    "CLIENT_ID",
    "ENVD_ACCESS_TOKEN",
    "PID",
    "SANDBOX_ID",
    "CommandAnswer",
    "E2bServer",
]

SANDBOX_ID = "sbx1"
ENVD_ACCESS_TOKEN = "envd-token-1"
CLIENT_ID = "client1"
TEMPLATE_ID = "piship-workspace"
ENVD_VERSION = "0.4.0"
PID = 42
CHECK_MARKER = "piship-sandbox-ready"
CONNECT_JSON = "application/connect+json"
# envd's end event after SIGKILL: ExitCode() -1, Exited() false (omitted), Go's status text.
KILLED_END = EndEvent(exit_code=-1, exited=False, status="signal: killed", error="signal: killed")

CommandAnswer = Mapping[str, Any]
Command = Callable[[dict[str, Any]], CommandAnswer]

_ANSWER_KEYS = frozenset(
    {
        "stdout",
        "stderr",
        "chunks",
        "exit_code",
        "omit_zero_exit",
        "keepalive",
        "after",
        "hang",
        "killed_end",
        "stream_error",
        "no_end_stream",
        "drop",
        "status",
        "body",
        "content_type",
    }
)
_CONTROL_PREFIXES = ("/sandboxes", "/v2/sandboxes")
_CREATE_PATHS = ("/sandboxes", "/v2/sandboxes")
_SANDBOX_PATH = re.compile(r"^(?:/v2)?/sandboxes/(?P<id>[^/]+)(?P<action>/timeout|/connect)?$")
_LIST_PATHS = ("/v2/sandboxes", "/sandboxes")
DEFAULT_LIFETIME = 300.0


@attrs.define
class _Live:
    """One live sandbox of the fake service (wall-clock seconds)."""

    sandbox_id: str
    metadata: dict[str, str]
    started: float
    ends: float


class E2bServer(RecordingServer):
    """The started fake service; see the module docstring for its routes and answers."""

    def __init__(
        self,
        *,
        command: Command | None = None,
        api_key: str | None = None,
        reject_once: Iterable[str] = (),
        create: int = 201,
        health: int = 204,
        user: str = "user",
    ) -> None:
        self._command = command
        self._api_key = api_key
        self._reject_once = list(reject_once)
        self._create = create
        self._health = health
        self._basic = "Basic " + base64.b64encode(f"{user}:".encode()).decode()
        self._state = threading.Lock()
        self._live: list[_Live] = []
        self._tokens = 1
        self._hung: list[tuple[str | None, threading.Event]] = []
        self._killed: set[str] = set()
        super().__init__(self._handle)

    @property
    def live_sandboxes(self) -> list[str]:
        """Sandboxes created, not deleted and not expired (one ``"sbx1"`` per live creation)."""
        with self._state:
            return [live.sandbox_id for live in self._alive()]

    def plant(
        self,
        sandbox_id: str,
        *,
        metadata: Mapping[str, str] | None = None,
        age: float = 0.0,
        lifetime: float = 3600.0,
    ) -> None:
        """Add a live sandbox started ``age`` seconds ago, as another client could have."""
        now = time.time()
        with self._state:
            self._live.append(_Live(sandbox_id, dict(metadata or {}), now - age, now + lifetime))

    def _alive(self) -> list[_Live]:
        """Drop the sandboxes whose end has passed; the rest. Called under the lock."""
        now = time.time()
        self._live = [live for live in self._live if live.ends > now]
        return self._live

    def _find(self, sandbox_id: str) -> _Live | None:
        return next((live for live in self._alive() if live.sandbox_id == sandbox_id), None)

    # ---- routing ---------------------------------------------------------------------

    def _handle(self, request: Request) -> Response:
        path = request.path
        if path == "/health":
            return Response(b"", status=self._health)
        if path.startswith(_CONTROL_PREFIXES):
            return self._rejection(request, path) or self._control(request, path)
        if path == "/process.Process/SendSignal":
            return self._send_signal(request)
        if path == "/process.Process/Start":
            return self._start(request)
        return Response(b"", status=404)

    def _rejection(self, request: Request, path: str) -> Response | None:
        presented = request.headers.get("X-API-Key", "")
        wrong_key = self._api_key is not None and presented != self._api_key
        if wrong_key or self._consume_reject(path):
            return _json(401, ApiError(401, f"invalid key {presented}"))
        return None

    def _consume_reject(self, path: str) -> bool:
        with self._state:
            if path in self._reject_once:
                self._reject_once.remove(path)
                return True
            return False

    def _control(self, request: Request, path: str) -> Response:
        if request.method == "POST" and path in _CREATE_PATHS:
            return self._create_sandbox(_body_object(request))
        if request.method == "GET" and path in _LIST_PATHS:
            return self._list(request)
        match = _SANDBOX_PATH.match(path)
        if match is None:
            return Response(b"", status=404)
        sandbox_id, action = match["id"], match["action"]
        if action == "/connect" and request.method == "POST":
            return self._connect(sandbox_id, _body_object(request))
        with self._state:
            live = self._find(sandbox_id)
            if live is not None and request.method == "DELETE" and action is None:
                self._live.remove(live)
            elif live is not None and action == "/timeout":
                live.ends = time.time() + _lifetime(_body_object(request))
        known = live is not None or sandbox_id == SANDBOX_ID
        return Response(b"", status=204 if known else 404)

    def _create_sandbox(self, body: dict[str, Any]) -> Response:
        if self._create >= 400:
            return _json(self._create, ApiError(self._create, "no capacity"))
        metadata = {str(k): str(v) for k, v in _object(body.get("metadata")).items()}
        now = time.time()
        with self._state:
            self._live.append(_Live(SANDBOX_ID, metadata, now, now + _lifetime(body)))
        info = SandboxInfo(SANDBOX_ID, TEMPLATE_ID, CLIENT_ID, ENVD_VERSION, ENVD_ACCESS_TOKEN)
        return _json(self._create, info)

    def _connect(self, sandbox_id: str, body: dict[str, Any]) -> Response:
        with self._state:
            live = self._find(sandbox_id)
            if live is None:
                return _json(404, ApiError(404, f"sandbox {sandbox_id} not found"))
            live.ends = max(live.ends, time.time() + _lifetime(body))
            self._tokens += 1
            token = f"envd-token-{self._tokens}"
        return _json(200, SandboxInfo(sandbox_id, TEMPLATE_ID, CLIENT_ID, ENVD_VERSION, token))

    def _list(self, request: Request) -> Response:
        wanted = dict(
            urllib.parse.parse_qsl(request.args.get("metadata", ""), keep_blank_values=True)
        )
        with self._state:
            listed = [
                _listed(live)
                for live in self._alive()
                if all(live.metadata.get(k) == v for k, v in wanted.items())
            ]
        return json_response(200, listed)

    # ---- envd ------------------------------------------------------------------------

    def _send_signal(self, request: Request) -> Response:
        tag = _signal_tag(request.get_data())
        with self._state:
            if tag is not None:
                self._killed.add(tag)
            gates = [gate for hung, gate in self._hung if tag is None or hung == tag]
        for gate in gates:
            gate.set()
        return json_response(200, {})

    def _start(self, request: Request) -> Response:
        authorization = request.headers.get("Authorization")
        if authorization is not None and authorization != self._basic:
            return _json(401, ConnectError("unauthenticated", "invalid user"))
        try:
            start = start_message(request.get_data())
        except WireError:
            refusal = ConnectError("invalid_argument", "the body is not a Connect envelope")
            return _json(400, refusal)
        answer = self._answer(start)
        if (status := answer.get("status")) is not None:
            return json_response(int(status), answer.get("body", b""))
        tag = start.get("tag") if isinstance(start.get("tag"), str) else None
        return self.stream(
            request,
            self._events(answer, tag),
            content_type=str(answer.get("content_type", CONNECT_JSON)),
        )

    def _answer(self, start: dict[str, Any]) -> CommandAnswer:
        process = _object(start.get("process"))
        args = process.get("args")
        script = args[2] if isinstance(args, list) and len(args) > 2 else ""
        if isinstance(script, str) and CHECK_MARKER in script:
            unlisted = _object(process.get("envs")).get("PISHIP_PROBE_UNLISTED") or "unset"
            return {"stdout": f"{CHECK_MARKER} {unlisted}\n"}
        answer = dict(self._command(start)) if self._command else {}
        unknown = set(answer) - _ANSWER_KEYS
        if unknown:
            raise ValueError(f"E2bServer: unknown command answer keys {sorted(unknown)}")
        return answer

    def _events(self, answer: CommandAnswer, tag: str | None) -> Iterator[bytes]:
        if not answer.get("hang"):
            yield from self._answer_events(answer, None)
            return
        # Listen for SendSignal before the start frame goes out: a client may send
        # it as soon as it has the pid (the official SDK's kill() does).
        entry = (tag, threading.Event())
        with self._state:
            self._hung.append(entry)
        try:
            yield from self._answer_events(answer, entry)
        finally:
            with self._state:
                self._hung.remove(entry)

    def _answer_events(
        self, answer: CommandAnswer, hung: tuple[str | None, threading.Event] | None
    ) -> Iterator[bytes]:
        keepalive = bool(answer.get("keepalive"))
        yield event_frame("start", StartEvent(PID))
        if keepalive:
            yield event_frame("keepalive", {})
        for stream, piece in _output(answer):
            data = base64.b64encode(piece).decode()
            event = DataEvent(stdout=data) if stream == "stdout" else DataEvent(stderr=data)
            yield event_frame("data", event)
            if keepalive:
                yield event_frame("keepalive", {})
        after = answer.get("after")
        if after is not None and not self.wait(after):
            raise DropConnection
        if answer.get("drop"):
            raise DropConnection
        if hung is not None:
            if not self._hang(*hung):
                raise DropConnection
            if answer.get("killed_end"):
                yield event_frame("end", KILLED_END)
            yield end_stream_frame()
            return
        if (error := answer.get("stream_error")) is not None:
            yield end_stream_frame(ConnectError("internal", str(error)))
            return
        yield event_frame("end", _end(answer))
        if not answer.get("no_end_stream"):
            yield end_stream_frame()

    def _hang(self, tag: str | None, gate: threading.Event) -> bool:
        """Wait for a SendSignal; True when one came, False when the server closed."""
        with self._state:
            if tag is not None and tag in self._killed:
                return True
        return self.wait(gate)


def _signal_tag(body: bytes) -> str | None:
    """The tag a SendSignal names; ``None`` (every hung stream) when it names none."""
    try:
        return structure(json.loads(body), SignalRequest).process.tag
    except (ValueError, WireError):
        return None


def _body_object(request: Request) -> dict[str, Any]:
    try:
        return _object(json.loads(request.get_data() or b"{}"))
    except ValueError:
        return {}


def _lifetime(body: Mapping[str, Any]) -> float:
    value = body.get("timeout")
    return float(value) if isinstance(value, (int, float)) and value > 0 else DEFAULT_LIFETIME


def _rfc3339(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")


def _listed(live: _Live) -> dict[str, Any]:
    return {
        "sandboxID": live.sandbox_id,
        "templateID": TEMPLATE_ID,
        "clientID": CLIENT_ID,
        "startedAt": _rfc3339(live.started),
        "endAt": _rfc3339(live.ends),
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": "running",
        "envdVersion": ENVD_VERSION,
        "metadata": live.metadata,
    }


def _json(status: int, value: object) -> Response:
    return json_response(status, to_json(value))


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _bytes(piece: str | bytes) -> bytes:
    return piece.encode() if isinstance(piece, str) else piece


def _output(answer: CommandAnswer) -> Iterator[tuple[str, bytes]]:
    if answer.get("stdout"):
        yield "stdout", _bytes(answer["stdout"])
    for piece in answer.get("chunks", ()):
        yield "stdout", _bytes(piece)
    if answer.get("stderr"):
        yield "stderr", _bytes(answer["stderr"])


def _end(answer: CommandAnswer) -> EndEvent | dict[str, Any]:
    """envd's end event; ``omit_zero_exit`` False sends the ``exitCode`` 0 protojson omits."""
    code = int(answer.get("exit_code", 0))
    end = EndEvent(exit_code=code, exited=True, status=f"exit status {code}")
    if code == 0 and not answer.get("omit_zero_exit", True):
        return {"exitCode": 0, **unstructure(end)}
    return end
