"""How much the file scenarios move at each ``--size`` (kept apart from the exec sizes).

>>> FILE_SIZES["small"].file_bytes // MIB
64
"""

from __future__ import annotations

import attrs

from benchmarks.sizes import MIB

__all__ = ["FILE_SIZES", "MIB", "FileSize"]


@attrs.frozen
class FileSize:
    """One file's bytes and rounds; a pushed tree's files and bytes and rounds."""

    file_bytes: int
    file_rounds: int
    tree_files: int
    tree_bytes: int
    push_rounds: int

    @property
    def disk_mib(self) -> int:
        """Room each sandbox needs: the file and its staging, with slack."""
        return max(1024, 2 * (self.file_bytes + self.tree_bytes) // MIB + 512)


FILE_SIZES: dict[str, FileSize] = {
    "tiny": FileSize(2 * MIB, 1, 200, 2_000_000, 1),
    "small": FileSize(64 * MIB, 3, 2_000, 20_000_000, 3),
    "full": FileSize(1024 * MIB, 5, 10_000, 100_000_000, 3),
}
