"""Hostile image archives against the template unpack: a compression bomb, a sparse member
claiming gigabytes, too many entries, a whiteout naming ``..``, a tree deeper than Python
recurses. Each is refused with nothing left behind, and the service refuses to start on
it with ``CONFIG_INVALID``."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.oci_archive import (
    ImageLimits,
    ImageRefused,
    copy_root,
    unpack_image,
)
from piship_remote.local.sandbox.templates import prepare_templates
from piship_remote.model.errors import CONFIG_INVALID, PiShipError
from tests.support.image import docker_save_tar, layer, oci_layout_tar
from tests.support.local_service import needs_bwrap
from tests.support.trees import depth_of, make_deep_tree, searchable_root

pytestmark = pytest.mark.timeout(120)
__all__ = ["searchable_root"]  # a fixture

MIB = 1024 * 1024
GIB = 1024 * MIB
DEEP_WITHIN_PATH_MAX = 1_500  # past Python's recursion limit; "d/" * 1_500 < PATH_MAX


def gzip_bomb_layer(expanded: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    """A gzip'd layer tar of one member of ``expanded`` zero bytes (a file, or with
    ``XHDTYPE`` an extended header, which a tar reader holds in memory whole): one
    compressed MiB of zeros repeated (gzip members concatenate), so it costs nothing."""
    header = tarfile.TarInfo("bomb")
    header.size, header.type = expanded, kind
    zeros = gzip.compress(b"\0" * MIB, mtime=0)
    return b"".join(
        [gzip.compress(header.tobuf(tarfile.GNU_FORMAT), mtime=0)]
        + [zeros] * (expanded // MIB)
        + [gzip.compress(b"\0" * 1024, mtime=0)]  # the tar's end
    )


def bomb_archive(target: Path, expanded: int, kind: bytes = tarfile.REGTYPE) -> Path:
    """A ``docker save`` archive whose one layer is :func:`gzip_bomb_layer`."""
    return docker_save_tar(target, [gzip_bomb_layer(expanded, kind)])


def sparse_layer(tmp_path: Path, size: int) -> bytes:
    """A layer tar holding one sparse file of ``size`` bytes (a few KB in the tar)."""
    tar_program = shutil.which("tar")
    if tar_program is None:
        pytest.skip("GNU tar is needed to write a sparse tar member")
    source = tmp_path / "sparse-source"
    source.mkdir()
    with open(source / "big", "wb") as handle:
        handle.truncate(size)
    out = tmp_path / "sparse-layer.tar"
    subprocess.run(
        [tar_program, "--sparse", "--format=gnu", "-cf", str(out), "-C", str(source), "big"],
        check=True,
        timeout=60,
    )
    return out.read_bytes()


def test_a_gzip_bomb_layer_is_refused_before_it_is_written(tmp_path: Path) -> None:
    archive = bomb_archive(tmp_path / "bomb.tar", 1536 * MIB)
    assert archive.stat().st_size < 2 * MIB
    with pytest.raises(ImageRefused, match="times its archive's size"):
        unpack_image(str(archive), str(tmp_path / "root"))
    assert not (tmp_path / "root").exists()


def test_a_gzip_bomb_header_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    archive = bomb_archive(tmp_path / "bomb.tar", 1536 * MIB, tarfile.XHDTYPE)
    with pytest.raises(ImageRefused, match="decompress to more than 100 times"):
        unpack_image(str(archive), str(tmp_path / "root"))
    assert not (tmp_path / "root").exists()


def test_a_sparse_member_claiming_3_gib_is_refused(tmp_path: Path) -> None:
    archive = oci_layout_tar(tmp_path / "sparse.tar", [sparse_layer(tmp_path, 3 * GIB)])
    assert archive.stat().st_size < 64 * 1024
    with pytest.raises(ImageRefused, match="times its archive's size"):
        unpack_image(str(archive), str(tmp_path / "root"))
    assert not (tmp_path / "root").exists()


def test_an_image_past_its_byte_limit_is_refused(tmp_path: Path) -> None:
    archive = docker_save_tar(tmp_path / "big.tar", [layer({"a": b"x" * MIB, "b": b"y" * MIB})])
    limits = ImageLimits(max_bytes=MIB + MIB // 2)
    with pytest.raises(ImageRefused, match="more than 1 MiB"):
        unpack_image(str(archive), str(tmp_path / "root"), limits)
    assert not (tmp_path / "root").exists()


def test_an_image_past_its_entry_limit_is_refused(tmp_path: Path) -> None:
    entries: dict[str, bytes | str | None] = {f"f{n}": b"" for n in range(20)}
    archive = docker_save_tar(tmp_path / "many.tar", [layer(entries)])
    with pytest.raises(ImageRefused, match="more than 10 entries"):
        unpack_image(str(archive), str(tmp_path / "root"), ImageLimits(max_entries=10))
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("whiteout", [".wh...", ".wh..", ".wh.", "app/.wh..."])
def test_a_whiteout_naming_no_entry_is_refused_before_it_removes_anything(
    tmp_path: Path, whiteout: str
) -> None:
    cache = tmp_path / "cache"
    good = docker_save_tar(tmp_path / "good.tar", [layer({"app/keep": b"k"})])
    evil = docker_save_tar(tmp_path / "evil.tar", [layer({"app/x": b"x", whiteout: b""})])
    with pytest.raises(ValueError, match="whiteout that names no entry"):
        prepare_templates({"good": str(good), "evil": str(evil)}, str(cache))
    assert (cache / "good" / "app" / "keep").read_bytes() == b"k"
    assert not (cache / "evil").exists()


@needs_bwrap
def test_the_service_refuses_to_start_on_a_gzip_bomb(tmp_path: Path, searchable_root: Path) -> None:
    archive = bomb_archive(tmp_path / "bomb.tar", 1536 * MIB)
    with pytest.raises(PiShipError) as raised:
        LocalE2bService(root=searchable_root, templates={"bomb": archive})
    assert raised.value.code == CONFIG_INVALID
    assert "times its archive's size" in raised.value.message
    assert os.listdir(searchable_root) == []


def test_a_root_filesystem_folder_deeper_than_python_recurses_is_copied(
    searchable_root: Path,
) -> None:
    make_deep_tree(searchable_root / "rootfs", DEEP_WITHIN_PATH_MAX)
    copy_root(str(searchable_root / "rootfs"), str(searchable_root / "copy"))
    assert depth_of(searchable_root / "copy") == DEEP_WITHIN_PATH_MAX
