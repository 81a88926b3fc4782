"""Files on a runtime that serves one root directory over REST: its REST surface for the
paths under that root, helper commands for the rest.

Both runtimes of a Kubernetes claim work this way (the router's runtime, :mod:`._files`;
sandboxd, :mod:`._sandboxd_files`). Neither has stat or mkdir, so those are idempotent
commands; a path outside the root (or one its REST surface cannot carry) moves through a
staging file under the root and one ``mv``/``cp``. The root is where the runtime's commands
start, asked once. A runtime supplies only its REST requests and how it runs a command::

    class SandboxdFiles(RootedFiles[SandboxdUse]):
        def _call(self, cancel, deadline): ...       # what one call's requests go through
        def _upload(self, call, relative, path, chunks, deadline): ...
        ...
"""

from __future__ import annotations

import posixpath
import secrets
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

from piship_remote.backends._common import SandboxErrors
from piship_remote.backends._file_protocol import write_failed
from piship_remote.backends._sandbox_commands import (
    STAGING_PREFIX,
    copy_out_command,
    list_dir_command,
    make_dir_command,
    move_in_command,
    remove_command,
    stat_command,
)
from piship_remote.backends.base import ChunkSink
from piship_remote.model.errors import FileNotFound, PiShipError
from piship_remote.model.transfer import FileInfo
from piship_remote.transport import HttpReply
from piship_remote.transport.deadline import Deadline

__all__ = [
    "FILE_TIMEOUT",
    "LIST_LIMIT",
    "TRANSFER_IDLE",
    "RootedFiles",
    "file_name",
    "is_entry",
    "listed_by_command",
    "listed_entry",
    "not_found",
    "sink_body",
]

FILE_TIMEOUT = 60.0
TRANSFER_IDLE = 60.0
LIST_LIMIT = 16 * 1024 * 1024
_TYPES = {"file": "file", "directory": "dir", "f": "file", "d": "dir", "l": "symlink"}

Call = TypeVar("Call")


