"""``Sandbox.files``: read, write, list and copy files in the sandbox, streamed both ways.

    sandbox.files.write("data/input.csv", open("input.csv", "rb"))   # streamed, parents made
    print(sandbox.files.read_text("data/input.csv", timeout=10))
    sandbox.files.upload("src", cancel=stop)           # a directory: one archive, one request
    sandbox.files.download("build/out", "results")     # into ./results, never outside it

A relative remote path is relative to the sandbox's working directory (the remote
image of the workspace root); an absolute one is used as is. Host paths obey the
policy: nothing under ``filesystem.read.deny`` is uploaded, and downloads write only
where ``filesystem.write.allow`` permits.

Every operation is governed like ``Sandbox.exec``: ``timeout`` (seconds; ``None``: none,
zero or less is ``CONFIG_INVALID``) stops it and raises :class:`CommandTimeout`;
setting ``cancel`` (a ``threading.Event``) stops it and raises :class:`CommandCancelled`
(at once, before any request, when it is already set); ``Sandbox.dispose()`` stops it
and it raises ``PiShipError`` ``SANDBOX_UNAVAILABLE`` mentioning "disposed". A stopped
transfer ends within milliseconds, whatever request it was blocked in.

What comes back from a sandbox is bounded by :attr:`SandboxFiles.limits` while it is
read (its size, its entries, the host filesystem's free space it leaves), and is put in
place only once it all arrived: a download that fails (a limit, a full disk, a cut
connection, a timeout) leaves nothing on the host.
"""

from __future__ import annotations

import io
import os
import posixpath
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO, TypeVar

from piship_remote.backends._file_protocol import SizedChunks
from piship_remote.backends._sandbox_commands import pack_tree_command
from piship_remote.model.errors import (
    ConfigInvalid,
    FileNotFound,
    PiShipError,
)
from piship_remote.model.transfer import FileInfo, SkippedPath, TransferLimits, TransferSummary
from piship_remote.telemetry import Telemetry
from piship_remote.telemetry.names import TRANSFER_SPAN
from piship_remote.workspace._file_calls import FileCall
from piship_remote.workspace._host_writes import (
    SpaceReserve,
    bounded_writer,
    host_write_error,
    make_parents,
    remove_directories,
)
from piship_remote.workspace._remote_archives import (
    Progress,
    RemoteArchives,
    staged_archive,
)
from piship_remote.workspace._tree import TreeWalk, inside
from piship_remote.workspace._worker import Worker

__all__ = ["CHUNK", "READ_LIMIT", "Progress", "SandboxFiles"]

_T = TypeVar("_T")

CHUNK = 1024 * 1024
READ_LIMIT = 64 * 1024 * 1024
"""``read``'s default ``max_bytes``: what one call may hold in memory (64 MiB)."""


