"""The sandbox agent's work on the sandbox's content: file operations, metadata, and the copies
of a sandbox's files that snapshots and forks are made of.

Standard library only: it runs inside the sandbox, shipped beside ``agent.py``, in a helper
process the agent forks for one request, already switched to the requesting user (see
``agent.py``), so it needs nothing from the image (no shell, no coreutils) and sees exactly
the sandbox's own view. :func:`serve` answers one request: one JSON line on ``reply``,
``{"ok": value}`` or ``{"error": {"errno": "ENOENT", ...}}``; bytes flow through ``data`` (a
pipe), never held whole::

    serve("stat", {"path": "/home/user/a"}, reply, None)    # {"ok": {"fields": [...], ...}}
    serve("read", {"path": "/home/user/a"}, reply, out)      # {"ok": {"size": n}}, then bytes
    serve("write", {"path": p, "metadata": None}, reply, in_)
    serve("export", {"places": ["/home/user", "/tmp"]}, reply, out)   # a tar stream
    serve("import", {"places": ["/home/user", "/tmp"]}, reply, in_)
    serve("watch", {"path": "/home/user", "recursive": True}, reply, out)  # events, until
                                                                           # out is closed

Entries are answered as a listing: for each, the fields ``find -printf`` would print
(type, target type, size, mode, owner, group, mtime, link target, path), each ended by a
NUL, then a JSON object of their metadata by path (the extended attributes
``user.e2b.<key>``), all in one string (bytes that are not UTF-8 kept as surrogates).

Every tree walk here is iterative and moves with the helper's working directory (a
directory is entered only through ``O_NOFOLLOW``, and the way back up is checked), so
a tree 10,000 levels deep is walked with short paths and without recursion.

A copy is a pax tar stream: each place's entries under its sandbox path (``home/user/…``),
regular files, directories and symlinks with their modes, owners, times and ``user.``
extended attributes; a sparse file is written as GNU sparse 1.0 (its data segments only,
found with ``SEEK_DATA``/``SEEK_HOLE``), so holes cost nothing in the copy and stay holes
when it is unpacked.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import re
import stat
import tarfile
from collections.abc import Iterator
from types import ModuleType
from typing import Any, BinaryIO

PIECE = 1024 * 1024
METADATA_PREFIX = "user.e2b."
COPIED_XATTRS = "user."
_KINDS = (
    (stat.S_ISREG, "f"),
    (stat.S_ISDIR, "d"),
    (stat.S_ISLNK, "l"),
    (stat.S_ISFIFO, "p"),
    (stat.S_ISSOCK, "s"),
    (stat.S_ISBLK, "b"),
    (stat.S_ISCHR, "c"),
)
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


def serve(call: str, args: dict[str, Any], reply: int, data: int | None) -> None:
    """Answer one request on ``reply`` (and ``data``); never raises."""
    try:
        value = _CALLS[call](args, reply, data)
    except Refused as e:
        _answer(reply, {"error": e.details})
    except OSError as e:
        code = errno.errorcode.get(e.errno or 0, "EIO")
        _answer(reply, {"error": {"errno": code, "path": e.filename}})
    except (KeyError, TypeError, ValueError) as e:
        _answer(reply, {"error": {"errno": "EINVAL", "message": str(e)[:200]}})
    else:
        if value is not _ANSWERED:
            _answer(reply, {"ok": value})


_ANSWERED = object()


def _answer(reply: int, message: dict[str, object]) -> None:
    line = json.dumps(message).encode() + b"\n"
    try:
        while line:
            line = line[os.write(reply, line) :]
    except OSError:
        pass


# ---- entries -------------------------------------------------------------------------


class _Names:
    """User and group names from the sandbox's own ``/etc/passwd`` and ``/etc/group``."""

    def __init__(self) -> None:
        self._users: dict[int, str] | None = None
        self._groups: dict[int, str] | None = None

    def user(self, uid: int) -> str:
        if self._users is None:
            self._users = _read_names("/etc/passwd")
        return self._users.get(uid, str(uid))

    def group(self, gid: int) -> str:
        if self._groups is None:
            self._groups = _read_names("/etc/group")
        return self._groups.get(gid, str(gid))


