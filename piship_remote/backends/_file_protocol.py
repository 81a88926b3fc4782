"""What a backend instance offers for files: the protocol ``Sandbox.files`` is built on.

Paths given to a :class:`RemoteFiles` are absolute remote paths (the façade resolves
relative ones against :meth:`RemoteFiles.working_directory`). Every call takes an
optional ``cancel`` event and raises ``CommandCancelled`` promptly when it is set, and
an optional :class:`~piship_remote.transport.deadline.Deadline` that bounds each of its
requests (:func:`request_timeout`); a missing path is ``PiShipError`` with code
``FILE_NOT_FOUND``, a write the sandbox refused (read-only, full, a file where a
folder must be) ``FILE_WRITE_FAILED`` (:func:`write_failed`), and the sandbox stays
usable; data moves in chunks, so memory stays bounded whatever the file's size::

    files = instance.files()
    files.write("/home/user/data.csv", iter([b"a,b\\n", b"1,2\\n"]))
    files.read("/home/user/data.csv", sink=sys.stdout.buffer.write)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, runtime_checkable

from piship_remote.model.errors import FileWriteFailed, PiShipError
from piship_remote.model.transfer import FileInfo
from piship_remote.transport.deadline import Deadline

__all__ = [
    "ChunkSink",
    "RemoteFiles",
    "SizedChunks",
    "SupportsFiles",
    "request_timeout",
    "write_failed",
]

ChunkSink = Callable[[bytes], None]


class SizedChunks:
    """An upload's chunks with the byte count they add up to, when it is known beforehand.

    A backend may then send the body with its length instead of chunked; exactly
    ``size`` bytes are sent (a source that grew is cut at ``size``; one that came up
    short fails the upload).
    """

    def __init__(self, chunks: Iterable[bytes], size: int) -> None:
        self.chunks = chunks
        self.size = size

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.chunks)


@runtime_checkable
class RemoteFiles(Protocol):
    """File operations on one remote sandbox; thread-safe beside running commands."""

    def working_directory(
        self, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> str:
        """The absolute remote directory that relative paths (and the workspace) map to."""
        ...

    def stat(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> FileInfo | None:
        """The entry at ``path`` (a symlink itself, not its target), or ``None`` if missing."""
        ...

    def list_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> list[FileInfo]:
        """The entries directly in the directory ``path``, in any order."""
        ...

    def make_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> bool:
        """Create ``path`` and its parents; ``False`` when it already was a directory."""
        ...

    def remove(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> None:
        """Remove a file, or a directory recursively; a missing path is not an error."""
        ...

    def write(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> FileInfo:
        """Stream ``chunks`` into the file ``path`` (parents created, replaced if present)."""
        ...

    def read(
        self,
        path: str,
        sink: ChunkSink,
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> int:
        """Stream the file ``path`` into ``sink`` chunk by chunk; returns the byte count."""
        ...


@runtime_checkable
class SupportsFiles(Protocol):
    """A backend instance that can move files."""

    def files(self) -> RemoteFiles:
        """The file operations of this instance's sandbox."""
        ...


def write_failed(path: str, why: str) -> PiShipError:
    """The sandbox refused to write the file ``path`` (``why``, its own words)."""
    return FileWriteFailed(
        f"writing {path} in the sandbox failed: {why or 'refused'}",
        user_action="write to a writable place in the sandbox (its working directory or /tmp)"
        " with room on its disk",
        component="files",
    )


def request_timeout(limit: float | None, deadline: Deadline | None) -> float | None:
    """The timeout for one request of a call bounded by ``deadline``: ``limit`` (the
    request's own bound, ``None``: none), or the time left before ``deadline`` when that
    is less (``0.0`` once it has passed, which the transport reports as timed out)."""
    left = None if deadline is None else deadline.remaining()
    if left is None:
        return limit
    return left if limit is None else min(limit, left)
