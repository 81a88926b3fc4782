"""The copies of a sandbox's files that its snapshots and forks are made of, and the tree
walks they and the sandbox agent's file operations share.

Standard library only, shipped beside ``agent.py`` and loaded by ``agent_files.py``: it runs
inside the sandbox, in the helper the agent forks for one request (as the sandbox's root
where it has one, else its user)::

    export({"places": ["/", "/home/user", "/tmp"], "layer": "/run/piship/layer"}, out)
    import_copy({"places": ["/", "/home/user", "/tmp"]}, in_)

A copy is a pax tar stream: each place's entries under its sandbox path (``home/user/…``),
regular files, directories and symlinks with their modes, owners, times and ``user.``
extended attributes; a sparse file is written as GNU sparse 1.0 (its data segments only,
found with ``SEEK_DATA``/``SEEK_HOLE``), so holes cost nothing in the copy and stay holes
when it is unpacked.

Place ``/`` is the root filesystem: what the sandbox changed of its template. Where an
overlay shows it its image, that is the overlay's upper layer (bound read-only at
``layer``); else ``/`` itself (the ``base`` template's own directory or tmpfs). Mounts are
left out (the host's folders bound read-only, ``/proc``, ``/dev``, the places, copied on
their own) and so is the agent's ``/run/piship``; each directory comes with the names ``/``
lists there, so what the sandbox deleted of its template (an overlay's whiteout, an opaque
directory) is deleted in the copy too, and the copy keeps nothing the source does not.

Every tree walk here is iterative and moves with the helper's working directory (a
directory is entered only through ``O_NOFOLLOW``, and the way back up is checked), so
a tree 10,000 levels deep is walked with short paths and without recursion.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tarfile
from collections.abc import Iterator
from typing import Any, BinaryIO

__all__ = [
    "COPIED_XATTRS",
    "PIECE",
    "Refused",
    "Tree",
    "export",
    "import_copy",
    "remove_tree",
    "write_all",
]

PIECE = 1024 * 1024
COPIED_XATTRS = "user."
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_BLOCK = tarfile.BLOCKSIZE
_XATTR_HEADER = "SCHILY.xattr."
# A directory of the root filesystem's copy: the names it holds (an entry missing from them
# was deleted), as a vendor pax record.
_NAMES_HEADER = "PISHIP.names"
AGENT_DIRECTORY = "run/piship"
_OCTAL = re.compile(r"\\([0-7]{3})")
_MOVED = "the files were moved while they were copied; try again"


class Refused(Exception):
    """A request answered with an error of its own (beyond an ``OSError``)."""

    def __init__(self, code: str, **details: object) -> None:
        super().__init__(code)
        self.details = {"errno": code, **details}


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Tree:
    """An iterative walk of the tree at ``top`` that moves the working directory along.

    :meth:`walk` yields each entry's relative path (``""`` for the top) and ``lstat``,
    with the working directory at the entry's parent (at the top itself for ``""``),
    directories before what they hold; symlinks are not followed, other filesystems
    are not entered, and the relative paths in ``skip`` are neither yielded nor entered.
    """

    def __init__(self, top: str, skip: frozenset[str] = frozenset()) -> None:
        self.top = top
        self.skip = skip

    def walk(self) -> Iterator[tuple[str, os.stat_result]]:
        os.chdir(self.top)
        here = os.lstat(".")
        device = here.st_dev
        yield "", here
        frames = [(sorted(os.listdir("."), reverse=True), here)]
        prefix = ""
        while frames:
            names, at = frames[-1]
            if not names:
                frames.pop()
                if frames:
                    _climb(frames[-1][1])
                    self._left()
                    prefix = prefix[: prefix.rstrip("/").rfind("/") + 1]
                continue
            name = names.pop()
            if prefix + name in self.skip:
                continue
            try:
                info = os.lstat(name)
            except FileNotFoundError:
                continue  # gone meanwhile
            yield prefix + name, info
            if stat.S_ISDIR(info.st_mode) and info.st_dev == device:
                try:
                    _enter(name, info)
                except OSError:
                    continue  # unreadable (its entry is kept), or replaced meanwhile
                try:
                    listed = sorted(os.listdir("."), reverse=True)
                except OSError:
                    _climb(at)
                    continue
                self._entered(name)
                frames.append((listed, os.lstat(".")))
                prefix += name + "/"

    def _entered(self, name: str) -> None:
        """The walk went down into directory ``name``."""

    def _left(self) -> None:
        """The walk went back up one level."""


class _RootLayer(Tree):
    """A walk of the sandbox's own layer of its root filesystem: the overlay's upper layer
    of its image, bound read-only at ``top``, or ``/`` itself (``top`` ``"/"``).

    :meth:`listing` says what ``/`` lists at the directory the walk is at: in an overlay,
    a template's entry the sandbox deleted is missing there and only there. The walk of
    ``/`` follows the layer's along, one open directory at a time.
    """

    def __init__(self, top: str, skip: frozenset[str]) -> None:
        super().__init__(top, skip)
        self._view = None if top == "/" else os.open("/", _DIRECTORY)
        self._above: list[os.stat_result] = []  # the view's directories, to climb back to
        self._lost = 0  # levels below the last directory the view could follow

    def listing(self, name: str) -> list[str] | None:
        """What ``/`` lists at directory ``name`` (relative to the walk's), if it has it."""
        if self._view is None:
            return os.listdir(name)
        if self._lost:
            return None
        try:
            fd = os.open(name, _DIRECTORY, dir_fd=self._view)
        except OSError:
            return None
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def _entered(self, name: str) -> None:
        if self._view is None:
            return
        if self._lost:
            self._lost += 1
            return
        try:
            fd = os.open(name, _DIRECTORY, dir_fd=self._view)
        except OSError:
            self._lost = 1
            return
        self._above.append(os.fstat(self._view))
        os.close(self._view)
        self._view = fd

    def _left(self) -> None:
        if self._view is None:
            return
        if self._lost:
            self._lost -= 1
            return
        fd = os.open("..", _DIRECTORY, dir_fd=self._view)
        expected, found = self._above.pop(), os.fstat(fd)
        os.close(self._view)
        self._view = fd
        if (found.st_dev, found.st_ino) != (expected.st_dev, expected.st_ino):
            raise Refused("EAGAIN", message=_MOVED)

    def close(self) -> None:
        if self._view is not None:
            os.close(self._view)
            self._view = None


def mount_points() -> frozenset[str]:
    """The sandbox's mount points but ``/``, relative to it, from its own mount table."""
    found = set()
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            fields = line.split(" ")
            if len(fields) > 4:
                point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4]).strip("/")
                if point:
                    found.add(point)
    return frozenset(found)


