"""The E2B double's files: one in-memory tree per sandbox, with envd's answers and errors.

Paths are resolved as envd does (relative to ``/home/user``, ``~`` expanded).
Each operation returns ``(status, json_value)``: the ``/files`` endpoints answer
``{"code": <status>, "message": …}`` errors, the Filesystem RPCs Connect errors::

    tree = MemoryTree()
    tree.write("a/b.txt", b"hi")                   # (200, [{"path": "/home/user/a/b.txt", …}])
    tree.rpc("ListDir", {"path": "a", "depth": 1})  # (200, {"entries": [...]})
    tree.snapshot()                                 # {"/home/user/a/b.txt": b"hi"}
"""

from __future__ import annotations

import hmac
import posixpath
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from piship_remote.wire.e2b_control import ApiError
from piship_remote.wire.e2b_json import WireError, structure, unstructure
from piship_remote.wire.envd import (
    ConnectError,
    EntryInfo,
    ListDirRequest,
    MoveRequest,
    PathRequest,
)
from piship_remote.wire.envd_paths import PathError, resolve, signature

__all__ = ["HOME", "MemoryTree", "files_refusal"]

HOME = "/home/user"
_STATUS = {"not_found": 404, "already_exists": 409, "invalid_argument": 400, "unimplemented": 501}
Answer = tuple[int, Any]


def _api_error(status: int, message: str) -> Answer:
    return status, unstructure(ApiError(status, message))


def _rpc_error(code: str, message: str) -> Answer:
    return _STATUS.get(code, 500), unstructure(ConnectError(code, message))


