"""Templates of the local service: sandboxes made from an image archive or a root filesystem folder.

The images are built here without docker (see ``image_support``): a few host programs
and their libraries copied into a root with no ``/usr`` and no Python, wrapped as an
OCI layout tar or as ``docker save`` writes it.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from piship_remote import E2bCompatibleBackend, activate_sandbox
from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.oci_archive import ImageRefused, unpack_image
from piship_remote.local.isolation.user_map import root_mappable
from piship_remote.model.errors import CONFIG_INVALID, PiShipError
from tests.support.image import (
    docker_save_tar,
    layer,
    layer_of_directory,
    minimal_rootfs,
    oci_layout_tar,
)
from tests.support.local_service import Client, needs_bwrap

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return minimal_rootfs(tmp_path_factory.mktemp("image") / "rootfs")


@pytest.fixture(scope="module")
def archive(rootfs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An OCI layout tar: the root filesystem, then a layer adding ``/etc/motd``."""
    top = layer({"etc/motd": b"from the image\n"})
    return oci_layout_tar(
        tmp_path_factory.mktemp("oci") / "image.tar", [layer_of_directory(rootfs), top]
    )


@pytest.fixture(scope="module")
def service(rootfs: Path, archive: Path) -> Iterator[LocalE2bService]:
    if LocalE2bService.check() is not None:
        pytest.skip(f"bubblewrap cannot run: {LocalE2bService.check()}")
    with LocalE2bService(templates={"oci": archive, "folder": rootfs}) as running:
        yield running


def unpacked(tmp_path: Path, *layers: bytes) -> Path:
    """The root filesystem ``layers`` make, as a ``docker save`` archive unpacked."""
    target = tmp_path / "root"
    unpack_image(str(docker_save_tar(tmp_path / "image.tar", list(layers))), str(target))
    return target


# -- unpacking (no sandbox) ----------------------------------------------------------------


def test_layers_apply_in_order(tmp_path: Path) -> None:
    root = unpacked(tmp_path, layer({"etc/name": b"first"}), layer({"etc/name": b"second"}))
    assert (root / "etc" / "name").read_bytes() == b"second"


def test_a_whiteout_removes_a_file_of_a_lower_layer(tmp_path: Path) -> None:
    lower = layer({"app/keep": b"k", "app/gone": b"g"})
    root = unpacked(tmp_path, lower, layer({"app/.wh.gone": b""}))
    assert sorted(os.listdir(root / "app")) == ["keep"]


def test_an_opaque_whiteout_empties_its_directory_first(tmp_path: Path) -> None:
    lower = layer({"data/old1": b"1", "data/old2": b"2"})
    root = unpacked(tmp_path, lower, layer({"data/.wh..wh..opq": b"", "data/new": b"n"}))
    assert sorted(os.listdir(root / "data")) == ["new"]


def test_an_oci_layout_with_gzip_layers_is_read(tmp_path: Path) -> None:
    archive = oci_layout_tar(tmp_path / "oci.tar", [layer({"a": b"1"}), layer({"b": b"2"})])
    unpack_image(str(archive), str(tmp_path / "root"))
    assert sorted(os.listdir(tmp_path / "root")) == ["a", "b"]


@pytest.mark.parametrize(
    "name", ["../outside", "a/../../outside", "/etc/outside"], ids=["dotdot", "nested", "absolute"]
)
def test_a_member_leaving_the_root_refuses_the_archive(tmp_path: Path, name: str) -> None:
    with pytest.raises(ImageRefused):
        unpacked(tmp_path, layer({name: b"x"}))
    assert not (tmp_path / "outside").exists()


