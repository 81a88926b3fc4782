"""A sandbox's writes to its root filesystem stay its own; the template it shares never changes.

Each sandbox sees its template (the host view ``base``, or an image's root filesystem)
through a writable layer of its own on its disk: ``/app`` and ``/etc`` can be written,
as on E2B, and a second sandbox of the same template sees none of it. The template's
files belong to a host uid no sandbox maps and nobody else may write them, so even a
sandbox root that reached the host's view of them could not plant a file there.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.uid_block import TEMPLATE_OWNER
from piship_remote.local.isolation.user_map import root_mappable
from tests.support.image import minimal_rootfs
from tests.support.local_service import HTTP_TIMEOUT, Client, needs_bwrap, start_as
from tests.support.sandbox_uid import as_host_uid, host_uid_of, mount_namespace, needs_util_linux

pytestmark = [needs_bwrap, pytest.mark.timeout(120)]
TEMPLATES = ["base", "folder"]
DISK_MIB = 16
needs_root_service = pytest.mark.skipif(
    not root_mappable(), reason="a sandbox's own host uids need the service run as root"
)
# Who writes the root filesystem: root where the sandbox has one, else its only user.
WRITER = "root" if root_mappable() else "user"


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return minimal_rootfs(tmp_path_factory.mktemp("image") / "rootfs")


@pytest.fixture(scope="module")
def service(rootfs: Path) -> Iterator[LocalE2bService]:
    with LocalE2bService(templates={"folder": rootfs}, max_disk_mib=DISK_MIB) as running:
        yield running


@pytest.fixture(scope="module")
def client(service: LocalE2bService) -> Client:
    return Client(service)


@pytest.fixture
def pair(client: Client, request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    template = getattr(request, "param", "base")
    created = [client.create(templateID=template) for _ in range(2)]
    yield created
    for sandbox in created:
        client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")


def run(client: Client, sandbox: dict[str, Any], command: str) -> tuple[int, str, str]:
    stream = start_as(client, sandbox, WRITER, command).finish()
    assert stream.end is not None
    return stream.end.get("exitCode", 0), stream.stdout, stream.stderr


def upload(
    client: Client, sandbox: dict[str, Any], path: str, data: bytes, *, username: str = WRITER
) -> requests.Response:
    headers = {**client.envd_headers(sandbox), "Content-Type": "application/octet-stream"}
    return client.session.post(
        client.service.url + "/files",
        params={"path": path, "username": username},
        data=data,
        headers=headers,
        timeout=HTTP_TIMEOUT,
    )


@pytest.mark.parametrize("pair", TEMPLATES, indirect=True)
def test_writes_to_app_and_etc_succeed_and_a_second_sandbox_does_not_see_them(
    client: Client, pair: list[dict[str, Any]]
) -> None:
    first, second = pair
    wrote = run(client, first, "mkdir -p /app && echo mine > /app/x && touch /etc/y")
    assert wrote[0] == 0, wrote[2]
    assert run(client, first, "cat /app/x; ls /etc/y")[1] == "mine\n/etc/y\n"
    code, seen, _ = run(client, second, "ls /app/x /etc/y")
    assert code != 0 and seen == ""


@pytest.mark.parametrize("pair", TEMPLATES, indirect=True)
def test_a_file_written_through_envd_gets_its_parents_in_the_root_filesystem(
    client: Client, pair: list[dict[str, Any]]
) -> None:
    first, second = pair
    written = upload(client, first, "/opt/x/y.txt", b"through envd\n")
    assert written.status_code == 200, written.text
    assert run(client, first, "cat /opt/x/y.txt")[1] == "through envd\n"
    assert run(client, second, "ls /opt/x")[0] != 0


@pytest.mark.parametrize("pair", TEMPLATES, indirect=True)
def test_the_users_write_to_app_gets_parents_the_user_owns_as_envd_makes_them(
    client: Client, pair: list[dict[str, Any]]
) -> None:
    written = upload(client, pair[0], "/app/deep/x.txt", b"mine\n", username="user")
    assert written.status_code == 200, written.text
    code, owners, error = run(client, pair[0], "stat -c %U /app /app/deep /app/deep/x.txt")
    assert code == 0, error
    assert owners == "user\nuser\nuser\n"


@pytest.mark.parametrize("pair", ["folder"], indirect=True)
def test_a_write_over_a_template_file_reaches_neither_the_template_nor_another_sandbox(
    service: LocalE2bService, client: Client, pair: list[dict[str, Any]], rootfs: Path
) -> None:
    first, second = pair
    assert run(client, first, "echo changed > /bin/planted && echo x >> /bin/echo")[0] == 0
    assert run(client, second, "ls /bin/planted")[0] != 0
    template = Path(service.root) / "templates" / "folder"
    assert not (template / "bin" / "planted").exists()
    assert (template / "bin" / "echo").read_bytes() == (rootfs / "bin" / "echo").read_bytes()


def test_an_error_writing_a_read_only_place_says_so(
    client: Client, pair: list[dict[str, Any]]
) -> None:
    written = upload(client, pair[0], "/usr/piship-x/y.txt", b"x")
    assert written.status_code == 500
    message = written.json()["message"].lower()
    assert "read-only file system" in message or "permission denied" in message
    assert "path is a file" not in message


def test_writes_to_the_root_filesystem_count_against_the_disk_cap(
    client: Client, pair: list[dict[str, Any]]
) -> None:
    code, _, error = run(client, pair[0], f"head -c {2 * DISK_MIB}M /dev/zero > /big")
    assert code != 0 and "No space left on device" in error


@needs_root_service
@needs_util_linux
def test_the_template_belongs_to_no_sandbox_and_is_read_only_to_all(
    service: LocalE2bService,
) -> None:
    template = Path(service.root) / "templates" / "folder"
    for path in (template, template / "etc", template / "bin" / "echo"):
        info = os.lstat(path)
        assert (info.st_uid, info.st_gid) == (TEMPLATE_OWNER, TEMPLATE_OWNER)
        assert info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) == 0


@needs_root_service
@needs_util_linux
@pytest.mark.parametrize("pair", ["folder"], indirect=True)
@pytest.mark.parametrize("user", ["user", "root"])
def test_a_sandbox_cannot_plant_a_file_in_the_shared_template(
    service: LocalE2bService, client: Client, pair: list[dict[str, Any]], user: str
) -> None:
    first, second = pair
    template = Path(service.root) / "templates" / "folder"
    attacker = host_uid_of(client, first, user)
    planted = as_host_uid(service, attacker, f"echo x > {template}/etc/planted")
    assert planted.returncode != 0 and "Permission denied" in planted.stderr
    assert run(client, second, "ls /etc/planted")[0] != 0


@needs_root_service
@pytest.mark.parametrize("pair", ["folder"], indirect=True)
def test_every_mount_the_service_makes_is_nosuid_and_nodev(
    service: LocalE2bService, pair: list[dict[str, Any]]
) -> None:
    mountinfo = mount_namespace(service).removesuffix("/ns/mnt") + "/mountinfo"
    with open(mountinfo, encoding="utf-8") as info:
        fields = [line.split() for line in info]
    ours = [
        (point, options)
        for _, _, _, _, point, options, *_ in fields
        if point.startswith(service.root)
    ]
    assert len(ours) >= 3 * len(pair)  # each sandbox's tmpfs, template and root filesystem
    for point, options in ours:
        assert {"nosuid", "nodev"} <= set(options.split(",")), point