def _read_names(path: str) -> dict[int, str]:
    found: dict[int, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as listing:
            for line in listing:
                fields = line.split(":")
                if len(fields) > 2 and fields[2].isdigit():
                    found.setdefault(int(fields[2]), fields[0])
    except OSError:
        pass
    return found


_NAMES = _Names()


def _kind(mode: int) -> str:
    for test, letter in _KINDS:
        if test(mode):
            return letter
    return "U"


def listing(paths: list[str]) -> str:
    """The listing of ``paths`` (those still there): their fields, then their metadata."""
    fields, found = [], {}
    for path in paths:
        try:
            described = describe(path)
        except OSError:
            continue
        fields += described
        metadata = read_metadata(path)
        if metadata:
            found[path] = metadata
    return "".join(field + "\0" for field in fields) + json.dumps(found)


def describe(path: str) -> list[str]:
    """``path``'s fields, as ``find -printf`` prints them."""
    info = os.lstat(path)
    kind = _kind(info.st_mode)
    link, target = "", kind
    if kind == "l":
        link = os.readlink(path)
        try:
            target = _kind(os.stat(path).st_mode)
        except FileNotFoundError:
            target = "N"
        except OSError as e:
            target = "L" if e.errno == errno.ELOOP else "?"
    nanos = info.st_mtime_ns
    return [
        kind,
        target,
        str(info.st_size),
        format(info.st_mode & 0o7777, "o"),
        _NAMES.user(info.st_uid),
        _NAMES.group(info.st_gid),
        f"{nanos // 10**9}.{nanos % 10**9:09d}",
        link,
        path,
    ]


def read_metadata(path: str) -> dict[str, str]:
    """``path``'s metadata: its ``user.e2b.<key>`` attributes (none where unreadable)."""
    try:
        names = os.listxattr(path)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.startswith(METADATA_PREFIX):
            try:
                value = os.getxattr(path, name)
            except OSError:
                continue
            found[name[len(METADATA_PREFIX) :]] = value.decode("ascii", "replace")
    return found


def write_metadata(path: str, wanted: dict[str, str]) -> None:
    """Replace ``path``'s metadata with ``wanted``."""
    for name in os.listxattr(path):
        if name.startswith(METADATA_PREFIX):
            os.removexattr(path, name)
    for key, value in wanted.items():
        os.setxattr(path, METADATA_PREFIX + key, value.encode("ascii"))


# ---- the calls -----------------------------------------------------------------------


def _stat(args: dict[str, Any], _: int, __: int | None) -> object:
    path = str(args["path"])
    os.lstat(path)
    return listing([path])


def _describe(args: dict[str, Any], _: int, __: int | None) -> object:
    return listing([str(path) for path in args["paths"]])


def _list(args: dict[str, Any], _: int, __: int | None) -> object:
    top, depth = str(args["path"]), int(args["depth"])
    if not stat.S_ISDIR(os.stat(top).st_mode):  # the top is followed, as find -H does
        raise Refused("ENOTDIR", path=top)
    found = []
    pending = [(top, 1)]
    while pending:
        directory, level = pending.pop()
        try:
            with os.scandir(directory) as entries:
                children = list(entries)
        except OSError:
            continue
        for child in children:
            path = os.path.join(directory, child.name)
            found.append(path)
            try:
                if level < depth and child.is_dir(follow_symlinks=False):
                    pending.append((path, level + 1))
            except OSError:
                continue
    return listing(found)


def _make_dir(args: dict[str, Any], _: int, __: int | None) -> object:
    path = str(args["path"])
    if os.path.isdir(path):
        raise Refused("EEXIST", directory=True)
    if os.path.lexists(path):
        raise Refused("EEXIST", directory=False)
    os.makedirs(path)
    return listing([path])


def _move(args: dict[str, Any], _: int, __: int | None) -> object:
    source, destination = str(args["source"]), str(args["destination"])
    if not os.path.lexists(source):
        raise Refused("ENOENT", path=source, source=True)
    os.makedirs(os.path.dirname(destination) or "/", exist_ok=True)
    try:
        os.rename(source, destination)
    except OSError as e:
        if e.errno != errno.EXDEV or (os.path.isdir(source) and not os.path.islink(source)):
            raise
        _copy_entry(source, destination)
        os.unlink(source)
    return listing([destination])


def _copy_entry(source: str, destination: str) -> None:
    """A file or symlink copied to another filesystem of the sandbox (a move across mounts)."""
    info = os.lstat(source)
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(source), destination)
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    with open(source, "rb") as reader, open(os.open(destination, flags, 0o600), "wb") as writer:
        while piece := reader.read(PIECE):
            writer.write(piece)
        os.fchmod(writer.fileno(), stat.S_IMODE(info.st_mode))
    os.utime(destination, ns=(info.st_atime_ns, info.st_mtime_ns))


