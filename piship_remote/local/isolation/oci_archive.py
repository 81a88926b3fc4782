"""A container image archive unpacked into a root filesystem, layer by layer, nothing outside it.

Three archive forms are read: what ``docker save`` / ``podman save`` write (a
``manifest.json`` listing the layer tars), an OCI image layout in a tar (``index.json``
-> a manifest blob -> layer blobs), and a flat root filesystem (what ``docker export``
writes: one tar of the files with ``usr/``, ``etc/`` or ``bin/`` at its top, read as one
layer). Layers are applied in order;
their whiteouts are honoured (``.wh.NAME`` removes ``NAME`` from the layers below,
``.wh..wh..opq`` empties its directory first). Layers may be plain or gzip tars::

    unpack_image("app.tar", "/var/cache/piship/templates/app")   # ImageRefused if hostile
    copy_root("./rootfs", "/var/cache/piship/templates/tools")     # a folder, links kept

Nothing is ever written outside ``target``: a member named with an absolute path or
``..``, one whose parent is a symlink (in the image so far), a hard link to outside
the root, and a whiteout naming no entry (``.wh.``, ``.wh..``, ``.wh...``) refuse the
whole archive (:class:`ImageRefused`), before that member changes anything. Device
nodes are skipped (they cannot be made unprivileged and a sandbox gets its own
``/dev``); owners are not restored (the files belong to the service, the sandbox sees
them read-only). Every file, link and directory keeps its modification time, and every
file its mode (a directory stays open to the service), so the image's ``.pyc`` files stay
valid: a Python whose sources all carried the unpack time would recompile them at every
start.

What an archive may cost the host is bounded by :class:`ImageLimits`: the bytes its
files hold once unpacked (a sparse member counts at its full size, as it is written
out), its entries, and the ratio of those bytes to the archive's own size (a gzip
layer of zeros expands a thousandfold). The ratio also bounds what the layers' tars
decompress to, headers included, counted before each read: a layer is read as a
stream (decompressed here, gzip, bzip2 or xz), so a header claiming gigabytes is
refused before it is held in memory. A refused archive leaves nothing behind.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Iterator
from typing import IO, Any, Protocol

import attrs

from piship_remote.local.isolation.trees import remove_tree, walk

__all__ = [
    "DEFAULT_IMAGE_LIMITS",
    "ImageLimits",
    "ImageRefused",
    "copy_root",
    "is_image_archive",
    "unpack_image",
]

WHITEOUT = ".wh."
WHITEOUT_META = ".wh..wh."
OPAQUE = ".wh..wh..opq"
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_OUTER_ENTRIES = 10_000
"""Files in the archive itself (docker save: a few per layer), before any layer is read."""
PIECE = 1024 * 1024
_ROOT_FOLDERS = frozenset({"usr", "etc", "bin"})  # one of them: a flat tar is a root filesystem
MIB = 1024 * 1024
IMAGE_MAX_MIB = 8192
"""The bytes an image's files may hold once unpacked."""
IMAGE_MAX_ENTRIES = 500_000
"""Entries (files, directories, links, whiteouts) over all of an image's layers."""
IMAGE_MAX_EXPANSION = 100
"""How many times its archive's size an image may unpack to, past ``EXPANSION_FREE_MIB``."""
EXPANSION_FREE_MIB = 64
"""What any archive, however small, may unpack to."""


@attrs.frozen
class ImageLimits:
    """What unpacking one image archive may cost the host."""

    max_bytes: int = IMAGE_MAX_MIB * MIB
    max_entries: int = IMAGE_MAX_ENTRIES
    max_expansion: int = IMAGE_MAX_EXPANSION

    def __attrs_post_init__(self) -> None:
        for name in ("max_bytes", "max_entries", "max_expansion"):
            if getattr(self, name) <= 0:
                raise ValueError(f"the image {name} limit must be positive")


DEFAULT_IMAGE_LIMITS = ImageLimits()


class ImageRefused(ValueError):
    """The archive is not an image this service reads, or would write outside its root."""


