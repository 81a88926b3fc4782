"""A template keeps its files as they were: times and modes, from a folder or an archive (so an
image's ``.pyc`` files stay valid), and a flat root filesystem tar (``docker export``) is one."""

from __future__ import annotations

import os
import py_compile
import struct
import tarfile
from pathlib import Path

import pytest
import requests

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.oci_archive import copy_root, unpack_image
from piship_remote.local.sandbox.templates import prepare_templates
from tests.support.image import docker_save_tar, layer, layer_of_directory, minimal_rootfs
from tests.support.local_service import Client, needs_bwrap

pytestmark = pytest.mark.timeout(120)
OLD = 1_000_000_000  # 2001-09-09: any time that is not now


def python_tree(root: Path) -> Path:
    """``lib/mod.py`` from long ago, compiled as CPython does (its time in the .pyc), mode 0640."""
    (root / "lib").mkdir(parents=True)
    source = root / "lib" / "mod.py"
    source.write_text("VALUE = 1\n")
    source.chmod(0o640)
    os.utime(source, (OLD, OLD))
    py_compile.compile(str(source), cfile=str(root / "lib" / "mod.pyc"))
    os.utime(root / "lib", (OLD, OLD))
    return root


def pyc_is_valid(source: Path, compiled: Path) -> bool:
    """Whether a timestamp .pyc still matches its source, as the import system checks it."""
    header = compiled.read_bytes()[:16]
    flags, mtime, size = struct.unpack("<III", header[4:16])
    info = source.stat()
    return flags == 0 and mtime == int(info.st_mtime) & 0xFFFFFFFF and size == info.st_size


def test_an_archive_keeps_its_files_times_and_modes(tmp_path: Path) -> None:
    image = docker_save_tar(
        tmp_path / "image.tar", [layer_of_directory(python_tree(tmp_path / "t"))]
    )
    unpack_image(str(image), str(tmp_path / "root"))
    source = tmp_path / "root" / "lib" / "mod.py"
    assert source.stat().st_mtime == OLD
    assert source.stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "root" / "lib").stat().st_mtime == OLD
    assert pyc_is_valid(source, tmp_path / "root" / "lib" / "mod.pyc")


def test_a_folder_keeps_its_files_times_and_modes(tmp_path: Path) -> None:
    tree = python_tree(tmp_path / "t")
    (tree / "lib" / "link").symlink_to("mod.py")
    os.utime(tree / "lib" / "link", (OLD, OLD), follow_symlinks=False)
    os.utime(tree / "lib", (OLD, OLD))
    copy_root(str(tree), str(tmp_path / "root"))
    copied = tmp_path / "root" / "lib"
    assert (copied / "mod.py").stat().st_mode & 0o777 == 0o640
    assert copied.stat().st_mtime == OLD
    assert (copied / "link").lstat().st_mtime == OLD
    assert pyc_is_valid(copied / "mod.py", copied / "mod.pyc")


def flat_tar(target: Path, entries: bytes) -> Path:
    target.write_bytes(entries)
    return target


def test_a_flat_root_filesystem_tar_is_unpacked_as_one_layer(tmp_path: Path) -> None:
    exported = flat_tar(tmp_path / "export.tar", layer({"etc/motd": b"hi\n", "bin/": None}))
    unpack_image(str(exported), str(tmp_path / "root"))
    assert (tmp_path / "root" / "etc" / "motd").read_bytes() == b"hi\n"


def test_a_missing_template_path_says_not_found(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"template gone: .*/nowhere\.tar is not found"):
        prepare_templates({"gone": tmp_path / "nowhere.tar"}, str(tmp_path / "cache"))


@needs_bwrap
def test_a_docker_export_tar_is_offered_as_a_template(tmp_path: Path) -> None:
    rootfs = minimal_rootfs(tmp_path / "rootfs")
    (rootfs / "etc" / "motd").write_text("exported\n")
    exported = tmp_path / "export.tar"
    with tarfile.open(exported, "w") as tar:
        for path in sorted(rootfs.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(rootfs)), recursive=False)
    with LocalE2bService(templates={"exported": exported}) as service:
        client = Client(service)
        sandbox = client.create(templateID="exported")
        assert client.run(sandbox, "cat /etc/motd").stdout == "exported\n"


@needs_bwrap
def test_the_service_lists_its_templates_without_a_key(tmp_path: Path) -> None:
    rootfs = minimal_rootfs(tmp_path / "rootfs")
    with LocalE2bService(templates={"tools": rootfs}) as service:
        answer = requests.get(service.url + "/templates", timeout=10)
    assert answer.status_code == 200
    assert [entry["templateID"] for entry in answer.json()] == ["base", "tools"]


@needs_bwrap
def test_an_offered_templates_alias_answers_its_template_id(client: Client) -> None:
    answer = client.control("GET", "/templates/aliases/base")
    assert answer.status_code == 200
    assert answer.json() == {"templateID": "base", "public": False}


@needs_bwrap
def test_an_alias_nothing_has_is_not_found(client: Client) -> None:
    answer = client.control("GET", "/templates/aliases/nothing-has-this-name")
    assert answer.status_code == 404


@needs_bwrap
def test_a_template_alias_needs_the_key(service: LocalE2bService) -> None:
    answer = requests.get(service.url + "/templates/aliases/base", timeout=10)
    assert answer.status_code == 401
