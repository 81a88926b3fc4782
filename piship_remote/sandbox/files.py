"""``Sandbox.files``: read, write, list and copy files in the sandbox, streamed both ways.

    sandbox.files.write("data/input.csv", open("input.csv", "rb"))   # streamed, parents made
    print(sandbox.files.read_text("data/input.csv"))
    sandbox.files.upload("src")                        # a directory: one archive, one request
    sandbox.files.download("build/out", "results")     # into ./results, never outside it

A relative remote path is relative to the sandbox's working directory (the remote
image of the workspace root); an absolute one is used as is. Host paths obey the
policy: nothing under ``filesystem.read.deny`` is uploaded, and downloads write only
where ``filesystem.write.allow`` permits.

What comes back from a sandbox is bounded by :attr:`SandboxFiles.limits` while it is
read, and is put in place only once it all arrived: a download that fails (a limit, a
full disk, a cut connection) leaves nothing on the host.
"""

from __future__ import annotations

import functools
import io
import os
import posixpath
import secrets
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import BinaryIO

from piship_remote.backends._file_protocol import RemoteFiles, SizedChunks
from piship_remote.model.errors import (
    CONFIG_INVALID,
    FILE_NOT_FOUND,
    FILE_WRITE_FAILED,
    SANDBOX_UNAVAILABLE,
    CommandCancelled,
    PiShipError,
)
from piship_remote.model.transfer import FileInfo, SkippedPath, TransferLimits, TransferSummary
from piship_remote.sandbox._worker import Worker
from piship_remote.workspace._archive import StreamedArchives
from piship_remote.workspace._host_writes import (
    bounded_writer,
    host_write_error,
    make_parents,
    remove_directories,
)
from piship_remote.workspace._sandbox_commands import (
    STAGING_PREFIX,
    pack_tree_command,
    unpack_command,
)
from piship_remote.workspace._tree import TreeEntry, TreeWalk, inside
from piship_remote.workspace._unpack import Exclude, unpack_streamed

__all__ = ["CHUNK", "CommandRunner", "Progress", "SandboxFiles"]

CHUNK = 1024 * 1024
STAGING_DIRECTORY = "/tmp"
CommandRunner = Callable[[str], "tuple[int, str]"]
Progress = Callable[[int], None]


