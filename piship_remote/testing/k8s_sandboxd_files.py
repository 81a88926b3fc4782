"""The fake sandboxd's REST surface on one pod's root directory: ``/v1/files/{path}``
(``GET`` a file's bytes or a directory's JSON listing, ``HEAD``, an atomic ``PUT`` with parents
created and an optional ``mode``, ``DELETE`` with ``recursive``), ``/v1/health`` and
``/v1/metadata``. Errors are ``{"code", "message"}``: 403 ``PERMISSION_DENIED`` for a path
that resolves outside the root, 404 ``NOT_FOUND``, 409 ``CONFLICT`` for a non-empty
directory, 400 ``INVALID_ARGUMENT``.

Paths resolve as sandboxd resolves them (:func:`resolve`): one that starts with the root
is taken relative to it, any other (absolute or not) is joined under the root, and
symbolic links are followed, so a link out of the root is refused.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator

from werkzeug import Request, Response
from werkzeug.formparser import parse_form_data

from piship_remote.testing.recorder import json_response

__all__ = ["PathEscapes", "SandboxdFiles", "resolve"]

_FILES = "/v1/files/"
_MODE = re.compile(r"^0[0-7]{3}$")
_CHUNK = 64 * 1024


class PathEscapes(ValueError):
    """The path resolves outside the sandbox root."""


def resolve(root: str, path: str) -> str:
    """``path`` within ``root`` as sandboxd resolves it; :class:`PathEscapes` outside."""
    clean = os.path.normpath(path) if path else "."
    if clean == root:
        clean = "."
    elif clean.startswith(root + os.sep):
        clean = clean[len(root) + 1 :]
    joined = os.path.normpath(os.path.join(root, clean.lstrip("/")))
    resolved = os.path.realpath(joined)
    if resolved != root and not resolved.startswith(root + os.sep):
        raise PathEscapes(f"access denied: path {path!r}: path escapes sandbox root")
    return resolved


class SandboxdFiles:
    """The request handler of one pod's REST server."""

    def __init__(self, root: str) -> None:
        self._root = root
        self._started = time.monotonic()

    def handle(self, request: Request) -> Response:
        if request.path == "/v1/health" and request.method == "GET":
            uptime = int(time.monotonic() - self._started)
            return json_response(200, {"status": "ok", "uptime_seconds": uptime})
        if request.path == "/v1/metadata" and request.method == "GET":
            return json_response(200, {"env": {}})
        path = request.path  # decoded: a %2F is a separator, as sandboxd takes it
        if not path.startswith(_FILES):
            return _error(404, "NOT_FOUND", "no such endpoint")
        relative = path[len(_FILES) :]
        try:
            target = resolve(self._root, relative)
        except PathEscapes:
            return _error(
                403, "PERMISSION_DENIED", "path traversal outside sandbox root is forbidden"
            )
        if request.method in ("GET", "HEAD"):
            return self._get(request, target, relative)
        if request.method == "PUT":
            return self._put(request, target)
        if request.method == "DELETE":
            return self._delete(request, target)
        return _error(405, "INVALID_ARGUMENT", f"{request.method} is not served here")

    def _get(self, request: Request, target: str, relative: str) -> Response:
        try:
            info = os.stat(target)
        except FileNotFoundError:
            return _error(404, "NOT_FOUND", "path does not exist within the sandbox")
        except PermissionError:
            return _error(403, "PERMISSION_DENIED", "permission denied")
        if stat.S_ISDIR(info.st_mode):
            return json_response(200, {"path": relative, "entries": self._entries(target)})
        if request.method == "HEAD":
            response = Response(b"", content_type="application/octet-stream")
            response.headers["Content-Length"] = str(info.st_size)
            return response
        try:
            opened = open(target, "rb")  # noqa: SIM115 - closed by the generator
        except PermissionError:
            return _error(403, "PERMISSION_DENIED", "permission denied")
        return Response(_chunks(opened), content_type="application/octet-stream")

    def _entries(self, directory: str) -> list[dict[str, object]]:
        entries = []
        for name in sorted(os.listdir(directory)):
            full = os.path.join(directory, name)
            try:
                resolve(self._root, full)
                info = os.stat(full)
            except (PathEscapes, OSError):
                continue  # a link out of the root, or one that points nowhere
            modified = datetime.datetime.fromtimestamp(info.st_mtime, datetime.timezone.utc)
            entries.append(
                {
                    "name": name,
                    "size": info.st_size,
                    "type": "directory" if stat.S_ISDIR(info.st_mode) else "file",
                    "modified_at": modified.isoformat().replace("+00:00", "Z"),
                    "mode": f"0{stat.S_IMODE(info.st_mode):03o}",
                }
            )
        return entries

    def _put(self, request: Request, target: str) -> Response:
        mode_text = request.args.get("mode", "0644")
        if not _MODE.match(mode_text):
            return _error(400, "INVALID_ARGUMENT", "mode must match ^0[0-7]{3}$")
        if os.path.isdir(target):
            return _error(400, "INVALID_ARGUMENT", "target path is a directory")
        body = request.get_data()
        if request.mimetype == "multipart/form-data":
            _, _, files = parse_form_data(request.environ)
            part = files.get("file")
            if part is None:
                return _error(400, "INVALID_ARGUMENT", "the multipart body has no file part")
            body = part.read()
        parent = os.path.dirname(target)
        try:
            os.makedirs(parent, exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=".sandboxd-", dir=parent)
            with os.fdopen(handle, "wb") as out:
                out.write(body)
            os.chmod(temporary, int(mode_text, 8))
            os.replace(temporary, target)
        except (PermissionError, NotADirectoryError, FileExistsError) as error:
            return _error(403, "PERMISSION_DENIED", f"permission denied: {error.strerror}")
        return Response(status=204)

    def _delete(self, request: Request, target: str) -> Response:
        if not os.path.lexists(target):
            return _error(404, "NOT_FOUND", "path does not exist within the sandbox")
        recursive = request.args.get("recursive", "false")
        if recursive not in ("true", "false", "1", "0"):
            return _error(400, "INVALID_ARGUMENT", "recursive must be a boolean")
        if target == self._root:
            return _error(403, "PERMISSION_DENIED", "the sandbox root cannot be removed")
        try:
            if os.path.isdir(target) and not os.path.islink(target):
                if recursive in ("true", "1"):
                    shutil.rmtree(target)
                else:
                    os.rmdir(target)
            else:
                os.remove(target)
        except OSError as error:
            if os.path.isdir(target) and os.listdir(target):
                return _error(409, "CONFLICT", "directory is not empty")
            return _error(403, "PERMISSION_DENIED", f"permission denied: {error.strerror}")
        return Response(status=204)


def _chunks(opened: object) -> Iterator[bytes]:
    with contextlib.closing(opened):  # type: ignore[type-var]
        while data := opened.read(_CHUNK):  # type: ignore[attr-defined]
            yield data


def _error(status: int, code: str, message: str) -> Response:
    return json_response(status, {"code": code, "message": message})
