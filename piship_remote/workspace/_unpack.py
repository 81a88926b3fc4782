"""Unpacking a tar from a sandbox that may be hostile: checked, bounded, applied whole.

    summary = unpack_tar(open("results.tar", "rb"), workspace, may_write=allowed)
    summary = unpack_streamed(lambda sink: remote.read(archive, sink), workspace)

Nothing in the archive is trusted: absolute names, ``..``, links, devices, FIFOs,
names that would land outside the destination (through a symlink on the host too)
are refused and listed, never written. Limits apply while the archive is read: the
bytes its entries declare, the number of entries, the size of one entry's header, and
what may follow its end, and the host filesystem's free space (the ``min_free_bytes``
reserve, checked before each file is written); past one, the unpack stops at once with a
``PiShipError`` naming the limit.

Each file is first written to a temporary name beside its target; the files are put
in place (renamed) only once the whole archive was read and checked. Anything that
stops the unpack (a limit, a cut or malformed archive, a full host disk) removes every
temporary file and every directory it made, so the host is left as it was. A name
that clashes with the host (a file where a folder must be, a folder where a file goes)
is listed as ``"name clash"`` and the rest is applied.
"""

from __future__ import annotations

import os
import stat
import tarfile
import tempfile
from collections.abc import Callable
from typing import IO, Protocol, cast

from piship_remote.model.errors import ConfigInvalid, PiShipError
from piship_remote.model.transfer import SkippedPath, TransferLimits, TransferSummary
from piship_remote.workspace._chunk_pipe import ChunkPipe, ChunkSink, ReaderGone
from piship_remote.workspace._host_writes import SpaceReserve, host_write_error
from piship_remote.workspace._tree import inside

__all__ = [
    "HEADER_ALLOWANCE",
    "TRAILING_ALLOWANCE",
    "Exclude",
    "limit_error",
    "unpack_streamed",
    "unpack_tar",
]

CHUNK = 256 * 1024
BLOCK = tarfile.BLOCKSIZE
# What one entry's headers (pax or GNU long names included) may take: tarfile reads
# such a header into memory whole, so a hostile one must not be allowed to grow.
HEADER_ALLOWANCE = 1024 * 1024
# What may follow the archive's end (tar pads it to a record of 10 KiB).
TRAILING_ALLOWANCE = 1024 * 1024
NAME_MAX, PATH_MAX = 255, 4096
_DEFAULTS = TransferLimits()

Exclude = Callable[[str, bool], "str | None"]
"""``exclude(relative, is_dir)``: a reason to leave the entry out, or ``None``."""


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


def unpack_tar(
    source: Readable,
    destination: str,
    *,
    may_write: Callable[[str], bool] = lambda path: True,
    exclude: Exclude | None = None,
    max_members: int = _DEFAULTS.max_entries,
    max_bytes: int = _DEFAULTS.max_bytes,
    min_free_bytes: int = _DEFAULTS.min_free_bytes,
) -> TransferSummary:
    """Unpack the regular files and directories of the tar in ``source`` below ``destination``.

    ``may_write(absolute_path)`` says whether the policy lets a file be written there.
    """
    reader = _Budgeted(source)
    root = os.path.realpath(destination)
    reserve = SpaceReserve(root, min_free_bytes)
    unpacker = _Unpacker(root, may_write, exclude, max_members, max_bytes, reserve)
    try:
        # Only read() is used in stream mode ("r|"); tarfile's stub wants a whole file type.
        with tarfile.open(fileobj=cast(IO[bytes], reader), mode="r|") as archive:
            while (member := _next(archive, reader)) is not None:
                unpacker.member(archive, member)
                vars(archive)["members"].clear()  # else tarfile keeps every entry it read
        reader.drain(TRAILING_ALLOWANCE)
        return unpacker.apply()
    except tarfile.TarError as e:
        unpacker.roll_back()
        raise ConfigInvalid(
            f"the archive from the sandbox is malformed: {e}", component="files"
        ) from None
    except BaseException:
        unpacker.roll_back()
        raise


