"""The package's floor plan: the root holds only the public entry modules, names are listed once."""

from __future__ import annotations

import types
from pathlib import Path

import piship_remote

PACKAGE = Path(piship_remote.__file__).parent


def test_the_package_root_holds_only_the_public_entry_modules() -> None:
    modules = sorted(path.name for path in PACKAGE.glob("*.py"))

    assert modules == ["__init__.py", "__main__.py"]


def test_every_public_name_of_the_package_is_in_all() -> None:
    bound = {
        name
        for name, value in vars(piship_remote).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }

    assert bound == set(piship_remote.__all__) - {"__version__"}


def test_every_name_in_all_can_be_imported() -> None:
    missing = [name for name in piship_remote.__all__ if not hasattr(piship_remote, name)]

    assert missing == []
