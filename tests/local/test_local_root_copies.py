"""Forks and snapshots carry a sandbox's whole writable root filesystem, as E2B's do.

What a sandbox wrote outside its places (``/app``, a new file in ``/etc``, an edit of
``/etc/hosts``) and what it deleted of its template is in a fork of it and in a sandbox
created from a snapshot of it; the host's folders bound read-only (``/usr``) are not
copied. Both templates (the host view ``base``, an image folder), under the service as it
runs here: as root, and again as a normal user (``test_local_as_normal_user.py``), where an
image sandbox's written layer is capped by its disk limit too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from piship_remote.local.isolation.user_map import root_mappable
from tests.support.image import minimal_rootfs
from tests.support.local_service import Client, needs_bwrap, start_as

pytestmark = [needs_bwrap, pytest.mark.timeout(180)]
TEMPLATES = ["base", "folder"]
DISK_MIB = 16
# Who writes the root filesystem: root where the sandbox has one, else its only user.
WRITER = "root" if root_mappable() else "user"
# A file each template has before any sandbox writes (the image's, or the service's /etc).
TEMPLATE_FILE = {"base": "/etc/hostname", "folder": "/bin/touch"}
CHANGES = (
    "mkdir -p /app && echo app > /app/x"
    " && echo extra > /etc/extra"
    " && echo '10.9.9.9 piship-test' >> /etc/hosts"
    " && rm {deleted}"
)
READ_BACK = "cat /app/x /etc/extra; tail -n 1 /etc/hosts; ls {deleted}"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalE2bService]:
    rootfs = minimal_rootfs(tmp_path_factory.mktemp("image") / "rootfs")
    (rootfs / "opt" / "tool").mkdir(parents=True)
    for name in ("a", "b"):
        (rootfs / "opt" / "tool" / name).write_text(name)
    with LocalE2bService(templates={"folder": rootfs}, max_disk_mib=DISK_MIB) as running:
        yield running


@pytest.fixture(scope="module")
def client(service: LocalE2bService) -> Client:
    return Client(service)


@pytest.fixture
def made(client: Client) -> Iterator[list[dict[str, Any]]]:
    """The sandboxes a test makes, deleted after it."""
    sandboxes: list[dict[str, Any]] = []
    yield sandboxes
    for each in sandboxes:
        client.control("DELETE", f"/sandboxes/{each['sandboxID']}")


@pytest.fixture
def changed(
    client: Client, made: list[dict[str, Any]], request: pytest.FixtureRequest
) -> tuple[str, dict[str, Any]]:
    """A sandbox of the template ``request.param`` that changed its root filesystem."""
    template: str = request.param
    sandbox = client.create(templateID=template)
    made.append(sandbox)
    code, _, error = run(client, sandbox, CHANGES.format(deleted=TEMPLATE_FILE[template]))
    assert code == 0, error
    return template, sandbox


def run(client: Client, sandbox: dict[str, Any], command: str) -> tuple[int, str, str]:
    stream = start_as(client, sandbox, WRITER, command).finish()
    assert stream.end is not None
    return stream.end.get("exitCode", 0), stream.stdout, stream.stderr


def fork(client: Client, sandbox: dict[str, Any]) -> dict[str, Any]:
    answer = client.control("POST", f"/sandboxes/{sandbox['sandboxID']}/fork", json={"count": 1})
    assert answer.status_code == 201, answer.text
    result = answer.json()[0]
    assert "sandbox" in result, result
    forked: dict[str, Any] = result["sandbox"]
    return forked


def from_snapshot(client: Client, sandbox: dict[str, Any]) -> dict[str, Any]:
    answer = client.control("POST", f"/sandboxes/{sandbox['sandboxID']}/snapshots", json={})
    assert answer.status_code == 201, answer.text
    return client.create(templateID=answer.json()["snapshotID"])


def assert_carried(client: Client, copy: dict[str, Any], template: str) -> None:
    deleted = TEMPLATE_FILE[template]
    code, seen, error = run(client, copy, READ_BACK.format(deleted=deleted))
    assert seen == "app\nextra\n10.9.9.9 piship-test\n"
    assert code != 0 and deleted in error  # still deleted


@pytest.mark.parametrize("changed", TEMPLATES, indirect=True)
def test_a_fork_has_the_root_filesystem_its_source_wrote_and_deleted(
    client: Client, changed: tuple[str, dict[str, Any]], made: list[dict[str, Any]]
) -> None:
    template, sandbox = changed
    copy = fork(client, sandbox)
    made.append(copy)
    assert_carried(client, copy, template)


@pytest.mark.parametrize("changed", TEMPLATES, indirect=True)
def test_a_sandbox_from_a_snapshot_has_the_root_filesystem_its_source_wrote_and_deleted(
    client: Client, changed: tuple[str, dict[str, Any]], made: list[dict[str, Any]]
) -> None:
    template, sandbox = changed
    copy = from_snapshot(client, sandbox)
    made.append(copy)
    assert_carried(client, copy, template)


@pytest.mark.parametrize("changed", TEMPLATES, indirect=True)
def test_a_fork_still_has_its_template_files_the_source_left_alone(
    client: Client, changed: tuple[str, dict[str, Any]], made: list[dict[str, Any]]
) -> None:
    _, sandbox = changed
    copy = fork(client, sandbox)
    made.append(copy)
    code, seen, error = run(client, copy, "echo kept | cat")
    assert (code, seen) == (0, "kept\n"), error


@pytest.mark.parametrize("changed", ["base"], indirect=True)
def test_the_hosts_read_only_folders_are_not_copied_into_a_fork(
    client: Client, changed: tuple[str, dict[str, Any]], made: list[dict[str, Any]]
) -> None:
    _, sandbox = changed
    copy = fork(client, sandbox)
    made.append(copy)
    code, _, error = run(client, copy, "touch /usr/piship-x")
    assert code != 0 and "Read-only file system" in error


@pytest.mark.parametrize("changed", TEMPLATES, indirect=True)
def test_a_forks_writes_stay_its_own(
    client: Client, changed: tuple[str, dict[str, Any]], made: list[dict[str, Any]]
) -> None:
    _, sandbox = changed
    copy = fork(client, sandbox)
    made.append(copy)
    assert run(client, copy, "echo fork > /app/x")[0] == 0
    assert run(client, sandbox, "cat /app/x")[1] == "app\n"


@pytest.mark.parametrize("template", TEMPLATES)
def test_writing_the_root_filesystem_past_the_disk_cap_fails_with_no_space(
    client: Client, template: str
) -> None:
    sandbox = client.create(templateID=template)
    try:
        code, _, error = run(client, sandbox, f"head -c {2 * DISK_MIB}M /dev/zero > /big")
    finally:
        client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")
    assert code != 0 and "No space left on device" in error


def test_a_filesystem_only_pause_keeps_what_an_image_sandbox_wrote_to_its_root(
    client: Client, made: list[dict[str, Any]]
) -> None:
    sandbox = client.create(templateID="folder")
    made.append(sandbox)
    assert run(client, sandbox, "mkdir -p /app && echo app > /app/x")[0] == 0
    where = f"/sandboxes/{sandbox['sandboxID']}"
    assert client.control("POST", where + "/pause", json={"memory": False}).status_code == 204
    assert client.control("POST", where + "/connect", json={"timeout": 60}).status_code == 201
    code, seen, error = run(client, sandbox, "cat /app/x")
    assert (code, seen) == (0, "app\n"), error


def test_a_template_folder_the_source_replaced_holds_only_its_new_files_in_a_fork(
    client: Client, made: list[dict[str, Any]]
) -> None:
    sandbox = client.create(templateID="folder")
    made.append(sandbox)
    replaced = "rm -rf /opt/tool && mkdir /opt/tool && echo c > /opt/tool/c"
    assert run(client, sandbox, replaced)[0] == 0
    copy = fork(client, sandbox)
    made.append(copy)
    assert run(client, copy, "ls /opt/tool")[1] == "c\n"
