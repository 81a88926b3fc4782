"""envd's ``filesystem.Filesystem`` Connect RPCs on the local service: Stat, ListDir, MakeDir,
Move, Remove, the watcher RPCs (unary, JSON codec), and WatchDir (a server stream).

Stat … Remove are each done by the sandbox's agent, inside it (see
:mod:`piship_remote.local.sandbox.fs`), and answer envd's shapes: ``{"entry":
EntryInfo}``, ``{"entries": [...]}``, ``{}``; the watchers are
:mod:`piship_remote.local.envd.watch_rpc`'s. Unary errors are Connect's ``{"code":
"not_found", "message": …}`` with the matching HTTP status and envd's wording;
WatchDir's are an end-of-stream error on HTTP 200, as Connect streams' are::

    rpc = FilesystemRpc(home="/home/user")
    reply = rpc.handle(sandbox, request, refusal=None)   # refusal: why the Basic user is not
    reply = rpc.handle(sandbox, request, None, root)     # as another user (an Identity)

Each operation runs as the requesting user, its relative paths from that user's home.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from piship_remote._http_server.messages import Reply, Request
from piship_remote.local.envd.watch_rpc import CONNECT_JSON, Watches, WatchFailed
from piship_remote.local.isolation.user_map import Identity
from piship_remote.local.sandbox.fs import FilesFailed, call, entries_of
from piship_remote.local.sandbox.registry import Sandbox
from piship_remote.wire.e2b_json import (
    WireError,
    end_stream_frame,
    parse,
    start_message,
    to_json,
    unstructure,
)
from piship_remote.wire.envd import (
    ConnectError,
    EntryInfo,
    ListDirRequest,
    MoveRequest,
    PathRequest,
)
from piship_remote.wire.envd_paths import PathError, resolve

__all__ = ["FILESYSTEM_PREFIX", "FilesystemRpc", "connect_error"]

FILESYSTEM_PREFIX = "/filesystem.Filesystem/"
MAX_DEPTH = 64
DEFAULT_KEEPALIVE = 90.0
STATUS = {
    "invalid_argument": 400,
    "failed_precondition": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "already_exists": 409,
    "resource_exhausted": 429,
    "internal": 500,
    "unknown": 500,
    "unimplemented": 501,
    "unavailable": 503,
}


class FilesystemRpc:
    """Answers the Filesystem RPCs for sandboxes whose user's home is ``home``."""

    def __init__(self, *, home: str) -> None:
        self._home = home
        self._watches = Watches(home=home)
        self._methods: dict[str, Callable[[Sandbox, bytes, Identity | None], Reply]] = {
            "Stat": self._stat,
            "ListDir": self._list_dir,
            "MakeDir": self._make_dir,
            "Move": self._move,
            "Remove": self._remove,
            "CreateWatcher": lambda s, b, u: self._watches.create(s, _json(b), u),
            "GetWatcherEvents": lambda s, b, _: self._watches.events(s, _json(b)),
            "RemoveWatcher": lambda s, b, _: self._watches.remove(s, _json(b)),
        }

    def handle(
        self,
        sandbox: Sandbox,
        request: Request,
        refusal: str | None,
        user: Identity | None = None,
    ) -> Reply:
        """Answer the RPC ``request`` names as ``user`` (default: the sandbox's);
        ``refusal`` says why its Basic user is refused."""
        method = request.path[len(FILESYSTEM_PREFIX) :]
        if method == "WatchDir":
            return self._watch_dir(sandbox, request, refusal, user)
        if refusal is not None:
            return connect_error("unauthenticated", refusal)
        if _media_type(request) != "application/json":
            return Reply(415, headers=(("Accept-Post", "application/json"),))
        answer = self._methods.get(method)
        if answer is None:
            return connect_error(
                "unimplemented", f"filesystem.Filesystem/{method[:60]} is not supported"
            )
        try:
            return answer(sandbox, request.body, user)
        except (WireError, PathError) as e:
            return connect_error("invalid_argument", str(e))
        except WatchFailed as e:
            return connect_error(e.error.code, e.error.message)

    def _watch_dir(
        self, sandbox: Sandbox, request: Request, refusal: str | None, user: Identity | None
    ) -> Reply:
        if refusal is not None:
            return _stream_error(ConnectError("unauthenticated", refusal))
        if _media_type(request) != CONNECT_JSON:
            return Reply(415, headers=(("Accept-Post", CONNECT_JSON),))
        try:
            message = start_message(request.body)
            keepalive = _keepalive(request.headers)
            stream = self._watches.stream(sandbox, message, keepalive=keepalive, user=user)
        except WireError as e:
            return _stream_error(ConnectError("invalid_argument", str(e)))
        except WatchFailed as e:
            return _stream_error(e.error)
        return Reply(200, content_type=CONNECT_JSON, headers=_STREAM_HEADERS, stream=stream)

    def _path(self, raw: str, user: Identity | None) -> str:
        return resolve(raw, self._home if user is None else user.home)

    def _stat(self, sandbox: Sandbox, body: bytes, user: Identity | None) -> Reply:
        path = self._path(parse(body, PathRequest).path, user)
        try:
            return _entry(call(sandbox, "stat", {"path": path}, user=user))
        except FilesFailed as e:
            if e.code == "ENOENT":
                return connect_error(
                    "not_found", f"file not found: lstat {path}: no such file or directory"
                )
            return _failed("reading the entry", path, e)

    def _list_dir(self, sandbox: Sandbox, body: bytes, user: Identity | None) -> Reply:
        request = parse(body, ListDirRequest)
        path = self._path(request.path, user)
        depth = min(max(request.depth, 1), MAX_DEPTH)
        try:
            found = call(sandbox, "list", {"path": path, "depth": depth}, user=user)
        except FilesFailed as e:
            if e.code == "ENOENT":
                return connect_error(
                    "not_found", f"path not found: stat {path}: no such file or directory"
                )
            if e.code == "ENOTDIR":
                return connect_error("invalid_argument", f"path is not a directory: {path}")
            return _failed("listing the directory", path, e)
        entries = [unstructure(e) for e in sorted(entries_of(found), key=_walk_order)]
        return _ok({"entries": entries})

    def _make_dir(self, sandbox: Sandbox, body: bytes, user: Identity | None) -> Reply:
        path = self._path(parse(body, PathRequest).path, user)
        try:
            return _entry(call(sandbox, "make_dir", {"path": path}, user=user))
        except FilesFailed as e:
            if e.code == "EEXIST" and e.details.get("directory"):
                return connect_error("already_exists", f"directory already exists: {path}")
            if e.code == "EEXIST":
                return connect_error(
                    "invalid_argument", f"path already exists but it is not a directory: {path}"
                )
            return _failed("creating the directory", path, e)

    def _move(self, sandbox: Sandbox, body: bytes, user: Identity | None) -> Reply:
        request = parse(body, MoveRequest)
        source = self._path(request.source, user)
        destination = self._path(request.destination, user)
        args = {"source": source, "destination": destination}
        try:
            return _entry(call(sandbox, "move", args, user=user))
        except FilesFailed as e:
            if e.code == "ENOENT" and e.details.get("source"):
                return connect_error(
                    "not_found",
                    f"source file not found: rename {source}: no such file or directory",
                )
            return _failed("moving the file", destination, e)

    def _remove(self, sandbox: Sandbox, body: bytes, user: Identity | None) -> Reply:
        path = self._path(parse(body, PathRequest).path, user)
        try:
            call(sandbox, "remove", {"path": path}, user=user)
        except FilesFailed as e:
            return _failed("removing the path", path, e)
        return _ok({})


