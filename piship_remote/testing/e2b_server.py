"""A fake E2B-compatible service: control plane and envd on one loopback server.

    with E2bServer(command=lambda start: {"stdout": "hi\\n", "exit_code": 3}) as mock:
        backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url, template="t")
        ...
        assert mock.requests[-1].path == "/sandboxes/sbx1"      # the DELETE
        assert mock.live_sandboxes == []

Routes:

- ``/health`` (any method): status ``health``, empty body.
- ``/sandboxes…`` and ``/v2/sandboxes…`` are control paths. With ``api_key`` set, a
  request whose ``X-API-Key`` differs is answered 401
  ``{"code":401,"message":"invalid key <the key presented>"}`` (the echo is deliberate:
  redaction must remove it). Each path listed in ``reject_once`` is answered that way
  once more, even with the right key (the query is ignored; list a path twice to
  reject it twice).
- ``POST /sandboxes`` (or ``/v2/sandboxes``, the official SDK's): status ``create``
  with sandbox ``sbx<n>``, the lowest ``n`` not alive (the first is ``sbx1``), envd
  token ``envd-token-1`` and ``"domain": null``, or, when
  ``create >= 400``, ``{"code":<create>,"message":"no capacity"}``. A create with an
  ``Idempotency-Key`` (1-255 of ``[a-z0-9-]``, else 400) makes one sandbox per key
  while it lives: the same key and body again answer that sandbox, another body 422,
  as the local service does; ``idempotency_keys=False`` ignores the header (a
  service that does not honour it).
- ``/sandboxes/sbx1/timeout`` and ``/sandboxes/sbx1`` (any method): 204. A DELETE of
  ``/sandboxes/sbx1`` ends one live sandbox.
- ``/process.Process/Start``: ``Authorization`` must be ``Basic base64("<user>:")``
  (absent is accepted as the service's default user, as the official SDK sends
  none); else 401 ``{"code":"unauthenticated","message":"invalid user"}``. The
  first envelope is the StartRequest. A script containing ``piship-sandbox-ready``
  is answered ``piship-sandbox-ready <envs.PISHIP_PROBE_UNLISTED or unset>\\n``.
  With the default file tree, a script the in-memory shell understands
  (:mod:`piship_remote.testing.sandbox_shell`) runs against the sandbox's tree — every
  such script without ``command``, beside one only the library's archive transfers
  (which name its ``/.piship-`` staging files); any other goes to ``command(start)``
  (default: empty output, exit 0).
- ``/process.Process/SendInput`` and ``CloseStdin``: 200 ``{}``; the input (base64
  ``input.stdin``, or ``input.pty`` typed on a terminal) is kept per ``process.tag``
  (``stdin(tag)`` shows it) for a ``cat`` answer, which ends once CloseStdin named its tag.
- ``/process.Process/Update`` (a terminal's new size): 200 ``{}``.
- ``/process.Process/SendSignal``: ends the hung streams with the request's
  ``process.tag`` (every hung stream when it names no tag) with an end-of-stream
  frame ``{}``, and remembers the tag, so a Start with that tag that arrives later
  does not hang. Answers 200 ``{}``.
- ``GET /sandboxes`` and ``GET /v2/sandboxes``: the live sandboxes (``metadata``
  query filter, ``k=v&k2=v2``), each with the metadata it was created with.
- ``POST /sandboxes/<id>/connect`` (and ``/v2/…``): 200 with the sandbox (the same
  envd token) and a lifetime of at least ``timeout`` (default 300) seconds; 404
  ``{"code":404,…}`` for a sandbox not alive.
- Lifetimes: a sandbox lives its create ``timeout`` (absent: 300 s on
  ``/v2/sandboxes``, 15 s on ``/sandboxes``, E2B's defaults), renewed by
  ``/timeout``, measured on ``clock`` (inject one to move time in tests). Once it
  passed, the sandbox is gone: its control paths answer 404 and envd 502
  ``{"sandboxId":…,"message":"The sandbox was not found","code":502}``.
- Files, one in-memory tree per sandbox (``files(sandbox_id)`` shows it):
  ``GET /files?path=`` (404 ``path '<p>' does not exist``, 400 for a directory),
  ``POST /files`` with an ``application/octet-stream`` body (``path`` required) or
  multipart ``file`` parts (the filename is the path unless ``path`` is given), and
  ``/filesystem.Filesystem/`` ``Stat``, ``ListDir``, ``MakeDir``, ``Move``,
  ``Remove`` with envd's Connect errors. ``/files`` needs ``X-Access-Token`` or a
  URL ``signature`` made with the envd token, as envd does.
- ``file_tree(sandbox_id)`` makes a sandbox's tree (default: an empty
  :class:`MemoryTree`); a subclass over a real directory, with a ``command`` that
  runs the Start request's script there, lets tar-based transfers run for real.
- ``distinct_ids=True``: the n-th create is ``sbx<n>``: an id is never reused.
- ``faults`` (:class:`~piship_remote.testing.faults.Faults`) and ``kill(sandbox_id)``:
  failures on demand.
- anything else: 404.

``command(start)`` gets the parsed StartRequest and returns a mapping (``stdout``,
``exit_code``, ``hang``, …); :mod:`piship_remote.testing.e2b_commands` lists its keys
and makes the Start stream of it; :mod:`piship_remote.testing.e2b_processes` keeps the
commands' input, hung streams and signals.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from piship_remote.testing.e2b_commands import (
    CHECK_MARKER,
    PID,
    Command,
    CommandAnswer,
    command_answer,
)
from piship_remote.testing.e2b_files import HOME, MemoryTree, files_refusal
from piship_remote.testing.e2b_listing import (
    CLIENT_ID,
    ENVD_VERSION,
    TEMPLATE_ID,
    LiveSandbox,
    has_metadata,
    listed,
)
from piship_remote.testing.e2b_processes import ProcessTable
from piship_remote.testing.faults import CreateFailure, Faults, hold_if_stalled
from piship_remote.testing.recorder import DropConnection, RecordingServer, json_response
from piship_remote.testing.sandbox_shell import Shell, script_of
from piship_remote.wire.e2b_control import ApiError, SandboxInfo
from piship_remote.wire.e2b_json import (
    WireError,
    metadata_filter,
    start_message,
    structure,
    to_json,
)
from piship_remote.wire.envd import ConnectError, SignalRequest
from piship_remote.wire.envd_paths import resolve

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
CONNECT_JSON = "application/connect+json"
_CONTROL_PREFIXES = ("/sandboxes", "/v2/sandboxes")
_CREATE_PATHS = ("/sandboxes", "/v2/sandboxes")
_SANDBOX_PATH = re.compile(r"(?:/v2)?/sandboxes/([A-Za-z0-9-]{1,128})(/timeout|/connect)?\Z")
_FILESYSTEM = "/filesystem.Filesystem/"
DEFAULT_TIMEOUT = {"/sandboxes": 15, "/v2/sandboxes": 300}
_IDEMPOTENCY_KEY = re.compile(r"[a-z0-9-]{1,255}\Z")
CONNECT_TIMEOUT = 300


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
        clock: Callable[[], float] = time.monotonic,
        distinct_ids: bool = False,
        file_tree: Callable[[str], MemoryTree] | None = None,
        idempotency_keys: bool = True,
    ) -> None:
        self._command = command
        self._honours_keys = idempotency_keys
        self._keyed: dict[str, tuple[bytes, str]] = {}  # key -> (the create's body, sandbox)
        self._file_tree = file_tree or (lambda _sandbox_id: MemoryTree())
        self._api_key = api_key
        self._reject_once = list(reject_once)
        self._create = create
        self._health = health
        self._basic = "Basic " + base64.b64encode(f"{user}:".encode()).decode()
        self._state = threading.Lock()
        self._clock = clock
        self._distinct = distinct_ids
        self._numbers = itertools.count(1)
        self._live: list[LiveSandbox] = []
        self._gone: set[str] = set()
        self._trees: dict[str, MemoryTree] = {}
        self._in_memory = file_tree is None
        self.faults = Faults()
        """Faults on demand (:class:`~piship_remote.testing.faults.Faults`)."""
        self._processes = ProcessTable(self.wait)
        super().__init__(self._handle)

    @property
    def live_sandboxes(self) -> list[str]:
        """Sandboxes created, not deleted and not expired, in creation order."""
        with self._state:
            self._prune()
            return [live.sandbox_id for live in self._live]

    def plant(
        self,
        sandbox_id: str,
        *,
        metadata: Mapping[str, str] | None = None,
        age: float = 0.0,
        lifetime: float = 3600.0,
    ) -> None:
        """Add a live sandbox started ``age`` seconds ago, as another client could have."""
        with self._state:
            self._live.append(
                LiveSandbox(
                    sandbox_id, dict(metadata or {}), time.time() - age, self._clock() + lifetime
                )
            )
            self._gone.discard(sandbox_id)

    def stdin(self, tag: str) -> bytes:
        """The input SendInput gave the command tagged ``tag`` so far."""
        return self._processes.stdin(tag)

    def kill(self, sandbox_id: str) -> None:
        """End ``sandbox_id`` now, as if its lifetime had run out: its control paths answer
        404, envd 502, and its commands' streams are cut."""
        with self._state:
            self._live = [live for live in self._live if live.sandbox_id != sandbox_id]
            self._gone.add(sandbox_id)
            self._trees.pop(sandbox_id, None)
        self._processes.cut(sandbox_id)

    def files(self, sandbox_id: str = SANDBOX_ID) -> dict[str, bytes]:
        """The files of ``sandbox_id``'s tree by absolute path (empty for one never written)."""
        with self._state:
            tree = self._trees.get(sandbox_id)
        return tree.snapshot() if tree is not None else {}

    def _tree(self, sandbox_id: str) -> MemoryTree:
        with self._state:
            tree = self._trees.get(sandbox_id)
            if tree is None:
                tree = self._trees[sandbox_id] = self._file_tree(sandbox_id)
            return tree

    def _prune(self) -> None:
        """With the state lock held: forget creations whose lifetime has passed."""
        now = self._clock()
        for live in [live for live in self._live if live.expires_at <= now]:
            self._live.remove(live)
            if not any(other.sandbox_id == live.sandbox_id for other in self._live):
                self._gone.add(live.sandbox_id)
                self._trees.pop(live.sandbox_id, None)

    def _is_gone(self, sandbox_id: str) -> bool:
        with self._state:
            self._prune()
            return sandbox_id in self._gone

    # ---- routing ---------------------------------------------------------------------

    def _handle(self, request: Request) -> Response:
        path = request.path
        hold_if_stalled(self.faults, path, self.wait, lambda: self.closing)
        if path == "/health":
            return Response(b"", status=self._health)
        if path.startswith(_CONTROL_PREFIXES):
            return self._rejection(request, path) or self._control(request, path)
        sandbox_id = request.headers.get("E2b-Sandbox-Id", SANDBOX_ID)
        if self._is_gone(sandbox_id):
            gone = {"sandboxId": sandbox_id, "message": "The sandbox was not found", "code": 502}
            return json_response(502, gone)
        if path == "/files":
            return self._files_endpoint(request, sandbox_id)
        if path.startswith(_FILESYSTEM):
            return self._filesystem(request, sandbox_id, path[len(_FILESYSTEM) :])
        if path == "/process.Process/SendSignal":
            return self._send_signal(request)
        if path == "/process.Process/Start":
            return self._start(request)
        if path in ("/process.Process/SendInput", "/process.Process/CloseStdin"):
            return self._input(request, closing=path.endswith("CloseStdin"))
        if path == "/process.Process/Update":
            return json_response(200, {})
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
        if path in _CREATE_PATHS:
            if request.method == "GET":
                return self._list(request)
            if request.method == "POST":
                return self._create_keyed(request, DEFAULT_TIMEOUT[path])
        match = _SANDBOX_PATH.match(path)
        if match is None:
            return Response(b"", status=404)
        sandbox_id, action = match.group(1), match.group(2)
        with self._state:
            self._prune()
            lives = [live for live in self._live if live.sandbox_id == sandbox_id]
            if sandbox_id in self._gone or (action == "/connect" and not lives):
                return _json(404, ApiError(404, f'sandbox "{sandbox_id}" not found'))
            if not lives and sandbox_id != SANDBOX_ID:
                return Response(b"", status=404)
            if action is not None and request.method == "POST" and lives:
                body = _object(_json_body(request))
                self._renew(lives, body.get("timeout"), connect=action == "/connect")
            if action is None and request.method == "DELETE" and lives:
                self._live.remove(lives[0])
        if action == "/connect":
            return _json(200, _info(sandbox_id))
        return Response(b"", status=204)

    def _renew(self, lives: list[LiveSandbox], seconds: object, *, connect: bool) -> None:
        """With the state lock held: a connect extends to ``seconds``, a timeout sets it."""
        if not isinstance(seconds, int):
            if not connect:
                return  # a /timeout without one leaves the lifetime as it is
            seconds = CONNECT_TIMEOUT
        end = self._clock() + seconds
        for live in lives:
            live.expires_at = max(live.expires_at, end) if connect else end

    def _create_keyed(self, request: Request, default_timeout: int) -> Response:
        """A create, answered with the sandbox its ``Idempotency-Key`` already made if any."""
        key = request.headers.get("Idempotency-Key") if self._honours_keys else None
        body = request.get_data()
        if key is not None and not _IDEMPOTENCY_KEY.match(key):
            return _json(400, ApiError(400, "invalid Idempotency-Key"))
        with self._state:
            self._prune()
            earlier = self._keyed.get(key) if key else None
            alive = earlier is not None and any(
                live.sandbox_id == earlier[1] for live in self._live
            )
        if earlier is not None and alive:
            if earlier[0] != body:
                return _json(422, ApiError(422, "the Idempotency-Key was used for another request"))
            return self._created(earlier[1])
        return self._create_sandbox(_object(_json_body(request)), default_timeout, key, body)

    def _create_sandbox(
        self, body: dict[str, Any], default_timeout: int, key: str | None, raw: bytes
    ) -> Response:
        if self._create >= 400:
            return _json(self._create, ApiError(self._create, "no capacity"))
        failure = self.faults.take_create_failure()
        if failure is not None:
            return _refused_create(failure)
        timeout = body.get("timeout", default_timeout)
        metadata = body.get("metadata")
        with self._state:
            self._prune()
            sandbox_id = self._new_id()
            self._trees.pop(sandbox_id, None)
            now = self._clock()
            lifetime = timeout if isinstance(timeout, int) else default_timeout
            kept = (
                {str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {}
            )
            self._live.append(LiveSandbox(sandbox_id, kept, time.time(), now + lifetime))
            self._gone.discard(sandbox_id)
            for stale in [k for k, (_, made) in self._keyed.items() if made == sandbox_id]:
                del self._keyed[stale]  # a reused id: that key's sandbox ended
            if key:
                self._keyed[key] = (raw, sandbox_id)
        return self._created(sandbox_id)

    def _created(self, sandbox_id: str) -> Response:
        if self.faults.take_lost_answer():
            raise DropConnection
        return _json(self._create, _info(sandbox_id))

    def _new_id(self) -> str:
        """With the state lock held: ``sbx<n>``, the lowest ``n`` not alive (with
        ``distinct_ids``, the n-th create's ``n``: never one used before)."""
        number = next(self._numbers)
        if self._distinct:
            return f"sbx{number}"
        alive = {live.sandbox_id for live in self._live}
        return next(f"sbx{n}" for n in itertools.count(1) if f"sbx{n}" not in alive)

    def _list(self, request: Request) -> Response:
        try:
            wanted = metadata_filter(request.args.get("metadata"))
        except WireError as e:
            return _json(400, ApiError(400, str(e)))
        with self._state:
            self._prune()
            lives = [live for live in self._live if has_metadata(live.metadata, wanted)]
        return json_response(200, [listed(live, self._clock()) for live in lives])

    # ---- envd files ------------------------------------------------------------------

    def _files_endpoint(self, request: Request, sandbox_id: str) -> Response:
        operation = {"GET": "read", "POST": "write"}.get(request.method)
        if operation is None:
            return Response(b"", status=405)
        headers = {name.lower(): value for name, value in request.headers.items()}
        refusal = files_refusal(headers, request.args, operation, ENVD_ACCESS_TOKEN)
        if refusal is not None:
            return _json(401, ApiError(401, refusal))
        tree = self._tree(sandbox_id)
        path = request.args.get("path")
        if request.method == "GET":
            status, value = tree.read(path or "")
            if status == 200:
                return Response(value, status=200, content_type="application/octet-stream")
            return json_response(status, value)
        media = (request.mimetype or "").lower()
        if media == "application/octet-stream":
            if path is None:
                message = "path query parameter is required for raw body upload"
                return _json(400, ApiError(400, message))
            return json_response(*tree.write(path, request.get_data()))
        if media.startswith("multipart/"):
            return self._multipart(tree, request, path)
        expected = "expected multipart/form-data or application/octet-stream"
        message = f"unsupported content type: {media}, {expected}"
        return _json(400, ApiError(400, message))

    def _multipart(self, tree: MemoryTree, request: Request, path: str | None) -> Response:
        written: list[Any] = []
        for part in request.files.getlist("file"):
            status, value = tree.write(path or part.filename or "", part.read())
            if status != 200:
                return json_response(status, value)
            written += value
        return json_response(200, written)

    def _filesystem(self, request: Request, sandbox_id: str, method: str) -> Response:
        try:
            body = json.loads(request.get_data() or b"{}")
        except ValueError:
            return _json(400, ConnectError("invalid_argument", "the body is not JSON"))
        return json_response(*self._tree(sandbox_id).rpc(method, body))

    # ---- envd ------------------------------------------------------------------------

    def _send_signal(self, request: Request) -> Response:
        self._processes.signal(_signal_tag(request.get_data()))
        return json_response(200, {})

    def _input(self, request: Request, *, closing: bool) -> Response:
        body = _object(_json_body(request))
        tag = _object(body.get("process")).get("tag")
        if not isinstance(tag, str):
            return _json(400, ConnectError("invalid_argument", "a process tag is required"))
        given = _object(body.get("input"))
        data = given.get("stdin", given.get("pty", ""))
        try:
            chunk = base64.b64decode(data, validate=True) if isinstance(data, str) else b""
        except binascii.Error:
            return _json(400, ConnectError("invalid_argument", "the input is not base64"))
        self._processes.send_input(tag, chunk, closing=closing)
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
        sandbox_id = request.headers.get("E2b-Sandbox-Id", SANDBOX_ID)
        answer = self._answer(start, sandbox_id)
        if (status := answer.get("status")) is not None:
            return json_response(int(status), answer.get("body", b""))
        if self.faults.take_dropped_stream():
            answer = {**answer, "drop": True}
        tag = start.get("tag") if isinstance(start.get("tag"), str) else None
        return self.stream(
            request,
            self._processes.frames(answer, tag, sandbox_id, is_gone=self._is_gone),
            content_type=str(answer.get("content_type", CONNECT_JSON)),
        )

    def _answer(self, start: dict[str, Any], sandbox_id: str) -> CommandAnswer:
        """The in-memory shell's answer when it runs the script, else ``command``'s."""
        process = _object(start.get("process"))
        script = script_of(process.get("args"))
        if self._in_memory and script is not None and CHECK_MARKER not in script:
            tree = self._tree(sandbox_id)
            cwd = process.get("cwd") if isinstance(process.get("cwd"), str) else HOME
            shell = Shell(tree, resolve(cwd, HOME) if cwd else HOME)
            if tree.kind(shell.cwd) == "dir" and shell.takes(script, self._command is None):
                envs = {str(k): str(v) for k, v in _object(process.get("envs")).items()}
                return shell.run(script, envs).answer()
        return command_answer(start, self._command)


def _signal_tag(body: bytes) -> str | None:
    """The tag a SendSignal names; ``None`` (every hung stream) when it names none."""
    try:
        return structure(json.loads(body), SignalRequest).process.tag
    except (ValueError, WireError):
        return None


def _refused_create(failure: CreateFailure) -> Response:
    response = _json(failure.status, ApiError(failure.status, "rate limit exceeded"))
    if failure.retry_after is not None:
        response.headers["Retry-After"] = str(failure.retry_after)
    return response


def _json(status: int, value: object) -> Response:
    return json_response(status, to_json(value))


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _info(sandbox_id: str) -> SandboxInfo:
    return SandboxInfo(sandbox_id, TEMPLATE_ID, CLIENT_ID, ENVD_VERSION, ENVD_ACCESS_TOKEN)


def _json_body(request: Request) -> Any:
    try:
        return json.loads(request.get_data() or b"{}")
    except ValueError:
        return {}