class SandboxFiles:
    """The file operations of one sandbox; thread-safe, usable while commands run.

    Each operation takes ``timeout`` (seconds) and ``cancel`` (a ``threading.Event``)
    as ``Sandbox.exec`` does: on expiry it stops and raises :class:`CommandTimeout`,
    on ``cancel`` :class:`CommandCancelled`; ``Sandbox.dispose()`` stops it with
    ``PiShipError`` ``SANDBOX_UNAVAILABLE`` ("disposed").

    ``limits`` bounds what one download or pull writes on this host, and the free space
    it leaves there; set it to change them (``files.limits = TransferLimits(max_bytes=...)``).
    :meth:`read` holds a file in memory, so it takes its own ``max_bytes``.
    """

    def __init__(
        self,
        archives: RemoteArchives,
        *,
        workspace: str | os.PathLike[str] | None = None,
        read_deny: Sequence[str] = (),
        telemetry: Telemetry | None = None,
        sandbox_id: Callable[[], str | None] | None = None,
    ) -> None:
        self._archives = archives
        self._telemetry = telemetry or Telemetry("remote")
        self._sandbox_id = sandbox_id
        self._remote = archives.remote
        self._calls = archives.calls
        self._workspace = os.path.realpath(workspace) if workspace is not None else None
        self._read_deny = tuple(os.path.realpath(path) for path in read_deny)

    def __repr__(self) -> str:
        return f"SandboxFiles(root={self._archives.root!r})"

    @property
    def limits(self) -> TransferLimits:
        return self._archives.limits

    @limits.setter
    def limits(self, limits: TransferLimits) -> None:
        self._archives.limits = limits

    # -- single files -----------------------------------------------------------

    def write(
        self,
        path: str,
        data: bytes | str | BinaryIO,
        *,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> FileInfo:
        """Write ``data`` (bytes, text as UTF-8, or a binary file object, streamed).

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            FileWriteFailed: the file could not be written there (read-only, full, a file where a
                folder must be).
            ConfigInvalid: a path the operation may not use, or a bad argument.
            SandboxUnavailable: the sandbox is gone, disposed, or failed during the transfer.
            PiShipError: any other failure the service reports, with its code.
        """

        def write() -> FileInfo:
            with self._calls.begin(timeout, cancel) as call:
                target = self._resolve(path, call)
                return self._remote.write(
                    target, _chunks(data), cancel=call.cancel, deadline=call.deadline
                )

        return self._moved("upload", write, _info_size)

    def read(
        self,
        path: str,
        *,
        max_bytes: int = READ_LIMIT,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> bytes:
        """The whole file ``path``, held in memory: at most ``max_bytes`` (64 MiB by default).

        A larger file raises ``PiShipError`` ``CONFIG_INVALID`` naming :meth:`download`
        (which streams to a file) as soon as ``max_bytes`` arrived: no more is read.

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            FileNotFound: nothing is at the path.
            ConfigInvalid: the file is larger than ``max_bytes`` (use ``download``), or a bad
                argument.
            SandboxUnavailable: the sandbox is gone, disposed, or failed during the transfer.
            PiShipError: any other failure the service reports, with its code.
        """
        _check_read_limit(max_bytes)

        def read() -> bytes:
            buffer = io.BytesIO()
            with self._calls.begin(timeout, cancel) as call:
                self._remote.read(
                    self._resolve(path, call),
                    _held(buffer.write, max_bytes, path),
                    cancel=call.cancel,
                    deadline=call.deadline,
                )
            return buffer.getvalue()

        return self._moved("download", read, len)

    def read_text(
        self,
        path: str,
        encoding: str = "utf-8",
        *,
        max_bytes: int = READ_LIMIT,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> str:
        """The file ``path`` decoded as ``encoding`` (at most ``max_bytes``, as :meth:`read`).

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            FileNotFound: nothing is at the path.
            ConfigInvalid: the file is larger than ``max_bytes`` (use ``download``), or a bad
                argument.
            UnicodeDecodeError: the file is not text in ``encoding``.
            SandboxUnavailable: the sandbox is gone, disposed, or failed during the transfer.
            PiShipError: any other failure the service reports, with its code.
        """
        return self.read(path, max_bytes=max_bytes, timeout=timeout, cancel=cancel).decode(
            encoding
        )

    def list(
        self,
        path: str = ".",
        *,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> list[FileInfo]:
        """The entries directly in the directory ``path``, sorted by name.

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            FileNotFound: nothing is at the path.
            ConfigInvalid: a path the operation may not use, or a bad argument.
            SandboxUnavailable: the sandbox is gone, disposed, or failed during the transfer.
            PiShipError: any other failure the service reports, with its code.
        """
        with self._calls.begin(timeout, cancel) as call:
            entries = self._remote.list_dir(
                self._resolve(path, call), cancel=call.cancel, deadline=call.deadline
            )
        return sorted(entries, key=lambda info: info.name)

    def exists(
        self, path: str, *, timeout: float | None = None, cancel: threading.Event | None = None
    ) -> bool:
        """Whether anything is at ``path``.

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            ConfigInvalid: a path the operation may not use, or a bad argument.
            SandboxUnavailable: the sandbox is gone, disposed, or failed during the transfer.
            PiShipError: any other failure the service reports, with its code.
        """
        with self._calls.begin(timeout, cancel) as call:
            found = self._remote.stat(
                self._resolve(path, call), cancel=call.cancel, deadline=call.deadline
            )
        return found is not None

    def remove(
        self, path: str, *, timeout: float | None = None, cancel: threading.Event | None = None
    ) -> None:
        """Remove a file, or a directory recursively (a missing path is fine).

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            ConfigInvalid: a path the operation may not use, or a bad argument.
            SandboxUnavailable: the sandbox is gone, disposed, or failed during the transfer.
            PiShipError: any other failure the service reports, with its code.
        """
        with self._calls.begin(timeout, cancel) as call:
            self._remote.remove(
                self._resolve(path, call), cancel=call.cancel, deadline=call.deadline
            )

    def make_dir(
        self, path: str, *, timeout: float | None = None, cancel: threading.Event | None = None
    ) -> bool:
        """Create the directory ``path`` and its parents; ``False`` if it existed.

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            FileWriteFailed: the file could not be written there (read-only, full, a file where a
                folder must be).
            ConfigInvalid: a path the operation may not use, or a bad argument.
            SandboxUnavailable: the sandbox is gone, disposed, or failed during the transfer.
            PiShipError: any other failure the service reports, with its code.
        """
        with self._calls.begin(timeout, cancel) as call:
            return self._remote.make_dir(
                self._resolve(path, call), cancel=call.cancel, deadline=call.deadline
            )

    def resolve(
        self, path: str, *, timeout: float | None = None, cancel: threading.Event | None = None
    ) -> str:
        """The absolute remote path for ``path``."""
        with self._calls.begin(timeout, cancel) as call:
            return self._resolve(path, call)

    def working_directory(
        self, *, timeout: float | None = None, cancel: threading.Event | None = None
    ) -> str:
        """The remote working directory (the remote image of the workspace root)."""
        with self._calls.begin(timeout, cancel) as call:
            return self._archives.working_directory(call)

    def _resolve(self, path: str, call: FileCall) -> str:
        if not isinstance(path, str) or not path or "\0" in path:
            raise ValueError(f"a remote path must be a non-empty string, not {path!r}")
        if posixpath.isabs(path):
            return posixpath.normpath(path)
        return posixpath.normpath(posixpath.join(self._archives.working_directory(call), path))

    # -- copies -----------------------------------------------------------------

    def upload(
        self,
        local: str | os.PathLike[str],
        remote: str | None = None,
        *,
        progress: Progress | None = None,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> TransferSummary:
        """Copy a host file or directory into the sandbox (``cp -r local remote``).

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            FileNotFound: nothing is at ``local`` on this host.
            FileWriteFailed: the file could not be written there (read-only, full, a file where a
                folder must be).
            ConfigInvalid: a path the operation may not use, or a bad argument.
            SandboxUnavailable: the sandbox is gone, disposed, or failed during the transfer.
            PiShipError: any other failure the service reports, with its code.
        """

        def upload() -> TransferSummary:
            with self._calls.begin(timeout, cancel) as call:
                return self._upload(local, remote, progress, call)

        return self._moved("upload", upload, _summary_bytes)

    def _upload(
        self,
        local: str | os.PathLike[str],
        remote: str | None,
        progress: Progress | None,
        call: FileCall,
    ) -> TransferSummary:
        source = os.path.realpath(local)
        target = self._resolve(remote if remote is not None else self._default_remote(source), call)
        if any(inside(source, denied) for denied in self._read_deny):
            return TransferSummary(skipped=(SkippedPath(os.fspath(local), "read-deny"),))
        if os.path.isdir(source):
            walk = TreeWalk(source, read_deny=self._read_deny, use_gitignore=False)
            self._archives.upload_walk(walk, target, call, progress=progress)
            return walk.summary()
        if not os.path.isfile(source):
            raise _missing_host(os.fspath(local))
        with open(source, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            chunks = SizedChunks(_chunks(handle, progress), size)
            info = self._remote.write(target, chunks, cancel=call.cancel, deadline=call.deadline)
        return TransferSummary(1, info.size or os.path.getsize(source))

    def download(
        self,
        remote: str,
        local: str | os.PathLike[str],
        *,
        progress: Progress | None = None,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> TransferSummary:
        """Copy a sandbox file or directory to the host path ``local`` (``cp -r``).

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            FileNotFound: nothing is at ``remote`` in the sandbox.
            FileWriteFailed: a file could not be written on this host.
            ConfigInvalid: a path the operation may not use, or a bad argument.
            SandboxUnavailable: the sandbox is gone, disposed, or failed during the transfer.
            PiShipError: any other failure the service reports, with its code.
        """

        def download() -> TransferSummary:
            with self._calls.begin(timeout, cancel) as call:
                return self._download(remote, local, progress, call)

        return self._moved("download", download, _summary_bytes)

    def _moved(self, direction: str, move: Callable[[], _T], size: Callable[[_T], int]) -> _T:
        """A transfer in its span, its bytes counted (nothing recorded without the extra)."""
        return self._telemetry.transfer(TRANSFER_SPAN, direction, move, size, self._sandbox_id)

    def _download(
        self,
        remote: str,
        local: str | os.PathLike[str],
        progress: Progress | None,
        call: FileCall,
    ) -> TransferSummary:
        source = self._resolve(remote, call)
        target = os.path.abspath(local)
        self._check_writable(target)
        # Most downloads are of a file: its bytes are fetched while the Stat that says
        # what the path is runs beside them, and kept only once it says "file".
        stat = Worker(
            lambda: self._remote.stat(source, cancel=call.cancel, deadline=call.deadline),
            "piship-files-stat",
        )
        try:
            fetched = self._fetch_file(source, target, progress, call)
        except PiShipError:
            info = stat.result()
            if info is not None and info.type == "file":
                raise
            return self._download_other(info, remote, source, target, progress, call)
        except BaseException:
            stat.result_quietly()
            raise
        temporary, size = fetched
        try:
            info = stat.result()
            if info is None or info.type != "file":
                _unlink_quietly(temporary)
                return self._download_other(info, remote, source, target, progress, call)
            os.replace(temporary, target)
        except OSError as e:
            _unlink_quietly(temporary)
            raise host_write_error(target, e) from None
        except BaseException:
            _unlink_quietly(temporary)
            raise
        return TransferSummary(1, size)

    def _download_other(
        self,
        info: FileInfo | None,
        remote: str,
        source: str,
        target: str,
        progress: Progress | None,
        call: FileCall,
    ) -> TransferSummary:
        if info is None:
            raise _missing_remote(remote)
        if info.type == "dir":
            archive = staged_archive()
            return self._archives.download_archive(
                pack_tree_command(source, archive), archive, target, call, progress
            )
        return TransferSummary(skipped=(SkippedPath(remote, "not a regular file"),))

    def _fetch_file(
        self, source: str, target: str, progress: Progress | None, call: FileCall
    ) -> tuple[str, int]:
        """The remote file in a temporary file beside ``target``: its path and size, at most
        :attr:`limits` ``.max_bytes``; on any failure nothing is left (not even the
        directories made for it)."""
        made = make_parents(target)
        try:
            handle, temporary = tempfile.mkstemp(
                prefix=".piship-", suffix=".part", dir=os.path.dirname(target)
            )
        except OSError as e:
            remove_directories(made)
            raise host_write_error(target, e) from None
        try:
            with os.fdopen(handle, "wb") as out:
                limits = self.limits
                reserve = SpaceReserve(target, limits.min_free_bytes)
                size = self._remote.read(
                    source,
                    bounded_writer(out.write, limits.max_bytes, source, target, progress, reserve),
                    cancel=call.cancel,
                    deadline=call.deadline,
                )
        except BaseException:
            _unlink_quietly(temporary)
            remove_directories(made)
            raise
        return temporary, size

    def _default_remote(self, source: str) -> str:
        """The same path relative to the workspace, or the base name for a path outside it."""
        if self._workspace is not None and inside(source, self._workspace):
            relative = os.path.relpath(source, self._workspace).replace(os.sep, "/")
            return relative
        return os.path.basename(source)

    def _check_writable(self, target: str) -> None:
        if not self._archives.may_write(target):
            raise ConfigInvalid(
                f"the policy does not allow writing {target}",
                user_action="download into the workspace, or allow the place in"
                " filesystem.write.allow",
                component="files",
            )


def _chunks(data: bytes | str | BinaryIO, progress: Progress | None = None) -> Iterator[bytes]:
    if isinstance(data, str):
        data = data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        yield bytes(data)
        return
    if not hasattr(data, "read"):
        raise TypeError(
            f"write() takes bytes, str or a binary file object, not {type(data).__name__}"
        )
    while chunk := data.read(CHUNK):
        if isinstance(chunk, str):
            raise TypeError("write() needs a file opened in binary mode ('rb')")
        if progress is not None:
            progress(len(chunk))
        yield chunk


def _info_size(info: FileInfo) -> int:
    return info.size or 0


def _summary_bytes(summary: TransferSummary) -> int:
    return summary.bytes


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _missing_remote(path: str) -> PiShipError:
    return FileNotFound(f"no file or directory at {path} in the sandbox", component="files")


def _missing_host(path: str) -> PiShipError:
    return FileNotFound(f"no file or directory at {path} on this host", component="files")


def _check_read_limit(max_bytes: int) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ConfigInvalid(
            f"max_bytes must be a positive int, not {max_bytes!r}",
            component="files",
        )


def _held(write: Callable[[bytes], object], limit: int, path: str) -> Callable[[bytes], None]:
    """``write`` up to ``limit`` bytes; past it, the error that names ``download()``."""
    held = 0

    def sink(chunk: bytes) -> None:
        nonlocal held
        held += len(chunk)
        if held > limit:
            raise ConfigInvalid(
                f"{path} in the sandbox is larger than read's max_bytes ({limit} bytes); "
                "nothing was kept",
                user_action="copy it to a file with files.download(), or pass a larger "
                "max_bytes",
                component="files",
            )
        write(chunk)

    return sink
