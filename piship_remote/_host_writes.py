"""What a failed write on this host becomes: a ``PiShipError`` naming the path and the cause.

    try:
        os.replace(temporary, target)
    except OSError as e:
        raise host_write_error(target, e) from None
"""

from __future__ import annotations

import errno

from piship_remote.errors import FILE_WRITE_FAILED, PiShipError

__all__ = ["host_write_error"]

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
    return PiShipError(
        FILE_WRITE_FAILED,
        f"{verb} {path} on this host failed: {cause}{detail}",
        user_action=_ACTIONS.get(code, "choose another place on this host"),
        component="files",
    )
