"""Chunks pushed by one thread, read as a file by another, with a few chunks in between.

    pipe = ChunkPipe()
    worker = pipe.consume(lambda: unpack(pipe), "piship-files-receive")  # reads pipe.read(n)
    remote.read(path, pipe.put)     # blocks while the pipe is full; raises once the reader failed
    pipe.close()                    # end of data: the reader's read() gives b""
    summary = worker.result()

What the pipe holds is bounded (:data:`PIPE_CHUNKS` chunks), so a fast sender waits
for the reader rather than filling memory. :meth:`ChunkPipe.abort` ends the reader's
reads with :class:`PipeAborted`; once the reader has ended (returned or raised),
:meth:`ChunkPipe.put` raises :class:`ReaderGone`, so the sender stops too.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TypeVar

from piship_remote.workspace._worker import Worker

__all__ = ["PIPE_CHUNKS", "ChunkPipe", "ChunkSink", "PipeAborted", "ReaderGone"]

PIPE_CHUNKS = 8
ChunkSink = Callable[[bytes], None]
T = TypeVar("T")


class PipeAborted(Exception):
    """The sender gave up: the reader must stop."""


class ReaderGone(Exception):
    """The reader ended before the data did: the sender must stop."""


class ChunkPipe:
    """A bounded queue of byte chunks with a file-like ``read`` on its far end."""

    def __init__(self, chunks: int = PIPE_CHUNKS) -> None:
        self._room = chunks
        self._queue: collections.deque[bytes] = collections.deque()
        self._partial = memoryview(b"")
        self._changed = threading.Condition()
        self._closed = False
        self._aborted = False
        self._reader_ended = False
        self.consumer_failed = False

    def consume(self, action: Callable[[], T], name: str) -> Worker[T]:
        """Run ``action`` (the reader) on a thread named ``name``."""
        return Worker(action, name, self._reader_done)

    def put(self, chunk: bytes) -> None:
        """Queue ``chunk``, waiting while the pipe is full; ``ReaderGone`` once it has ended."""
        with self._changed:
            while len(self._queue) >= self._room and not self._reader_ended:
                self._changed.wait()
            if self._reader_ended:
                raise ReaderGone()
            self._queue.append(chunk)
            self._changed.notify_all()

    def close(self) -> None:
        """No more chunks: the reader sees the end once it has read what is queued."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def abort(self) -> None:
        """Drop what is queued; the reader's next read raises :class:`PipeAborted`."""
        with self._changed:
            self._aborted = True
            self._queue.clear()
            self._changed.notify_all()

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (at least one unless at the end), as a file's read gives."""
        if not self._partial:
            chunk = self._next_chunk()
            if chunk is None:
                return b""
            self._partial = memoryview(chunk)
        take = len(self._partial) if size is None or size < 0 else size
        piece = bytes(self._partial[:take])
        self._partial = self._partial[take:]
        return piece

    def _next_chunk(self) -> bytes | None:
        with self._changed:
            while True:
                if self._aborted:
                    raise PipeAborted()
                if self._queue:
                    chunk = self._queue.popleft()
                    self._changed.notify_all()
                    if chunk:
                        return chunk
                    continue
                if self._closed:
                    return None
                self._changed.wait()

    def _reader_done(self, failed: bool) -> None:
        with self._changed:
            self._reader_ended = True
            self.consumer_failed = failed
            self._queue.clear()
            self._changed.notify_all()