def _walk_order(entry: EntryInfo) -> list[bytes]:
    """envd's order (Go's ``WalkDir``): depth first, each directory's entries by name."""
    return [part.encode(errors="surrogateescape") for part in entry.path.split("/")]


def _entry(value: object) -> Reply:
    entries = entries_of(value)
    if not entries:
        return connect_error("internal", "error reading the entry: it is gone")
    return _ok({"entry": unstructure(entries[0])})


def _failed(doing: str, path: str, failure: FilesFailed) -> Reply:
    """envd's answer for an operation the user may not do, or that failed."""
    where = str(failure.details.get("path") or path)
    if failure.code == "EACCES":
        return connect_error("permission_denied", f"error {doing}: {where}: permission denied")
    if failure.code in ("ENOSPC", "EDQUOT"):
        return connect_error("resource_exhausted", f"error {doing}: no space left on device")
    return connect_error("internal", f"error {doing}: {where}: {failure.reason}")


def _ok(value: object) -> Reply:
    return Reply(200, to_json(value), "application/json")


_STREAM_HEADERS = (("Connect-Content-Encoding", "identity"),)


def _stream_error(error: ConnectError) -> Reply:
    return Reply(200, end_stream_frame(error), CONNECT_JSON, _STREAM_HEADERS)


def _json(body: bytes) -> object:
    try:
        return json.loads(body) if body.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WireError("the request body is not JSON") from None


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


def _keepalive(headers: Mapping[str, str]) -> float:
    value = headers.get("keepalive-ping-interval", "").strip()
    if value.isdigit() and 0 < int(value) <= 3600:
        return float(value)
    return DEFAULT_KEEPALIVE


def connect_error(code: str, message: str) -> Reply:
    """A unary Connect error: the code's HTTP status and ``{"code", "message"}``."""
    return Reply(STATUS.get(code, 500), to_json(ConnectError(code, message)), "application/json")
