"""Writing on this host what a sandbox sends: a failure is a ``PiShipError`` naming the path.

    try:
        os.replace(temporary, target)
    except OSError as e:
        raise host_write_error(target, e) from None

    made = make_parents(target)               # the directories made for it, to undo
    reserve = SpaceReserve(target, limits.min_free_bytes)
    sink = bounded_writer(out.write, limit, remote, target, progress, reserve)
    reserve.take(size, target)                # before writing size more bytes
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from piship_remote.model.errors import (
    ConfigInvalid,
    FileWriteFailed,
    PiShipError,
)

__all__ = [
    "SpaceReserve",
    "bounded_writer",
    "free_bytes",
    "host_write_error",
    "make_parents",
    "remove_directories",
]

_CAUSES = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file is larger than the filesystem allows",
    errno.EROFS: "the filesystem is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "a file is where a folder must be",
    errno.EEXIST: "a file is where a folder must be",
    errno.EISDIR: "a folder is where the file must go",
}
_ACTIONS = {
    errno.ENOSPC: "free space on this host, or download to a larger disk",
    errno.EDQUOT: "free space on this host, or download to a larger disk",
    errno.EROFS: "choose a writable place on this host",
    errno.EACCES: "choose a place on this host you may write to",
    errno.EPERM: "choose a place on this host you may write to",
}


def host_write_error(
    path: str, error: OSError, detail: str = "; nothing was written", *, verb: str = "writing"
) -> PiShipError:
    """``FILE_WRITE_FAILED`` for ``error`` while ``verb`` (writing, deleting) ``path`` on
    this host; ``detail`` says what the transfer left."""
    code = error.errno or 0
    cause = _CAUSES.get(code) or error.strerror or str(error)
    return FileWriteFailed(
        f"{verb} {path} on this host failed: {cause}{detail}",
        user_action=_ACTIONS.get(code, "choose another place on this host"),
        component="files",
    )


def free_bytes(path: str) -> int:
    """The bytes an unprivileged writer may still use on the filesystem holding ``path``
    (or its nearest existing parent)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


class SpaceReserve:
    """The free space a transfer writing under ``path`` leaves on its host filesystem.

    :meth:`take` comes before each write: one that would leave less than ``reserve``
    bytes free raises a ``PiShipError`` naming ``min_free_bytes``. The filesystem is asked
    again only once what it said last is used up, so a long write costs few ``statvfs``.
    """

    def __init__(self, path: str, reserve: int) -> None:
        self._path = path
        self._reserve = reserve
        self._left: int | None = None  # what may still be written, as last asked

    def take(self, size: int, target: str) -> None:
        """Count ``size`` more bytes written to ``target``; raise when they do not fit."""
        if self._reserve == 0:
            return
        if self._left is None or size > self._left:
            try:
                self._left = free_bytes(self._path) - self._reserve
            except OSError as e:
                raise host_write_error(target, e) from None
            if size > self._left:
                raise FileWriteFailed(
                    f"writing {target} on this host would leave less than {self._reserve} "
                    "bytes free on its filesystem (the min_free_bytes reserve); nothing was "
                    "written",
                    user_action="free space on this host, write to a larger disk, or lower "
                    "the reserve: files.limits = TransferLimits(min_free_bytes=…)",
                    component="files",
                )
        self._left -= size


def bounded_writer(
    write: Callable[[bytes], object],
    limit: int,
    source: str,
    target: str,
    progress: Callable[[int], None] | None,
    reserve: SpaceReserve | None = None,
) -> Callable[[bytes], None]:
    """A sink writing at most ``limit`` bytes: past it, a ``PiShipError`` naming the limit;
    one past the ``reserve``, or a failed write, a ``PiShipError`` naming ``target``."""
    written = 0

    def sink(chunk: bytes) -> None:
        nonlocal written
        written += len(chunk)
        if written > limit:
            raise ConfigInvalid(
                f"{source} in the sandbox is larger than {limit} bytes (the max_bytes limit);"
                " nothing was written",
                user_action="raise the limit: files.limits = TransferLimits(max_bytes=…)",
                component="files",
            )
        if reserve is not None:
            reserve.take(len(chunk), target)
        try:
            write(chunk)
        except OSError as e:
            raise host_write_error(target, e) from None
        if progress is not None:
            progress(len(chunk))

    return sink


def make_parents(path: str) -> list[str]:
    """Make the directories above ``path``: those made, parents first."""
    missing: list[str] = []
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    made: list[str] = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except OSError as e:
            remove_directories(made)
            raise host_write_error(directory, e) from None
        made.append(directory)
    return made


def remove_directories(made: list[str]) -> None:
    for directory in reversed(made):
        try:
            os.rmdir(directory)
        except OSError:
            pass
