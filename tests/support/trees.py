"""Directory trees deeper than Python recurses and than ``PATH_MAX`` reaches, made and
measured one directory at a time (``pathlib`` and ``os.makedirs`` recurse), and a place
for them every user may search (a root service refuses any other)::

    make_deep_tree(tmp_path / "t", 10_000)      # t/d/d/.../d/leaf
    depth_of(tmp_path / "t")                    # 10_000
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from piship_remote.local.isolation.trees import remove_tree

__all__ = ["DEEP", "depth_of", "make_deep_tree", "searchable_root"]

DEEP = 10_000
"""What the issue asks a removal to survive."""


def make_deep_tree(top: Path, depth: int) -> None:
    """``top/d/d/…`` ``depth`` directories deep, with a file ``leaf`` at the bottom."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.close(leaf)
    finally:
        os.close(fd)


def depth_of(top: Path) -> int:
    """How many ``d`` directories deep the tree at ``top`` goes."""
    depth = 0
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while True:
            try:
                below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                return depth
            os.close(fd)
            fd, depth = below, depth + 1
    finally:
        os.close(fd)


@pytest.fixture
def searchable_root() -> Iterator[Path]:
    """A fresh directory under the system's temporary directory, searchable by every user,
    removed with :func:`remove_tree` at teardown: a deep tree must never be left to
    pytest's own cleanup of ``tmp_path``, which recurses and fails on it."""
    root = Path(tempfile.mkdtemp(prefix="piship-attack-"))
    root.chmod(0o755)
    yield root
    with contextlib.suppress(OSError):
        remove_tree(str(root))
