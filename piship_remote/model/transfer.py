"""The values file operations return: ``FileInfo``, ``TransferSummary``, ``SkippedPath``,
and the ``TransferLimits`` a download or pull obeys.

summary = sandbox.push()
print(summary.files, summary.bytes)
for skipped in summary.skipped:
    print(skipped.path, skipped.reason)      # e.g. ".env secret file"

sandbox.files.limits = TransferLimits(max_bytes=2 * 1024**3)   # what may come back at most
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

__all__ = [
    "FILE_TYPES",
    "SKIP_REASONS",
    "FileInfo",
    "SkippedPath",
    "TransferLimits",
    "TransferSummary",
]

FILE_TYPES = ("file", "dir", "symlink", "other")
SKIP_REASONS = (
    "read-deny",
    "ignored",
    "outside the workspace",
    "symlink leaves the workspace",
    "symlink",
    "not a regular file",
    "write not allowed",
    "not readable",
    "secret file",
    "secret folder",
    "name clash",
    "name not exact",
)


@attrs.frozen
class FileInfo:
    """A remote file or directory: ``path`` is absolute; ``type`` one of ``FILE_TYPES``."""

    path: str
    name: str
    type: str = attrs.field(validator=attrs.validators.in_(FILE_TYPES))
    size: int = 0


@attrs.frozen
class SkippedPath:
    """A path a transfer left out, and why in words (one of ``SKIP_REASONS``)."""

    path: str
    reason: str


def _skipped(values: Iterable[SkippedPath]) -> tuple[SkippedPath, ...]:
    return tuple(values)


@attrs.frozen
class TransferSummary:
    """What a transfer moved (regular files and their bytes) and what it left out."""

    files: int = 0
    bytes: int = 0
    skipped: tuple[SkippedPath, ...] = attrs.field(default=(), converter=_skipped)

    def __add__(self, other: TransferSummary) -> TransferSummary:
        return TransferSummary(
            self.files + other.files, self.bytes + other.bytes, self.skipped + other.skipped
        )


def _positive(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"TransferLimits.{attribute.name} must be a positive int, not {value!r}")


def _not_negative(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"TransferLimits.{attribute.name} must be an int >= 0, not {value!r}")


@attrs.frozen
class TransferLimits:
    """The most a download or pull from a sandbox writes on this host: bytes (what the
    entries declare, sparse ones at their full size) and entries, and the free space it
    leaves: it stops before the free space of the host filesystem it writes to (what an
    unprivileged user may use) falls below ``min_free_bytes`` (default 512 MiB; 0: no
    reserve). They apply while the data is read; past one, the transfer stops with a
    ``PiShipError`` naming it and leaves nothing on the host."""

    max_bytes: int = attrs.field(default=64 * 1024**3, validator=_positive)
    max_entries: int = attrs.field(default=1_000_000, validator=_positive)
    min_free_bytes: int = attrs.field(default=512 * 1024**2, validator=_not_negative)