class SandboxFiles:
    """The file operations of one sandbox; thread-safe, usable while commands run.

    ``limits`` bounds what one download or pull writes on this host; set it to change
    them (``files.limits = TransferLimits(max_bytes=...)``).
    """

    def __init__(
        self,
        remote: RemoteFiles,
        run: CommandRunner,
        *,
        workspace: str | os.PathLike[str] | None = None,
        read_deny: Sequence[str] = (),
        write_allow: Sequence[str] = (),
        cancel: threading.Event | None = None,
        limits: TransferLimits | None = None,
    ) -> None:
        self.limits = limits if limits is not None else TransferLimits()
        self._remote = remote
        self._workspace = os.path.realpath(workspace) if workspace is not None else None
        self._run = run
        self._read_deny = tuple(os.path.realpath(path) for path in read_deny)
        self._write_allow = tuple(os.path.realpath(path) for path in write_allow)
        self._cancel = cancel
        self._root: str | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SandboxFiles(root={self._root!r})"

    # -- single files -----------------------------------------------------------

    def write(self, path: str, data: bytes | str | BinaryIO) -> FileInfo:
        """Write ``data`` (bytes, text as UTF-8, or a binary file object, streamed)."""
        return self._remote.write(self.resolve(path), _chunks(data), cancel=self._cancel)

    def read(self, path: str) -> bytes:
        """The whole file ``path`` (use :meth:`download` for a large one)."""
        buffer = io.BytesIO()
        self._remote.read(self.resolve(path), _counting(buffer.write, None), cancel=self._cancel)
        return buffer.getvalue()

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The file ``path`` decoded as ``encoding``."""
        return self.read(path).decode(encoding)

    def list(self, path: str = ".") -> list[FileInfo]:
        """The entries directly in the directory ``path``, sorted by name."""
        return sorted(
            self._remote.list_dir(self.resolve(path), cancel=self._cancel),
            key=lambda info: info.name,
        )

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path``."""
        return self._remote.stat(self.resolve(path), cancel=self._cancel) is not None

    def remove(self, path: str) -> None:
        """Remove a file, or a directory recursively (a missing path is fine)."""
        self._remote.remove(self.resolve(path), cancel=self._cancel)

    def make_dir(self, path: str) -> bool:
        """Create the directory ``path`` and its parents; ``False`` if it existed."""
        return self._remote.make_dir(self.resolve(path), cancel=self._cancel)

    def resolve(self, path: str) -> str:
        """The absolute remote path for ``path``."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise ValueError(f"a remote path must be a non-empty string, not {path!r}")
        if posixpath.isabs(path):
            return posixpath.normpath(path)
        return posixpath.normpath(posixpath.join(self.working_directory(), path))

    def working_directory(self) -> str:
        """The remote working directory (the remote image of the workspace root)."""
        with self._lock:
            if self._root is None:
                self._root = self._remote.working_directory(cancel=self._cancel)
            return self._root

    # -- copies -----------------------------------------------------------------

    def upload(
        self,
        local: str | os.PathLike[str],
        remote: str | None = None,
        *,
        progress: Progress | None = None,
    ) -> TransferSummary:
        """Copy a host file or directory into the sandbox (``cp -r local remote``)."""
        source = os.path.realpath(local)
        target = self.resolve(remote if remote is not None else self._default_remote(source))
        if any(inside(source, denied) for denied in self._read_deny):
            return TransferSummary(skipped=(SkippedPath(os.fspath(local), "read-deny"),))
        if os.path.isdir(source):
            return self._upload_tree(source, target, progress)
        if not os.path.isfile(source):
            raise _missing_host(os.fspath(local))
        with open(source, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            chunks = SizedChunks(_chunks(handle, progress), size)
            info = self._remote.write(target, chunks, cancel=self._cancel)
        return TransferSummary(1, info.size or os.path.getsize(source))

    def download(
        self, remote: str, local: str | os.PathLike[str], *, progress: Progress | None = None
    ) -> TransferSummary:
        """Copy a sandbox file or directory to the host path ``local`` (``cp -r``)."""
        source = self.resolve(remote)
        target = os.path.abspath(local)
        self._check_writable(target)
        # Most downloads are of a file: its bytes are fetched while the Stat that says
        # what the path is runs beside them, and kept only once it says "file".
        stat = Worker(lambda: self._remote.stat(source, cancel=self._cancel), "piship-files-stat")
        try:
            fetched = self._fetch_file(source, target, progress)
        except PiShipError:
            info = stat.result()
            if info is not None and info.type == "file":
                raise
            return self._download_other(info, remote, source, target, progress)
        except BaseException:
            stat.result_quietly()
            raise
        temporary, size = fetched
        try:
            info = stat.result()
            if info is None or info.type != "file":
                _unlink_quietly(temporary)
                return self._download_other(info, remote, source, target, progress)
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
    ) -> TransferSummary:
        if info is None:
            raise _missing_remote(remote)
        if info.type == "dir":
            return self._download_tree(source, target, progress)
        return TransferSummary(skipped=(SkippedPath(remote, "not a regular file"),))

    def upload_archive(self, chunks: Iterator[bytes], target: str, *, then: str = "") -> None:
        """Send a tar stream and unpack it into the remote directory ``target``.

        ``then`` is a shell line run after a successful unpack in the same command
        (one round trip fewer than a command of its own).
        """
        self.upload_archives([chunks], target, then=then)

    def upload_archives(
        self,
        archives: Iterable[Iterator[bytes]],
        target: str,
        *,
        then: str = "",
        check: Callable[[], None] = lambda: None,
    ) -> None:
        """Send tar streams one after another, each unpacked into ``target`` in order while
        the next one is sent; ``then`` runs after the last unpack, in its command.

        ``archives`` may be made as they are sent: the next one is asked for only once
        the one before has been sent. ``check()`` runs after each is sent and before it
        is unpacked: what it raises drops that archive. An unpack that fails stops the
        sending; the first failure is raised once nothing is left running.
        """
        unpacking: Worker[None] | None = None
        remaining = iter(archives)
        try:
            chunks = next(remaining, None)
            while chunks is not None:
                archive = _staged_archive()
                try:
                    self._remote.write(archive, chunks, cancel=self._cancel)
                    if unpacking is not None:
                        unpacking.result()
                    check()
                    following = next(remaining, None)
                except BaseException:
                    self._remove_quietly(archive)  # no unpack will take it away
                    raise
                last = following is None
                command = unpack_command(archive, target, then if last else "")
                unpacking = Worker(
                    functools.partial(self._unpacked, command, target), "piship-files-unpack"
                )
                chunks = following
        except BaseException:
            if unpacking is not None:
                unpacking.result_quietly()
            raise
        if unpacking is not None:
            unpacking.result()

    def upload_walk(
        self,
        walk: Iterable[TreeEntry],
        target: str,
        *,
        then: str = "",
        progress: Progress | None = None,
    ) -> None:
        """Send the entries of ``walk`` as :meth:`upload_archives` does, the first archive
        going out while the walk goes on. What the walk raises is raised once the archive
        it cut is sent; that archive is dropped and nothing after it is sent or unpacked."""
        archives = StreamedArchives(walk)
        counted = (_counted(chunks, progress) for chunks in archives)
        self.upload_archives(counted, target, then=then, check=archives.check)

    def _unpacked(self, command: str, target: str) -> None:
        self.run_checked(command, f"unpacking into {target}", code=FILE_WRITE_FAILED)

    def _remove_quietly(self, path: str) -> None:
        try:
            self._remote.remove(path)
        except (PiShipError, CommandCancelled):
            pass  # the failure being raised says more; the staged file is in /tmp

    def download_archive(
        self,
        create: str,
        archive: str,
        target: str,
        progress: Progress | None = None,
        *,
        exclude: Exclude | None = None,
    ) -> TransferSummary:
        """Run ``create`` (a shell line writing the tar ``archive``), then unpack the archive
        into ``target`` as it is read, within :attr:`limits`; ``exclude(relative, is_dir)``
        names entries to leave out, with the reason."""
        try:
            self.run_checked(create, f"packing {archive}")
            return unpack_streamed(
                lambda sink: self._remote.read(
                    archive, _counting(sink, progress), cancel=self._cancel
                ),
                target,
                may_write=self._may_write,
                exclude=exclude,
                limits=self.limits,
            )
        finally:
            self._remote.remove(archive, cancel=self._cancel)

    def run_checked(self, command: str, what: str, *, code: str = SANDBOX_UNAVAILABLE) -> str:
        """Run a helper command in the sandbox; a failure names ``what``, with ``code``
        (``FILE_WRITE_FAILED`` where it writes files the caller asked for)."""
        status, output = self._run(command)
        if status != 0:
            detail = " ".join(output.split())[-300:]
            raise PiShipError(
                code,
                f"{what} in the sandbox failed (exit {status}): {detail}",
                user_action="check that the sandbox image has tar, the place is writable and"
                " the disk has room",
                component="files",
            )
        return output

    def _upload_tree(self, source: str, target: str, progress: Progress | None) -> TransferSummary:
        walk = TreeWalk(source, read_deny=self._read_deny, use_gitignore=False)
        self.upload_walk(walk, target, progress=progress)
        return walk.summary()

    def _download_tree(
        self, source: str, target: str, progress: Progress | None
    ) -> TransferSummary:
        archive = _staged_archive()
        return self.download_archive(pack_tree_command(source, archive), archive, target, progress)

    def _fetch_file(
        self, source: str, target: str, progress: Progress | None
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
                size = self._remote.read(
                    source,
                    bounded_writer(out.write, self.limits.max_bytes, source, target, progress),
                    cancel=self._cancel,
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
        if not self._may_write(target):
            raise PiShipError(
                CONFIG_INVALID,
                f"the policy does not allow writing {target}",
                user_action="download into the workspace, or allow the place in"
                " filesystem.write.allow",
                component="files",
            )

    def _may_write(self, path: str) -> bool:
        real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        return not self._write_allow or any(inside(real, place) for place in self._write_allow)


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


def _counted(chunks: Iterator[bytes], progress: Progress | None) -> Iterator[bytes]:
    for chunk in chunks:
        if progress is not None:
            progress(len(chunk))
        yield chunk


def _counting(
    write: Callable[[bytes], object], progress: Progress | None
) -> Callable[[bytes], None]:
    def sink(chunk: bytes) -> None:
        write(chunk)
        if progress is not None:
            progress(len(chunk))

    return sink


def _staged_archive() -> str:
    """Where an archive waits in the sandbox: its ``/tmp``, writable on every service, where
    the directory above the working directory (``/home``) may be read-only."""
    return posixpath.join(STAGING_DIRECTORY, f"{STAGING_PREFIX}{_token()}.tar")


def _token() -> str:
    return secrets.token_hex(8)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _missing_remote(path: str) -> PiShipError:
    return PiShipError(
        FILE_NOT_FOUND, f"no file or directory at {path} in the sandbox", component="files"
    )


def _missing_host(path: str) -> PiShipError:
    return PiShipError(
        FILE_NOT_FOUND, f"no file or directory at {path} on this host", component="files"
    )
