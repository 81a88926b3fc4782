"""Tar archives out of a host tree: streamed from a selection, cut into parts as they fill.

    body = tar_stream(selection.entries)                  # an iterator of bytes, bounded memory

Unpacking what a sandbox sends back is :mod:`piship_remote.workspace._unpack`'s (re-exported here).
"""

from __future__ import annotations

import collections
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator

from piship_remote.model.transfer import TransferLimits
from piship_remote.workspace._tree import TreeEntry
from piship_remote.workspace._unpack import unpack_tar

__all__ = [
    "MAX_MEMBERS",
    "MAX_UNPACKED_BYTES",
    "StreamedArchives",
    "archive_parts",
    "cut_parts",
    "tar_stream",
    "unpack_tar",
]

CHUNK = 256 * 1024
BLOCK = tarfile.BLOCKSIZE
MAX_MEMBERS = TransferLimits().max_entries
MAX_UNPACKED_BYTES = TransferLimits().max_bytes
# A tree is sent as archives of about this much (file bytes, or members), so that the
# sandbox unpacks one while the next is on the wire; a small tree is one archive.
PART_BYTES = 64 * 1024 * 1024
PART_MEMBERS = 5000
# What is left after a full archive goes in it when it is at most this fraction of one:
# an archive of its own would cost one more unpack command (a round trip) at the end.
TAIL_FRACTION = 32
# Files are read through a plain descriptor, not a file object: a tree is mostly small
# files, and the objects a buffered open() builds around each cost more than the read.
_OPEN_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def tar_stream(entries: Iterable[TreeEntry], chunk: int = CHUNK) -> Iterator[bytes]:
    """A POSIX (pax) tar of ``entries``, produced as it is read: one file open at a time.

    Headers, small files and padding are gathered into pieces of about ``chunk``
    bytes, so a tree of many small files goes out in few sends, not three per file.
    """
    pending = bytearray()
    for entry in entries:
        for piece in _member(entry, chunk):
            if pending and len(pending) + len(piece) > chunk:
                yield bytes(pending)
                pending.clear()
            if len(piece) >= chunk:
                yield piece
            else:
                pending += piece
    end = b"\0" * (2 * BLOCK)
    if pending and len(pending) + len(end) > chunk:
        yield bytes(pending)
        pending.clear()
    yield bytes(pending + end)


def archive_parts(entries: Iterable[TreeEntry]) -> list[list[TreeEntry]]:
    """``entries`` cut, in order, into runs of at most about :data:`PART_BYTES` of file
    data or :data:`PART_MEMBERS` members (at least one run, possibly empty)::

        for part in archive_parts(selection.entries):
            send(tar_stream(part))

    Order is kept, so a directory still comes before what it holds and the runs can be
    unpacked one after another into the same place.
    """
    return [list(part) for part in cut_parts(entries)]


def cut_parts(entries: Iterable[TreeEntry]) -> Iterator[Iterator[TreeEntry]]:
    """:func:`archive_parts`, lazily: each run is read from ``entries`` as it is consumed,
    so a walk feeds the first archive while it goes on::

        for part in cut_parts(TreeWalk(root)):
            send(tar_stream(part))      # each run read to its end before the next is asked for

    A run ends at the first entry that does not fit (read, and kept for the next run),
    so once a run is read to its end, whether another follows is known without reading
    on. When a run is full, at most :data:`TAIL_FRACTION` of a run more is read ahead:
    if the entries end there, they go in this run rather than in a small last one.
    """
    source = _Lookahead(iter(entries))
    yield source.run()
    while source.more():
        yield source.run()


class _Lookahead:
    """An iterator of entries, with those read ahead but not yet taken."""

    def __init__(self, entries: Iterator[TreeEntry]) -> None:
        self._entries = entries
        self._ahead: collections.deque[TreeEntry] = collections.deque()
        self._ahead_bytes = 0
        self._ended = False

    def more(self) -> bool:
        return bool(self._ahead) or self._read()

    def run(self) -> Iterator[TreeEntry]:
        """Entries up to :data:`PART_BYTES` of file data or :data:`PART_MEMBERS` members,
        or all that are left when they are a small tail past that."""
        size = 0
        count = 0
        limited = True
        while self.more():
            entry = self._ahead[0]
            if limited and count and (size + entry.size > PART_BYTES or count >= PART_MEMBERS):
                if not self._only_a_tail_left():
                    return
                limited = False
            self._ahead.popleft()
            self._ahead_bytes -= entry.size
            yield entry
            size += entry.size
            count += 1

    def _only_a_tail_left(self) -> bool:
        most_members, most_bytes = PART_MEMBERS // TAIL_FRACTION, PART_BYTES // TAIL_FRACTION
        while len(self._ahead) <= most_members and self._ahead_bytes <= most_bytes:
            if not self._read():
                return True
        return False

    def _read(self) -> bool:
        """One more entry read ahead; ``False`` when there are no more."""
        if self._ended:
            return False
        entry = next(self._entries, None)
        if entry is None:
            self._ended = True
            return False
        self._ahead.append(entry)
        self._ahead_bytes += entry.size
        return True