def _remove(args: dict[str, Any], _: int, __: int | None) -> object:
    remove_tree(str(args["path"]))
    return {}


def _read(args: dict[str, Any], reply: int, data: int | None) -> object:
    path = str(args["path"])
    assert data is not None
    try:
        info = os.stat(path)
    except PermissionError:
        raise Refused("EACCES", path=path, stage="stat") from None
    except OSError:
        raise Refused("ENOENT", path=path) from None
    if stat.S_ISDIR(info.st_mode):
        raise Refused("EISDIR", path=path)
    try:
        source = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except PermissionError:
        raise Refused("EACCES", path=path, stage="open") from None
    try:
        size = os.fstat(source).st_size
        os.set_blocking(source, True)
        _answer(reply, {"ok": {"size": size}})
        _send(source, data, size)
    finally:
        os.close(source)
    return _ANSWERED


def _send(source: int, target: int, size: int) -> None:
    """Copy at most ``size`` bytes of ``source`` to ``target`` (a device never ends)."""
    left = size
    while left > 0:
        try:
            sent = os.sendfile(target, source, None, min(left, PIECE))
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            piece = os.read(source, min(left, PIECE))
            _write_all(target, piece)
            sent = len(piece)
        if sent == 0:
            return
        left -= sent


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write(args: dict[str, Any], _: int, data: int | None) -> object:
    path, metadata = str(args["path"]), args.get("metadata")
    assert data is not None
    if os.path.isdir(path):
        raise Refused("EISDIR", path=path)
    parent = os.path.dirname(path) or "/"
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        blocked = _first_non_directory(parent)
        code = "ENOTDIR" if blocked is not None else errno.errorcode.get(e.errno or 0, "EIO")
        raise Refused(code, path=e.filename or parent, blocked=blocked, stage="parent") from None
    existed = os.path.isfile(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOCTTY | os.O_CLOEXEC
    try:
        target = os.open(path, flags, 0o666)
    except OSError as e:
        raise Refused(errno.errorcode.get(e.errno or 0, "EIO"), path=path, stage="open") from None
    try:
        os.utime(target)
        while piece := os.read(data, PIECE):
            _write_all(target, piece)
    finally:
        os.close(target)
    if existed or metadata:
        try:
            write_metadata(path, dict(metadata or {}))
        except OSError as e:
            raise Refused("EMETADATA", message=e.strerror or "failed") from None
    return {}


def hand_parents(path: str, uid: int) -> None:
    """As the sandbox's root, before a helper becomes ``uid``: make the missing parents of
    ``path`` and give them to ``uid``, as envd does, so the user's ``/app/x`` can be written.

    Whatever fails here is left to the user's own write, which reports it.
    """
    if not os.path.isabs(path):
        return
    missing: list[str] = []
    parent = os.path.dirname(os.path.normpath(path))
    while parent != "/" and not os.path.lexists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o755)
            os.chown(directory, uid, uid, follow_symlinks=False)
        except OSError:
            return


