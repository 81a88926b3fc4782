"""What a normal (non-editable) install ships, and what loads without the test extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parent.parent

# Blocks the test extra's packages, as in an environment with only the runtime ones.
WITHOUT_TEST_EXTRA = (
    "import sys\nfor name in ('werkzeug', 'pytest_httpserver'):\n    sys.modules[name] = None\n"
)


def python_without_test_extra(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TEST_EXTRA + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_module_directory_is_a_package_the_install_ships() -> None:
    found = set(setuptools.find_packages(str(ROOT), include=["piship_remote*"]))
    with_modules = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "piship_remote").rglob("*.py")
    }
    assert with_modules - found == set()


def test_the_typing_marker_is_shipped() -> None:
    assert (ROOT / "piship_remote" / "py.typed").is_file()


@pytest.mark.timeout(90)
def test_the_library_and_its_pytest_plugin_load_without_the_test_extra() -> None:
    done = python_without_test_extra(
        "import piship_remote, piship_remote.testing.plugin\n"
        "from piship_remote.backends.e2b.backend import E2bCompatibleBackend\n"
        "print('loaded')\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "loaded\n"


@pytest.mark.timeout(90)
def test_a_test_double_without_the_test_extra_names_what_is_missing() -> None:
    done = python_without_test_extra("from piship_remote.testing import E2bServer\n")
    assert done.returncode != 0
    assert "werkzeug" in done.stderr or "pytest_httpserver" in done.stderr