class MemoryTree:
    """Files (path → bytes) and directories of one sandbox; safe to use from any thread."""

    def __init__(self, home: str = HOME) -> None:
        self._home = home
        self._lock = threading.Lock()
        self._files: dict[str, bytes] = {}
        self._dirs: set[str] = {"/", "/tmp", *_ancestors(home + "/x")}
        self._modified = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._times: dict[str, float] = {}

    def snapshot(self) -> dict[str, bytes]:
        """Every file by its absolute path."""
        with self._lock:
            return dict(self._files)

    # ---- /files ----------------------------------------------------------------------

    def read(self, raw: str) -> tuple[int, Any]:
        """``(200, bytes)``, or envd's 404 / 400 error."""
        try:
            path = resolve(raw, self._home)
        except PathError as e:
            return _api_error(400, str(e))
        with self._lock:
            if path in self._dirs:
                return _api_error(400, f"path '{path}' is a directory")
            if path not in self._files:
                return _api_error(404, f"path '{path}' does not exist")
            return 200, self._files[path]

    def write(self, raw: str, data: bytes) -> Answer:
        """Write one file (parents created): ``(200, [entry])`` or envd's error."""
        try:
            path = resolve(raw, self._home)
        except PathError as e:
            return _api_error(400, str(e))
        with self._lock:
            if path in self._dirs:
                return _api_error(400, f"path is a directory: {path}")
            for parent in _ancestors(path):
                if parent in self._files:
                    return _api_error(500, f"error ensuring directories: path is a file: {parent}")
            self._dirs.update(_ancestors(path))
            self._files[path] = data
            self._times[path] = time.time()
        return 200, [{"path": path, "name": posixpath.basename(path), "type": "file"}]

    # ---- what the in-memory shell uses (absolute paths) ------------------------------

    def kind(self, path: str) -> str | None:
        with self._lock:
            return "dir" if path in self._dirs else "file" if path in self._files else None

    def read_file(self, path: str) -> bytes:
        with self._lock:
            if path in self._dirs:
                raise IsADirectoryError(21, "Is a directory", path)
            if path not in self._files:
                raise FileNotFoundError(2, "No such file or directory", path)
            return self._files[path]

    def write_file(self, path: str, data: bytes, mtime: float | None = None) -> None:
        with self._lock:
            self._check_parent(path)
            if path in self._dirs:
                raise IsADirectoryError(21, "Is a directory", path)
            self._files[path] = data
            self._times[path] = time.time() if mtime is None else mtime

    def make_dir(self, path: str) -> None:
        with self._lock:
            self._check_parent(path)
            if path in self._dirs or path in self._files:
                raise FileExistsError(17, "File exists", path)
            self._dirs.add(path)
            self._times[path] = time.time()

    def remove(self, path: str) -> None:
        with self._lock:
            if path not in self._dirs and path not in self._files:
                raise FileNotFoundError(2, "No such file or directory", path)
            self._drop(path)

    def names(self, path: str) -> list[str]:
        with self._lock:
            if path not in self._dirs:
                raise NotADirectoryError(20, "Not a directory", path)
            below = (p for p in (*self._dirs, *self._files) if _under(p, path, 1))
            return sorted(posixpath.basename(p) for p in below)

    def mtime(self, path: str) -> float:
        with self._lock:
            return self._times.get(path, 0.0)

    def touch(self, path: str) -> None:
        with self._lock:
            if path not in self._dirs and path not in self._files:
                self._check_parent(path)
                self._files[path] = b""
            self._times[path] = time.time()

    def _check_parent(self, path: str) -> None:
        parent = posixpath.dirname(path)
        if parent in self._files:
            raise NotADirectoryError(20, "Not a directory", path)
        if parent not in self._dirs:
            raise FileNotFoundError(2, "No such file or directory", path)

    def _drop(self, path: str) -> None:
        for old in [p for p in self._files if p == path or p.startswith(path + "/")]:
            del self._files[old]
            self._times.pop(old, None)
        self._dirs -= {p for p in self._dirs if p == path or p.startswith(path + "/")}

    # ---- filesystem.Filesystem ---------------------------------------------------------

    def rpc(self, method: str, body: Any) -> Answer:
        """Answer the unary Filesystem RPC ``method`` for the decoded JSON ``body``."""
        handlers = {
            "Stat": self._stat,
            "ListDir": self._list_dir,
            "MakeDir": self._make_dir,
            "Move": self._move,
            "Remove": self._remove,
        }
        handler = handlers.get(method)
        if handler is None:
            return _rpc_error("unimplemented", f"filesystem.Filesystem/{method} is not supported")
        try:
            with self._lock:
                return handler(body if isinstance(body, dict) else {})
        except (WireError, PathError) as e:
            return _rpc_error("invalid_argument", str(e))

    def _path(self, raw: str) -> str:
        return resolve(raw, self._home)

    def _stat(self, body: dict[str, Any]) -> Answer:
        path = self._path(structure(body, PathRequest).path)
        if not self._exists(path):
            return _rpc_error(
                "not_found", f"file not found: lstat {path}: no such file or directory"
            )
        return 200, {"entry": self._entry(path)}

    def _list_dir(self, body: dict[str, Any]) -> Answer:
        request = structure(body, ListDirRequest)
        path = self._path(request.path)
        depth = max(request.depth, 1)
        if not self._exists(path):
            return _rpc_error(
                "not_found", f"path not found: stat {path}: no such file or directory"
            )
        if path not in self._dirs:
            return _rpc_error("invalid_argument", f"path is not a directory: {path}")
        below = [p for p in sorted(self._dirs | set(self._files)) if _under(p, path, depth)]
        return 200, {"entries": [self._entry(p) for p in below]}

    def _make_dir(self, body: dict[str, Any]) -> Answer:
        path = self._path(structure(body, PathRequest).path)
        if path in self._dirs:
            return _rpc_error("already_exists", f"directory already exists: {path}")
        if path in self._files:
            return _rpc_error(
                "invalid_argument", f"path already exists but it is not a directory: {path}"
            )
        self._dirs.update({path, *_ancestors(path)})
        return 200, {"entry": self._entry(path)}

    def _move(self, body: dict[str, Any]) -> Answer:
        request = structure(body, MoveRequest)
        source, destination = self._path(request.source), self._path(request.destination)
        if not self._exists(source):
            missing = f"source file not found: rename {source}: no such file or directory"
            return _rpc_error("not_found", missing)
        self._dirs.update(_ancestors(destination))
        for table in (self._files, self._dirs):
            moved = [p for p in table if p == source or p.startswith(source + "/")]
            for old in moved:
                new = destination + old[len(source) :]
                if isinstance(table, dict):
                    table[new] = table.pop(old)
                else:
                    table.discard(old)
                    table.add(new)
        return 200, {"entry": self._entry(destination)}

    def _remove(self, body: dict[str, Any]) -> Answer:
        path = self._path(structure(body, PathRequest).path)
        self._drop(path)
        return 200, {}

    def _exists(self, path: str) -> bool:
        return path in self._files or path in self._dirs

    def _entry(self, path: str) -> Any:
        is_dir = path in self._dirs
        entry = EntryInfo(
            name=posixpath.basename(path) or "/",
            type="FILE_TYPE_DIRECTORY" if is_dir else "FILE_TYPE_FILE",
            path=path,
            size="0" if is_dir else str(len(self._files[path])),
            mode=0o755 if is_dir else 0o644,
            permissions="drwxr-xr-x" if is_dir else "-rw-r--r--",
            owner="user",
            group="user",
            modified_time=self._modified,
        )
        return unstructure(entry)


def _ancestors(path: str) -> set[str]:
    parents: set[str] = set()
    parent = posixpath.dirname(path)
    while parent not in parents and parent:
        parents.add(parent)
        if parent == "/":
            break
        parent = posixpath.dirname(parent)
    return parents


def _under(candidate: str, directory: str, depth: int) -> bool:
    prefix = directory.rstrip("/") + "/"
    if not candidate.startswith(prefix) or candidate == directory:
        return False
    return candidate[len(prefix) :].count("/") < depth


def files_refusal(
    headers: Mapping[str, str], args: Mapping[str, str], operation: str, envd_token: str
) -> str | None:
    """Why envd refuses a ``/files`` request (``headers`` lower-cased), ``None`` if it passes.

    envd needs ``envd_token`` in ``X-Access-Token`` or a URL signed with it.
    """
    token = headers.get("x-access-token")
    if token is not None:
        if hmac.compare_digest(token, envd_token):
            return None
        return "access token present in header but does not match"
    given = args.get("signature")
    if given is None:
        return "missing signature query parameter"
    raw = args.get("signature_expiration")
    expiration = int(raw) if raw is not None and raw.lstrip("-").isdigit() else None
    expected = signature(
        args.get("path", ""),
        operation,
        args.get("username", ""),
        envd_token,
        expiration,
    )
    if not hmac.compare_digest(given, expected):
        return "invalid signature"
    if expiration is not None and expiration < time.time():
        return "signature is already expired"
    return None