def test_a_write_through_a_symlink_refuses_the_archive(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    escape = layer({"link": f"->{outside}"})
    with pytest.raises(ImageRefused, match="symlink"):
        unpacked(tmp_path, escape, layer({"link/planted": b"x"}))
    assert list(outside.iterdir()) == []


def test_a_hard_link_out_of_the_root_refuses_the_archive(tmp_path: Path) -> None:
    buffer = tmp_path / "layer.tar"
    with tarfile.open(buffer, "w") as tar:
        info = tarfile.TarInfo("stolen")
        info.type, info.linkname = tarfile.LNKTYPE, "../../etc/passwd"
        tar.addfile(info)
    with pytest.raises(ImageRefused):
        unpacked(tmp_path, buffer.read_bytes())


def test_a_tar_that_is_no_image_is_refused(tmp_path: Path) -> None:
    plain = tmp_path / "plain.tar"
    plain.write_bytes(layer({"a": b"1"}))
    with pytest.raises(ImageRefused, match="not an image archive"):
        unpack_image(str(plain), str(tmp_path / "root"))


# -- the service ---------------------------------------------------------------------------


@needs_bwrap
def test_the_service_lists_its_templates(service: LocalE2bService) -> None:
    assert service.templates == ["base", "folder", "oci"]


@needs_bwrap
def test_an_archive_with_a_path_escape_is_refused_at_start(tmp_path: Path) -> None:
    hostile = docker_save_tar(tmp_path / "hostile.tar", [layer({"../escaped": b"x"})])
    with pytest.raises(PiShipError) as raised:
        LocalE2bService(templates={"hostile": hostile})
    assert raised.value.code == CONFIG_INVALID
    assert "hostile" in raised.value.message
    assert not (tmp_path / "escaped").exists()


@needs_bwrap
def test_an_unknown_template_is_refused_at_create_naming_it(service: LocalE2bService) -> None:
    client = Client(service)
    response = client.control("POST", "/sandboxes", json={"templateID": "python-3.12"})
    assert response.status_code == 404
    assert response.json() == {"code": 404, "message": "template 'python-3.12' not found"}


@needs_bwrap
@pytest.mark.parametrize("template", ["oci", "folder"])
def test_a_template_sandbox_runs_commands_and_files_without_the_hosts_usr(
    service: LocalE2bService, template: str, tmp_path: Path
) -> None:
    backend = E2bCompatibleBackend(
        endpoint=service.url, credential=lambda: service.api_key, template=template
    )
    with activate_sandbox({"required": True}, backend=backend, workspace=tmp_path) as sandbox:
        view = sandbox.run("ls /usr; command -v python3 python; echo shell=$0", check=False)
        assert "No such file or directory" in view.stderr
        assert view.stdout == "shell=/bin/bash\n"
        sandbox.files.write("notes/a.txt", "written through envd\n")
        assert sandbox.run("cat notes/a.txt").stdout == "written through envd\n"
        assert [info.name for info in sandbox.files.list("notes")] == ["a.txt"]
        assert sandbox.files.read_text("notes/a.txt") == "written through envd\n"


@needs_bwrap
def test_the_archive_s_layers_are_what_the_sandbox_sees(
    service: LocalE2bService, tmp_path: Path
) -> None:
    backend = E2bCompatibleBackend(
        endpoint=service.url, credential=lambda: service.api_key, template="oci"
    )
    with activate_sandbox({"required": True}, backend=backend, workspace=tmp_path) as sandbox:
        assert sandbox.run("cat /etc/motd").stdout == "from the image\n"


@needs_bwrap
def test_a_sandbox_s_writes_outside_its_places_do_not_reach_the_template(
    service: LocalE2bService, rootfs: Path
) -> None:
    client = Client(service)
    first = client.create(templateID="folder")
    second = client.create(templateID="folder")
    try:
        wrote = client.run(first, "echo mine > /tmp/scratch; touch /bin/planted")
        # The root filesystem is the sandbox's own writable layer (issue 40): the user's
        # write over the template's /bin is refused as root's files, or, in a sandbox with
        # no root beside its user, lands in that layer; either way only this sandbox has it.
        kept = client.run(first, "ls /bin/planted")
        assert "Permission denied" in wrote.stderr or kept.stdout == "/bin/planted\n"
        seen = client.run(second, "ls /tmp; ls /bin/planted")
        assert "scratch" not in seen.stdout
        assert not (rootfs / "bin" / "planted").exists()
    finally:
        for created in (first, second):
            client.control("DELETE", f"/sandboxes/{created['sandboxID']}")


# -- the base template: what E2B's base offers by name ---------------------------------------


@needs_bwrap
def test_the_base_template_runs_python_as_python3(service: LocalE2bService) -> None:
    client = Client(service)
    sandbox = client.create()
    try:
        ran = client.run(sandbox, "python -c 'import sys; print(sys.version_info[0])'")
        assert ran.stdout == "3\n"
    finally:
        client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")


@needs_bwrap
@pytest.mark.skipif(not root_mappable(), reason="a sandbox has a root only under a root service")
def test_the_base_templates_user_runs_a_command_as_root_with_sudo(
    service: LocalE2bService,
) -> None:
    client = Client(service)
    sandbox = client.create()
    try:
        ran = client.run(sandbox, "id -u; sudo id -u; sudo -u root sh -c 'echo $HOME; exit 3'")
        assert ran.stdout == "1000\n0\n/root\n"
        assert ran.end is not None and ran.end["exitCode"] == 3
    finally:
        client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")


@needs_bwrap
def test_sudo_refuses_another_target_user(service: LocalE2bService) -> None:
    client = Client(service)
    sandbox = client.create()
    try:
        ran = client.run(sandbox, "sudo -u nobody id")
        assert ran.stderr == "sudo: only root can be the target user here\n"
        assert ran.end is not None and ran.end["exitCode"] == 1
    finally:
        client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")
