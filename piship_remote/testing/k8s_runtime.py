"""The fake sandbox runtime: ``/execute`` answers and an in-memory file tree per claim.

It behaves like agent-sandbox's python runtime behind its router:

- ``POST /execute`` ``{"command": …}`` answers ``{"stdout", "stderr", "exit_code"}``;
  every runtime failure is HTTP 200 with ``exit_code`` 1 and stderr starting
  ``Failed to execute command: `` (a command ``shlex`` cannot split, an empty command,
  the runtime's own timeout — ``Command '[…]' timed out after 300.0 seconds`` — and
  output that is not UTF-8, which the runtime decodes strictly); a body without
  ``command`` is FastAPI's 422;
- ``POST /upload`` (multipart field ``file``; its filename is the path),
  ``GET /download/<path>``, ``GET /list/<path>`` and ``GET /exists/<path>``: paths are
  relative to the runtime's base directory, percent-decoded once more than HTTP does
  (``%2F`` is a slash), and one that escapes the base is 403 ``Access denied``.

What a command prints and returns comes from the test's ``execute(command)`` answer
(see :class:`~piship_remote.testing.kubernetes_server.KubernetesServer`).
"""

from __future__ import annotations

import posixpath
import shlex
import urllib.parse
from collections.abc import Mapping
from typing import Any

import attrs

from piship_remote.testing.e2b_files import MemoryTree

__all__ = ["RUNTIME_BASE", "FileTree", "Reply", "Runtime"]


@attrs.frozen
class Reply:
    """What the runtime answers: status, a JSON value or raw bytes, extra headers."""

    status: int
    body: Any
    headers: Mapping[str, str] = attrs.field(factory=dict)


RUNTIME_BASE = "/app"
"""The runtime's base directory: where commands start and what its file endpoints serve."""


class FileTree:
    """One sandbox's files. The endpoints use paths relative to the base directory;
    :attr:`memory` holds the whole file system (absolute paths) for the in-memory shell."""

    def __init__(self, base: str = RUNTIME_BASE) -> None:
        self.base = base
        self.memory = MemoryTree(base)

    def snapshot(self) -> dict[str, bytes]:
        """The files under the base directory, by path relative to it."""
        prefix = self.base + "/"
        return {
            path[len(prefix) :]: data
            for path, data in self.memory.snapshot().items()
            if path.startswith(prefix)
        }

    def write(self, path: str, data: bytes) -> None:
        absolute = self._absolute(path)
        parent = posixpath.dirname(absolute)
        if self.memory.kind(absolute) == "dir":
            raise IsADirectoryError(f"[Errno 21] Is a directory: '{path}'")
        _make_parents(self.memory, parent, path)
        self.memory.write_file(absolute, data)

    def read(self, path: str) -> bytes | None:
        try:
            return self.memory.read_file(self._absolute(path))
        except OSError:
            return None

    def exists(self, path: str) -> bool:
        return self.memory.kind(self._absolute(path)) is not None

    def entries(self, path: str) -> list[dict[str, Any]] | None:
        """The directory's entries, or None when ``path`` is not a directory."""
        directory = self._absolute(path)
        if self.memory.kind(directory) != "dir":
            return None
        found = []
        for name in self.memory.names(directory):
            child = posixpath.join(directory, name)
            is_dir = self.memory.kind(child) == "dir"
            found.append(
                {
                    "name": name,
                    "size": 4096 if is_dir else len(self.memory.read_file(child)),
                    "type": "directory" if is_dir else "file",
                    "mod_time": self.memory.mtime(child),
                }
            )
        return found

    def _absolute(self, path: str) -> str:
        return posixpath.join(self.base, path) if path else self.base


def _make_parents(tree: MemoryTree, directory: str, path: str) -> None:
    kind = tree.kind(directory)
    if kind == "file":
        raise NotADirectoryError(f"[Errno 20] Not a directory: '{path}'")
    if kind is None:
        _make_parents(tree, posixpath.dirname(directory), path)
        try:
            tree.make_dir(directory)
        except FileExistsError:
            pass  # another upload made it meanwhile


def confined(raw: str) -> str | None:
    """``raw`` (already URL-decoded once) decoded again and made relative; None if it escapes."""
    decoded = urllib.parse.unquote(raw).lstrip("/")
    normal = posixpath.normpath(decoded) if decoded else "."
    if normal == ".." or normal.startswith("../"):
        return None
    return "" if normal == "." else normal


class Runtime:
    """The runtime's endpoints over one :class:`FileTree`; commands come from the caller."""

    def __init__(self, tree: FileTree) -> None:
        self.tree = tree

    def upload(self, filename: str | None, data: bytes | None) -> Reply:
        if filename is None or data is None:
            detail = [
                {"type": "missing", "loc": ["body", "file"], "msg": "Field required", "input": None}
            ]
            return Reply(422, {"detail": detail})
        path = confined(filename)
        if path is None:
            return Reply(403, {"message": "Access denied"})
        try:
            self.tree.write(path, data)
        except OSError as error:
            return Reply(500, {"message": f"File upload failed: {error}"})
        return Reply(200, {"message": f"File '{filename}' uploaded successfully."})

    def download(self, raw: str) -> Reply:
        path = confined(raw)
        if path is None:
            return Reply(403, {"message": "Access denied"})
        data = self.tree.read(path)
        if data is None:
            return Reply(404, {"message": "File not found"})
        name = urllib.parse.unquote(raw)
        disposition = (
            f'attachment; filename="{name}"'
            if name.isascii()
            else f"attachment; filename*=utf-8''{urllib.parse.quote(name)}"
        )
        headers = {"Content-Type": "application/octet-stream", "Content-Disposition": disposition}
        return Reply(200, data, headers)

    def list(self, raw: str) -> Reply:
        path = confined(raw)
        if path is None:
            return Reply(403, {"message": "Access denied"})
        entries = self.tree.entries(path)
        if entries is None:
            return Reply(404, {"message": "Path is not a directory"})
        return Reply(200, entries)

    def exists(self, raw: str) -> Reply:
        path = confined(raw)
        if path is None:
            return Reply(403, {"message": "Access denied"})
        return Reply(200, {"path": urllib.parse.unquote(raw), "exists": self.tree.exists(path)})


def spawn_failure(command: str) -> str | None:
    """The runtime's error text when ``command`` cannot even start, else None."""
    try:
        argv = shlex.split(command)
    except ValueError as error:
        return f"Failed to execute command: {error}"
    if not argv:
        return "Failed to execute command: list index out of range"
    return None


def timed_out(command: str, limit: float) -> dict[str, Any]:
    """The runtime's answer when a command outlived its own limit (output is lost)."""
    argv = shlex.split(command)
    stderr = f"Failed to execute command: Command '{argv!r}' timed out after {float(limit)} seconds"
    return {"stdout": "", "stderr": stderr, "exit_code": 1}


def decoded(result: dict[str, Any]) -> dict[str, Any]:
    """``stdout``/``stderr`` given as bytes decoded as the runtime does (strict UTF-8)."""
    out = dict(result)
    try:
        for key in ("stdout", "stderr"):
            if isinstance(out.get(key), bytes):
                out[key] = out[key].decode("utf-8")
    except UnicodeDecodeError as error:
        return {"stdout": "", "stderr": f"Failed to execute command: {error}", "exit_code": 1}
    return out
