"""Shared fixtures: the test doubles' plugin, and the seed's workspace layout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["piship_remote.testing.plugin"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The test's temporary directory with symlinks resolved (the seed's ``root``)."""
    return Path(os.path.realpath(tmp_path))


@pytest.fixture
def workspace(root: Path) -> Path:
    """``<root>/ws``, with ``ws/sub`` created."""
    path = root / "ws"
    (path / "sub").mkdir(parents=True)
    return path


@pytest.fixture
def home(root: Path) -> Path:
    """``<root>/home`` (not created), the home directory the seed activates with."""
    return root / "home"
