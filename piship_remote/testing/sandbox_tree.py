"""What the doubles' in-memory shell needs of a file tree (absolute POSIX paths).

Errors are the ``OSError`` subclasses a real file system raises, so the utilities
can report them as ``sh`` would.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["ShellTree"]


class ShellTree(Protocol):
    def kind(self, path: str) -> str | None:
        """``"file"``, ``"dir"``, or ``None`` when nothing is there."""

    def read_file(self, path: str) -> bytes:
        """The file's bytes (``FileNotFoundError``, ``IsADirectoryError``)."""

    def write_file(self, path: str, data: bytes, mtime: float | None = None) -> None:
        """Create or replace a file; its parent must be a directory."""

    def make_dir(self, path: str) -> None:
        """Create one directory; its parent must exist (``FileExistsError`` if it does)."""

    def remove(self, path: str) -> None:
        """Remove a file, or a directory and everything under it."""

    def names(self, path: str) -> list[str]:
        """The names in a directory, sorted."""

    def mtime(self, path: str) -> float:
        """When the file or directory last changed (seconds since the epoch)."""

    def touch(self, path: str) -> None:
        """Set an existing path's time to now, or create an empty file."""
