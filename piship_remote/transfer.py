"""The values file operations return: ``FileInfo``, ``TransferSummary``, ``SkippedPath``.

summary = sandbox.push()
print(summary.files, summary.bytes)
for skipped in summary.skipped:
    print(skipped.path, skipped.reason)      # e.g. ".env read-deny"
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

__all__ = ["FILE_TYPES", "SKIP_REASONS", "FileInfo", "SkippedPath", "TransferSummary"]

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