class StreamedArchives:
    """Tar archives of ``entries`` (a walk, say), made as the walk goes and cut as they fill.

        archives = StreamedArchives(TreeWalk(root))
        for chunks in archives:     # each read to its end before the next is asked for
            send(chunks)
            archives.check()        # raises what the walk raised: do not unpack this one

    An exception raised by ``entries`` ends the archive being made (it still ends well,
    so nothing downstream sees a transport failure), ends the iteration, and is kept
    for :meth:`check`; the archive it ended must be dropped, not unpacked.
    """

    def __init__(self, entries: Iterable[TreeEntry]) -> None:
        self._entries = entries
        self._failure: Exception | None = None

    def __iter__(self) -> Iterator[Iterator[bytes]]:
        for part in cut_parts(self._guarded()):
            yield tar_stream(part)

    def check(self) -> None:
        """Raise what ``entries`` raised, if it raised."""
        if self._failure is not None:
            raise self._failure

    def _guarded(self) -> Iterator[TreeEntry]:
        try:
            yield from self._entries
        except Exception as error:  # raised again by check(), after this archive is sent
            self._failure = error


def _member(entry: TreeEntry, chunk: int) -> Iterator[bytes]:
    if entry.kind == "dir":
        yield _header(entry.relative, entry.mode, int(entry.mtime), tarfile.DIRTYPE)
        return
    if entry.kind == "symlink":
        yield _header(entry.relative, entry.mode, int(entry.mtime), tarfile.SYMTYPE, 0,
                      entry.link_target or "")
        return
    try:
        descriptor = os.open(entry.absolute, os.O_RDONLY | _OPEN_FLAGS)
    except OSError:
        return  # vanished or unreadable since it was selected: not sent
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            return  # no longer a file (a directory now): not sent, as if it had vanished
        size = info.st_size
        yield _header(entry.relative, entry.mode, int(entry.mtime), tarfile.REGTYPE, size)
        yield from _exactly(descriptor, size, chunk)
    finally:
        os.close(descriptor)
    if size % BLOCK:
        yield b"\0" * (BLOCK - size % BLOCK)


_USTAR_TAIL = tarfile.POSIX_MAGIC + b"\0" * (32 + 32 + 8 + 8 + 155 + 12)
_TAIL_SUM = sum(_USTAR_TAIL)


def _header(
    name: str, mode: int, mtime: int, kind: bytes, size: int = 0, link: str = ""
) -> bytes:
    """The member's header block(s): the bytes ``TarInfo.tobuf(PAX_FORMAT)`` gives, built
    directly when every field fits a plain ustar header (the common case), else by tarfile."""
    if kind == tarfile.DIRTYPE and not name.endswith("/"):
        name += "/"
    if not (
        name.isascii()
        and len(name) <= 100
        and link.isascii()
        and len(link) <= 100
        and 0 <= size < 8**11
        and 0 <= mtime < 8**11
    ):
        return _pax_header(name, mode, mtime, kind, size, link)
    encoded, target = name.encode("ascii"), link.encode("ascii")
    fields = b"%07o\0%07o\0%07o\0%011o\0%011o\0" % (mode & 0o7777, 0, 0, size, mtime)
    # The checksum counts its own field as eight spaces; the NUL padding adds nothing.
    checksum = sum(encoded) + sum(fields) + 8 * 32 + kind[0] + sum(target) + _TAIL_SUM
    return b"".join(
        (
            encoded.ljust(100, b"\0"),
            fields,
            b"%06o\0 " % checksum,
            kind,
            target.ljust(100, b"\0"),
            _USTAR_TAIL,
        )
    )


def _pax_header(name: str, mode: int, mtime: int, kind: bytes, size: int, link: str) -> bytes:
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = mtime
    info.type = kind
    info.size = size
    info.linkname = link
    return info.tobuf(tarfile.PAX_FORMAT)


def _exactly(descriptor: int, size: int, chunk: int) -> Iterator[bytes]:
    """``size`` bytes of the open file: a file that shrank is padded, one that grew is cut."""
    left = size
    while left > 0:
        data = os.read(descriptor, min(chunk, left))
        if not data:
            yield b"\0" * left
            return
        left -= len(data)
        yield data
