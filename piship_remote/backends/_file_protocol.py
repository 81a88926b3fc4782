"""The helpers of a backend's files (:class:`~piship_remote.backends.base.RemoteFiles`):
an upload's sized chunks, a request's bound inside an operation's deadline, a refused
write's error.

    files = instance.files()
    files.write("/home/user/data.csv", iter([b"a,b\\n", b"1,2\\n"]))
    files.read("/home/user/data.csv", sink=sys.stdout.buffer.write)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from piship_remote.model.errors import FileWriteFailed, PiShipError
from piship_remote.transport.deadline import Deadline

__all__ = [
    "SizedChunks",
    "request_timeout",
    "write_failed",
]


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