def unpack_streamed(
    feed: Callable[[ChunkSink], object],
    destination: str,
    *,
    may_write: Callable[[str], bool] = lambda path: True,
    exclude: Exclude | None = None,
    limits: TransferLimits = _DEFAULTS,
) -> TransferSummary:
    """:func:`unpack_tar` of what ``feed(sink)`` passes to ``sink`` chunk by chunk, unpacked
    on a ``piship-files-receive`` thread while it arrives (nothing is spooled first).

    What stops the unpack (a limit, a full disk) makes the next ``sink`` call raise, so
    ``feed`` stops reading; what ``feed`` raises stops the unpack, which leaves nothing.
    """
    pipe = ChunkPipe()

    def unpack() -> TransferSummary:
        return unpack_tar(
            pipe,
            destination,
            may_write=may_write,
            exclude=exclude,
            max_members=limits.max_entries,
            max_bytes=limits.max_bytes,
            min_free_bytes=limits.min_free_bytes,
        )

    worker = pipe.consume(unpack, "piship-files-receive")
    try:
        feed(pipe.put)
    except ReaderGone:
        return worker.result()  # raises the unpack's failure: why the feed stopped
    except BaseException:
        pipe.abort()
        worker.result_quietly()
        raise
    pipe.close()
    return worker.result()


def limit_error(what: str, limit: str | None = None) -> PiShipError:
    """Past a transfer limit: the message names it (a ``TransferLimits`` field, when one is
    the cause) and how to raise it."""
    if limit is None:
        named, action = "", "the sandbox sent a hostile archive: check what runs in it"
    else:
        named = f" (the {limit} limit)"
        action = f"pull fewer paths, or raise it: files.limits = TransferLimits({limit}=…)"
    return ConfigInvalid(
        f"the archive from the sandbox has {what}{named}; nothing was unpacked",
        user_action=action,
        component="files",
    )


def _next(archive: tarfile.TarFile, reader: _Budgeted) -> tarfile.TarInfo | None:
    reader.limit = archive.offset + HEADER_ALLOWANCE
    member = archive.next()
    # What is read until the next header: this entry's data, which member() checks first.
    reader.limit = archive.offset + HEADER_ALLOWANCE
    return member


class _Budgeted:
    """``source`` read through a byte budget: past ``limit`` bytes, reading is refused."""

    def __init__(self, source: Readable) -> None:
        self._source = source
        self.given = 0
        self.limit = HEADER_ALLOWANCE

    def read(self, size: int = -1) -> bytes:
        if self.given >= self.limit:
            raise limit_error(f"an entry's header larger than {HEADER_ALLOWANCE} bytes")
        room = self.limit - self.given
        data = self._source.read(room if size is None or size < 0 else min(size, room))
        self.given += len(data)
        return data

    def drain(self, allowance: int) -> None:
        """Read to the end; more than ``allowance`` bytes after the archive's end is refused."""
        left = allowance
        while data := self._source.read(min(CHUNK, left + 1)):
            left -= len(data)
            if left < 0:
                raise limit_error(f"more than {allowance} bytes after its end")