def is_image_archive(path: str) -> bool:
    """Whether ``path`` is a file holding a tar (the image forms are checked on unpacking)."""
    return os.path.isfile(path) and tarfile.is_tarfile(path)


def unpack_image(archive: str, target: str, limits: ImageLimits = DEFAULT_IMAGE_LIMITS) -> None:
    """Unpack the image ``archive`` into the new directory ``target`` (its parent must exist);
    :class:`ImageRefused` (or ``OSError``) with nothing left in ``target``'s place if not."""
    budget = _Budget(limits, os.path.getsize(archive))
    os.mkdir(target, 0o755)
    folder_times: dict[str, float] = {}
    try:
        with tarfile.open(archive, "r:*") as outer:
            flat = _is_flat(outer)
            layers = () if flat else _layers(outer)
            for layer in layers:
                with tarfile.open(fileobj=_Metered(_decompressed(layer), budget), mode="r|") as tar:
                    _apply(tar, target, budget, folder_times)
        if flat:
            with open(archive, "rb") as raw:
                stream = _Metered(_decompressed(raw), budget)
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    _apply(tar, target, budget, folder_times)
        _set_folder_times(folder_times)
    except BaseException:
        remove_tree(target)
        raise


def copy_root(source: str, target: str) -> None:
    """Copy the root filesystem ``source`` into the new directory ``target``: directories,
    regular files and symlinks (as links, never followed), with their times; other kinds
    are skipped."""
    os.mkdir(target, 0o755)
    folder_times = {target: os.stat(source).st_mtime}
    for directory, dirnames, filenames in walk(source):
        inside = os.path.join(target, os.path.relpath(directory, source))
        for name in dirnames + filenames:
            copied = os.path.join(inside, name)
            mtime = _copy_entry(os.path.join(directory, name), copied)
            if name in dirnames and mtime is not None:
                folder_times[copied] = mtime
    _set_folder_times(folder_times)


def _set_folder_times(folder_times: dict[str, float]) -> None:
    """Give each folder its time, deepest first (filling a folder changes its time)."""
    for folder in sorted(folder_times, key=lambda path: path.count(os.sep), reverse=True):
        if os.path.isdir(folder) and not os.path.islink(folder):
            os.utime(folder, (folder_times[folder], folder_times[folder]))


def _is_flat(outer: tarfile.TarFile) -> bool:
    """Whether the tar is a root filesystem itself (``docker export``): a root's ``usr``,
    ``etc`` or ``bin`` at its top (an image archive has its layers and manifest there),
    seen among its first ``MAX_OUTER_ENTRIES`` members."""
    for seen, member in enumerate(outer, 1):
        top = member.name.removeprefix("./").split("/", 1)[0]
        if top in ("manifest.json", "index.json") or seen > MAX_OUTER_ENTRIES:
            return False
        if top in _ROOT_FOLDERS:
            return True
    return False


class _Budget:
    """What one archive has unpacked so far, against its :class:`ImageLimits`."""

    def __init__(self, limits: ImageLimits, archive_size: int) -> None:
        self.limits = limits
        expansion = limits.max_expansion * archive_size
        self.expansion_cap = max(expansion, EXPANSION_FREE_MIB * MIB)
        self.entries = 0
        self.bytes = 0
        self.streamed = 0

    def stream(self, size: int) -> None:
        """Count ``size`` more bytes of the layers' tars about to be read (headers included):
        :class:`ImageRefused` before a read that would pass the expansion ratio."""
        self.streamed += size
        if self.streamed > self.expansion_cap:
            raise ImageRefused(
                f"the image's layers decompress to more than {self.limits.max_expansion} times"
                " its archive's size: a compression bomb"
            )

    def entry(self, member: tarfile.TarInfo) -> None:
        """Count ``member``; :class:`ImageRefused` before it is written if it is one too many
        or its bytes would pass a limit."""
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise ImageRefused(f"the image holds more than {self.limits.max_entries} entries")
        if not member.isfile():
            return
        self.bytes += member.size
        if self.bytes > self.limits.max_bytes:
            raise ImageRefused(f"the image unpacks to more than {self.limits.max_bytes // MIB} MiB")
        if self.bytes > self.expansion_cap:
            raise ImageRefused(
                f"the image unpacks to more than {self.limits.max_expansion} times its"
                f" archive's size ({self.bytes // MIB} MiB so far): a compression bomb or"
                " sparse files"
            )


