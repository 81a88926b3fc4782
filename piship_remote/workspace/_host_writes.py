"""Writing on this host what a sandbox sends: a failure is a ``PiShipError`` naming the path.

    try:
        os.replace(temporary, target)
    except OSError as e:
        raise host_write_error(target, e) from None

    made = make_parents(target)               # the directories made for it, to undo
    sink = bounded_writer(out.write, limit, remote, target, progress)
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

__all__ = ["bounded_writer", "host_write_error", "make_parents", "remove_directories"]

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


def bounded_writer(
    write: Callable[[bytes], object],
    limit: int,
    source: str,
    target: str,
    progress: Callable[[int], None] | None,
) -> Callable[[bytes], None]:
    """A sink writing at most ``limit`` bytes: past it, a ``PiShipError`` naming the limit;
    a failed write, one naming ``target``."""
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