class RootedFiles(ABC, Generic[Call]):
    """The ``RemoteFiles`` flow of a runtime with a REST root; ``Call`` is what one file
    call's REST requests go through (a claim held across them, or just the call's cancel)."""

    def __init__(self, errors: SandboxErrors, workdir: str | None) -> None:
        self._errors = errors
        self._workdir = workdir
        self._lock = threading.Lock()
        self._roots: dict[str, str] = {}

    # -- RemoteFiles ------------------------------------------------------------------

    def working_directory(
        self, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> str:
        if self._workdir is not None:
            return self._workdir
        with self._call(cancel) as call:
            return self._root(call, deadline)

    def stat(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> FileInfo | None:
        if self._known_missing(path, cancel, deadline):
            return None
        output = self._command(stat_command(path), f"checking {path}", cancel, deadline)
        kind, _, size = output.strip().partition(" ")
        if kind == "missing":
            return None
        if kind not in ("file", "dir", "symlink", "other"):
            raise self._errors(f"checking {path} failed: the sandbox answered {kind!r}")
        return FileInfo(path, file_name(path), kind, int(size) if size.isdigit() else 0)

    def list_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> list[FileInfo]:
        with self._call(cancel) as call:
            relative = self._relative(call, path, deadline)
            if relative is not None:
                return self._list(call, relative, path, deadline)
        output = self._command(list_dir_command(path), f"listing {path}", cancel, deadline)
        return listed_by_command(path, output)

    def make_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> bool:
        output = self._command(
            make_dir_command(path), f"making {path}", cancel, deadline, writing=path
        )
        return output.strip() == "made"

    def remove(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> None:
        if not self._removed_over_rest(path, cancel, deadline):
            self._command(remove_command(path), f"removing {path}", cancel, deadline, writing=path)

    def write(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> FileInfo:
        """Uploaded in place when the REST surface carries ``path``, else uploaded to a
        staging file under the root and moved in by a command."""
        with self._call(cancel) as call:
            relative = self._relative(call, path, deadline)
            if relative is not None and self._carries(relative):
                size = self._upload(call, relative, path, chunks, deadline)
                return FileInfo(path, file_name(path), "file", size)
            staging = _staging()
            size = self._upload(call, staging, path, chunks, deadline)
            source = posixpath.join(self._root(call, deadline), staging)
        self._command(
            move_in_command(source, path, posixpath.dirname(path) or "/"),
            f"writing {path}",
            cancel,
            deadline,
            writing=path,
        )
        return FileInfo(path, file_name(path), "file", size)

    def read(
        self,
        path: str,
        sink: ChunkSink,
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> int:
        """Downloaded in place when the REST surface carries ``path``, else copied to a
        staging file under the root by a command, downloaded, and removed."""
        with self._call(cancel) as call:
            relative = self._relative(call, path, deadline)
            if relative is not None and self._carries(relative):
                return self._download(call, relative, path, sink, deadline)
            staging = _staging()
            copy = posixpath.join(self._root(call, deadline), staging)
        output = self._command(copy_out_command(path, copy), f"reading {path}", cancel, deadline)
        if output.strip() != "copied":
            raise not_found(path, "file")
        try:
            with self._call(cancel) as call:
                return self._download(call, staging, path, sink, deadline)
        finally:
            self._command(remove_command(copy), f"cleaning up after reading {path}", None, None)

    # -- what a runtime supplies --------------------------------------------------------

    @abstractmethod
    def _call(self, cancel: threading.Event | None) -> AbstractContextManager[Call]:
        """What one file call's REST requests (and its root) go through."""

    @abstractmethod
    def _root_key(self, call: Call) -> str:
        """What the root is asked once for (one runtime, or one claim)."""

    @abstractmethod
    def _ask_root(self, call: Call, deadline: Deadline | None) -> str:
        """The runtime's root, an absolute path, asked of the sandbox."""

    @abstractmethod
    def _carries(self, relative: str) -> bool:
        """Whether a read or write of ``relative`` (under the root) goes over REST."""

    @abstractmethod
    def _execute(
        self, script: str, what: str, cancel: threading.Event | None, deadline: Deadline | None
    ) -> tuple[int | None, str, str]:
        """Run the helper ``script``: its exit code (``None``: unknown), stdout and stderr."""

    @abstractmethod
    def _list(
        self, call: Call, relative: str, path: str, deadline: Deadline | None
    ) -> list[FileInfo]:
        """The entries of the directory ``path`` (``relative`` under the root) over REST."""

    @abstractmethod
    def _upload(
        self,
        call: Call,
        relative: str,
        path: str,
        chunks: Iterable[bytes],
        deadline: Deadline | None,
    ) -> int:
        """Write ``chunks`` to ``relative`` under the root (``path`` names it in errors)."""

    @abstractmethod
    def _download(
        self, call: Call, relative: str, path: str, sink: ChunkSink, deadline: Deadline | None
    ) -> int:
        """Send the file ``relative`` under the root to ``sink``; its size."""

    def _known_missing(
        self, path: str, cancel: threading.Event | None, deadline: Deadline | None
    ) -> bool:
        """Whether the REST surface tells, before any command, that ``path`` is missing."""
        return False

    def _removed_over_rest(
        self, path: str, cancel: threading.Event | None, deadline: Deadline | None
    ) -> bool:
        """Remove ``path`` over REST when the surface can; whether it did."""
        return False

    # -- the pieces -------------------------------------------------------------------

    def _root(self, call: Call, deadline: Deadline | None) -> str:
        """The runtime's root (where its commands start), asked once."""
        key = self._root_key(call)
        with self._lock:
            known = self._roots.get(key)
        if known is not None:
            return known
        root = self._ask_root(call, deadline)
        with self._lock:
            self._roots[key] = root
        return root

    def _relative(self, call: Call, path: str, deadline: Deadline | None) -> str | None:
        """``path`` relative to the root (``""``: the root), or ``None`` outside it."""
        relative = posixpath.relpath(posixpath.normpath(path), self._root(call, deadline))
        if relative == ".":
            return ""
        if relative == ".." or relative.startswith("../"):
            return None
        return relative

    def _command(
        self,
        script: str,
        what: str,
        cancel: threading.Event | None,
        deadline: Deadline | None,
        *,
        writing: str | None = None,
    ) -> str:
        """Run an idempotent helper ``script``; its stdout, or an error naming ``what``
        (``FILE_WRITE_FAILED`` for the path ``writing`` when the script exits non-zero)."""
        code, out, err = self._execute(script, what, cancel, deadline)
        if code != 0:
            detail = " ".join((err or out).split())[-300:]
            if writing is not None:
                raise write_failed(writing, detail)
            raise self._errors(f"{what} in the sandbox failed (exit {code}): {detail}")
        return out


def listed_by_command(path: str, output: str) -> list[FileInfo]:
    """The entries of the directory ``path`` from the output of its ``list_dir_command``."""
    if output.strip() == "missing":
        raise not_found(path, "directory")
    entries = []
    for record in output.split("\0"):
        kind, _, rest = record.partition(" ")
        size, _, name = rest.partition(" ")
        if name:
            entries.append(
                FileInfo(
                    posixpath.join(path, name),
                    name,
                    _TYPES.get(kind, "other"),
                    int(size) if size.isdigit() else 0,
                )
            )
    return entries


def is_entry(entry: object) -> bool:
    """Whether a REST listing's ``entry`` is one (an object with a ``name``)."""
    return isinstance(entry, dict) and isinstance(entry.get("name"), str)


def listed_entry(directory: str, entry: dict[str, Any]) -> FileInfo:
    """A REST listing's ``entry`` of ``directory``."""
    name = str(entry["name"])
    size = entry.get("size")
    kind = _TYPES.get(str(entry.get("type")), "other")
    return FileInfo(
        posixpath.join(directory, name),
        name,
        kind,
        size if isinstance(size, int) and not isinstance(size, bool) and kind == "file" else 0,
    )


def sink_body(response: HttpReply, sink: ChunkSink) -> int:
    """Send a download's body to ``sink``; its size (a ``TransportError`` mid-body)."""
    total = 0
    for chunk in response.iter_raw():
        sink(bytes(chunk))
        total += len(chunk)
    return total


def file_name(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) or "/"


def not_found(path: str, what: str) -> PiShipError:
    return FileNotFound(f"no {what} at {path} in the sandbox", component="files")


def _staging() -> str:
    return f"{STAGING_PREFIX}{secrets.token_hex(8)}.part"