def _copy_entry(path: str, copy: str) -> float | None:
    """Copy one entry (a directory empty: its files follow); its modification time."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(path), copy)
    elif stat.S_ISDIR(info.st_mode):
        os.mkdir(copy, stat.S_IMODE(info.st_mode) | 0o700)
        return info.st_mtime
    elif stat.S_ISREG(info.st_mode):
        shutil.copyfile(path, copy, follow_symlinks=False)
        os.chmod(copy, stat.S_IMODE(info.st_mode) & 0o1777)
    else:
        return None
    os.utime(copy, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
    return info.st_mtime


class _Reader(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class _Metered(io.RawIOBase):
    """A layer's tar as it is read, each read counted by the budget before it is made."""

    def __init__(self, stream: _Reader, budget: _Budget) -> None:
        self._stream = stream
        self._budget = budget

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = PIECE
        self._budget.stream(size)
        return self._stream.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _decompressed(layer: IO[bytes]) -> _Reader:
    """A layer's tar: the layer itself, or decompressed as it is read (gzip, bzip2, xz)."""
    stream = layer if isinstance(layer, io.BufferedReader) else io.BufferedReader(_Raw(layer))
    magic = stream.peek(6)[:6]
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(stream, mode="rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(stream, mode="rb")
    return stream


class _Raw(io.RawIOBase):
    """Any binary file as raw I/O, to buffer it."""

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._source.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _layers(outer: tarfile.TarFile) -> Iterator[IO[bytes]]:
    """The layer tars of a docker-save archive or an OCI layout, lowest first."""
    names = _outer_names(outer)
    if "manifest.json" in names:
        manifest = _json(outer, "manifest.json")
        if not isinstance(manifest, list) or not manifest or not isinstance(manifest[0], dict):
            raise ImageRefused("manifest.json names no image")
        paths = manifest[0].get("Layers")
    elif "index.json" in names:
        paths = _oci_layers(outer)
    else:
        raise ImageRefused(
            "not an image archive: no manifest.json (docker save) or index.json (OCI), nor a"
            " root filesystem (docker export: usr/, etc/ or bin/ at its top)"
        )
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ImageRefused("the image's manifest lists no layers")
    for path in paths:
        yield _member(outer, path)


def _outer_names(outer: tarfile.TarFile) -> set[str]:
    """The names of the archive's own members (its layers and their manifests), at most
    ``MAX_OUTER_ENTRIES`` of them."""
    names: set[str] = set()
    for member in outer:
        names.add(member.name)
        if len(names) > MAX_OUTER_ENTRIES:
            raise ImageRefused(
                f"the archive holds more than {MAX_OUTER_ENTRIES} files: not an image archive"
            )
    return names


def _oci_layers(outer: tarfile.TarFile) -> list[str]:
    index = _json(outer, "index.json")
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or not manifests or not isinstance(manifests[0], dict):
        raise ImageRefused("index.json names no manifest")
    manifest = _json(outer, _blob(manifests[0].get("digest")))
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise ImageRefused("the OCI manifest lists no layers")
    return [_blob(layer.get("digest") if isinstance(layer, dict) else None) for layer in layers]


def _blob(digest: object) -> str:
    if not isinstance(digest, str) or ":" not in digest:
        raise ImageRefused(f"not a content digest: {digest!r}"[:200])
    algorithm, _, value = digest.partition(":")
    if not (algorithm.isalnum() and value.isalnum()):
        raise ImageRefused(f"not a content digest: {digest!r}"[:200])
    return f"blobs/{algorithm}/{value}"


def _member(outer: tarfile.TarFile, name: str) -> IO[bytes]:
    try:
        extracted = outer.extractfile(name)
    except KeyError:
        extracted = None
    if extracted is None:
        raise ImageRefused(f"the archive has no file {name!r}"[:200])
    return extracted


def _json(outer: tarfile.TarFile, name: str) -> Any:
    data = _member(outer, name).read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ImageRefused(f"{name} is too large")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ImageRefused(f"{name} is not JSON") from None


# -- one layer -----------------------------------------------------------------------------


def _apply(
    tar: tarfile.TarFile, root: str, budget: _Budget, folder_times: dict[str, float]
) -> None:
    for member in tar:
        budget.entry(member)
        relative = _safe_name(member.name)
        if relative is None:
            continue  # the root itself
        parent, base = posixpath.split(relative)
        if base == OPAQUE:
            _empty(_inside(root, parent))
        elif base.startswith(WHITEOUT_META):
            continue  # the layer format's own bookkeeping (aufs), not the image's files
        elif base.startswith(WHITEOUT):
            removed = _whited_out(member.name, base)  # checked before anything is removed
            _remove(os.path.join(_inside(root, parent), removed))
        else:
            _write(tar, member, root, _inside(root, parent), base)
            if member.isdir():
                folder_times[os.path.join(root, relative)] = member.mtime


def _whited_out(name: str, base: str) -> str:
    """The entry a whiteout ``base`` removes; :class:`ImageRefused` when it names none."""
    removed = base[len(WHITEOUT) :]
    if removed in ("", ".", ".."):
        raise ImageRefused(f"the image holds a whiteout that names no entry: {name!r}"[:200])
    return removed


def _safe_name(name: str) -> str | None:
    """The member's path relative to the root; :class:`ImageRefused` if it leaves it."""
    if name.startswith("/"):
        raise ImageRefused(f"the image holds an absolute path: {name!r}"[:200])
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageRefused(f"the image holds a path out of its root: {name!r}"[:200])
    return "/".join(parts) or None


def _inside(root: str, relative: str) -> str:
    """The host path of directory ``relative``, made if missing, refusing symlinks on the way."""
    path = root
    for part in relative.split("/") if relative else ():
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            os.mkdir(path, 0o755)
            continue
        if stat.S_ISLNK(mode):
            raise ImageRefused(f"the image writes through a symlink: {relative!r}"[:200])
        if not stat.S_ISDIR(mode):
            raise ImageRefused(f"the image writes below a file: {relative!r}"[:200])
    return path


def _remove(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        remove_tree(path)
        if os.path.lexists(path):
            raise OSError(f"{os.path.basename(path)!r} could not be removed")
    else:
        os.unlink(path)


def _empty(directory: str) -> None:
    for name in os.listdir(directory):
        _remove(os.path.join(directory, name))


def _write(
    tar: tarfile.TarFile, member: tarfile.TarInfo, root: str, parent: str, base: str
) -> None:
    path = os.path.join(parent, base)
    if member.isdir():
        # Kept writable by the service while later members and layers fill it.
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, _mode(member) | 0o700)
            return
        _remove(path)
        os.mkdir(path, _mode(member) | 0o700)
        return
    _remove(path)
    if member.issym():
        os.symlink(member.linkname, path)
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
    elif member.islnk():
        source = _safe_name(member.linkname)
        if source is None:
            raise ImageRefused(f"the image links to its root: {member.name!r}"[:200])
        head, tail = posixpath.split(source)
        os.link(os.path.join(_inside(root, head), tail), path, follow_symlinks=False)
    elif member.isfile():
        extracted = tar.extractfile(member)
        assert extracted is not None  # a regular file always has content
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, _mode(member))
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(extracted, out, PIECE)
        os.chmod(path, _mode(member))
        os.utime(path, (member.mtime, member.mtime))
    elif member.isfifo():
        os.mkfifo(path, _mode(member))
        os.utime(path, (member.mtime, member.mtime))
    # Character and block devices are skipped: the sandbox gets its own /dev.


def _mode(member: tarfile.TarInfo) -> int:
    """The member's permission bits without set-id bits (the sandbox's mounts are nosuid)."""
    return member.mode & 0o1777