def _first_non_directory(path: str) -> str | None:
    """The first component of ``path`` that exists and is not a directory, if any."""
    walked = "/"
    for part in path.strip("/").split("/"):
        walked = os.path.join(walked, part)
        if not os.path.lexists(walked):
            return None
        if not os.path.isdir(walked):
            return walked
    return None


def _canonical(args: dict[str, Any], _: int, __: int | None) -> object:
    path = str(args["path"])
    try:
        info = os.stat(path)
    except PermissionError:
        raise Refused("EACCES", path=path, stage="stat") from None
    except OSError:
        raise Refused("ENOENT", path=path) from None
    if not stat.S_ISDIR(info.st_mode):
        raise Refused("ENOTDIR", path=path)
    real = os.path.realpath(path)
    if not os.access(real, os.R_OK | os.X_OK):
        raise Refused("EACCES", path=path, stage="read")
    return real


def _usage(args: dict[str, Any], _: int, __: int | None) -> object:
    total = 0
    for place in args["places"]:
        for _entry, info in _Tree(str(place)).walk():
            total += info.st_size
    return total


# ---- trees ---------------------------------------------------------------------------


class _Tree:
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


class _RootLayer(_Tree):
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


def _export(args: dict[str, Any], _: int, data: int | None) -> object:
    assert data is not None
    places = [str(p) for p in args["places"]]
    kept_out = _kept_out()
    with open(data, "wb", buffering=PIECE, closefd=False) as out:
        for place in places:
            if place == "/":
                _export_root(str(args.get("layer") or "/"), kept_out, out)
            elif os.path.isdir(place):
                _export_place(place, _below(kept_out, place.strip("/")), out)
        out.write(b"\0" * (2 * _BLOCK))
    return {}


def _below(paths: frozenset[str], root: str) -> frozenset[str]:
    """``paths`` (relative to ``/``) below ``root``, relative to it."""
    return frozenset(path[len(root) + 1 :] for path in paths if path.startswith(root + "/"))


def _export_place(place: str, skip: frozenset[str], out: BinaryIO) -> None:
    root = place.strip("/")
    for relative, info in _Tree(place, skip).walk():
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
                    _write_all(fd, piece)
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


def _import(args: dict[str, Any], _: int, data: int | None) -> object:
    assert data is not None
    unpacker = _Unpacker([str(p) for p in args["places"]], os.geteuid() == 0)
    with (
        open(data, "rb", closefd=False) as stream,
        tarfile.open(fileobj=stream, mode="r|") as archive,
    ):
        while (member := archive.next()) is not None:
            archive.members.clear()  # type: ignore[attr-defined]  # a stream: nothing is looked up again
            unpacker.apply(member, archive)
    unpacker.finish()
    return {}


def _watch(args: dict[str, Any], reply: int, data: int | None) -> object:
    """Watch a directory until the host closes ``data`` (see ``agent_watch.py``)."""
    assert data is not None
    real = str(_canonical(args, reply, None))
    watching = _sibling("agent_watch")
    watching.watch(real, bool(args.get("recursive")), lambda: _answer(reply, {"ok": real}), data)
    return _ANSWERED


def _sibling(name: str) -> ModuleType:
    """The shipped module ``name``, beside this file (the sandbox has no package)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"piship_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CALLS = {
    "stat": _stat,
    "describe": _describe,
    "list": _list,
    "make_dir": _make_dir,
    "move": _move,
    "remove": _remove,
    "read": _read,
    "write": _write,
    "canonical": _canonical,
    "watch": _watch,
    "usage": _usage,
    "export": _export,
    "import": _import,
}