def _kept_out() -> frozenset[str]:
    """What a copy of the root filesystem leaves alone: every mount (host folders bound
    read-only, the places copied on their own, ``/proc``, ``/dev``) and the agent's folder."""
    return mount_points() | {AGENT_DIRECTORY}


def _enter(name: str, expected: os.stat_result) -> None:
    """Make directory ``name`` (never a symlink) the working directory; ``OSError`` if not."""
    fd = os.open(name, _DIRECTORY)
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (expected.st_dev, expected.st_ino):
            raise OSError(errno.ENOENT, "the directory was replaced while it was walked", name)
        os.fchdir(fd)
    finally:
        os.close(fd)


def _climb(expected: os.stat_result) -> None:
    """Go up one level, to the directory ``expected`` describes; ``OSError`` if it moved."""
    os.chdir("..")
    info = os.lstat(".")
    if (info.st_dev, info.st_ino) != (expected.st_dev, expected.st_ino):
        raise Refused("EAGAIN", message=_MOVED)


def remove_tree(path: str) -> None:
    """``rm -rf path``: iterative, never following a symlink; nothing there is fine."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(path)
        return
    parent, name = os.path.split(os.path.normpath(path))
    os.chdir(parent or "/")
    _remove_directory(name, info)


def _remove_entry(name: str) -> None:
    """Remove ``name`` of the working directory, a directory with all it holds."""
    info = os.lstat(name)
    if stat.S_ISDIR(info.st_mode):
        _remove_directory(name, info)
    else:
        os.unlink(name)


def _remove_directory(name: str, info: os.stat_result) -> None:
    """Remove directory ``name`` of the working directory (``info``: its ``lstat``) and all
    it holds, level by level; the working directory is where it was after."""
    frames: list[tuple[str, list[str], os.stat_result]] = []
    above = os.lstat(".")
    _enter(name, info)
    frames.append((name, _clear_files(), above))
    while frames:
        name, subdirectories, above = frames[-1]
        if subdirectories:
            child = subdirectories.pop()
            here = os.lstat(".")
            _enter(child, os.lstat(child))
            frames.append((child, _clear_files(), here))
            continue
        frames.pop()
        _climb(above)
        os.rmdir(name)


def _clear_files(directory: str = ".") -> list[str]:
    """Unlink everything in ``directory`` but its subdirectories, which it returns."""
    subdirectories = []
    with os.scandir(directory) as listing:
        for entry in listing:
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.name)
            else:
                os.unlink(entry.name)
    return subdirectories


# ---- copies (export and import) --------------------------------------------------------


def export(args: dict[str, Any], data: int) -> None:
    """Write the copy of ``args["places"]`` to pipe ``data``."""
    places = [str(p) for p in args["places"]]
    kept_out = _kept_out()
    with open(data, "wb", buffering=PIECE, closefd=False) as out:
        for place in places:
            if place == "/":
                _export_root(str(args.get("layer") or "/"), kept_out, out)
            elif os.path.isdir(place):
                _export_place(place, _below(kept_out, place.strip("/")), out)
        out.write(b"\0" * (2 * _BLOCK))


def _below(paths: frozenset[str], root: str) -> frozenset[str]:
    """``paths`` (relative to ``/``) below ``root``, relative to it."""
    return frozenset(path[len(root) + 1 :] for path in paths if path.startswith(root + "/"))


def _export_place(place: str, skip: frozenset[str], out: BinaryIO) -> None:
    root = place.strip("/")
    for relative, info in Tree(place, skip).walk():
        name = root + "/" + relative if relative else root
        _export_entry(out, name, os.path.basename(relative) if relative else ".", info)


def _export_root(layer: str, kept_out: frozenset[str], out: BinaryIO) -> None:
    """The sandbox's own changes to its root filesystem: what its layer (``layer``: an
    overlay's upper layer, or ``/`` itself) holds, but what :func:`_kept_out` names; each
    directory with the names ``/`` lists there, so what it deleted stays deleted."""
    tree = _RootLayer(layer, kept_out)
    try:
        for relative, info in tree.walk():
            here = os.path.basename(relative) if relative else "."
            names = tree.listing(here) if stat.S_ISDIR(info.st_mode) else None
            _export_entry(out, relative or ".", here, info, names)
    finally:
        tree.close()


def _export_entry(
    out: BinaryIO, name: str, here: str, info: os.stat_result, names: list[str] | None = None
) -> None:
    """One entry of a copy: a directory (with the ``names`` it holds, where given), a symlink
    or a regular file; anything else (a device, an overlay's whiteout) is left out."""
    if stat.S_ISDIR(info.st_mode):
        member = _header(name, info, tarfile.DIRTYPE, here)
        if names is not None:
            member.pax_headers = {**member.pax_headers, _NAMES_HEADER: json.dumps(sorted(names))}
        _put(out, member, None)
    elif stat.S_ISLNK(info.st_mode):
        member = _header(name, info, tarfile.SYMTYPE, None)
        try:
            member.linkname = os.readlink(here)
        except OSError:
            return  # no longer a symlink: what the sandbox changes meanwhile is left out
        _put(out, member, None)
    elif stat.S_ISREG(info.st_mode):
        _export_file(out, name, here, info)


def _header(name: str, info: os.stat_result, kind: bytes, here: str | None) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    member.mode = stat.S_IMODE(info.st_mode)
    member.uid, member.gid = info.st_uid, info.st_gid
    member.mtime = info.st_mtime
    if here is not None:
        member.pax_headers = _xattrs(here)
    return member


def _xattrs(path: str) -> dict[str, str]:
    found = {}
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    for name in names:
        if name.startswith(COPIED_XATTRS):
            try:
                value = os.getxattr(path, name, follow_symlinks=False)
            except OSError:
                continue
            found[_XATTR_HEADER + name] = value.decode("utf-8", "surrogateescape")
    return found


def _export_file(out: BinaryIO, name: str, here: str, info: os.stat_result) -> None:
    try:
        fd = os.open(here, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return  # unreadable, or replaced meanwhile: left out, as the user cannot read it
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode):
            return
        member = _header(name, now, tarfile.REGTYPE, here)
        segments = _segments(fd, now.st_size)
        if segments is None:
            member.size = now.st_size
            _put(out, member, lambda: _copy_range(fd, out, 0, now.st_size))
            return
        sparse_map = _sparse_map(segments)
        member.name = f"{os.path.dirname(name)}/GNUSparseFile.0/{os.path.basename(name)}"
        member.size = len(sparse_map) + sum(length for _, length in segments)
        member.pax_headers = {
            **member.pax_headers,
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": name,
            "GNU.sparse.realsize": str(now.st_size),
        }

        def body() -> int:
            out.write(sparse_map)
            written = len(sparse_map)
            for offset, length in segments:
                written += _copy_range(fd, out, offset, length)
            return written

        _put(out, member, body)
    finally:
        os.close(fd)


def _segments(fd: int, size: int) -> list[tuple[int, int]] | None:
    """The data segments of a file with holes (``None`` for a file without)."""
    if size == 0 or os.fstat(fd).st_blocks * 512 >= size:
        return None
    segments, offset = [], 0
    try:
        while offset < size:
            start = os.lseek(fd, offset, os.SEEK_DATA)
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            segments.append((start, end - start))
            offset = end
    except OSError as e:
        if e.errno != errno.ENXIO:  # ENXIO: no data after offset
            return None
    return segments


def _sparse_map(segments: list[tuple[int, int]]) -> bytes:
    numbers = [len(segments)] + [n for segment in segments for n in segment]
    text = "".join(f"{n}\n" for n in numbers).encode()
    return text + b"\0" * (-len(text) % _BLOCK)


def _copy_range(fd: int, out: BinaryIO, offset: int, length: int) -> int:
    """Write ``length`` bytes of ``fd`` from ``offset`` (zeros where the file shrank)."""
    left = length
    while left > 0:
        piece = os.pread(fd, min(left, PIECE), offset + length - left)
        if not piece:
            out.write(b"\0" * left)
            break
        out.write(piece)
        left -= len(piece)
    return length


def _put(out: BinaryIO, member: tarfile.TarInfo, body: object) -> None:
    out.write(member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
    if body is not None and member.size:
        assert callable(body)
        body()
        out.write(b"\0" * (-member.size % _BLOCK))


class _Unpacker:
    """Applies a copy's members in order to the places of this sandbox, moving the working
    directory along (members come parents first, as :func:`_export` writes them).

    The root filesystem (place ``/``) takes what the copy holds but where this sandbox has
    a mount or its agent's folder (:func:`_kept_out`), and a directory that comes with the
    names it holds keeps only those (and what holds a mount)."""

    def __init__(self, places: list[str], owners: bool) -> None:
        self._places = {p.strip("/"): p for p in places}
        self._owners = owners
        self._place: str | None = None
        self._path: list[str] = []
        self._here = ""  # self._path joined
        self._dirs: list[tuple[tarfile.TarInfo, os.stat_result]] = []
        self._top: tarfile.TarInfo | None = None
        self._kept_out = _kept_out() if "" in self._places else frozenset()
        self._holding = _with_parents(self._kept_out)  # never removed

    def apply(self, member: tarfile.TarInfo, source: tarfile.TarFile) -> None:
        place, relative = self._split(member.name)
        if place == "" and self._is_kept_out(relative):
            return
        if not relative:  # the place itself: settled once its entries are in
            self._go(place, "")
            self._top = member
            self._prune(member)
            return
        parent, _, name = relative.rpartition("/")
        self._go(place, parent)
        if name in ("", ".", "..") or "\0" in name:
            raise ValueError("the copy names an entry outside its place")
        existing = _lstat(name)
        if existing is not None and (not member.isdir() or not stat.S_ISDIR(existing.st_mode)):
            _remove_entry(name)
        if member.isdir():
            if existing is None or not stat.S_ISDIR(existing.st_mode):
                os.mkdir(name, 0o700)
            self._descend(name, member)
            self._prune(member)
        elif member.issym():
            os.symlink(member.linkname, name)
            self._settle(member, name)
        elif member.isreg():
            self._file(member, name, source)

    def finish(self) -> None:
        self._go(None, "")

    def _split(self, name: str) -> tuple[str, str]:
        """The place ``name`` is in, and its path below it."""
        for root in sorted(self._places, key=len, reverse=True):
            if not root:
                return root, "" if name == "." else name  # the root filesystem holds the rest
            if name == root:
                return root, ""
            if name.startswith(root + "/"):
                return root, name[len(root) + 1 :]
        raise ValueError("the copy names a place this sandbox does not have")

    def _is_kept_out(self, relative: str) -> bool:
        return any(relative == kept or relative.startswith(kept + "/") for kept in self._kept_out)

    def _prune(self, member: tarfile.TarInfo) -> None:
        """Remove what the working directory holds beyond the names ``member`` came with."""
        listed = member.pax_headers.get(_NAMES_HEADER)
        if listed is None or self._place != "":
            return
        names = set(json.loads(listed))
        for name in os.listdir("."):
            path = f"{self._here}/{name}" if self._here else name
            if name not in names and path not in self._holding:
                _remove_entry(name)

    def _go(self, place: str | None, parent: str) -> None:
        """Make ``parent`` in ``place`` the working directory (climbing out of what is done)."""
        if place == self._place and parent == self._here:
            return  # the common case: the next entry of the same directory
        if place != self._place:
            while self._path:
                self._leave()
            if self._top is not None:
                self._settle(self._top, ".")
                self._top = None
            self._place = place
            if place is None:
                return
            os.chdir(self._places[place])
        parts = parent.split("/") if parent else []
        keep = 0
        while keep < min(len(parts), len(self._path)) and parts[keep] == self._path[keep]:
            keep += 1
        while len(self._path) > keep:
            self._leave()
        if len(parts) > len(self._path):
            raise ValueError("the copy names an entry before its directory")

    def _descend(self, name: str, member: tarfile.TarInfo) -> None:
        above = os.lstat(".")
        _enter(name, os.lstat(name))
        self._path.append(name)
        self._here = f"{self._here}/{name}" if self._here else name
        self._dirs.append((member, above))

    def _leave(self) -> None:
        member, above = self._dirs.pop()
        name = self._path.pop()
        self._here = self._here.rpartition("/")[0]
        _climb(above)
        self._settle(member, name)

    def _settle(self, member: tarfile.TarInfo, name: str) -> None:
        """Owner, extended attributes, mode and time, as the copy has them."""
        symlink = member.issym()
        if self._owners:
            try:
                os.chown(name, member.uid, member.gid, follow_symlinks=False)
            except OSError:
                pass
        if not symlink:
            for key, value in member.pax_headers.items():
                if key.startswith(_XATTR_HEADER + COPIED_XATTRS):
                    try:
                        raw = value.encode(errors="surrogateescape")
                        os.setxattr(name, key[len(_XATTR_HEADER) :], raw)
                    except OSError:
                        pass
            os.chmod(name, member.mode)
        os.utime(name, (member.mtime, member.mtime), follow_symlinks=False)

    def _file(self, member: tarfile.TarInfo, name: str, source: tarfile.TarFile) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600)
        try:
            stream = source.fileobj
            assert stream is not None
            stream.seek(member.offset_data)
            sparse: list[tuple[int, int]] | None = getattr(member, "sparse", None)
            segments = [(0, member.size)] if sparse is None else sparse
            for offset, length in segments:
                os.lseek(fd, offset, os.SEEK_SET)
                left = length
                while left > 0:
                    piece = stream.read(min(left, PIECE))
                    if not piece:
                        raise ValueError("the copy ended inside a file")
                    write_all(fd, piece)
                    left -= len(piece)
            os.ftruncate(fd, member.size)
        finally:
            os.close(fd)
        self._settle(member, name)


def _with_parents(paths: frozenset[str]) -> frozenset[str]:
    """``paths`` (relative) and every directory above each."""
    found: set[str] = set()
    for path in paths:
        parts = path.split("/")
        found.update("/".join(parts[:n]) for n in range(1, len(parts) + 1))
    return frozenset(found)


def _lstat(name: str) -> os.stat_result | None:
    try:
        return os.lstat(name)
    except FileNotFoundError:
        return None


def import_copy(args: dict[str, Any], data: int) -> None:
    """Unpack the copy read from pipe ``data`` into ``args["places"]``."""
    unpacker = _Unpacker([str(p) for p in args["places"]], os.geteuid() == 0)
    with (
        open(data, "rb", closefd=False) as stream,
        tarfile.open(fileobj=stream, mode="r|") as archive,
    ):
        while (member := archive.next()) is not None:
            archive.members.clear()  # type: ignore[attr-defined]  # a stream: nothing is looked up again
            unpacker.apply(member, archive)
    unpacker.finish()
