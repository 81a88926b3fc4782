"""Tar archives to and from one sandbox, and the helper commands that pack and unpack them.

What :class:`~piship_remote.sandbox.files.SandboxFiles` copies whole directories with,
and what workspace sync is made of; not part of the public ``Sandbox.files``::

    archives = RemoteArchives(instance.files(), run_helper, FileCalls(adapter="e2b"))
    with archives.calls.begin(timeout, cancel) as call:
        archives.upload_walk(TreeWalk(source), "/home/user/src", call)

Every method takes the :class:`~piship_remote.workspace._file_calls.FileCall` of the
operation it is part of: its requests and helper commands carry the call's token and
deadline, so a timeout, a cancel or dispose stops them all.
"""

from __future__ import annotations

import functools
import os
import posixpath
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

from piship_remote.backends._sandbox_commands import STAGING_PREFIX, unpack_command
from piship_remote.backends.base import ChunkSink, RemoteFiles
from piship_remote.model.errors import (
    FILE_WRITE_FAILED,
    SANDBOX_UNAVAILABLE,
    CommandCancelled,
    PiShipError,
    error_for,
)
from piship_remote.model.transfer import TransferLimits, TransferSummary
from piship_remote.transport.deadline import Deadline
from piship_remote.workspace._archive import StreamedArchives
from piship_remote.workspace._file_calls import FileCall, FileCalls
from piship_remote.workspace._tree import TreeEntry, inside
from piship_remote.workspace._unpack import Exclude, unpack_streamed
from piship_remote.workspace._worker import Worker

__all__ = [
    "CLEANUP_TIMEOUT",
    "STAGING_DIRECTORY",
    "CommandRunner",
    "Progress",
    "RemoteArchives",
    "counting",
    "staged_archive",
]

STAGING_DIRECTORY = "/tmp"
CLEANUP_TIMEOUT = 5.0  # seconds a staged archive's removal may take after a failure
CommandRunner = Callable[[str, FileCall], "tuple[int, str]"]
"""Runs a helper command in the sandbox as part of a file call: its exit status and output."""
Progress = Callable[[int], None]


class RemoteArchives:
    """Archives and helper commands for one sandbox, under the operations of ``calls``.

    ``limits`` bounds what one download or pull writes on this host; ``write_allow``
    names the host places they may write (none given: anywhere).
    """

    def __init__(
        self,
        remote: RemoteFiles,
        run: CommandRunner,
        calls: FileCalls | None = None,
        *,
        write_allow: Sequence[str] = (),
        limits: TransferLimits | None = None,
    ) -> None:
        self.remote = remote
        self.calls = calls if calls is not None else FileCalls()
        self.limits = limits if limits is not None else TransferLimits()
        self._run = run
        self._write_allow = tuple(os.path.realpath(path) for path in write_allow)
        self.root: str | None = None  # the working directory, once asked
        self._lock = threading.Lock()

    def working_directory(self, call: FileCall) -> str:
        """The remote working directory (the remote image of the workspace root), asked once."""
        with self._lock:
            if self.root is not None:
                return self.root
        root = self.remote.working_directory(cancel=call.cancel, deadline=call.deadline)
        with self._lock:
            self.root = root
        return root

    def may_write(self, path: str) -> bool:
        """Whether the policy lets a download write the host path ``path``."""
        real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        return not self._write_allow or any(inside(real, place) for place in self._write_allow)

    def upload_archives(
        self,
        archives: Iterable[Iterator[bytes]],
        target: str,
        call: FileCall,
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
                archive = staged_archive()
                try:
                    self.remote.write(archive, chunks, cancel=call.cancel, deadline=call.deadline)
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
                    functools.partial(self._unpacked, command, target, call),
                    "piship-files-unpack",
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
        call: FileCall,
        *,
        then: str = "",
        progress: Progress | None = None,
    ) -> None:
        """Send the entries of ``walk`` as :meth:`upload_archives` does, the first archive
        going out while the walk goes on. What the walk raises is raised once the archive
        it cut is sent; that archive is dropped and nothing after it is sent or unpacked."""
        archives = StreamedArchives(walk)
        counted = (_counted(chunks, progress) for chunks in archives)
        self.upload_archives(counted, target, call, then=then, check=archives.check)

    def download_archive(
        self,
        create: str,
        archive: str,
        target: str,
        call: FileCall,
        progress: Progress | None = None,
        *,
        exclude: Exclude | None = None,
    ) -> TransferSummary:
        """Run ``create`` (a shell line writing the tar ``archive``), then unpack the archive
        into ``target`` as it is read, within :attr:`limits`; ``exclude(relative, is_dir)``
        names entries to leave out, with the reason."""
        try:
            self.run_checked(create, f"packing {archive}", call)
            summary = unpack_streamed(
                lambda sink: self.remote.read(
                    archive, counting(sink, progress), cancel=call.cancel, deadline=call.deadline
                ),
                target,
                may_write=self.may_write,
                exclude=exclude,
                limits=self.limits,
            )
        except BaseException:
            self._remove_quietly(archive)
            raise
        self._remove(archive)
        return summary

    def run_checked(
        self, command: str, what: str, call: FileCall, *, code: str = SANDBOX_UNAVAILABLE
    ) -> str:
        """Run a helper command in the sandbox; a failure names ``what``, with ``code``
        (``FILE_WRITE_FAILED`` where it writes files the caller asked for)."""
        status, output = self._run(command, call)
        if status != 0:
            detail = " ".join(output.split())[-300:]
            raise error_for(
                code,
                f"{what} in the sandbox failed (exit {status}): {detail}",
                user_action="check that the sandbox image has tar, the place is writable and"
                " the disk has room",
                component="files",
            )
        return output

    def _unpacked(self, command: str, target: str, call: FileCall) -> None:
        self.run_checked(command, f"unpacking into {target}", call, code=FILE_WRITE_FAILED)

    def _remove(self, path: str) -> None:
        """Remove a staged archive, also after a timeout or a cancel (not after dispose),
        for at most ``CLEANUP_TIMEOUT`` seconds."""
        deadline = Deadline.after(CLEANUP_TIMEOUT)
        self.remote.remove(path, cancel=self.calls.disposal, deadline=deadline)

    def _remove_quietly(self, path: str) -> None:
        try:
            self._remove(path)
        except (PiShipError, CommandCancelled):
            pass  # the failure being raised says more; the staged file is in /tmp


def counting(write: Callable[[bytes], object], progress: Progress | None) -> ChunkSink:
    """A sink that writes each chunk with ``write`` and reports its size to ``progress``."""

    def sink(chunk: bytes) -> None:
        write(chunk)
        if progress is not None:
            progress(len(chunk))

    return sink


def staged_archive() -> str:
    """Where an archive waits in the sandbox: its ``/tmp``, writable on every service, where
    the directory above the working directory (``/home``) may be read-only."""
    return posixpath.join(STAGING_DIRECTORY, f"{STAGING_PREFIX}{secrets.token_hex(8)}.tar")


def _counted(chunks: Iterator[bytes], progress: Progress | None) -> Iterator[bytes]:
    for chunk in chunks:
        if progress is not None:
            progress(len(chunk))
        yield chunk
