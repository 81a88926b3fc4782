"""Tar archives a hostile sandbox could send: the members both fuzzers build.

A :class:`Member` is one header (any name, type, link, mode, declared size) and
the bytes that follow it, which need not match the declared size; :func:`tar_bytes`
writes members in a tar format, optionally without the end blocks, cut short,
or compressed (the unpacker reads any compression ``tarfile`` knows).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import tarfile

import attrs

BLOCK = tarfile.BLOCKSIZE
FORMATS = (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)
TYPES = (
    tarfile.REGTYPE,
    tarfile.AREGTYPE,
    tarfile.DIRTYPE,
    tarfile.SYMTYPE,
    tarfile.LNKTYPE,
    tarfile.CHRTYPE,
    tarfile.BLKTYPE,
    tarfile.FIFOTYPE,
    tarfile.CONTTYPE,
    tarfile.GNUTYPE_SPARSE,
    b"Z",  # no type tarfile knows
)
# Names aimed at the destination's outside, its metadata, and the path parser's corners.
NAMES = (
    "a",
    "a/b",
    "./a",
    "a//b",
    "dir/",
    "",
    ".",
    "..",
    "../escape",
    "a/../../escape",
    "/etc/escape",
    "//escape",
    "a\\..\\..\\escape",
    "link/escape",
    ".git/config",
    "deny",
    "a/deny",
    "x" * 300,
    "/".join(["d"] * 60),
    "\u00e9t\u00e9/\u65e5\u672c",
)
LINKS = ("", "..", "../..", "/", "/etc/passwd", "a", "link", "x" * 200)
COMPRESSIONS = (None, "gz", "bz2", "xz")
# Sizes a header may declare: small, past the data, past the unpacker's limits, the format's.
SIZES = (0, 1, BLOCK, BLOCK + 1, 1 << 20, 64 * 1024**3 + 1, 8**11 - 1, 2**63)


@attrs.frozen
class Member:
    name: str
    type: bytes
    data: bytes = b""
    linkname: str = ""
    mode: int = 0o644
    size: int | None = None  # the declared size; ``None``: the data's length
    format: int = tarfile.PAX_FORMAT


def tar_bytes(
    members: list[Member],
    *,
    end: bool = True,
    cut: int | None = None,
    compression: str | None = None,
) -> bytes:
    """The archive of ``members``; ``cut`` keeps only that many bytes (before compressing)."""
    body = b"".join(_member_bytes(member) for member in members)
    if end:
        body += b"\0" * (2 * BLOCK)
    if cut is not None:
        body = body[:cut]
    if compression == "gz":
        return gzip.compress(body, mtime=0)
    if compression == "bz2":
        return bz2.compress(body)
    if compression == "xz":
        return lzma.compress(body)
    return body


def _member_bytes(member: Member) -> bytes:
    info = tarfile.TarInfo(member.name)
    info.type = member.type
    info.linkname = member.linkname
    info.mode = member.mode
    info.size = len(member.data) if member.size is None else member.size
    try:
        header = info.tobuf(member.format, "utf-8", "surrogateescape")
    except ValueError:  # a field the format cannot hold: pax holds any
        header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    padding = b"\0" * (-len(member.data) % BLOCK)
    return header + member.data + padding