class _Unpacker:
    def __init__(
        self,
        root: str,
        may_write: Callable[[str], bool],
        exclude: Exclude | None,
        max_members: int,
        max_bytes: int,
        reserve: SpaceReserve,
    ) -> None:
        self.root = root
        self.reserve = reserve
        self.may_write = may_write
        self.exclude = exclude
        self.max_members = max_members
        self.max_bytes = max_bytes
        self.members = 0
        self.declared = 0
        self.skipped: list[SkippedPath] = []
        self.staged: dict[str, tuple[str, int]] = {}  # target -> (temporary, size)
        self.made: list[str] = []  # directories this unpack created, parents first
        self.name_max = _name_max(root)

    def member(self, archive: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise limit_error(f"more than {self.max_members} entries", "max_entries")
        if member.isdir() and member.name.replace("\\", "/").strip("/") in ("", "."):
            return  # the archive's root: the target directory itself
        # Counted for refused entries too: tarfile reads past what each one declares.
        declared = _declared_bytes(archive, member)
        self.declared += declared
        if self.declared > self.max_bytes:
            raise limit_error(f"more than {self.max_bytes} bytes", "max_bytes")
        target, reason = self._target(member)
        if reason is not None or target is None:
            self.skipped.append(SkippedPath(member.name, reason or "outside the workspace"))
            return
        if not self._make_parents(target, member.isdir()):
            self.skipped.append(SkippedPath(member.name, "name clash"))
            return
        if member.isdir():
            return
        stream = archive.extractfile(member)
        if stream is None:
            self.skipped.append(SkippedPath(member.name, "not a regular file"))
            return
        self.reserve.take(declared, target)  # a sparse entry is written at its full size
        self._stage(target, stream, member.mode, member.size)

    def apply(self) -> TransferSummary:
        """Put every staged file in place; the summary of what was."""
        if not os.path.isdir(self.root):
            try:
                os.makedirs(self.root)
            except OSError as e:
                raise host_write_error(self.root, e) from None
        files = size = 0
        pending = list(self.staged.items())
        for done, (target, (temporary, length)) in enumerate(pending):
            try:
                os.replace(temporary, target)
            except (IsADirectoryError, NotADirectoryError):
                _remove_quietly(temporary)  # the host changed under the unpack
                self.skipped.append(SkippedPath(self._relative(target), "name clash"))
                continue
            except OSError as e:
                for left, _ in pending[done:]:
                    _remove_quietly(left)
                raise host_write_error(
                    target, e, f"; {files} of {len(pending)} files were put in place"
                ) from None
            files += 1
            size += length
        self.staged.clear()
        return TransferSummary(files, size, tuple(self.skipped))

    def roll_back(self) -> None:
        """Remove every temporary file and every directory this unpack made."""
        for temporary, _ in self.staged.values():
            _remove_quietly(temporary)
        self.staged.clear()
        for directory in reversed(self.made):
            try:
                os.rmdir(directory)
            except OSError:
                pass
        self.made.clear()

    def _stage(self, target: str, stream: IO[bytes], mode: int, size: int) -> None:
        previous = self.staged.pop(target, None)
        if previous is not None:  # a later entry of the same name replaces it, as in tar
            _remove_quietly(previous[0])
        directory = os.path.dirname(target)
        try:
            handle, temporary = tempfile.mkstemp(prefix=".piship-", suffix=".part", dir=directory)
        except OSError as e:
            raise host_write_error(target, e) from None
        self.staged[target] = (temporary, size)
        try:
            with os.fdopen(handle, "wb") as out:
                while data := stream.read(CHUNK):
                    out.write(data)
            os.chmod(temporary, (mode & 0o777) or 0o644)
        except OSError as e:
            raise host_write_error(target, e) from None

    def _make_parents(self, target: str, is_dir: bool) -> bool:
        """Make the directories down to ``target`` (and it, for a directory); ``False`` when
        a host file (or a file this archive staged) is where one must be, or a directory
        is where the file goes."""
        directory = target if is_dir else os.path.dirname(target)
        missing: list[str] = []
        path = directory
        while not os.path.isdir(path):
            if os.path.lexists(path) or path in self.staged:
                return False
            missing.append(path)
            path = os.path.dirname(path)
        if not is_dir and (os.path.isdir(target) or os.path.islink(target)):
            return False
        for path in reversed(missing):
            try:
                os.mkdir(path)
            except OSError as e:
                raise host_write_error(path, e) from None
            self.made.append(path)
        return True

    def _target(self, member: tarfile.TarInfo) -> tuple[str | None, str | None]:
        name = member.name
        if "\0" in name:  # a pax name may hold one; no path can
            raise ConfigInvalid(
                "the archive from the sandbox is malformed: an entry's name holds a NUL byte",
                component="files",
            )
        parts = [part for part in name.replace("\\", "/").split("/") if part not in ("", ".")]
        if name.startswith("/") or ".." in parts or not parts or os.path.isabs(name):
            return None, "outside the workspace"
        if member.issym() or member.islnk():
            return None, "symlink"
        if not (member.isfile() or member.isdir()):
            return None, "not a regular file"
        target = os.path.join(self.root, *parts)
        if not self._representable(target, parts):
            return None, "name not exact"
        parent = os.path.realpath(os.path.dirname(target))
        if not inside(parent, self.root) or _is_link(target):
            return None, "outside the workspace"
        if ".git" in parts:
            return None, "write not allowed"
        if self.exclude is not None:
            reason = self.exclude("/".join(parts), member.isdir())
            if reason is not None:
                return None, reason
        if not self.may_write(target):
            return None, "write not allowed"
        return target, None

    def _representable(self, target: str, parts: list[str]) -> bool:
        """Whether this host's filesystem can hold ``target`` under that very name."""
        return len(os.fsencode(target)) < PATH_MAX and all(
            len(os.fsencode(part)) <= self.name_max for part in parts
        )

    def _relative(self, target: str) -> str:
        return os.path.relpath(target, self.root).replace(os.sep, "/")


def _declared_bytes(archive: tarfile.TarFile, member: tarfile.TarInfo) -> int:
    """The data bytes ``member`` declares: its size or, for a sparse entry whose header
    says more, what tarfile reads past to reach the next entry (less block padding)."""
    return max(member.size, archive.offset - member.offset_data - (BLOCK - 1))


def _name_max(root: str) -> int:
    """The longest file name the filesystem of ``root`` (or its nearest existing parent) holds."""
    place = root
    while not os.path.isdir(place) and os.path.dirname(place) != place:
        place = os.path.dirname(place)
    try:
        return os.pathconf(place, "PC_NAME_MAX")
    except (OSError, ValueError):
        return NAME_MAX


def _is_link(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
