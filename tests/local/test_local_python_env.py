"""``python_env=``: the local service lends a host Python environment, read-only, to every
sandbox, so a suite's dependencies are there with no image, no docker and no network."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from piship_remote import PiShipError
from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.python_env import LENT_FOLDER, PythonEnv
from piship_remote.model.errors import CONFIG_INVALID
from tests.support.local_service import Client, needs_bwrap

pytestmark = pytest.mark.timeout(120)
HERE = sys.prefix  # the environment these tests run in: it holds pytest and attrs


def fake_env(folder: Path, *, home: str = "/usr/bin") -> Path:
    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / "python3"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    (folder / "pyvenv.cfg").write_text(f"home = {home}\nversion = 3.11\n")
    return folder


def test_a_venv_of_the_system_python_lends_only_itself(tmp_path: Path) -> None:
    env = PythonEnv.find(fake_env(tmp_path / "venv"))
    assert env.mounts() == [str((tmp_path / "venv").resolve())]
    assert env.variables("/usr/bin")["PATH"] == f"{(tmp_path / 'venv').resolve()}/bin:/usr/bin"
    assert env.variables("/usr/bin")["VIRTUAL_ENV"] == str((tmp_path / "venv").resolve())


def test_a_venv_of_another_installation_lends_that_too(tmp_path: Path) -> None:
    base = tmp_path / "opt" / "python3.11"
    (base / "bin").mkdir(parents=True)
    env = PythonEnv.find(fake_env(tmp_path / "venv", home=str(base / "bin")))
    assert env.base == str(base.resolve())
    assert str(base.resolve()) in env.mounts()


def test_editable_installs_lend_their_source_folders(tmp_path: Path) -> None:
    venv = fake_env(tmp_path / "venv")
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    old_style, new_style = tmp_path / "src-a", tmp_path / "src-b" / "pkg"
    old_style.mkdir()
    new_style.mkdir(parents=True)
    (site / "easy-install.pth").write_text(f"{old_style}\nimport os\n")
    (site / "__editable___pkg_1_0_finder.py").write_text(
        f"MAPPING: dict[str, str] = {{'pkg': '{new_style}'}}\n"
    )
    env = PythonEnv.find(venv)
    assert env.editable == (str(old_style.resolve()), str(new_style.resolve()))


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda tmp: tmp / "nothing", "not found"),
        (lambda tmp: tmp, "has no bin/python3"),
    ],
)
def test_what_cannot_be_lent_is_refused_saying_why(tmp_path: Path, make, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        PythonEnv.find(make(tmp_path))


def test_a_folder_over_the_sandbox_home_is_refused(tmp_path: Path) -> None:
    venv = fake_env(tmp_path / "venv")
    with pytest.raises(ValueError, match="overlaps the sandbox's own"):
        PythonEnv.find(venv, workdir=str(tmp_path))


@needs_bwrap
def test_the_service_refuses_a_bad_environment_as_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(PiShipError) as raised:
        LocalE2bService(python_env=tmp_path / "missing")
    assert raised.value.code == CONFIG_INVALID and "not found" in raised.value.message


@pytest.fixture
def lending() -> Iterator[LocalE2bService]:
    with LocalE2bService(python_env=HERE) as service:
        yield service


@needs_bwrap
def test_the_sandboxs_python3_is_the_lent_environment(lending: LocalE2bService) -> None:
    client = Client(lending)
    sandbox = client.create()
    result = client.run(sandbox, "python3 -c 'import sys, attrs, pytest; print(sys.prefix)'")
    assert result.stdout == f"{os.path.realpath(HERE)}\n"


@needs_bwrap
def test_the_lent_environment_is_read_only(lending: LocalE2bService) -> None:
    client = Client(lending)
    sandbox = client.create()
    result = client.run(sandbox, f"touch {os.path.realpath(HERE)}/bin/planted")
    assert "Read-only file system" in result.stderr
    assert not os.path.exists(os.path.join(HERE, "bin", "planted"))


@needs_bwrap
def test_a_staged_bind_is_gone_with_the_service() -> None:
    service = LocalE2bService(python_env=HERE)
    staged = os.path.join(service.root, LENT_FOLDER)
    service.close()
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        assert staged not in mounts.read()
    assert os.path.isdir(os.path.realpath(HERE))  # the lent folders themselves untouched
